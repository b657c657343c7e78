// The end-of-run memory report of the example programs: every rank's measured peak bytes
// (StageExecutor::peak_memory) next to the planner's estimate for its stage
// (PlanStage::memory_bytes), printed as a table and written to the metrics, one line per rank.
//
// Two measured figures: the executor's own count of what it holds (parameters, gradients,
// optimizer state, stashed weight versions, activations), which the estimate holds too, and the
// allocator's peak in use during training (StageMemory::allocator_bytes): that and every
// temporary of the ops besides, which the estimate charges as the stage's working memory
// (PlanStage::workspace_bytes, from the profiler's workspace_bytes and runtime_bytes). On a GPU
// that is the caching pool's blocks (an in-process rank's: those of its stream); on the CPU the
// host allocator's buffers of 64 KiB and more, shown where each rank has a process of its own.
//
// The planner's estimate is for its own assumptions: minibatches of the profile's batch size
// under 1F1B with weight stashing and the plan's in-flight depth; under a flush schedule or
// another batch size the two differ by design. With the profile the plan was made from, the
// report adds each rank's peak as the simulator predicts it for the schedule the run executed
// (simulated_peak_memory), which holds for any schedule and microbatch count.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/profile/profile.hpp>
#include <pipeline/runtime/metrics.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "common/pipeline_flags.hpp"

namespace pipeline::examples {

// Every rank's peak memory, on every rank. Collective. Each value travels as two floats (high
// part and remainder), exact to 2^48 bytes; a slot has one non-zero contributor, so the sum is
// exact.
inline std::vector<StageMemory> gather_peak_memory(const StageExecutor& ex, Communicator& comm) {
  constexpr int kFields = 7;
  const int n = comm.size();
  Tensor t = Tensor::zeros(Shape{static_cast<std::int64_t>(n) * kFields * 2});
  const StageMemory& m = ex.peak_memory();
  const std::int64_t mine[kFields] = {m.parameter_bytes,      m.gradient_bytes,   m.optimizer_bytes,
                                      m.stashed_weight_bytes, m.activation_bytes, m.total_bytes,
                                      m.allocator_bytes};
  float* v = t.data<float>() + static_cast<std::ptrdiff_t>(comm.rank()) * kFields * 2;
  for (int i = 0; i < kFields; ++i) {
    const double d = static_cast<double>(mine[i]);
    v[2 * i] = static_cast<float>(d);
    v[2 * i + 1] = static_cast<float>(d - static_cast<double>(v[2 * i]));
  }
  comm.allreduce_sum(t, comm.world());
  std::vector<StageMemory> out(static_cast<std::size_t>(n));
  const float* all = t.data<float>();
  for (int r = 0; r < n; ++r) {
    std::int64_t f[kFields];
    for (int i = 0; i < kFields; ++i) {
      const float* p = all + (static_cast<std::ptrdiff_t>(r) * kFields + i) * 2;
      f[i] = static_cast<std::int64_t>(static_cast<double>(p[0]) + static_cast<double>(p[1]));
    }
    out[static_cast<std::size_t>(r)] = {f[0], f[1], f[2], f[3], f[4], f[5], f[6]};
  }
  return out;
}

// Every rank's peak memory as the simulator predicts it for `schedule` (the one the run executed,
// on minibatches of `minibatch_size` samples) over the plan with the run's recomputation (per
// stage) and transfer dtype (pipeline-simulate's peak_memory_bytes). Empty, with a warning, where
// the profile does not fit the plan: the run has ended by then, and keeps its results.
inline std::vector<std::int64_t> simulated_peak_memory(const Profile& profile, Plan plan,
                                                       const std::vector<bool>& recompute,
                                                       const PipelineFlags& flags,
                                                       const Schedule& schedule,
                                                       int minibatch_size) {
  for (std::size_t s = 0; s < plan.stages.size(); ++s) plan.stages[s].recompute = recompute[s];
  SimulateOptions options;
  const int microbatches = std::max(1, schedule.microbatches);
  options.microbatch_size = (minibatch_size + microbatches - 1) / microbatches;
  options.transfer_bytes_scale = flags.wire_dtype(&plan) == DType::BFloat16 ? 0.5 : 1.0;
  std::vector<std::int64_t> out;
  try {
    for (const RankSimulation& r : simulate(schedule, profile, plan, Topology{}, options).ranks)
      out.push_back(r.peak_memory_bytes);
  } catch (const std::exception& e) {
    log_warn("no simulated memory: {}", e.what());
    out.clear();
  }
  return out;
}

// Prints the table (when `print`) and writes one metrics line per rank; with the profile the plan
// was made from and the schedule run, each rank's simulated_peak_memory beside. Collective
// (gathers).
inline void report_peak_memory(const StageExecutor& ex, Communicator& comm, const Plan& plan,
                               const PipelineFlags& flags, const std::optional<Profile>& profile,
                               const std::optional<Schedule>& schedule, int minibatch_size,
                               MetricsWriter& metrics, bool print) {
  const std::vector<bool> recompute = recompute_stages(flags, plan);
  const std::vector<std::int64_t> simulated =
      profile && schedule
          ? simulated_peak_memory(*profile, plan, recompute, flags, *schedule, minibatch_size)
          : std::vector<std::int64_t>();
  const std::vector<StageMemory> all = gather_peak_memory(ex, comm);
  bool counted = false;  // the allocator's figure is there
  for (const StageMemory& m : all) counted = counted || m.allocator_bytes > 0;
  const PipelineLayout& layout = ex.layout();
  constexpr double kMiB = 1048576.0;
  bool overridden = false;  // a row whose stages recompute otherwise than their plan says
  if (print)
    fmt::print(
        "memory per rank, measured peak bytes held (MiB; each part at its own peak) vs the "
        "planner's estimate of them (plan held; an output waiting for its send is counted in "
        "the plan's working memory) and with that working memory (planned){}:"
        "\n{:>4} {:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{}{}\n",
        simulated.empty() ? "" : ", and the simulated peak of the schedule run", "rank", "stage",
        "recompute", "params", "grads", "optimizer", "stashed w", "activation", "peak", "plan held",
        "planned", simulated.empty() ? "" : fmt::format(" {:>10}", "simulated"),
        counted ? fmt::format(" {:>14}", "allocator peak") : "");
  for (int s = 0; s < layout.num_stages(); ++s)
    for (int r : layout.stage_ranks[static_cast<std::size_t>(s)]) {
      const StageMemory& m = all[static_cast<std::size_t>(r)];
      // A rank of an interleaved plan holds several stages: one row for all of them, at its
      // first, beside the sum of their estimates.
      const std::vector<int> held = layout.stages_of(r);
      if (held.front() != s) continue;
      bool rc = false, differs = false;
      double planned = 0, planned_workspace = 0;
      for (int h : held) {
        const auto k = static_cast<std::size_t>(h);
        const bool mine = k < recompute.size() && recompute[k];
        rc = rc || mine;
        if (k < plan.stages.size()) {
          planned += plan.stages[k].memory_bytes;
          // (A rank runs one pass at a time: the plan charges its largest working memory once.)
          planned_workspace = std::max(planned_workspace, plan.stages[k].workspace_bytes);
          differs = differs || mine != plan.stages[k].recompute;
        }
      }
      overridden = overridden || (differs && planned > 0);
      const auto R = static_cast<std::size_t>(r);
      if (print)
        fmt::print(
            "{:>4} {:>5} {:>9} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} "
            "{:>10} {:>10}{}{}\n",
            r, fmt::format("{}", fmt::join(held, ",")), rc ? "yes" : "no", m.parameter_bytes / kMiB,
            m.gradient_bytes / kMiB, m.optimizer_bytes / kMiB, m.stashed_weight_bytes / kMiB,
            m.activation_bytes / kMiB, m.total_bytes / kMiB,
            planned > 0 ? fmt::format("{:.3f}", (planned - planned_workspace) / kMiB)
                        : std::string("-"),
            planned > 0 ? fmt::format("{:.3f}{}", planned / kMiB, differs ? "*" : "")
                        : std::string("-"),
            R < simulated.size() ? fmt::format(" {:>10.3f}", simulated[R] / kMiB) : std::string(),
            counted ? fmt::format(" {:>14.3f}", m.allocator_bytes / kMiB) : std::string());
      nlohmann::json record{{"memory_rank", r},
                            {"stage", s},
                            {"recompute", rc},
                            {"measured_peak_bytes", m.total_bytes},
                            {"parameter_bytes", m.parameter_bytes},
                            {"gradient_bytes", m.gradient_bytes},
                            {"optimizer_bytes", m.optimizer_bytes},
                            {"stashed_weight_bytes", m.stashed_weight_bytes},
                            {"activation_bytes", m.activation_bytes},
                            {"planned_bytes", planned},
                            {"planned_workspace_bytes", planned_workspace},
                            {"allocator_peak_bytes", m.allocator_bytes}};
      if (R < simulated.size()) record["simulated_peak_bytes"] = simulated[R];
      metrics.write(record);
    }
  if (print && overridden)
    fmt::print(
        "* planned for the plan's own choice of recomputation, which --recompute overrides in "
        "this run{}\n",
        simulated.empty() ? "" : " (the simulated column is for this run's)");
}

}  // namespace pipeline::examples
