// Simulator: discrete-event timing of a schedule on a profile, a plan and a topology — the
// prediction of a plan's throughput, bubbles and memory without running it.
//
// Cost model: the partitioner's (plan/cost_model.hpp), whose functions it calls, seen from the
// schedule's side:
//  - compute: a stage's forward / backward time is the sum over its layers (PlanStage::layer_ids
//    when set, else [begin, end)) of the profile's times (on a mixed cluster, of the profile of
//    the stage's device type, SimulateOptions::device_profiles), scaled by microbatch_size /
//    profile.batch_size. A split backward uses the profile's input/weight-gradient times where
//    measured, half of the backward each otherwise. A step takes the profile's step time of the
//    stage's layers for the plan's optimizer (StageTiming::step_s) plus optimizer_step_s.
//    Stragglers: a rank's forwards and backwards take its rank_slowdown factor times as long, and
//    each one a jitter factor more (SimulateOptions).
//  - transfers: the bytes crossing the cut after a stage (outputs of layers in it or earlier
//    stages that a later stage reads, the partitioner's boundary bytes; scaled like compute) at
//    the bandwidth of the innermost topology level holding both ranks, plus latency_s. One
//    message costs transfer_time(a, 1, B, 1) = 2a/B: a link's two directions share its bandwidth
//    (full_duplex: a/B). A rank's link towards a neighbour stage is shared by the peers the
//    dealing gives it there, each pair getting its share of the messages; under round-robin a
//    boundary between r and r' replicas then carries 2a/(B·min(r, r')) per minibatch, the
//    partitioner's transfer term. Messages on one link
//    direction go one at a time. An empty topology, or a level of bandwidth 0, moves data free.
//  - allreduce among a stage's r replicas: sync_time(|w|, r, B, 1) = 4(r−1)|w|/(rB) at the
//    slowest level the group spans (scaled by allreduce_factor / 4), plus 2(r−1)·latency_s; it
//    blocks the replicas once all have arrived, or (overlap_allreduce, as the runtime does) runs
//    in buckets that start during the replicas' last backward before it; on CPU ranks the
//    copying and summing of the peers' gradients also takes the rank's core
//    (allreduce_cpu_s_per_byte).
//  - overlap: sends never block, receives are posted early and waited for where the schedule
//    says, so transfers overlap with compute as the runtime's non-blocking communication does.
// Agreement with the partitioner (tests/unit/test_simulator_partition.cpp): in the steady state
// of 1F1B-stash the simulated time per minibatch equals the plan's predicted.time_per_minibatch_s
// (the bottleneck of compute + sync and transfer per stage) when the model is the same, and is
// never below it. It is above it where the partitioner's formula ignores what the runtime waits
// for, and then the simulator is the right view:
//  - transfer latency: with p − s minibatches in flight at stage s (PipeDream's warm-up), the
//    round trip from stage s down to stage j and back — the forwards and backwards of stages
//    s..j and two messages per boundary in between — is shared by only j − s + 1 minibatches, so
//    slow links make the period max(prediction, max over s ≤ j of round trip / (j − s + 1));
//  - replicated stages: replicas take minibatches in turn but meet at a blocking allreduce after
//    each, which the partitioner's (T + sync)/r assumes costs them no waiting for one another.
// Memory per rank: peak over time of stashed activations (per microbatch: what the stage's
// layers save for backward — stash_bytes() of the profile, their outputs where that was not
// measured — plus its received input; a recomputing stage only its input, plus the saved bytes
// of the one microbatch whose backward is running; a split backward also the gradients of the
// stage's layer outputs from its I to its W) plus weight versions times the stage's
// parameters. Recomputation also charges the stage's forward time again inside its backward.
//
// Reported: time per minibatch (flush schedules: makespan / minibatches; stash and 2BW schedules:
// the steady-state period, measured on every rank from its forward n/4, or its first after its
// warm-up where that is later, to its forward 3n/4, the slowest rank's), samples/s, bubble fraction
// (idle share of the makespan) overall and per rank, and its steady-state value over the same
// window.
#pragma once

#include <pipeline/plan/allreduce_buckets.hpp>
#include <pipeline/plan/device_profiles.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>
#include <pipeline/profile/profile.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {

struct SimulateOptions {
  int microbatch_size = 0;  // samples per microbatch; 0: the profile's batch size
  double latency_s = 0;     // per point-to-point message
  // Bytes on the wire per byte of float32 activation or gradient: 1, or 0.5 when they move as
  // bfloat16 (ExecutorOptions::transfer_dtype).
  double transfer_bytes_scale = 1.0;
  double optimizer_step_s = 0;  // added to every step (beyond the plan optimizer's measured time)
  double allreduce_factor = 4.0;
  // Model the runtime's overlapped gradient allreduce (ExecutorOptions::overlap_allreduce): the
  // stage's gradients go in buckets of at least allreduce_bucket_bytes, by layer in backward
  // order; a bucket starts when every replica's last backward before the AR has finished its
  // layers (the fraction of the backward's time that the layers up to it take in the profile),
  // buckets share the link one after another (each its share of the allreduce time, and the
  // latency), and the AR waits for the last. Off: the AR blocks for the whole allreduce once
  // every replica has arrived, as the partitioner's formula assumes (its plans' predictions are
  // for that model).
  bool overlap_allreduce = false;
  std::int64_t allreduce_bucket_bytes = kAllreduceBucketBytes;
  // CPU ranks: seconds of the rank's own core per byte of a peer's gradients that it receives and
  // adds (the copy out of the transport and the sum). Each replica spends (r − 1)·|w| times this
  // on every allreduce, time its compute cannot use: the AR ends no earlier than that long after
  // the last replica arrived (with overlap, the sums run in the backward's tests, so the network
  // part still overlaps). 0: not charged (a device whose copies and sums run beside its compute).
  double allreduce_cpu_s_per_byte = 0;
  bool full_duplex = false;
  bool record_trace = false;  // keep every action's start and end in Simulation::events
  // Mixed clusters: a profile per worker type (not owned; must outlive the call). A stage whose
  // plan entry names a device type is timed from that type's profile (ConfigError when it has
  // none); without this every stage is timed from the profile passed to simulate().
  const DeviceProfiles* device_profiles = nullptr;
  // Stragglers: rank r's forwards and backwards take rank_slowdown[r] times their cost (1:
  // nominal; ranks past the end run at 1), e.g. {1, 3} slows rank 1 threefold, as
  // PIPELINE_TEST_SLOW_RANK=1:3 does in the runtime. Each factor must be positive.
  std::vector<double> rank_slowdown;
  // Jitter: every forward and backward also takes a factor drawn from a lognormal distribution
  // of mean 1 and this coefficient of variation (0: none), from a stream per rank seeded by
  // jitter_seed, so a simulation is reproducible from its seed.
  double jitter_cv = 0;
  std::uint64_t jitter_seed = 0;
  // Ranks that share cores (CPU ranks of one host, e.g. under mpirun --oversubscribe): the job's
  // ranks have this many cores between them; 0, or at least as many cores as ranks: each rank
  // computes on its own. With fewer, the cores are shared as an OS scheduler shares them: while
  // k > cores ranks compute, each runs at cores / k of its speed (processor sharing, simulated
  // exactly: a compute action ends when the cores have done its work at the speeds the other
  // ranks' actions leave it; Simulation::core_stretch). An allreduce's CPU time stretches by the
  // contention when it starts. The cores never do more than their share: the time per
  // minibatch is at least the work per minibatch over the cores.
  int cores = 0;
  // With `cores`: the threads each rank's compute was timed on (the profile's Profile::threads),
  // each computing rank taking that many of the cores (k ranks of t threads run at cores / (k t)
  // of their profiled speed where that is less than 1).
  int threads_per_rank = 1;
  // Gradient clipping by the whole model's norm (ExecutorOptions::clip_norm > 0): each optimizer
  // step sums the squared gradient norm over every rank first (a blocking world allreduce), so a
  // rank's step waits for the last rank to reach its own. Under 1F1B-stash that is the first
  // stage's backward of the same minibatch, which the stages after it reach earlier.
  bool clip_by_global_norm = false;
};

// One executed action. Sends: start is when it was posted, end the arrival at the receiver.
// Receives: start is when the rank began waiting, end when the data was there.
struct TraceEvent {
  int rank = 0;
  Action action;
  double start_s = 0;
  double end_s = 0;
  int flow = -1;  // pairs a send with its receive (same id); -1 otherwise
};

// Costs of one stage for one microbatch, as the simulator charges them.
struct StageTiming {
  double forward_s = 0;
  double backward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
  std::int64_t output_bytes = 0;      // sent to the next stage per microbatch
  // Stashed per in-flight microbatch (on the last stage with the loss's gradient).
  std::int64_t activation_bytes = 0;
  // Held from a split backward's I to its W: the gradients of the stage's layer outputs.
  std::int64_t split_gradient_bytes = 0;
  std::int64_t parameter_bytes = 0;
  std::int64_t version_bytes = 0;  // one stashed weight version (less under bf16 stashing)
  // One optimizer step over the stage's parameters: the profile's step_s for the plan's
  // optimizer (Plan::optimizer; 0 when the plan names none). Not scaled by the microbatch size.
  double step_s = 0;
  // A recomputing stage (PlanStage::recompute) stashes only its input (activation_bytes) and
  // rebuilds these bytes at backward, holding them until its backward (or its W) ends; its
  // backward and backward_input times include the forward it runs again.
  bool recompute = false;
  std::int64_t recompute_bytes = 0;
  // The gradient of the backward in progress beyond activation_bytes: its input gradient, as large
  // as the input, less the loss's gradient where that is held (backward_gradient_bytes of
  // plan/cost_model.hpp).
  std::int64_t backward_gradient_bytes = 0;
  // Beyond that gradient, the larger of the stage's layer passes' temporaries and what one layer's
  // backward holds (scaled with the microbatch), and the runtime's own working memory
  // (Profile::runtime_bytes).
  std::int64_t workspace_bytes = 0;
  // The same for a split backward, whose I keeps each trained layer's output gradient for its W
  // in split_gradient_bytes: a layer's backward holds that much less beyond it.
  std::int64_t split_workspace_bytes = 0;
};

// `scale` = microbatch size / profile batch size. Throws ConfigError when the stage's layer
// range does not fit the profile.
StageTiming stage_timing(const Profile& profile, const Plan& plan, int stage, double scale);

// Bandwidth in bytes/s between ranks a and b (infinity when free).
double link_bandwidth(const Topology& topology, int a, int b);

struct RankSimulation {
  int rank = 0;
  int stage = 0;
  double busy_s = 0;
  double bubble_fraction = 0;
  double steady_state_bubble_fraction = 0;
  int peak_activations = 0;
  int peak_weight_versions = 1;
  std::int64_t peak_activation_bytes = 0;
  std::int64_t peak_weight_bytes = 0;
  // Gradient accumulators (two sets while a replica's backward runs before the allreduce of a
  // closed round), the input gradient of a backward in progress (StageTiming's
  // backward_gradient_bytes, the largest of the rank's stages') and the optimizer's state
  // (Plan::optimizer's copies of the weights; the partitioner's default, momentum, when the plan
  // names none).
  std::int64_t peak_state_bytes = 0;
  // The working memory of the rank's stages' passes: StageTiming::workspace_bytes, the largest of
  // its stages', with the stage's message buffers (message_buffer_bytes of plan/cost_model.hpp).
  std::int64_t workspace_bytes = 0;
  // Activations, weight versions, gradients (with the input gradient of a backward in progress)
  // and optimizer state at once, plus workspace_bytes: what the partitioner's estimate for a stage
  // charges (PlanStage::memory_bytes), for the schedule simulated.
  std::int64_t peak_memory_bytes = 0;
};

struct Simulation {
  std::string schedule;
  int samples_per_minibatch = 0;
  double makespan_s = 0;
  double time_per_minibatch_s = 0;
  double samples_per_s = 0;
  double bubble_fraction = 0;
  double steady_state_bubble_fraction = 0;
  std::vector<RankSimulation> ranks;
  std::vector<TraceEvent> events;  // with SimulateOptions::record_trace
  // Per rank, how much longer its compute took for sharing cores (SimulateOptions::cores: its
  // compute's time over its work); empty when every rank had a core of its own.
  std::vector<double> core_stretch;
};

// Validates the schedule (throws ConfigError like validate()) and times it. The plan's stages
// must match the schedule's (same count and ranks).
Simulation simulate(const Schedule& schedule, const Profile& profile, const Plan& plan,
                    const Topology& topology, const SimulateOptions& options = {});

}  // namespace pipeline
