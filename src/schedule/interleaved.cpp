// Interleaved 1F1B: one more generator over the shared schedule representation.
#include <pipeline/schedule/schedules/interleaved.hpp>

#include <algorithm>

namespace pipeline {

Schedule interleaved_one_f_one_b_schedule(const ScheduleSpec& spec) {
  check_spec(spec, /*one_stage_per_rank=*/false);
  const int p = spec.num_ranks();
  const int stages = spec.num_stages();
  PIPELINE_CHECK_AS(
      ConfigError, stages % p == 0,
      "interleaved-1f1b needs the same number of stages on every rank: {} stages on {} ranks; "
      "cut the model into a multiple of {} stages",
      stages, p, p);
  for (int s = 0; s < stages; ++s)
    PIPELINE_CHECK_AS(
        ConfigError, spec.stage_ranks[s].size() == 1 && spec.stage_ranks[s][0] == s % p,
        "interleaved-1f1b places stage k on rank k mod {} without replicas, but stage {} runs on "
        "{} rank(s) starting with rank {}",
        p, s, spec.stage_ranks[s].size(), spec.stage_ranks[s][0]);
  PIPELINE_CHECK_AS(
      ConfigError, spec.microbatches % p == 0,
      "interleaved-1f1b sends microbatches through the ranks in groups of {} (the ranks), so "
      "microbatches per minibatch must be a multiple of {}; got {}",
      p, p, spec.microbatches);
  const int v = stages / p;
  const int m = spec.microbatches;
  const int total = m * v;  // (stage, microbatch) pairs per rank and minibatch
  Schedule sched = detail::empty_schedule(spec, "interleaved-1f1b", UpdatePolicy::Flush);
  for (int r = 0; r < p; ++r) {
    auto& out = sched.ranks[static_cast<std::size_t>(r)];
    // Room for the communication too, which insert_communication adds in place.
    out.reserve(static_cast<std::size_t>(spec.minibatches) *
                static_cast<std::size_t>(6 * total + v));
    const int warmup = m == p ? total : std::min(total, 2 * (p - 1 - r) + (v - 1) * p);
    for (int j = 0; j < spec.minibatches; ++j) {
      const int base = j * m;
      // The k-th forward (backward) of the rank within the minibatch: groups of p microbatches,
      // cycling through the rank's stages in ascending (descending) order.
      auto pair_of = [&](int k, bool backward) {
        const int group = k % (p * v) / p;
        const int chunk = backward ? v - 1 - group : group;
        const int mb = k / (p * v) * p + k % p;
        return std::pair<int, int>{chunk * p + r, base + mb};
      };
      auto fwd = [&](int k) {
        auto [s, u] = pair_of(k, false);
        out.push_back(forward(s, u));
      };
      auto bwd = [&](int k) {
        auto [s, u] = pair_of(k, true);
        out.push_back(backward(s, u));
      };
      for (int k = 0; k < warmup; ++k) fwd(k);
      for (int k = 0; k < total - warmup; ++k) {
        fwd(warmup + k);
        bwd(k);
      }
      for (int k = total - warmup; k < total; ++k) bwd(k);
      for (int c = 0; c < v; ++c) out.push_back({ActionKind::Step, c * p + r, j, -1});
    }
  }
  insert_communication(sched);
  return sched;
}

}  // namespace pipeline
