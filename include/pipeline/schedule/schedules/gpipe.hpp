// GPipe (fill-drain): per minibatch, every rank runs the forwards of all its microbatches, then
// their backwards in the same order, then (replicated stages) an allreduce and one optimizer
// step. Activations of all m microbatches are alive at once on every stage; with p equal stages
// the bubble fraction is (p - 1) / (m + p - 1).
#pragma once

#include <pipeline/schedule/generator.hpp>

namespace pipeline {

Schedule gpipe_schedule(const ScheduleSpec& spec);

}  // namespace pipeline
