#include <pipeline/schedule/dealing.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/plan/partition.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pipeline {

std::vector<std::int32_t> deal_by_speed(std::span<const double> seconds_per_microbatch, int count,
                                        int min_each) {
  const auto r = seconds_per_microbatch.size();
  PIPELINE_CHECK_AS(ConfigError, r > 0, "deal_by_speed: no replicas to deal to");
  PIPELINE_CHECK_AS(ConfigError, count >= 0 && min_each >= 0,
                    "deal_by_speed: counts must be non-negative, got {} and {}", count, min_each);
  for (double t : seconds_per_microbatch)
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(t) && t > 0,
                      "deal_by_speed: a replica's seconds per microbatch must be positive and "
                      "finite, got {}",
                      t);
  // The guaranteed microbatches first, in round-robin order, then the greedy over the rest with
  // each replica's finish time counting what it already has.
  const int floor_each =
      static_cast<std::int64_t>(min_each) * static_cast<std::int64_t>(r) <= count ? min_each : 0;
  std::vector<int> held(r, floor_each);
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int k = 0; k < floor_each; ++k)
    for (std::size_t i = 0; i < r; ++i) out.push_back(static_cast<std::int32_t>(i));
  while (static_cast<int>(out.size()) < count) {
    std::size_t best = 0;
    double best_finish = 0;
    for (std::size_t i = 0; i < r; ++i) {
      const double finish = (held[i] + 1) * seconds_per_microbatch[i];
      if (i == 0 || finish < best_finish) {
        best = i;
        best_finish = finish;
      }
    }
    ++held[best];
    out.push_back(static_cast<std::int32_t>(best));
  }
  return out;
}

std::vector<std::vector<std::int32_t>> dealing_by_speed(const ScheduleSpec& spec,
                                                        std::span<const double> seconds_per_rank) {
  check_spec(spec);
  PIPELINE_CHECK_AS(ConfigError,
                    seconds_per_rank.size() >= static_cast<std::size_t>(spec.num_ranks()),
                    "dealing_by_speed: {} ranks' speeds for a schedule of {} ranks",
                    seconds_per_rank.size(), spec.num_ranks());
  std::vector<std::vector<std::int32_t>> dealing(spec.stage_ranks.size());
  for (std::size_t s = 0; s < spec.stage_ranks.size(); ++s) {
    const auto& ranks = spec.stage_ranks[s];
    if (ranks.size() < 2) continue;
    std::vector<double> t;
    for (int rank : ranks) t.push_back(seconds_per_rank[static_cast<std::size_t>(rank)]);
    const std::vector<std::int32_t> one = deal_by_speed(t, spec.microbatches, /*min_each=*/1);
    bool round_robin = true;
    for (std::size_t k = 0; k < one.size(); ++k)
      round_robin = round_robin && one[k] == static_cast<std::int32_t>(k % ranks.size());
    // Round-robin over a minibatch that is a multiple of the replicas is round-robin over the
    // run; otherwise the dealing repeats the minibatch's pattern, which round-robin would not.
    if (round_robin && spec.microbatches % static_cast<int>(ranks.size()) == 0) continue;
    auto& d = dealing[s];
    d.reserve(one.size() * static_cast<std::size_t>(spec.minibatches));
    for (int j = 0; j < spec.minibatches; ++j) d.insert(d.end(), one.begin(), one.end());
  }
  return dealing;
}

void check_dealable(const Plan& plan, const std::string& schedule) {
  PIPELINE_CHECK_AS(ConfigError, !plan.interleaved(),
                    "--rebalance deals a replicated stage's microbatches by speed under a flush "
                    "schedule of one stage per rank; this plan runs {} stages per rank: drop "
                    "--rebalance, or plan without --virtual-stages",
                    plan.virtual_stages);
  PIPELINE_CHECK_AS(ConfigError, plans_flush(schedule),
                    "--rebalance deals microbatches by speed, which only flush schedules (gpipe, "
                    "1f1b-flush, zb-h1) can follow; {} deals them round-robin: add --schedule "
                    "1f1b-flush",
                    schedule);
}

Schedule schedule_by_speed(const std::string& name, const ScheduleSpec& spec,
                           std::span<const double> seconds_per_rank,
                           const std::function<double(const Schedule&)>& makespan) {
  ScheduleSpec dealt = spec;
  dealt.dealing = dealing_by_speed(spec, seconds_per_rank);
  const bool by_list = std::any_of(dealt.dealing.begin(), dealt.dealing.end(),
                                   [](const auto& d) { return !d.empty(); });
  ScheduleSpec round_robin = spec;
  round_robin.dealing.clear();
  Schedule even = generate_schedule(name, round_robin);
  if (!by_list) return even;
  Schedule by_speed = generate_schedule(name, dealt);
  std::vector<double> slowdown(static_cast<std::size_t>(spec.num_ranks()), 1.0);
  for (const auto& ranks : spec.stage_ranks) {
    double fastest = std::numeric_limits<double>::infinity();
    for (int r : ranks) fastest = std::min(fastest, seconds_per_rank[static_cast<std::size_t>(r)]);
    for (int r : ranks)
      slowdown[static_cast<std::size_t>(r)] =
          seconds_per_rank[static_cast<std::size_t>(r)] / fastest;
  }
  const auto time = [&](const Schedule& s) {
    return makespan ? makespan(s) : detail::probe_makespan_slowed(spec, s, slowdown);
  };
  const double even_s = time(even), dealt_s = time(by_speed);
  return dealt_s < even_s * (1 - 1e-9) ? by_speed : even;
}

std::vector<int> dealt_counts(const Schedule& schedule, int stage, int minibatch) {
  std::vector<int> counts(static_cast<std::size_t>(schedule.replicas(stage)), 0);
  const int first = minibatch * schedule.microbatches;
  for (int u = first; u < first + schedule.microbatches; ++u)
    ++counts[static_cast<std::size_t>(schedule.replica_of(stage, u))];
  return counts;
}

}  // namespace pipeline
