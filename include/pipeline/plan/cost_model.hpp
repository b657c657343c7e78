// The cost model of a pipeline stage, shared by the partitioner and the simulator.
//
// A stage is a set of layers with total compute time T (forward + backward, seconds per
// minibatch), parameters P bytes and activations A bytes, replicated over r workers (or groups).
//   compute + weight synchronisation:  (T + 4(r-1)P / (B r S)) / r     (added, as PipeDream does)
//   activation transfer of a boundary of a bytes into or out of the stage:  2a / (B r R)
// where B is the bandwidth of the level the replicas span, S the number of workers that share
// that synchronisation (the inner workers of a group) and R the activation compression ratio.
// Two variants:
//  - CostModel::PipeDream reproduces the released optimizer (SOSP'19): S is the previous level's
//    count for a single stage and 1 for a split-off stage, transfers only when a compression
//    ratio is given, and memory `ceil((M - m)/r) (A + P)` (no working copy; last stage unstashed).
//  - CostModel::Pipeline (default) shares the synchronisation by all inner workers of a group
//    (S = product of the inner level counts) in both cases, charges transfers by default (R = 1),
//    uses the bytes that really cross a cut, and counts memory as below.
// The simulator (schedule/simulator.hpp) charges these same terms per microbatch and rank. Its
// steady-state time per minibatch under 1F1B-stash equals the bottleneck computed here where the
// two model the same thing and is larger, never smaller, where this formula leaves out what the
// runtime waits for: transfer round trips that the in-flight minibatches cannot hide, and
// replicas of a stage meeting at a blocking allreduce (tests/unit/test_simulator_partition.cpp).
#pragma once

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <vector>

namespace pipeline {

enum class CostModel { Pipeline, PipeDream };

inline std::string_view to_string(CostModel m) { return m == CostModel::Pipeline ? "pipeline" : "pipedream"; }

inline double sync_time(double parameter_bytes, int replicas, double bandwidth, double sharers) {
  return 4.0 * (replicas - 1) * parameter_bytes / (bandwidth * replicas * sharers);
}

// Seconds per minibatch of a stage replicated `replicas` times: compute plus synchronisation.
inline double replicated_stage_time(double compute_s, double parameter_bytes, int replicas, double bandwidth,
                                    double sharers) {
  return (compute_s + sync_time(parameter_bytes, replicas, bandwidth, sharers)) / replicas;
}

// An activation forward plus its gradient backward, shared by the receiving stage's replicas.
inline double transfer_time(double boundary_bytes, int replicas, double bandwidth, double compression) {
  return 2.0 * boundary_bytes / (bandwidth * replicas * compression);
}

// Minibatches in flight at a stage under 1F1B with weight stashing (PipeDream's warm-up + 1):
// the stage sees (workers - 1 - ranks before it) / replicas warm-up minibatches.
inline int in_flight(int workers, int ranks_before, int replicas) {
  int warmup = (workers - 1 - ranks_before) / replicas;
  return (warmup < 0 ? 0 : warmup) + 1;
}

// in_flight() of each stage of a pipeline with `replicas` per stage (PipeDream's counts).
inline std::vector<int> pipedream_in_flights(int workers, const std::vector<int>& replicas) {
  std::vector<int> out(replicas.size());
  int before = 0;
  for (std::size_t s = 0; s < replicas.size(); ++s) {
    out[s] = in_flight(workers, before, replicas[s]);
    before += replicas[s];
  }
  return out;
}

// Minibatches in flight at each stage of a pipeline with replicated stages (`replicas` per
// stage) under 1F1B-stash as the runtime schedules it: PipeDream's count plus, for every stage
// with replicas from this one on (this one included unless it is the last), its replicas - 1.
// Round-robin dealing makes a minibatch wait up to r - 1 periods for its replica of a stage of
// r, and those waits add up along the pipeline, so a stage must hold that many more to keep it
// full: a balanced 1-2-1 plan runs at 2/3 of its rate with PipeDream's count and at its rate
// with one more minibatch at the input stage.
inline std::vector<int> stash_in_flights(int workers, const std::vector<int>& replicas) {
  std::vector<int> out = pipedream_in_flights(workers, replicas);
  int waits = 0;  // replicas - 1 summed over the stages after s
  for (std::size_t s = replicas.size(); s-- > 0;) {
    out[s] += waits + (s + 1 < replicas.size() ? replicas[s] - 1 : 0);
    waits += replicas[s] - 1;
  }
  return out;
}

// The share of a link's bandwidth one pair of ranks gets across a boundary between stages of a
// and b replicas under round-robin dealing: each rank talks to b/g resp. a/g peers (g = gcd)
// evenly, so a pair gets 1/(max(a, b)/g) (the simulator's link model).
inline double round_robin_pair_share(int a, int b) {
  return 1.0 / static_cast<double>(std::max(a, b) / std::gcd(a, b));
}

// stash_in_flights() where messages take time. On a pipeline without replicas 1F1B keeps
// w_s - w_j + 1 minibatches on the loop from stage s to a later stage j and back (w: the warm-up
// depths, in flight - 1), and a minibatch takes the forwards and backwards on the way
// (`replica_seconds`: a replica's compute per minibatch of its own) and both messages across each
// boundary (`message_seconds[k]`: one message into stage k at a link's whole bandwidth; [0]
// unused) to go round it, so each loop's time over the plan's period (`period_s`) bounds that
// difference. On free links and balanced stages this is stash_in_flights()' count (PipeDream's
// without replicas); never less. Over slow links PipeDream's count leaves the
// pipeline waiting: VGG-16 on 4 workers at 1.25 GB/s, 1-1-1-1, ran at 0.65x its planned rate with
// depths 3-2-1-0 and at it with 6-3-2-0. With replicas the same holds per replica, whose loop
// carries one minibatch in r (and whose messages each take a pair's share of the link): mlp's
// 1-2-1 on 4 workers at 1 Gbit/s ran at 0.54x its planned rate with stash_in_flights()' 5 at the
// input stage and at it with 10. The generator's shape search, timed on the plan's stage times
// and messages, then picks depths within these counts (stash_depth_limits).
inline std::vector<int> stash_in_flights(int workers, const std::vector<int>& replicas,
                                         const std::vector<double>& replica_seconds,
                                         const std::vector<double>& message_seconds,
                                         double period_s) {
  std::vector<int> out = stash_in_flights(workers, replicas);
  if (!(period_s > 0)) return out;
  // Periods a loop takes, rounded up; within 0.1% of whole periods counts as whole (a minibatch
  // more in flight there would buy at most 0.1%, as on links so fast their messages vanish).
  const auto periods = [&](double seconds) {
    return static_cast<int>(std::ceil(seconds / period_s * (1 - 1e-3)));
  };
  // need[s]: what a replica of stage s must hold for the loops to fit, PipeDream's count at
  // least. A replica takes every r-th minibatch, so it runs a minibatch's backward
  // (need[s] − 1)·r_s periods after its forward, and the loop from s to j and back takes the
  // loop's periods less the r_s of stage s's own passes; at the input stage, whose replicas meet
  // at every allreduce (the generator delays none there), plus the r_s − 1 for which the first
  // replica of a round waits for the last.
  std::vector<int> need = pipedream_in_flights(workers, replicas);
  for (std::size_t s = out.size(); s-- > 0;) {
    double loop = replica_seconds[s];  // from s to j and back
    for (std::size_t j = s + 1; j < out.size(); ++j) {
      // A pair of ranks gets its share of the link (round_robin_pair_share), so its messages
      // take longer than the boundary's load per minibatch.
      loop += replica_seconds[j] +
              2 * message_seconds[j] / round_robin_pair_share(replicas[j - 1], replicas[j]);
      const int periods_held =
          (need[j] - 1) * replicas[j] + periods(loop) + (s == 0 ? replicas[s] - 1 : 0);
      need[s] = std::max(need[s], (periods_held + replicas[s] - 1) / replicas[s]);
    }
    out[s] = std::max(out[s], need[s]);
  }
  return out;
}

// The extra bytes per worker of a replicated stage whose replicas wait for an allreduce after
// their next backward (the schedule's delayed allreduces): a second gradient set, into which that
// backward accumulates. (The forward before it runs on a version the stage stashes anyway: the
// simulator and the runtime's allocator hold no more versions than the in-flight count's.) None
// for a stage of one replica, and none for the input stage, whose replicas load their minibatches
// together and never delay (the generator's replicated_stash_shape).
inline double delayed_allreduce_bytes(double parameter_bytes, int replicas, bool input_stage) {
  return replicas > 1 && !input_stage ? parameter_bytes : 0.0;
}

// Receives the runtime keeps posted ahead of the actions that wait for them
// (ExecutorOptions::receive_lookahead, runtime/stage_executor.hpp), each holding a buffer of one
// message.
constexpr int kPostedReceives = 4;

// A message a stage sent stays allocated until its receiver takes it, at that rank's next poll
// of its transfers, which may come after this stage's next pass: its last message is counted as
// alive beside everything else (on fashion-cnn's and transformer-lm's sending ranks the
// allocator's peak fell by exactly one message when each send was waited for at once).
constexpr int kUnfinishedSends = 1;

// The message buffers of a stage, part of its working memory: kPostedReceives receives and
// kUnfinishedSends sends of the larger message it exchanges — its input (received from the stage
// before, its gradient sent back), its output (sent on, its gradient received) — at the bytes on
// the wire (`compression`: the activation compression ratio, 2 for bf16 transfers). On a CPU
// pipeline of transformer blocks the receives were the whole 4-5% by which the allocator's peak
// exceeded the plan.
inline double message_buffer_bytes(double input_bytes, double output_bytes, double compression) {
  return (kPostedReceives + kUnfinishedSends) * std::max(input_bytes, output_bytes) / compression;
}

// The gradient of the backward in progress that the memory model charges beside a stage's
// stashed activations: its input gradient, as large as the input (`input_bytes`), or on the last
// stage the loss's gradient where that is the larger (`loss_gradient_bytes`:
// StateGraph::stage_loss_gradient_bytes): the backward reads it, and lets it go before its input
// gradient is whole. A stage's working memory counts its layers' backward beyond this
// (StageWorkspace).
inline double backward_gradient_bytes(double input_bytes, double loss_gradient_bytes) {
  return std::max(input_bytes, loss_gradient_bytes);
}

// The gradients a stage holds beside its stashed activations: backward_gradient_bytes, and on the
// last stage the loss's gradient of every other minibatch in flight, made at its forward and kept
// for its backward (on a transformer-lm's last stage twice its input).
inline double held_gradient_bytes(double input_bytes, double loss_gradient_bytes,
                                  int in_flight_minibatches) {
  return loss_gradient_bytes * (in_flight_minibatches - 1) +
         backward_gradient_bytes(input_bytes, loss_gradient_bytes);
}

// Bytes per worker of a stage under 1F1B-stash (Pipeline cost model): the working weights, their
// gradient, the optimizer state (`optimizer_state_factor` copies, 1 for momentum SGD, 2 for
// Adam), one stashed weight version per in-flight minibatch beyond the newest (`version_bytes`
// each: parameter_bytes, or less where a bf16 profile stashes weight matrices in bf16), the
// activations of every in-flight minibatch with the stage input it received (`input_bytes`, the
// bytes crossing into the stage; 0 for the first stage), the gradients of held_gradient_bytes,
// and the working memory of the pass in progress (`workspace_bytes`: StageWorkspace of
// antichain.hpp, the temporaries of one layer's pass and the runtime's own, plus
// message_buffer_bytes). The runtime's measured peak (StageMemory) holds all but the last; the
// allocator's peak (the trainers' "allocator peak") the last too. A stage whose first layer keeps
// none of its input (`frees_input`: StateGraph::stage_frees_input) holds it only while its
// forward runs.
inline double stage_memory_bytes(double parameter_bytes, double version_bytes,
                                 double activation_bytes, int in_flight_minibatches,
                                 double optimizer_state_factor, double input_bytes,
                                 double loss_gradient_bytes, double workspace_bytes,
                                 bool frees_input) {
  const double held_input = frees_input ? 0.0 : input_bytes;
  return parameter_bytes * (2.0 + optimizer_state_factor) +
         version_bytes * (in_flight_minibatches - 1) +
         (activation_bytes + held_input) * in_flight_minibatches +
         held_gradient_bytes(input_bytes, loss_gradient_bytes, in_flight_minibatches) +
         workspace_bytes;
}

// The same stage with activation recomputation: it keeps only its input per in-flight minibatch
// (`kept_input_bytes`: StateGraph::stage_recompute_input_bytes; the input it received, or the
// model's on the first stage, whose `input_bytes` is 0) and runs its forward again at backward,
// so one minibatch's activations are held at a time, during its backward (with the gradients of
// held_gradient_bytes). It costs one more forward: the stage's compute becomes forward + backward
// + forward. (On the first stage the activations count again what its layers keep of the model's
// input: one minibatch's at most, on the safe side.)
inline double recompute_stage_memory_bytes(double parameter_bytes, double version_bytes,
                                           double activation_bytes, double input_bytes,
                                           double kept_input_bytes, double loss_gradient_bytes,
                                           int in_flight_minibatches, double optimizer_state_factor,
                                           double workspace_bytes) {
  return parameter_bytes * (2.0 + optimizer_state_factor) +
         version_bytes * (in_flight_minibatches - 1) + kept_input_bytes * in_flight_minibatches +
         activation_bytes +
         held_gradient_bytes(input_bytes, loss_gradient_bytes, in_flight_minibatches) +
         workspace_bytes;
}

// Copies of the weights an optimizer keeps (PartitionOptions::optimizer_state_factor) by its
// name: "sgd" 0, "momentum" (SGD with momentum, PipeDream's) 1, "adamw" or "adam" 2.
// ConfigError naming the accepted names otherwise.
inline double optimizer_state_copies(std::string_view optimizer) {
  if (optimizer == "sgd") return 0;
  if (optimizer == "momentum") return 1;
  if (optimizer == "adamw" || optimizer == "adam") return 2;
  PIPELINE_FAIL(ConfigError, "unknown optimizer '{}': use sgd, momentum or adamw (the state the "
                "memory model charges: 0, 1 or 2 copies of the weights)", optimizer);
}

// Which stages recompute their activations: none, those that would not fit in memory otherwise
// (auto), or all.
enum class Recompute { None, Auto, All };

inline std::string_view to_string(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Auto ? "auto" : "all";
}

// PipeDream's memory test for a stage of r replicas when the stage and all stages before it use m
// of the level's M machines: ceil((M - m) / r) * (A + P).
inline double pipedream_stage_memory_bytes(double parameter_bytes, double activation_bytes, int machines,
                                           int machines_so_far, int replicas) {
  int versions = (machines - machines_so_far + replicas - 1) / replicas;
  return versions * (activation_bytes + parameter_bytes);
}

}  // namespace pipeline
