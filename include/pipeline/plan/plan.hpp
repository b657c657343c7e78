// Plan: a model split into contiguous stages, each replicated over some workers (ranks) of one
// worker type, with the schedule to run and the partitioner's prediction. Serialised as plan.json
// (format "pipeline.plan/1", see DESIGN.md; "pipeline.plan/2" for interleaved plans).
//
// Interleaved plans (virtual_stages = v > 1, Narayanan et al. SC'21): the model is cut into v·p
// contiguous stages over p workers and stage k runs on rank k mod p, so every rank holds v
// non-adjacent layer ranges and a microbatch passes every rank v times; r data-parallel copies of
// such a pipeline replicate every stage r times (interleaved_layout.hpp). Such a plan runs under
// the interleaved-1f1b schedule (ScheduleSpec::from_plan builds its spec); one of 2 stages per
// rank placed in a V (stage k ≥ p on the rank of stage 2p − 1 − k) under zb-v.
#pragma once

#include <pipeline/nn/architecture.hpp>

#include <algorithm>
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
  // Activation recomputation: the stage keeps only its input per in-flight microbatch and runs
  // its forward again during backward (plan.json "recompute": true; absent means false).
  bool recompute = false;
  // Minibatches a replica of the stage holds at once under 1F1B-stash (for a plan made for a
  // flush schedule: the microbatches it starts before its first backward under 1F1B-flush or
  // ZB-H1), which its memory estimate charges and the schedule keeps to: PipeDream's count, or
  // more where the planner found that transfers need them (stash_in_flights with transfers)
  // (plan.json "in_flight"; 0 when absent: the schedule's default, stash_in_flight of the stage).
  int in_flight = 0;
  // Whether the stage's replicas may wait for an allreduce only after their next backward, which
  // takes a second gradient set per replica (plan.json
  // "delay_allreduce": false where the memory estimate could not take them; absent means true).
  bool delay_allreduce = true;
  // The worker type the stage runs on, for a plan over a mixed cluster (Topology::types;
  // plan.json "device": "h100", absent for a plan over one kind of worker). Its replicas are all
  // of that type, and the simulator times the stage from that type's profile.
  std::string device;
  // The partitioner's breakdown of this stage, per minibatch (0 when unknown): compute over its
  // replicas, weight synchronisation, the larger of its input and output transfers, and the
  // predicted memory per worker, and of it the working memory of the pass in progress
  // (StageWorkspace: temporaries of one layer's pass and the runtime's own), which the runtime's
  // own accounting (StageMemory) does not hold but its allocator's peak does.
  double compute_s = 0;
  double sync_s = 0;
  double transfer_s = 0;
  // Seconds one of the stage's input activations (or, back, its gradient) takes on the link from
  // the stage before at the link's whole bandwidth, 2a/B as a half-duplex pair carries both (0 for
  // the input stage, free links, or unknown): what the schedule's warm-up depths must hide
  // (stash_in_flights with transfers).
  double input_message_s = 0;
  double memory_bytes = 0;
  double workspace_bytes = 0;
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
  Architecture architecture;  // the profile's (Profile::architecture); empty where not recorded
  // The profile's batch size: the microbatch the predictions hold for (0: not recorded).
  int batch_size = 0;
  int workers = 0;
  std::string schedule = "1f1b-stash";
  int in_flight = 1;   // minibatches admitted at the input stage (PipeDream's warm-up depth)
  // Microbatches per minibatch the plan's prediction and memory are for, when it was planned for a
  // flush schedule (plan.json "microbatches", absent otherwise): the trainers' and the
  // simulator's default.
  int microbatches = 0;
  std::string config;  // PipeDream notation: replicas per stage joined by '-'
  std::string cost_model;  // "pipeline" or "pipedream" (empty when unknown)
  // The update rule whose step times the prediction includes ("sgd", "momentum", "adamw"; plan.json
  // "optimizer", absent when none): the simulator charges the same per stage.
  std::string optimizer;
  // The dtype of the profile the plan was made from when it is not float32 ("bfloat16"; plan.json
  // "dtype", absent for float32): the precision its memory estimate assumes (weight versions
  // stashed in bf16) and the trainers' default --dtype.
  std::string dtype;
  // The threads per process its CPU profile was timed on (Profile::threads; plan.json
  // "profile_threads", absent when unknown): its times hold for ranks that compute on as many.
  int profile_threads = 0;
  // The element type of the activations and gradients between stages the plan's costs assume when
  // it is not the one `dtype` implies ("bfloat16" for float32 plans, "float32" for bf16 ones;
  // plan.json "transfer_dtype", absent otherwise): the trainers' and simulator's default
  // --transfer-dtype. transfer_bf16() says which it is.
  std::string transfer_dtype;
  bool transfer_bf16() const {
    return transfer_dtype.empty() ? dtype == "bfloat16" : transfer_dtype == "bfloat16";
  }
  // Stages per rank: 1 for a plain pipeline (each rank serves one stage), v > 1 for an
  // interleaved plan: r pipelines of p = workers / r ranks, stages.size() == v · p, every stage
  // with r replicas, stage k on the ranks of stage k mod p, or in a V (interleaved_layout.hpp).
  int virtual_stages = 1;
  // An interleaved plan run under interleaved 1F1B: microbatches per group, a multiple of the
  // ranks of a pipeline, more than them where the messages of a microbatch's way round the ranks
  // need hiding (InterleavedOrder; plan.json "microbatch_group", absent: one per rank).
  int microbatch_group = 0;
  std::vector<PlanStage> stages;
  PlanPrediction predicted;

  int num_stages() const { return static_cast<int>(stages.size()); }
  bool interleaved() const { return virtual_stages > 1; }
  // Each stage's replica count, in stage order.
  std::vector<int> replica_counts() const {
    std::vector<int> counts;
    for (const PlanStage& s : stages) counts.push_back(s.replicas);
    return counts;
  }
  // The ranks the stages run on, ascending: 0..workers-1, or fewer where the plan leaves workers
  // of its topology idle (pipeline-partition --allow-idle, manual stages on fewer workers); empty
  // where a hand-written plan leaves its ranks out.
  std::vector<int> ranks_used() const {
    std::vector<int> ranks;
    for (const PlanStage& s : stages) {
      if (s.ranks.empty()) return {};
      ranks.insert(ranks.end(), s.ranks.begin(), s.ranks.end());
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    return ranks;
  }
  // How many ranks the plan trains on: ranks_used()'s, or every worker where that is unknown.
  int ranks_run() const {
    const std::size_t used = ranks_used().size();
    return used > 0 ? static_cast<int>(used) : workers;
  }
  // Each stage's predicted compute per replica (PlanStage::compute_s), in stage order: what the
  // schedules that order by time take (ScheduleSpec::stage_seconds).
  std::vector<double> stage_seconds() const {
    std::vector<double> seconds;
    for (const PlanStage& s : stages) seconds.push_back(s.compute_s);
    return seconds;
  }
};

// The plan as a job of just the ranks it uses runs it: those ranks renumbered 0..k−1 in order
// (each with its predicted memory) and `workers` k. A plan whose ranks are 0..workers−1 comes
// back as it is. Its ranks keep their places in the topology in the plan as written, which the
// predictions (and pipeline-simulate) are for; the trainers run the compacted one.
inline Plan compact_ranks(Plan plan) {
  const std::vector<int> used = plan.ranks_used();
  if (used.empty() || static_cast<int>(used.size()) == plan.workers) return plan;
  auto job_rank = [&](int rank) {
    return static_cast<int>(std::lower_bound(used.begin(), used.end(), rank) - used.begin());
  };
  for (PlanStage& s : plan.stages)
    for (int& rank : s.ranks) rank = job_rank(rank);
  std::vector<std::int64_t>& memory = plan.predicted.peak_memory_bytes;
  if (memory.size() == static_cast<std::size_t>(plan.workers)) {
    std::vector<std::int64_t> kept;
    for (int rank : used) kept.push_back(memory[static_cast<std::size_t>(rank)]);
    memory = std::move(kept);
  }
  plan.workers = static_cast<int>(used.size());
  return plan;
}

}  // namespace pipeline
