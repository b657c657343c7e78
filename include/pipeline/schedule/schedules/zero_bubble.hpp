// Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).
//
// The backward pass splits into I (the input gradient, which the previous stage waits for) and W
// (the weight gradient, which nobody waits for). Scheduling the I's as early as 1F1B schedules
// whole backwards and deferring W's into what would otherwise be idle time shrinks the pipeline
// bubble without changing the result: it is a flush schedule, so it equals sequential training.
//
//  - zb-h1: per minibatch, every replica runs 1F1B's warm-up forwards, then one forward and one
//    I (oldest first), then the remaining I's; a W follows each I once the stage has `lag` I's
//    pending, and the last W's close the minibatch before its allreduce and step. The lag of a
//    stage is the warm-up it runs short of the first stage's (s on a straight pipeline), so every
//    stage holds at most the first stage's p microbatches — 1F1B's peak activation memory — and
//    the deferred W's fill the cool-down while the I's race down the pipeline. With free
//    communication and T_W <= T_F, its bubble is (p − 1)(T_F + T_I − T_W) per rank against
//    1F1B's (p − 1)(T_F + T_I + T_W): a third of it when the three are equal.
//
// ZB-H2 (zero bubble for twice the warm-up memory) needs W's placed inside the steady state and
// the optimizer step moved past a post-validation, which this order does not give: not built.
#pragma once

#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule zero_bubble_h1_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
