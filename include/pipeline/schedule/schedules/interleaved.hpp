// Interleaved 1F1B (Narayanan et al., SC'21, "virtual pipeline stages"): the model is cut into
// v·p stages and rank r holds the v stages r, r + p, ..., r + (v−1)p, so a microbatch passes
// every rank v times. Each rank runs a 1F1B order over (stage, microbatch) pairs taken in groups
// of p microbatches per stage: forwards go through its stages in ascending order, backwards in
// descending order; the warm-up is 2(p − 1 − r) + (v − 1)p forwards (all of them when m = p).
// ScheduleSpec::microbatch_group takes larger groups (a multiple of p) where the messages round
// the ranks take time (InterleavedOrder, interleaved_layout.hpp).
// Per minibatch it ends with one optimizer step per stage it holds (flush semantics, equal to
// sequential training).
//
// With equal stages and free communication the bubble shrinks by v: (p − 1) / (v·m + p − 1) of
// the makespan, i.e. (p − 1) / (v·m) relative to the ideal time, at the price of v times the
// point-to-point messages.
//
// Data parallelism over interleaved pipelines (Megatron's DP × PP): every stage may have the same
// number r of replicas, replica j of stage k on the rank of replica j of stage k mod p, so the
// p·r ranks form r interleaved pipelines of p ranks. Microbatches are dealt round-robin (u to
// pipeline u mod r); each pipeline runs the order above over its m/r microbatches, and at the
// end of the minibatch every rank allreduces each of its stages' gradients with the stage's other
// replicas, then steps them (all allreduces before the steps, so that a global gradient norm
// sees every stage's final gradient).
//
// Interleaved zero bubble (interleaved-zb-h1; ZB-H1 of Qi et al. 2023 on interleaved stages):
// the same order with every backward split into I, the input gradient the previous stage waits
// for, in the backward's place, and W, the weight gradient nobody waits for, deferred on rank r
// by the forwards its warm-up runs short of rank 0's (2r I's), so rank r's W's fill its cool-down
// while the I's race up the pipeline. Each rank then holds as many microbatches as rank 0 does
// under interleaved 1F1B; results are those of interleaved 1F1B (flush, split backward).
//
// Spec: stage_ranks as above (ScheduleSpec::interleaved builds it); microbatches must be a
// multiple of p·r.
#pragma once

#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule interleaved_one_f_one_b_schedule(const ScheduleSpec& spec);
Schedule interleaved_zero_bubble_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
