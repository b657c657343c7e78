// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): zero-bubble order on a V-shape
// placement. The model is cut into 2p stages; rank r holds stage r and stage 2p − 1 − r, so a
// microbatch's forward goes down the ranks 0..p−1 and back up, its backward down and up again,
// and rank 0 holds both the input and the loss stage (interleaved_layout.hpp, StagePlacement::V).
// Every backward is split into I (the input gradient) and W (the weight gradient).
//
// The order (plan/zb_v_order.hpp) is built by list scheduling on the stages' times
// (ScheduleSpec::stage_seconds: a third each for F, I and W; unit times without them) and
// messages (ScheduleSpec::input_message_seconds), so that it follows uneven stages and slow links;
// every rank derives the same order from the same plan, and the partitioner times the plan by
// walking the same order. A rank holds at most 2p stage activations (an F's until its W): 1F1B's
// peak on its first rank, as two half-size stages per microbatch, on every rank alike. With equal
// stage times and free messages a rank idles about p − 1 ticks per minibatch, while the first
// microbatch goes down the V (at most 2 more; less where other ranks' trailing W's overlap rank
// 0's next forwards, 1.5 at p = 3), for any microbatch count: a bubble of about
// (p − 1) / (6m + p − 1). Rank 0 both starts and ends each minibatch's critical path, so
// consecutive minibatches overlap far less than under looped interleaving: with a microbatch per
// rank (m = p) its bubble is half of interleaved-zb-h1's, at m ≥ 2p up to twice it (which then
// holds up to 1.5× the activations on its later ranks, while ZB-V's are even). The transfer
// between stage p − 1 and p stays on one rank.
//
// Flush semantics as the other zero-bubble schedules: per minibatch every W runs before the
// rank's allreduces (replicated stages: r V-pipelines of p ranks, microbatches dealt round-robin,
// as interleaved_layout.hpp places them) and its steps, so the result equals sequential training.
// Any microbatch count works.
#pragma once

#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule zero_bubble_v_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
