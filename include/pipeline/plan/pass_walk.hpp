// A pipeline's passes in the order its schedule runs them, and the walk that times them. The
// partitioner times its plans by walking the orders their schedules will run (it may not call
// the schedule library), and the generators that share an order builder with it (zb-v, the
// flush schedules' 1F1B, GPipe and ZB-H1 orders) run the same passes.
#pragma once

#include <cstdint>
#include <vector>

namespace pipeline {

// A whole backward (B), or its input-gradient (I) and weight-gradient (W) halves.
enum class PassKind : std::uint8_t { Forward, Backward, Input, Weight };

// One pass of a rank's order: of a stage, for a microbatch (0..m − 1 of a minibatch).
struct StagePass {
  PassKind kind = PassKind::Forward;
  int stage = 0;
  int microbatch = 0;
};

// Each rank's passes of one minibatch, in order.
using PassOrder = std::vector<std::vector<StagePass>>;

// A microbatch's times on each stage: its F, B, I and W, and the transfer of its input into the
// stage (and of its input gradient back), which is not read where the stage before runs on the
// same rank (stage 0's neither).
struct StagePassTimes {
  std::vector<double> forward_s, backward_s, input_s, weight_s, message_s;
};

struct PassWalk {
  // Per rank, its last pass's end.
  std::vector<double> rank_end_s;
  // Per stage, when its last B or W ends (where its allreduce's buckets close).
  std::vector<double> closing_end_s;
  double makespan_s = 0;  // the latest of rank_end_s
};

// When the passes of `minibatches` minibatches of `order` end, each rank running its order once
// per minibatch (microbatches m·j + u in minibatch j), its stages on the ranks `rank_of_stage`:
// a pass starts once its rank is free and its input (or gradient) has arrived; a message leaves
// when its pass ends and crosses its link (one per pair of ranks, direction and kind, as the
// simulator has) after those sent on it before.
PassWalk walk_passes(const PassOrder& order, const std::vector<int>& rank_of_stage, int m,
                     const StagePassTimes& times, int minibatches = 1);

}  // namespace pipeline
