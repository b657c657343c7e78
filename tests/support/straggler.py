"""Measured straggler throughput against the simulator's prediction.

The slow-rank hook stretches only forward and backward passes. The per-step work the simulator
leaves out (the allreduce on free links, the optimizer, data loading) is not slowed by the hook,
and on a loaded machine it is a large, varying share of a step; the machine's speed during the
runs also drifts from its speed while profiling. Two readings of the simulator bound what a run
should measure:
- scaled: the measured nominal rate times the simulator's slowed / nominal ratio (right when the
  whole measured step stretches with compute: the machine ran slower than it profiled);
- additive: the measured nominal time per sample plus the time per sample the simulator says the
  slowdown adds (right when the difference is unslowed per-step work).
A case passes when its rate lies within tolerance of the range between them. (On one loaded CI
run the nominal rate was 39% under the simulator: the slowed rate was 0.463 of nominal against
0.333 scaled, 3% off the additive reading.)
"""


def expected_range(measured_nominal, simulated_nominal, simulated_case):
    scaled = measured_nominal * simulated_case / simulated_nominal
    additive = 1.0 / (1.0 / measured_nominal + 1.0 / simulated_case - 1.0 / simulated_nominal)
    return min(scaled, additive), max(scaled, additive)


def check(name, measured_nominal, measured_case, simulated_nominal, simulated_case, tolerance):
    """A line for the log, and an error message when the case is off by more than tolerance."""
    low, high = expected_range(measured_nominal, simulated_nominal, simulated_case)
    if measured_case < low:
        error = (low - measured_case) / low
    elif measured_case > high:
        error = (measured_case - high) / high
    else:
        error = 0.0
    line = (f"{name}: measured {measured_nominal:,.0f} -> {measured_case:,.0f} samples/s "
            f"(x{measured_case / measured_nominal:.3f}); simulator {simulated_nominal:,.0f} -> "
            f"{simulated_case:,.0f} (x{simulated_case / simulated_nominal:.3f}), so expected "
            f"{low:,.0f}-{high:,.0f}: off by {error:.1%}")
    problem = None
    if error > tolerance:
        problem = (f"{name}: measured {measured_case:,.0f} samples/s is more than {tolerance:.0%} "
                   f"outside the {low:,.0f}-{high:,.0f} the simulator's slowdown predicts")
    return line, problem
