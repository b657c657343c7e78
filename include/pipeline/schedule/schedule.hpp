// Schedule: what every rank does, in order, as plain data — the single source of truth that the
// runtime executes, the simulator times and the validator checks.
//
// A schedule is one list of actions per rank. An action names a stage, a microbatch and a kind:
// compute (forward F, backward B, or the split backward I = input gradient, W = weight
// gradient), point-to-point communication with a peer rank (send/receive of an activation or of
// a gradient), a gradient allreduce among the replicas of a stage, or an optimizer step.
//
// Microbatches are numbered globally over the run: microbatch u belongs to minibatch
// u / microbatches. A stage with r replicas hands microbatch u to its replica u % r (PipeDream's
// round-robin dealing), so a rank only ever sees every r-th microbatch of its stage — unless the
// schedule carries its own dealing (Schedule::dealing: flush schedules whose microbatches are
// dealt by the replicas' speed, schedule/dealing.hpp).
//
// Semantics the runtime and simulator share:
//  - sends are posted without blocking (MPI_Isend / NCCL in a side stream); a rank never waits
//    on its own send;
//  - a receive is posted ahead of time and the Recv action is the wait for its completion, so
//    transfers overlap with whatever the rank computes meanwhile;
//  - AllReduce number k is the k-th allreduce of the stage, a collective over all its replicas,
//    of the gradients of round k: minibatch k under Flush and DoubleBuffered, the replica's
//    (k+1)-th backward under Stash. A replica's gradients of round k are complete after its last
//    backward of the round (closing_backwards), where the runtime starts their allreduce; the AR
//    action waits for it, and may come after backwards of later rounds (their gradients go to a
//    second buffer), so that replicas staggered by the round-robin dealing need not meet;
//  - Step number k is the k-th optimizer step of the stage. Under UpdatePolicy::Flush the step
//    closes minibatch k (gradients accumulated over its microbatches); under
//    UpdatePolicy::Stash a step follows every backward and each in-flight microbatch keeps the
//    weight version its forward used (PipeDream's weight stashing). With vertical sync every
//    stage uses the version the input stage used, which travels with the activation. Under
//    UpdatePolicy::DoubleBuffered (PipeDream-2BW) step k also closes minibatch k, but the next
//    minibatches do not wait for it: every microbatch of minibatch k runs forward and backward
//    with the weights after k − 1 steps (W(k+1) = W(k) − lr·∇f(W(k−1))), so a stage holds two
//    weight versions.
//
// Text form, one token per action: <stage><code><number>[@<peer>], e.g. `0F3` (stage 0, forward,
// microbatch 3), `1B0`, `2I5`, `2W5`, `0SA3@1` (stage 0 sends the activation of microbatch 3 to
// rank 1), `1RA3@0`, `1SG3@0`, `0RG3@1`, `0AR2` (third allreduce of stage 0), `0ST2`.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/plan/pass_walk.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

enum class ActionKind : std::uint8_t {
  Forward,         // F
  Backward,        // B: input and weight gradient together
  BackwardInput,   // I: input gradient only (zero-bubble schedules)
  BackwardWeight,  // W: weight gradient only, after I of the same microbatch
  SendActivation,  // SA: this stage's output for the microbatch, to a rank of stage + 1
  RecvActivation,  // RA: the input of the microbatch, from a rank of stage - 1
  SendGradient,    // SG: the gradient of this stage's input, to a rank of stage - 1
  RecvGradient,    // RG: the gradient of this stage's output, from a rank of stage + 1
  AllReduce,       // AR: sum of weight gradients among the stage's replicas
  Step,            // ST: optimizer update of the stage's weights
};

inline constexpr int kNumActionKinds = 10;

// The compute action of a pass (plan/pass_walk.hpp): the kinds are listed in the same order.
constexpr ActionKind action_kind(PassKind kind) {
  return static_cast<ActionKind>(kind);
}
static_assert(action_kind(PassKind::Backward) == ActionKind::Backward &&
              action_kind(PassKind::Input) == ActionKind::BackwardInput &&
              action_kind(PassKind::Weight) == ActionKind::BackwardWeight);

// The token code of a kind: "F", "B", "I", "W", "SA", "RA", "SG", "RG", "AR", "ST".
std::string_view action_code(ActionKind kind);

inline bool is_compute(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
         k == ActionKind::BackwardWeight;
}
inline bool is_send(ActionKind k) {
  return k == ActionKind::SendActivation || k == ActionKind::SendGradient;
}
inline bool is_recv(ActionKind k) {
  return k == ActionKind::RecvActivation || k == ActionKind::RecvGradient;
}
inline bool is_p2p(ActionKind k) {
  return is_send(k) || is_recv(k);
}

// 16 bytes: a schedule of 1,024 ranks x 10,000 microbatches holds ~60 million of these.
struct Action {
  ActionKind kind = ActionKind::Forward;
  std::int32_t stage = 0;
  std::int32_t microbatch = 0;  // for AllReduce and Step: the round / step number
  std::int32_t peer = -1;       // the other rank of a send or receive; -1 otherwise

  friend bool operator==(const Action&, const Action&) = default;
};

inline Action forward(int stage, int mb) {
  return {ActionKind::Forward, stage, mb, -1};
}
inline Action backward(int stage, int mb) {
  return {ActionKind::Backward, stage, mb, -1};
}

// How weights are updated, which decides what Step means and what the validator demands.
enum class UpdatePolicy {
  Flush,  // accumulate over the minibatch's microbatches, step once: equals sequential training
  Stash,  // step after every backward; each in-flight microbatch keeps its weight version
  // Step once per minibatch without a flush; minibatch k computes its gradient with the weights
  // after k − 1 steps (after 0 for k = 0): two weight versions per stage (PipeDream-2BW).
  DoubleBuffered,
};

// The weight version (steps taken) the microbatches of minibatch k use under DoubleBuffered.
inline int double_buffered_version(int minibatch) {
  return minibatch > 0 ? minibatch - 1 : 0;
}

std::string_view update_policy_name(UpdatePolicy p);   // "flush" / "stash" / "2bw"
UpdatePolicy parse_update_policy(std::string_view s);  // throws ConfigError

struct Schedule {
  std::string name;
  UpdatePolicy policy = UpdatePolicy::Flush;
  bool vertical_sync = false;  // Stash only: all stages use the input stage's weight version
  int microbatches = 1;        // per minibatch
  int minibatches = 1;
  // stage -> the ranks holding its replicas, in replica order (microbatch u goes to
  // stage_ranks[s][u % size]). A rank may hold several stages (interleaved schedules).
  std::vector<std::vector<int>> stage_ranks;
  std::vector<std::vector<Action>> ranks;  // rank -> its actions in execution order
  // stage -> the replica (index into stage_ranks[stage]) of each of the run's microbatches.
  // Empty, or empty for a stage: round-robin (microbatch u on replica u % replicas).
  std::vector<std::vector<std::int32_t>> dealing;

  int num_stages() const { return static_cast<int>(stage_ranks.size()); }
  int num_ranks() const { return static_cast<int>(ranks.size()); }
  int num_microbatches() const { return microbatches * minibatches; }
  int replicas(int stage) const { return static_cast<int>(stage_ranks[stage].size()); }
  bool round_robin(int stage) const {
    return static_cast<std::size_t>(stage) >= dealing.size() || dealing[stage].empty();
  }
  // The replica of `stage` (index into stage_ranks[stage]) that runs microbatch `mb`.
  int replica_of(int stage, int mb) const {
    const auto n = stage_ranks[stage].size();
    if (n == 1) return 0;
    return round_robin(stage) ? static_cast<int>(static_cast<std::size_t>(mb) % n)
                              : dealing[stage][static_cast<std::size_t>(mb)];
  }
  // The rank that runs microbatch `mb` of `stage`.
  int rank_of(int stage, int mb) const { return stage_ranks[stage][replica_of(stage, mb)]; }
  std::size_t num_actions() const {
    std::size_t n = 0;
    for (auto& r : ranks) n += r.size();
    return n;
  }
};

// For each action of one rank's list, the allreduce round whose gradients it completes on its
// stage (the last backward — B, or W of a split backward — of the round, see AllReduce above), or
// -1. `microbatches` is the schedule's count per minibatch.
std::vector<std::int32_t> closing_backwards(const std::vector<Action>& actions, UpdatePolicy policy,
                                            int microbatches);

// Whether a run of the schedule has one gradient norm over the whole model to clip by
// (global_norm_exists of plan/partition.hpp); check_global_norm_exists throws ConfigError saying so
// where not (the executor and the simulator refuse clipping there alike).
bool global_norm_exists(const Schedule& schedule);
void check_global_norm_exists(const Schedule& schedule);

// One action as a token (`0F3`, `0SA3@1`) and back. parse_action throws ConfigError naming the
// token and what is wrong with it.
std::string to_string(const Action& a);
Action parse_action(std::string_view token);

// A whole rank's list as space-separated tokens and back.
std::string to_string(const std::vector<Action>& actions);
std::vector<Action> parse_actions(std::string_view text);

}  // namespace pipeline
