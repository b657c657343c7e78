// ZB-V's order (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) on a V pipeline of p ranks
// (interleaved_layout.hpp, StagePlacement::V: stage k and 2p − 1 − k on rank k). The zb-v
// generator runs this order and the partitioner times its V plans by walking it (pass_walk.hpp),
// so it lives here, below the schedule library.
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

#include <pipeline/plan/pass_walk.hpp>

#include <vector>

namespace pipeline {

// The rank of each of a V's 2p stages: stage k and 2p − 1 − k on rank k.
std::vector<int> v_stage_ranks(int p);

// F, I and W each a third of `seconds` (per stage, a microbatch's whole pass),
// with the messages `message_s` (per stage, or empty: free); unit times where `seconds` is not 2p
// positive entries.
StagePassTimes v_times_in_thirds(int p, const std::vector<double>& seconds,
                                 const std::vector<double>& message_s);

// The order (F, I and W passes) of one minibatch of m microbatches on a V of p ranks, built and
// judged on `times`.
PassOrder zero_bubble_v_order(int p, int m, const StagePassTimes& times);

}  // namespace pipeline
