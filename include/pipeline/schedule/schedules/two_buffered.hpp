// PipeDream-2BW (Narayanan et al., ICML'21, "Memory-Efficient Pipeline-Parallel DNN Training"):
// 1F1B without flushes, one optimizer step per minibatch of m microbatches, two weight versions.
//
// Every replica runs PipeDream's 1F1B order over all its microbatches of the run (warm-up of
// (workers − 1 − ranks before the stage) / replicas forwards, then one forward and one backward),
// and closes minibatch k — allreduce among replicas, step k — right after the backward of its
// last microbatch there, without draining: the forwards of the next minibatch are already in
// flight. The gradient of minibatch k is accumulated over its microbatches at the weights after
// k − 1 steps and applied to the latest weights (UpdatePolicy::DoubleBuffered):
//   W(k+1) = W(k) − lr · ∇f_k(W(k−1)),
// the update of 2BW with its delay of one step, the same on every stage (no vertical sync
// needed). A stage therefore holds two versions, W(k−1) for the microbatches in flight and W(k)
// to update, instead of one per in-flight minibatch as under 1f1b-stash.
//
// Needs microbatches >= warm-up x replicas on every stage (p − 1 on a straight pipeline), so
// that a minibatch's first forward comes after the step that made its weights.
#pragma once

#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule two_buffered_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
