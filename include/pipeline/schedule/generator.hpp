// Schedule generators: from a pipeline shape (stages and their replicas) and a microbatch count
// to per-rank action lists.
//
// A generator only decides the order of compute (F/B/I/W), AllReduce and Step actions on each
// rank; insert_communication() then adds the sends and receives every cross-stage dependency
// needs (a send right after the compute that produces the data, the matching receive right
// before the compute that consumes it), so a new schedule — interleaved 1F1B, 2BW, zero-bubble —
// is one more function registered by name.
#pragma once

#include <pipeline/plan/plan.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pipeline {

// What a plan tells the generators beyond its layout (ScheduleSpec::from_plan takes them from
// it; the trainers pass them on through ScheduleRequest), so that a run follows the schedule the
// simulator timed for the plan.
struct ScheduleHints {
  // Stash schedules: minibatches each replica of the input stage admits before its first
  // backward (PipeDream's NOAM); 0 picks NOAM = ceil(workers / replicas of the input stage),
  // i.e. one warm-up of (workers - 1 - ranks before s) / replicas(s) forwards per stage.
  int in_flight = 0;
  // Stash schedules: per stage, the most minibatches a replica holds (PlanStage::in_flight: what
  // the plan's memory estimate charges); empty or 0 for a stage: stash_in_flight of the stage.
  std::vector<int> stage_in_flight;
  // Stash schedules: per stage, whether its replicas may delay their allreduces (StashShape;
  // PlanStage::delay_allreduce); empty: all may.
  std::vector<char> stage_may_delay;
  // Per stage, the seconds of one microbatch's forward and backward over its replicas (the
  // plan's PlanStage::compute_s: a replica's time over the replica count), for the generators
  // that order by time (zb-v) and the stash shape search; empty or any non-positive entry: equal
  // stages.
  std::vector<double> stage_seconds;
  // Per stage, the seconds one input activation (or its gradient) takes on the link from the
  // stage before at its whole bandwidth (PlanStage::input_message_s); the stash shape search
  // charges them as the simulator does, and zb-v orders by them. Empty: free links.
  std::vector<double> input_message_seconds;
  // Interleaved 1F1B (and interleaved-zb-h1): microbatches per group (a multiple of the ranks of
  // a pipeline, InterleavedOrder; Plan::microbatch_group); 0: one per rank.
  int microbatch_group = 0;
};

// What a generator is asked for.
struct ScheduleSpec : ScheduleHints {
  // stage -> ranks of its replicas (PlanStage::ranks).
  std::vector<std::vector<int>> stage_ranks;
  int microbatches = 1;  // per minibatch (stash schedules: must be 1, each minibatch is a unit)
  int minibatches = 1;
  bool vertical_sync = false;
  // stage -> the replica of each of the run's microbatches (Schedule::dealing; dealing.hpp
  // deals them by the replicas' speed). Empty: round-robin. Flush schedules (gpipe, 1f1b-flush,
  // zb-h1) follow any dealing; the others deal round-robin and refuse one.
  std::vector<std::vector<std::int32_t>> dealing;

  int num_stages() const { return static_cast<int>(stage_ranks.size()); }
  int num_ranks() const;

  // p stages of one rank each (rank s runs stage s).
  static ScheduleSpec straight(int stages, int microbatches, int minibatches = 1);
  // v·p stages on p ranks, stage k on rank k mod p (interleaved schedules); with r replicas,
  // r such pipelines, replica j of stage k on rank j·p + k mod p.
  static ScheduleSpec interleaved(int ranks, int stages_per_rank, int microbatches,
                                  int minibatches = 1, int replicas = 1);
  // 2p stages on p ranks in a V (zb-v): stage k on rank k, stage 2p − 1 − k on rank k; with r
  // replicas, r such pipelines (interleaved_layout.hpp).
  static ScheduleSpec v_shape(int ranks, int microbatches, int minibatches = 1, int replicas = 1);
  // The stages and replicas of a plan; in_flight and stage_seconds from the plan.
  static ScheduleSpec from_plan(const Plan& plan, int microbatches, int minibatches = 1);
};

using ScheduleGenerator = std::function<Schedule(const ScheduleSpec&)>;

// Generators by name. builtin() holds gpipe, 1f1b-flush, zb-h1, 1f1b-stash, 1f1b-stash-vsync,
// 2bw, interleaved-1f1b, interleaved-zb-h1 and zb-v;
// copy it and add() to extend.
class GeneratorRegistry {
 public:
  static const GeneratorRegistry& builtin();

  void add(std::string name, ScheduleGenerator generator);
  bool contains(const std::string& name) const { return m_generators.count(name) != 0; }
  std::vector<std::string> names() const;
  // Throws ConfigError listing the known names when `name` is unknown.
  Schedule generate(const std::string& name, const ScheduleSpec& spec) const;

 private:
  std::map<std::string, ScheduleGenerator> m_generators;
};

// generate_schedule(name, spec) == GeneratorRegistry::builtin().generate(name, spec).
Schedule generate_schedule(const std::string& name, const ScheduleSpec& spec);

// Adds SA/RA/SG/RG actions for every cross-stage dependency of the compute actions already in
// `schedule` (any existing point-to-point actions are dropped first). Peers follow the
// round-robin dealing: microbatch u of stage s lives on schedule.rank_of(s, u).
void insert_communication(Schedule& schedule);

// Checks a spec and throws ConfigError on empty stages, ranks out of range or repeated,
// non-positive counts, and a dealing that does not give each microbatch one replica. Generators
// call it first; those that place several stages on one rank (interleaved schedules) pass
// one_stage_per_rank = false.
void check_spec(const ScheduleSpec& spec, bool one_stage_per_rank = true);

// Minibatches for a 1F1B-stash run to reach its steady state: at least 8 per worker, in whole
// rounds of every stage (round-robin dealing needs a multiple of every replica count, so of their
// least common multiple). 0 when that exceeds `limit`: coprime replica counts in the thousands
// (PipeDream's planner gives 2938-1083-75 for 4096 workers) make it tens of millions, more than a
// simulation or a run can take.
std::int64_t steady_state_minibatches(const std::vector<int>& replicas, std::int64_t limit);
// The same for a plan's run: with replicated stages the shape's first rounds last about as many
// minibatches as its replicas hold (PlanStage::in_flight), so at least 8 times those where that
// stays within `limit` (VGG-16's 7-1 plan over a 1.25 GB/s link, 8 in flight a replica, read 9%
// fast at 8 minibatches per worker); without replicas, at least 8 times the deepest stage's
// in-flight count, which slow links make more than the workers.
std::int64_t steady_state_minibatches(const Plan& plan, std::int64_t limit);
// The limit the simulating front ends take (a simulation of about a million minibatches per
// stage runs for seconds).
inline constexpr std::int64_t kMaxSimulatedMinibatches = std::int64_t{1} << 20;

// The microbatches a flush or interleaved schedule splits a minibatch of `batch` samples (0: any
// number) into on `ranks` ranks when none are asked for, as pipeline-partition plans them by
// default: 4 per rank, or the most below that which divide the batch; for an interleaved plan,
// whose groups need a multiple of the ranks, 4 per rank where that divides the batch, else 3, 2
// or 1 per rank, else 4 per rank (or as many as the batch has samples for) of unequal sizes.
int default_flush_microbatches(int ranks, bool interleaved, int batch);
// The microbatches a run of `plan` under `schedule` takes when none are asked for: 1 under a
// stash schedule, the plan's where it was made for a count, otherwise
// default_flush_microbatches() on the ranks the plan trains on. The trainers and
// pipeline-simulate (at the plan's batch) both take it.
int default_microbatches(const Plan& plan, const std::string& schedule, int batch);

namespace detail {
// The makespan of `schedule` on `spec`'s pipeline (its stage times and messages where it has
// them, else balanced stages), each rank's computation `rank_slowdown[r]` times as long;
// infinity for a schedule that deadlocks.
double probe_makespan_slowed(const ScheduleSpec& spec, const Schedule& schedule,
                             std::span<const double> rank_slowdown);
// Warm-up depth of one replica of `stage` under 1F1B: PipeDream's
// (workers - 1 - ranks before the stage) / replicas, i.e. p - 1 - s for a straight pipeline.
int one_f_one_b_warmup(const ScheduleSpec& spec, int stage);
// Warm-up depth of every stage under 1F1B-stash before any deadlock check: PipeDream's depth,
// capped by spec.in_flight - 1 on every stage and by the stage's own stage_in_flight - 1, and
// non-increasing along the pipeline.
std::vector<int> stash_warmups(const ScheduleSpec& spec);
// Warm-up depth of every stage as the plan gives it (1F1B-stash, and 1F1B-flush and ZB-H1 on a
// pipeline without replicas): the stage's stage_in_flight - 1 (which exceeds PipeDream's depth
// where the planner found that transfers need more), PipeDream's where not given, capped by
// spec.in_flight - 1 and non-increasing.
std::vector<int> planned_warmups(const ScheduleSpec& spec);
// The shape of a 1F1B-stash schedule per stage: its warm-up depth, and how many of its replicas
// (the first ones of the round-robin) wait for each allreduce and step only after their next
// backward. Round-robin dealing staggers a stage's replicas by one period of the stage before
// them, so a replica that waited right after its backward would idle until the last replica's
// backward of the round; a delaying replica computes meanwhile (its next backward's gradients go
// to a second buffer, and the forward in between uses the weights before the step).
struct StashShape {
  std::vector<int> warmups;
  std::vector<int> delaying;  // per stage, 0..replicas; empty: none
};
// The deepest warm-up the stash search gives each stage: its in-flight count less one
// (ScheduleSpec::stage_in_flight, or stash_in_flight), the input stage's within in_flight.
std::vector<int> stash_depth_limits(const ScheduleSpec& spec);
// Shapes for 1F1B-stash on a pipeline with replicated stages, chosen by simulation (see
// generator.cpp): every shape returned runs without deadlock on a run of a few rounds.
StashShape replicated_stash_shape(const ScheduleSpec& spec);
// Lowers the shape until `sched`, the 1F1B-stash schedule for it, validates: on a deadlock the
// delays of the stages involved go first, then the deepest warm-up among them; `sched` is
// regenerated as the shape changes.
void lower_until_valid(const ScheduleSpec& spec, StashShape& shape, Schedule& sched);
// 1F1B-stash of the given shape (one_f_one_b_stash_schedule picks it).
Schedule stash_schedule_with(const ScheduleSpec& spec, const StashShape& shape);
// Whether 1F1B-flush and ZB-H1 search their warm-up depths: on replicated stages dealt
// round-robin.
bool searches_flush_warmups(const ScheduleSpec& spec);
// The warm-up depths 1F1B-flush (ZB-H1 with split_backward) runs: searched on a pipeline with
// replicated stages (replicated_flush_warmups), the plan's on one without (planned_warmups);
// nullopt: PipeDream's.
std::optional<std::vector<int>> flush_warmups(const ScheduleSpec& spec, bool split_backward);
// Warm-up depths for 1F1B-flush (ZB-H1 with split_backward) on a pipeline with replicated
// stages dealt round-robin, chosen by simulating the balanced pipeline (see generator.cpp);
// never slower there than PipeDream's.
std::vector<int> replicated_flush_warmups(const ScheduleSpec& spec, bool split_backward);
// 1F1B-flush / ZB-H1 with the given warm-up depth per stage, or PipeDream's depths when null.
Schedule one_f_one_b_flush_with(const ScheduleSpec& spec, const std::vector<int>* warmups);
Schedule zero_bubble_h1_with(const ScheduleSpec& spec, const std::vector<int>* warmups);
// ConfigError when the spec deals microbatches other than round-robin: for the generators whose
// schedule depends on it (stash, 2BW, interleaved).
void require_round_robin(const ScheduleSpec& spec, const std::string& schedule);
// The microbatches among [first, first + count) that replica `replica` of `stage` runs (the
// spec's dealing, round-robin without one).
std::vector<int> replica_microbatches(const ScheduleSpec& spec, int stage, int replica, int first,
                                      int count);
// An empty schedule for the spec (ranks sized, stage_ranks copied, counts set).
Schedule empty_schedule(const ScheduleSpec& spec, std::string name, UpdatePolicy policy);
}  // namespace detail

}  // namespace pipeline
