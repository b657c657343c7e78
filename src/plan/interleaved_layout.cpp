#include <pipeline/plan/interleaved_layout.hpp>

#include <pipeline/core/error.hpp>

#include <fmt/ranges.h>

#include <set>

namespace pipeline {

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
  shape.positions = workers / shape.replicas;
  PIPELINE_CHECK_AS(
      ConfigError, stages % shape.positions == 0,
      "an interleaved layout needs the same number of stages on every rank: {} stages on {} ranks "
      "per pipeline; cut the model into a multiple of {} stages",
      stages, shape.positions, shape.positions);
  shape.stages_per_rank = stages / shape.positions;
  // (Stages 0..p-1 then hold p·r distinct ranks: every rank is at one place of one pipeline.)
  for (int k = 0; k < shape.positions; ++k) {
    const auto& mine = stage_ranks[static_cast<std::size_t>(k)];
    PIPELINE_CHECK_AS(ConfigError, static_cast<int>(mine.size()) == shape.replicas,
                      "an interleaved layout gives every stage the same replicas, but stage 0 has "
                      "{} and stage {} has {}",
                      shape.replicas, k, mine.size());
  }
  for (int k = 0; k < stages; ++k) {
    const auto& mine = stage_ranks[static_cast<std::size_t>(k)];
    const auto& first = stage_ranks[static_cast<std::size_t>(k % shape.positions)];
    PIPELINE_CHECK_AS(
        ConfigError, mine == first,
        "an interleaved layout places stage k on the ranks of stage k mod {} (the ranks of one "
        "pipeline), replica for replica, but stage {} runs on ranks {} and stage {} on {}",
        shape.positions, k, mine, k % shape.positions, first);
  }
  return shape;
}

}  // namespace pipeline
