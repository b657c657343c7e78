#include <pipeline/plan/interleaved_layout.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/plan/plan.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <mutex>
#include <set>

namespace pipeline {

const char* to_string(StagePlacement placement) {
  return placement == StagePlacement::V ? "v" : "looped";
}

std::vector<std::vector<int>> interleaved_stage_ranks(int positions, int stages_per_rank,
                                                      int replicas, StagePlacement placement) {
  PIPELINE_CHECK_AS(
      ConfigError, positions > 0 && stages_per_rank > 0 && replicas > 0,
      "an interleaved pipeline needs ranks, stages per rank and replicas > 0, got {}, {} and {}",
      positions, stages_per_rank, replicas);
  PIPELINE_CHECK_AS(ConfigError, placement == StagePlacement::Looped || stages_per_rank == 2,
                    "a V-shape placement has 2 stages per rank, not {}", stages_per_rank);
  InterleavedShape shape{positions, stages_per_rank, replicas, placement};
  std::vector<std::vector<int>> out;
  for (int k = 0; k < positions * stages_per_rank; ++k) {
    std::vector<int> mine;
    for (int j = 0; j < replicas; ++j) mine.push_back(j * positions + shape.place_of(k));
    out.push_back(std::move(mine));
  }
  return out;
}

InterleavedShape interleaved_shape(const std::vector<std::vector<int>>& stage_ranks) {
  PIPELINE_CHECK_AS(ConfigError, !stage_ranks.empty() && !stage_ranks[0].empty(),
                    "an interleaved layout needs stages with ranks");
  InterleavedShape shape;
  shape.replicas = static_cast<int>(stage_ranks[0].size());
  std::set<int> ranks;
  for (const auto& r : stage_ranks) ranks.insert(r.begin(), r.end());
  const int workers = static_cast<int>(ranks.size());
  const int stages = static_cast<int>(stage_ranks.size());
  PIPELINE_CHECK_AS(ConfigError, workers % shape.replicas == 0,
                    "an interleaved layout with {} replicas of every stage on {} ranks: the ranks "
                    "must be a multiple of the replicas",
                    shape.replicas, workers);
  const int p = workers / shape.replicas;
  shape.positions = p;
  PIPELINE_CHECK_AS(
      ConfigError, stages % p == 0,
      "an interleaved layout needs the same number of stages on every rank: {} stages on {} ranks "
      "per pipeline; cut the model into a multiple of {} stages",
      stages, p, p);
  shape.stages_per_rank = stages / p;
  // (Stages 0..p-1 then hold p·r distinct ranks: every rank is at one place of one pipeline.)
  for (int k = 0; k < p; ++k) {
    const auto& mine = stage_ranks[static_cast<std::size_t>(k)];
    PIPELINE_CHECK_AS(ConfigError, static_cast<int>(mine.size()) == shape.replicas,
                      "an interleaved layout gives every stage the same replicas, but stage 0 has "
                      "{} and stage {} has {}",
                      shape.replicas, k, mine.size());
  }
  // Stage p on the ranks of stage p − 1 (not of stage 0) makes it a V.
  if (shape.stages_per_rank == 2 && p > 1 &&
      stage_ranks[static_cast<std::size_t>(p)] == stage_ranks[static_cast<std::size_t>(p) - 1])
    shape.placement = StagePlacement::V;
  for (int k = 0; k < stages; ++k) {
    const auto& mine = stage_ranks[static_cast<std::size_t>(k)];
    const int place = shape.place_of(k);
    const auto& first = stage_ranks[static_cast<std::size_t>(place)];
    PIPELINE_CHECK_AS(
        ConfigError, mine == first,
        "an interleaved layout places stage k on the ranks of stage k mod {} (the ranks of one "
        "pipeline; looped) or, with 2 stages per rank, of stage {} - k (a V), replica for "
        "replica, but stage {} runs on ranks {} and stage {} on {}",
        p, 2 * p - 1, k, mine, place, first);
  }
  return shape;
}

int InterleavedOrder::group_size() const {
  return std::min(group > 0 ? group : positions, microbatches);
}

InterleavedPair InterleavedOrder::pair(int k, bool backward) const {
  const int v = stages_per_rank, g = group_size();
  const int first = k / (g * v) * g;                   // the group's first microbatch
  const int size = std::min(g, microbatches - first);  // the last group: what remains
  const int offset = k - first * v;
  const int chunk = offset / size;
  return {backward ? v - 1 - chunk : chunk, first + offset % size};
}

int InterleavedOrder::warmup(int place) const {
  const int p = positions, v = stages_per_rank, total = microbatches * v;
  return microbatches == p ? total : std::min(total, 2 * (p - 1 - place) + (v - 1) * group_size());
}

void check_microbatch_group(int group, int positions) {
  PIPELINE_CHECK_AS(ConfigError, group >= 0 && group % positions == 0,
                    "interleaved 1F1B takes microbatches in groups of a multiple of the {} ranks "
                    "of a pipeline; got a group of {} (0 or leave it out: {})",
                    positions, group, positions);
}

const PassOrder& interleaved_passes(const InterleavedOrder& order) {
  static std::mutex mutex;
  static std::map<std::array<int, 4>, PassOrder> cache;
  const std::lock_guard lock(mutex);
  auto [it, inserted] = cache.try_emplace(
      {order.positions, order.stages_per_rank, order.microbatches, order.group_size()});
  if (!inserted) return it->second;  // (a map's elements stay where they are)
  const int p = order.positions;
  PassOrder& out = it->second;
  out.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::vector<StagePass>& mine = out[static_cast<std::size_t>(r)];
    mine.reserve(2 * static_cast<std::size_t>(order.microbatches * order.stages_per_rank));
    order.for_each_pass(r, [&](int k, bool backward) {
      const InterleavedPair pair = order.pair(k, backward);
      mine.push_back(
          {backward ? PassKind::Backward : PassKind::Forward, pair.chunk * p + r, pair.index});
    });
  }
  return out;
}

std::vector<int> looped_stage_places(int positions, int stages_per_rank) {
  std::vector<int> places;
  for (int k = 0; k < positions * stages_per_rank; ++k) places.push_back(k % positions);
  return places;
}

StagePlacement placement_of(const Plan& plan) {
  if (!plan.interleaved()) return StagePlacement::Looped;
  std::vector<std::vector<int>> stage_ranks;
  for (const PlanStage& s : plan.stages) {
    if (s.ranks.empty()) return StagePlacement::Looped;
    stage_ranks.push_back(s.ranks);
  }
  return interleaved_shape(stage_ranks).placement;
}

std::string interleaved_schedule_for(const Plan& plan) {
  return placement_of(plan) == StagePlacement::V ? "zb-v" : "interleaved-1f1b";
}

void check_schedule_for_plan(const Plan& plan, const std::string& schedule) {
  const bool interleaved_schedule =
      schedule == "interleaved-1f1b" || schedule == "interleaved-zb-h1" || schedule == "zb-v";
  if (!plan.interleaved()) {
    PIPELINE_CHECK_AS(ConfigError, !interleaved_schedule,
                      "{} runs interleaved plans (several stages on each rank), but this plan "
                      "gives each worker one stage ({} stages over {} workers): run it under its "
                      "own schedule ({}), or make an interleaved one with pipeline-partition "
                      "--virtual-stages 2{}",
                      schedule, plan.num_stages(), plan.workers, plan.schedule,
                      schedule == "zb-v" ? " --stage-placement v" : "");
    return;
  }
  const bool v = placement_of(plan) == StagePlacement::V;
  PIPELINE_CHECK_AS(
      ConfigError,
      v ? schedule == "zb-v" : schedule == "interleaved-zb-h1" || schedule == "interleaved-1f1b",
      "the plan is interleaved ({} stages per rank, {} placement): run it with --schedule {}, "
      "not {}",
      plan.virtual_stages, v ? "V" : "looped",
      v ? "zb-v (its default)" : "interleaved-1f1b (its default) or interleaved-zb-h1", schedule);
}

}  // namespace pipeline
