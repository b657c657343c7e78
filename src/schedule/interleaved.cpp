// Interleaved 1F1B: one more generator over the shared schedule representation.
#include <pipeline/schedule/schedules/interleaved.hpp>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

namespace {

// Interleaved 1F1B, or with `split_backward` its zero-bubble form: each backward split into I
// (queued in 1F1B's order) and W, rank r's W's deferred by `lag(r)` I's.
Schedule interleaved_schedule(const ScheduleSpec& spec, const std::string& name,
                              bool split_backward) {
  check_spec(spec, /*one_stage_per_rank=*/false);
  detail::require_round_robin(spec, name);
  const InterleavedShape shape = interleaved_shape(spec.stage_ranks);
  PIPELINE_CHECK_AS(ConfigError, shape.placement == StagePlacement::Looped,
                    "{} runs stage k on the ranks of stage k mod p; these {} stages are placed "
                    "in a V (stage k >= {} on the ranks of stage {} - k): run them with zb-v",
                    name, spec.num_stages(), shape.positions, 2 * shape.positions - 1);
  const int p = shape.positions, v = shape.stages_per_rank, replicas = shape.replicas;
  PIPELINE_CHECK_AS(
      ConfigError, spec.microbatches % (p * replicas) == 0,
      "{} sends microbatches through the ranks of each of its {} pipeline(s) in groups of {} "
      "(the ranks), so microbatches per minibatch must be a multiple of {}; got {}",
      name, replicas, p, p * replicas, spec.microbatches);
  check_microbatch_group(spec.microbatch_group, p);
  const int m = spec.microbatches / replicas;  // per pipeline
  const int total = m * v;                     // (stage, microbatch) pairs per rank and minibatch
  const InterleavedOrder order{p, v, m, spec.microbatch_group};
  Schedule sched = detail::empty_schedule(spec, name, UpdatePolicy::Flush);
  for (int pipe = 0; pipe < replicas; ++pipe)
    for (int r = 0; r < p; ++r) {
      auto& out = sched.ranks[static_cast<std::size_t>(spec.stage_ranks[r][pipe])];
      // Room for the communication too, which insert_communication adds in place.
      out.reserve(static_cast<std::size_t>(spec.minibatches) *
                  static_cast<std::size_t>(7 * total + 2 * v));
      // Zero bubble: rank r runs short of rank 0's warm-up by this many forwards, and holds as
      // many W's back, which then fill its cool-down while the I's race up the pipeline.
      const int lag = order.warmup(0) - order.warmup(r);
      for (int j = 0; j < spec.minibatches; ++j) {
        // This pipeline's microbatches of the minibatch (round-robin: pipe, pipe + r, ...).
        const std::vector<int> mbs =
            detail::replica_microbatches(spec, r, pipe, j * spec.microbatches, spec.microbatches);
        // The k-th forward (backward) of the rank within the minibatch.
        auto pair_of = [&](int k, bool backward) {
          const InterleavedPair pair = order.pair(k, backward);
          return std::pair<int, int>{pair.chunk * p + r, mbs[static_cast<std::size_t>(pair.index)]};
        };
        std::deque<std::pair<int, int>> pending;  // (stage, microbatch) whose I ran, W not yet
        auto fwd = [&](int k) {
          auto [s, u] = pair_of(k, false);
          out.push_back(forward(s, u));
        };
        auto bwd = [&](int k) {
          auto [s, u] = pair_of(k, true);
          if (!split_backward) {
            out.push_back(backward(s, u));
            return;
          }
          out.push_back({ActionKind::BackwardInput, s, u, -1});
          pending.emplace_back(s, u);
          if (static_cast<int>(pending.size()) > lag) {
            out.push_back(
                {ActionKind::BackwardWeight, pending.front().first, pending.front().second, -1});
            pending.pop_front();
          }
        };
        order.for_each_pass(r, [&](int k, bool backward) { backward ? bwd(k) : fwd(k); });
        for (auto [s, u] : pending) out.push_back({ActionKind::BackwardWeight, s, u, -1});
        if (replicas > 1)
          for (int c = 0; c < v; ++c) out.push_back({ActionKind::AllReduce, c * p + r, j, -1});
        for (int c = 0; c < v; ++c) out.push_back({ActionKind::Step, c * p + r, j, -1});
      }
    }
  insert_communication(sched);
  return sched;
}

}  // namespace

Schedule interleaved_one_f_one_b_schedule(const ScheduleSpec& spec) {
  return interleaved_schedule(spec, "interleaved-1f1b", /*split_backward=*/false);
}

Schedule interleaved_zero_bubble_schedule(const ScheduleSpec& spec) {
  return interleaved_schedule(spec, "interleaved-zb-h1", /*split_backward=*/true);
}

}  // namespace pipeline
