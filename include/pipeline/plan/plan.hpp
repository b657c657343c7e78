// Plan: a model split into contiguous stages, each replicated over some workers (ranks), with
// the schedule to run and the partitioner's prediction. Serialised as plan.json
// (format "pipeline.plan/1", see DESIGN.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {

struct PlanStage {
  int begin = 0;  // half-open range [begin, end) of profile layer indices
  int end = 0;
  int replicas = 1;
  std::vector<int> ranks;  // size == replicas; consecutive, replicas adjacent
  // For a DAG profile whose stage is not one contiguous range: the exact layers of the stage
  // (ascending; begin/end then bound them). Empty when the stage is exactly [begin, end).
  std::vector<int> layer_ids;
  // The partitioner's breakdown of this stage, per minibatch (0 when unknown): compute over its
  // replicas, weight synchronisation, the larger of its input and output transfers, and the
  // predicted memory per worker.
  double compute_s = 0;
  double sync_s = 0;
  double transfer_s = 0;
  double memory_bytes = 0;
};

struct PlanPrediction {
  double time_per_minibatch_s = 0;  // steady-state period: the bottleneck stage per minibatch
  double samples_per_s = 0;
  double data_parallel_time_per_minibatch_s = 0;
  double bubble_fraction = 0;
  std::vector<std::int64_t> peak_memory_bytes;  // per rank
};

struct Plan {
  std::string model;
  int workers = 0;
  std::string schedule = "1f1b-stash";
  int in_flight = 1;   // minibatches admitted at the input stage (PipeDream's warm-up depth)
  std::string config;  // PipeDream notation: replicas per stage joined by '-'
  std::string cost_model;  // "pipeline" or "pipedream" (empty when unknown)
  std::vector<PlanStage> stages;
  PlanPrediction predicted;

  int num_stages() const { return static_cast<int>(stages.size()); }
};

}  // namespace pipeline
