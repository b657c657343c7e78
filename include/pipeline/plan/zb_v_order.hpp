// ZB-V's order (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) on a V pipeline of p ranks
// (interleaved_layout.hpp, StagePlacement::V: stage k and 2p − 1 − k on rank k), and the walk
// that times it. The zb-v generator runs this order and the partitioner times its V plans by
// walking it, so both live here, below the schedule library.
//
// Every backward is split into I (the input gradient) and W (the weight gradient). The order is
// built by list scheduling, in event order on the stages' times: the rank that can start an
// action first runs one, an I that is ready (oldest microbatch first, its later stage first),
// else a forward that is ready (its later stage first), else its oldest pending W; an input (or
// gradient) from another rank is ready once its message has crossed. A rank holds at most 2p
// stage activations (an F's until its W): 1F1B's peak on its first rank, as two half-size stages
// per microbatch, on every rank alike; a forward of the rank's first stage also keeps room for
// microbatches whose second forward is still to come (a few amounts of room are tried). The
// orders built on the given times and on unit times (free messages) compete, each judged by a
// walk of two minibatches on the given times (a rank's part of one minibatch may overlap the
// next), and the shortest is kept: never slower there than the unit-time order.
#pragma once

#include <cstdint>
#include <vector>

namespace pipeline {

enum class VPassKind : std::uint8_t { Forward, Input, Weight };

// One pass of a rank's order: F, I or W of a stage (0..2p − 1) for a microbatch (0..m − 1).
struct VPass {
  VPassKind kind = VPassKind::Forward;
  int stage = 0;
  int microbatch = 0;
};

// Each rank's passes in order.
using VOrder = std::vector<std::vector<VPass>>;

// A microbatch's times on each of the 2p stages: its F, I and W, and the transfer of its input
// into the stage (and of its input gradient back); stage 0's and stage p's are not read (stage p
// takes its input on stage p − 1's rank).
struct VStageTimes {
  std::vector<double> forward_s, input_s, weight_s, message_s;
};

// F, I and W each a third of `seconds` (per stage, a microbatch's whole pass), with the
// messages `message_s` (per stage, or empty: free); unit times where `seconds` is not 2p positive
// entries.
VStageTimes v_times_in_thirds(int p, const std::vector<double>& seconds,
                              const std::vector<double>& message_s);

// The order of one minibatch of m microbatches on a V of p ranks, built and judged on `times`.
VOrder zero_bubble_v_order(int p, int m, const VStageTimes& times);

struct VWalk {
  // Per rank, its last pass's end.
  std::vector<double> place_end_s;
  // Per stage, its last W's end (where its allreduce's buckets close).
  std::vector<double> last_weight_s;
  double makespan_s = 0;  // the latest of place_end_s
};

// When the passes of `minibatches` minibatches of `order` (m microbatches each, each rank running
// its order once per minibatch) end on `times`: a pass starts once its rank is free and its input
// (or gradient) has arrived; a message leaves when its pass ends and crosses its link (one per
// pair of ranks, direction and kind, as the simulator has) after those sent on it before.
VWalk walk_v(const VOrder& order, int m, const VStageTimes& times, int minibatches = 1);

}  // namespace pipeline
