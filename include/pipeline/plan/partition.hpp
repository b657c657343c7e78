// PipeDream's dynamic-programming partitioner (SOSP'19 §3.1) over antichain states.
//
// partition() splits a profile into stages, each a contiguous range of antichain states (for a
// chain: of layers), and replicates each stage, so that the slowest stage (compute plus weight
// synchronisation, and activation transfers) is as fast as possible on the topology. Levels are
// solved innermost first: a segment's best time on a whole group of the level below becomes its
// compute time one level up (PipeDream's hierarchy rule). Ties are broken deterministically: the
// candidate with fewer stages wins, then the earlier split.
//
// Contract: the profile is validated; the topology has at least one level of positive counts
// and bandwidths. With a memory limit, a plan whose every stage fits is returned, or
// ConfigError says the smallest memory per worker for which one would (and, when recomputation
// is off but would make a plan fit, says so). DAG profiles with more
// than `max_states` antichain states are planned over the antichain states of a coarsened DAG
// (StateGraph::build_coarsened; logged), never worse than planning over one topological order.
//
// Interleaved plans (PartitionOptions::virtual_stages = v > 1): the workers form d data-parallel
// copies of a straight pipeline of p = workers / d ranks (pipeline j on ranks j·p .. j·p + p − 1;
// d = 1 with `straight`), and the model, in its layer order, is cut into v·p contiguous stages,
// stage k at place k mod p of every pipeline (or, with PartitionOptions::placement V and v = 2,
// stage k ≥ p at place 2p − 1 − k, so that stages p − 1 and p share a rank and hand over without
// a transfer). For each d that leaves pipelines of at least 2 ranks,
// an exact dynamic program over the cut points minimises the slowest stage's time: max(compute /
// d + the allreduce of its weights among its d replicas / m, transfer in, transfer out), with m
// microbatches per minibatch (PartitionOptions::microbatches, 0: 4 per worker; for looped plans a
// multiple of the workers, which interleaved 1F1B takes in groups of a pipeline's), transfers at
// the bandwidth of the level joining the two ranks (each pipeline sends 1/d of them), the
// allreduce at the bandwidth of the level joining the pipelines; among the cuts that reach it, a
// second pass takes the one with the least sum of squared stage times (the most even; ties: the
// earlier cut), which also evens out each rank's sum over its stages. The degree with the least
// predicted time wins (ties: fewer pipelines). The plan records m, and its time_per_minibatch_s
// is a minibatch's makespan per microbatch: ⌈m/d⌉ × the slowest rank's pace (the sum over its v
// stages of their compute per microbatch, or of their transfers, if larger) + the fill and drain,
// (a microbatch's way through the v·p stages and the messages between them − that pace) / v
// (under zb-v less 3(p − 1) × the least weight-gradient time of a stage, not below 0; with only
// p microbatches per pipeline, which interleaved 1F1B runs all forwards first, the pace is at
// least the slowest rank's forwards plus the slowest rank's backwards) + the slowest rank's
// allreduces and optimizer steps; the memory per rank is the sum over its stages of weights,
// gradient and optimizer state, the largest working memory of its stages (it runs one pass at a
// time), and the microbatches (each a whole one of the profile's batch, whichever pipeline takes
// it) its schedule holds at its peak at the plan's microbatch count: its order (interleaved 1F1B's
// in the plan's group, or zb-v's) walked pass by pass, a V keeping the output gradients from each
// I to its W. With a
// memory limit the plan must fit or ConfigError names the rank. Recomputation: under Recompute::All
// every stage keeps only its input per held microbatch (zb-v also what it rebuilt, from the I to
// the W) and runs its forward twice (its compute includes the second forward); Auto takes the
// faster of two plans that fit: the stashing cut with, on each rank that would not fit, its stages
// recomputing one by one (the one that saves most there first), and the cut of every stage
// recomputing.
#pragma once

#include <pipeline/core/dtype.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>
#include <pipeline/profile/profile.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

struct PartitionOptions {
  CostModel cost_model = CostModel::Pipeline;
  bool straight = false;          // no replication (PipeDream --straight_pipeline)
  // May leave workers unused (PipeDream --use_fewer_machines). The search charges each stage the
  // minibatches in flight of a pipeline over every worker; under a memory limit on one level of
  // at most 64 workers every count is planned instead, each charged for its own pipeline.
  bool allow_idle = false;
  bool ignore_transfer = false;   // no activation transfer cost at all
  // 1F1B-stash plans keep PipeDream's in-flight counts (the least weight staleness; with
  // replicas, stash_in_flights()') even where slow links then leave round trips unhidden; by
  // default they hold more where that hides them (stash_in_flights with transfers).
  bool pipedream_in_flight = false;
  // Activation compression ratio R. PipeDream model: transfers are charged only when it is set.
  // Pipeline model: 1 when unset.
  std::optional<double> activation_compression;
  double optimizer_state_factor = 1.0;  // Pipeline model memory: optimizer copies of the weights
  // Pipeline model: the update rule ("sgd", "momentum", "adamw") whose measured step time
  // (LayerProfile::step_s) a stage's compute includes, once per minibatch on every replica, as the
  // runtime pays it; recorded in the plan (Plan::optimizer) for the simulator. Empty: no step
  // time (profiles without step times charge none either).
  std::string optimizer;
  // Activation recomputation (Pipeline model only): None stashes every stage's activations; Auto
  // recomputes a stage exactly when stashing would not fit in memory and recomputing does (its
  // compute then includes a second forward, so the search still picks the fastest plan that
  // fits); All recomputes every stage. The plan's stages say which recompute.
  Recompute recompute = Recompute::None;
  // Antichain states the search may use (0: 4000 on one level; 1500 on several, whose inner
  // levels keep a table over every pair of states). A DAG with more is planned over the states of
  // a coarsened DAG, with one topological order's prefixes added (StateGraph::build_coarsened).
  std::size_t max_states = 0;
  // Stages per worker: 1 for PipeDream's plans; v > 1 plans d interleaved pipelines of v·p
  // stages (see above; Pipeline cost model; `straight` keeps d = 1).
  int virtual_stages = 1;
  // Where an interleaved plan's stages go: looped (stage k at place k mod p, interleaved-1f1b) or,
  // with 2 virtual stages, in a V (stage k ≥ p at place 2p − 1 − k, zb-v; interleaved_layout.hpp).
  StagePlacement placement = StagePlacement::Looped;
  // The transfers' element type (set_transfer_dtype), recorded in the plan; unset: float32.
  std::optional<DType> transfer_dtype;
  // The schedule the plan is for: "1f1b-stash" (PipeDream's objective, above), or a flush
  // schedule ("1f1b-flush", "zb-h1", "gpipe"; see below) run with `microbatches` per minibatch
  // (0: 4 per worker), which the plan records for the trainers and the simulator.
  std::string schedule = "1f1b-stash";
  int microbatches = 0;
};

// Plans for a flush schedule (PartitionOptions::schedule; Pipeline cost model, one kind of
// worker, one stage per worker): d data-parallel copies of a straight pipeline of p = workers / d
// stages (stage k's d replicas on ranks k·d .. k·d + d − 1; the round-robin dealing then gives
// each copy ⌈m / d⌉ of a minibatch's m microbatches), for every d that divides the workers, d =
// workers being plain data parallelism and d = 1 the only one under `straight`. For each d a
// dynamic program over the cut points minimises the predicted time per minibatch among the cuts
// whose every stage fits in memory (under Recompute::Auto a stage that would not fit stashing
// recomputes where that fits; All: every stage), keeping per cut point the (slowest stage, way)
// pairs that no other beats in both; the degree with the least time wins:
//   a microbatch's way through the pipeline (the stages' compute, and at each cut its activation
//   and its gradient, one after the other) + (⌈m / d⌉ − 1) × the slowest stage per microbatch,
//   max(compute, transfer in, transfer out) + the largest allreduce of a stage's gradients
//   among its replicas and optimizer step (once per minibatch),
// less, under zb-h1, (p − 1 + min(⌈m / d⌉, p) − 1) × the least weight-gradient time of a stage
// (the W's that fill 1F1B's bubble: 2(p − 1) of them from p microbatches per copy on); under
// gpipe, whose forwards and backwards run in two phases, the slowest stage's forward plus the
// slowest's backward pace the further microbatches where that is more (the cut is 1F1B's). A stage
// holds, per replica, its weights, gradient and optimizer state (no stashed version) and the
// activations of min(⌈m/d⌉, p − k) microbatches under 1f1b-flush (stage k), min(⌈m/d⌉, p) under
// zb-h1 (with the output gradients kept from each I to its W), ⌈m/d⌉ under gpipe. The plan's
// time_per_minibatch_s is the predicted time per minibatch divided by m (per microbatch of the
// profile's batch, so samples_per_s compares with any other plan), and its data-parallel time the
// same figure for d = workers.

// Whether the partitioner plans for `schedule` as a flush schedule (1f1b-flush, zb-h1, gpipe;
// PartitionOptions::schedule).
inline bool plans_flush(std::string_view schedule) {
  return schedule == "1f1b-flush" || schedule == "zb-h1" || schedule == "gpipe";
}

// Whether `schedule` is a weight-stashing schedule (1f1b-stash, with or without vertical sync):
// one microbatch per minibatch, a step after every backward.
inline bool stashes_weights(std::string_view schedule) {
  return schedule.starts_with("1f1b-stash");
}

// Gradient clipping by the whole model's norm sums it over every rank at each step: under a
// weight-stashing schedule with replicated stages the stages step at different rates, so no such
// norm exists. Whether a run of stages with `replicas_per_stage` has one (the trainers run the
// others unclipped, and the partitioner plans them so).
inline bool global_norm_exists(bool weight_stashing, const std::vector<int>& replicas_per_stage) {
  return !weight_stashing || std::all_of(replicas_per_stage.begin(), replicas_per_stage.end(),
                                         [](int r) { return r == 1; });
}

// The same for a run of `plan` under its own schedule.
inline bool plan_has_global_norm(const Plan& plan) {
  return global_norm_exists(stashes_weights(plan.schedule), plan.replica_counts());
}

// Whether `schedule` runs interleaved plans (virtual stages): interleaved-1f1b (or "interleaved"),
// interleaved-zb-h1 on a looped placement, zb-v on a V.
inline bool plans_interleaved(std::string_view schedule) {
  return schedule == "interleaved" || schedule == "interleaved-1f1b" ||
         schedule == "interleaved-zb-h1" || schedule == "zb-v";
}

// Activations and gradients sent in `dtype`: bf16 halves the bytes on the wire, which the cost
// models charge as a compression ratio of 2 on top of any ratio already set. PipeDream's model
// charges transfers only under a ratio, so without one it stays uncharged there too.
inline void set_transfer_dtype(PartitionOptions& o, DType dtype) {
  o.transfer_dtype = dtype;
  if (dtype == DType::BFloat16 &&
      (o.cost_model == CostModel::Pipeline || o.activation_compression.has_value()))
    o.activation_compression = 2.0 * o.activation_compression.value_or(1.0);
}

// Records in `plan` the transfers' element type the options set, where it is not the one the
// plan's dtype implies (Plan::transfer_dtype). Call after plan.dtype is set.
inline void record_transfer_dtype(Plan& plan, const PartitionOptions& o) {
  if (!o.transfer_dtype) return;
  const bool bf16 = *o.transfer_dtype == DType::BFloat16;
  plan.transfer_dtype = bf16 == (plan.dtype == "bfloat16") ? "" : bf16 ? "bfloat16" : "float32";
}

// A stage of a manual plan: [begin, end) layer range replicated `replicas` times.
struct ManualStage {
  int begin = 0;
  int end = 0;
  int replicas = 1;
};

// Topologies with worker types are planned by partition_typed (typed_partition.hpp) and refused
// here with ConfigError.
Plan partition(const Profile& profile, const Topology& topology, const PartitionOptions& options = {});

// partition(), but nullopt instead of ConfigError when no plan fits in memory, without the
// search for the memory that would admit one (what cost planning asks of many sub-clusters).
std::optional<Plan> try_partition(const Profile& profile, const Topology& topology,
                                  const PartitionOptions& options = {});

// The antichain states partition() may use on this topology: options.max_states, or by default
// 4,000 on one level and 1,500 on several.
std::size_t antichain_state_budget(const Topology& topology, const PartitionOptions& options);

// "none" | "auto" | "all" → Recompute; ConfigError naming the choices otherwise.
Recompute parse_recompute(std::string_view text);

// "0:5x2,5:12,12:20" → stages; throws ConfigError on syntax errors.
std::vector<ManualStage> parse_manual_stages(std::string_view text);

// Evaluates a user-chosen plan with the same cost model (stages over the profile's layer order,
// ranks assigned consecutively). Throws ConfigError when the stages do not cover the model
// exactly in order, use more workers than the topology has, or (with a memory limit) do not fit.
// With options.virtual_stages = v > 1 the stages form an interleaved plan: exactly v·p of them,
// each with the same replicas r (r pipelines of p = workers / r ranks), stage k at its place
// (options.placement) of every pipeline.
Plan evaluate_stages(const Profile& profile, const Topology& topology, const std::vector<ManualStage>& stages,
                     const PartitionOptions& options = {});

// The profile the Pipeline cost model times: each layer's backward_s carries its step_s for
// options.optimizer (with_optimizer_steps(p, {}) is p).
Profile with_optimizer_steps(const Profile& profile, const PartitionOptions& options);

// The in-flight counts that hide a 1F1B-stash plan's transfers (stash_in_flights with transfers)
// from its stages' compute (PlanStage::compute_s) and input messages (input_message_s), at
// `period_s` per minibatch on `workers` workers.
std::vector<int> stash_in_flights_hiding_transfers(const Plan& plan, int workers, double period_s);

// Data-parallel time per minibatch over every worker under the chosen model (the baseline).
double data_parallel_time(const Profile& profile, const Topology& topology, const PartitionOptions& options = {});

}  // namespace pipeline
