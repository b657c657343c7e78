// One-forward-one-backward schedules.
//
// Every replica runs a warm-up of w forwards, then alternates one forward and one backward
// (oldest microbatch first), then drains the remaining backwards. w is PipeDream's warm-up
// depth (workers - 1 - ranks before the stage) / replicas, p - 1 - s for a straight pipeline,
// so stage s never holds more than p - s activations.
//
//  - 1f1b-flush (PipeDream-Flush / DAPPLE): per minibatch of m microbatches, then an allreduce
//    (replicated stages) and one optimizer step; same bubble as GPipe, (p-1)/(m+p-1), with
//    p - s instead of m stashed activations.
//  - 1f1b-stash (PipeDream): minibatches flow without flushes, `in_flight` admitted at the input
//    stage, an optimizer step after every backward (after an allreduce among replicas); each
//    in-flight minibatch keeps the weight version its forward used, so stage s keeps p - s
//    versions. No bubble in the steady state. 1f1b-stash-vsync adds vertical sync: every stage
//    uses the version the input stage used for that minibatch.
#pragma once

#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule one_f_one_b_flush_schedule(const ScheduleSpec& spec);
Schedule one_f_one_b_stash_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
