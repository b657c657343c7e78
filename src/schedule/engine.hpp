// Internal: the dataflow execution of a schedule that validation and simulation share.
//
// Every rank runs its list in order with its own clock. Compute advances the clock by the
// stage's cost (with shared cores: as a job on the cores, which ends when the processor-sharing
// timeline of all ranks' jobs has done its work); a send posts a message that arrives after the
// transfer time (messages on one link are serialised) and never blocks; a receive waits until its
// message has arrived; an allreduce waits for all replicas of the stage and then takes the ring
// time, or, overlapped, ends when the last of its buckets (started during the replicas' last
// backwards) has. Because ranks share nothing but messages, running each rank as far as it can and
// waking it when what it waits for arrives gives the same times as a global event queue, in
// O(actions). Shared cores couple the ranks' compute: the ranks still run as far as they can, and
// only the jobs on the cores advance in global time order (O(actions x ranks computing)).
//
// Preconditions: the schedule passed detail::check_local() (every send has its receive and
// every dependency is on the right rank), so what can still go wrong is only the order: a
// deadlock, reported as a ConfigError naming the ranks and actions that wait on each other.
#pragma once

#include <pipeline/schedule/schedule.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace pipeline::detail {

struct StageCosts {
  double forward_s = 0;
  double backward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
  double step_s = 0;
  double allreduce_s = 0;
  // The replica's own CPU time per allreduce (copying and summing its peers' gradients), which
  // its compute cannot overlap (SimulateOptions::allreduce_cpu_s_per_byte).
  double allreduce_cpu_s = 0;
  // Overlapped allreduce (SimulateOptions::overlap_allreduce): the gradients go in buckets; bucket
  // j may start once every replica's last backward before the AR (B or W) has run the fraction
  // bucket_ready[j] of its time, takes bucket_s[j], and buckets go one after another. Empty: one
  // blocking allreduce of allreduce_s once all replicas have arrived at the AR.
  std::vector<double> bucket_ready;
  std::vector<double> bucket_s;
  std::int64_t activation_bytes = 0;  // stashed per microbatch between its forward and backward
  // The input gradient of a backward in progress beyond activation_bytes
  // (StageTiming::backward_gradient_bytes), charged throughout, as the partitioner charges it.
  std::int64_t backward_gradient_bytes = 0;
  // Rebuilt by a recomputing stage at the start of a backward (B, or I of a split one) and held
  // until it ends (B) or until its W.
  std::int64_t recompute_bytes = 0;
  // A split backward keeps the gradients of the stage's layer outputs from its I until its W.
  std::int64_t split_gradient_bytes = 0;
  std::int64_t parameter_bytes = 0;  // the latest weight version
  std::int64_t version_bytes = 0;    // each older (stashed) version
  // One set of gradient accumulators; a replica holds a second while a backward of the next
  // round runs before the allreduce of a closed one (the runtime's delayed allreduce).
  std::int64_t gradient_bytes = 0;
  std::int64_t optimizer_bytes = 0;  // the optimizer's state (momentum, Adam's moments)
  std::int64_t workspace_bytes = 0;  // working memory of a pass (StageTiming::workspace_bytes)
};

struct EngineCosts {
  std::vector<StageCosts> stages;
  // Seconds to move one message of `kind` (SendActivation / SendGradient) of `stage` from
  // rank src to rank dst. Empty: free.
  std::function<double(int src, int dst, int stage, ActionKind kind)> transfer_s;
  // Stragglers (SimulateOptions::rank_slowdown, jitter_cv): every forward and backward (B, I, W)
  // of rank r takes rank_slowdown[r] times its cost (empty or missing: 1), times, with
  // jitter_cv > 0, a lognormal factor of mean 1 and that coefficient of variation drawn from
  // Rng(jitter_seed, "jitter.rank<r>") in the rank's action order, so a run is reproducible
  // whatever order the engine visits the ranks in.
  std::vector<double> rank_slowdown;
  // Ranks sharing cores (SimulateOptions::cores; 0: a core for every rank): the compute actions
  // and steps running at any moment share this many cores as an OS scheduler shares them, each
  // at min(1, shared_cores / k) of its speed while k run (processor sharing). The replicas' CPU
  // share of an allreduce stretches by the contention when it starts.
  int shared_cores = 0;
  int threads_per_rank = 1;  // of the shared cores, what one computing rank takes
  double jitter_cv = 0;
  std::uint64_t jitter_seed = 0;
  // Clipping by the whole model's gradient norm (SimulateOptions::clip_by_global_norm): a rank's
  // first step of each step number sums the squared norm with every rank that steps (a blocking
  // world allreduce, as the executor's), so it waits until all have reached theirs, and then
  // `global_norm_s` more (the allreduce's latency).
  bool global_norm_steps = false;
  double global_norm_s = 0;
};

struct RankRecord {
  double finish_s = 0;
  double busy_s = 0;  // compute and optimizer steps
  double work_s = 0;  // what busy_s would be on a core of its own (EngineCosts::shared_cores)
  int peak_activations = 0;
  int peak_weight_versions = 1;
  std::int64_t peak_activation_bytes = 0;
  std::int64_t peak_weight_bytes = 0;
  std::int64_t peak_state_bytes = 0;  // gradients (RankSimulation's) and optimizer state
  std::int64_t workspace_bytes = 0;   // the working memory charged (the largest of its stages')
  std::int64_t peak_memory_bytes = 0;
  // Steady-state window of stash schedules (timed runs only): from the start of the rank's
  // forward number n/4 (or its first after its warm-up, where that comes later) to that of number
  // 3n/4 (n = its forwards); window_forwards == 0 when the rank has too few, or for flush
  // schedules.
  int window_forwards = 0;
  double window_begin_s = 0, window_begin_busy_s = 0;
  double window_end_s = 0, window_end_busy_s = 0;
};

struct EngineResult {
  std::vector<RankRecord> ranks;
  std::vector<TraceEvent> events;  // only when asked for, in execution order per rank
};

// `costs` null: every duration is zero (validation).
EngineResult execute_schedule(const Schedule& schedule, const EngineCosts* costs,
                              bool record_trace);

// The structural checks of validate(): every action is well-formed and on the right rank, every
// dependency comes first on its rank, every send has its receive, update rules of the policy.
// Throws ConfigError naming the rank, the action's index and its token.
void check_local(const Schedule& schedule);

}  // namespace pipeline::detail
