// Dealing microbatches to the replicas of a stage by their speed: what a replicated stage does
// about a straggler (FlexRR's peer re-assignment). Round-robin gives every replica the same share
// of each minibatch, so the stage runs at its slowest replica's pace; dealt by speed, a replica
// that computes at a third of its peers' rate gets about a third of their microbatches, and its
// peers take the rest. Under a flush schedule the minibatch's gradient is the same sum whoever
// computes each microbatch, so the result is that of round-robin (up to the order of the
// allreduce's additions) and every sample is still used exactly once.
#pragma once

#include <pipeline/schedule/generator.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pipeline {

// The replica of each of `count` microbatches, given each replica's seconds per microbatch
// (positive): each microbatch in turn goes to the replica that would finish it first (ties to the
// lower index), which minimises the time of the slowest replica for equal microbatches (greedy
// earliest finish is optimal for unit jobs on machines of different speeds). Equal speeds give
// round-robin 0, 1, ..., r-1, 0, ... With min_each > 0 every replica gets at least that many
// (when count allows), so a replica that recovers is measured again.
std::vector<std::int32_t> deal_by_speed(std::span<const double> seconds_per_microbatch, int count,
                                        int min_each = 0);

// A dealing for `spec` (ScheduleSpec::dealing): every minibatch of every replicated stage dealt
// by deal_by_speed from the seconds per microbatch of each rank (indexed by rank), with at least
// one microbatch per replica and minibatch where there are enough. Stages without replicas, or
// whose replicas are all equally fast, are left round-robin (empty).
std::vector<std::vector<std::int32_t>> dealing_by_speed(const ScheduleSpec& spec,
                                                        std::span<const double> seconds_per_rank);

// ConfigError, naming the fix, where `schedule` cannot deal the plan's microbatches by speed:
// a schedule other than the flush schedules of one stage per rank (gpipe, 1f1b-flush, zb-h1),
// or a plan of several stages per rank (interleaved), both of which deal round-robin.
void check_dealable(const Plan& plan, const std::string& schedule);

// The schedule `name` for `spec` with its microbatches dealt by speed (dealing_by_speed), or
// dealt round-robin where that runs no slower on those speeds: a dealing other than round-robin
// keeps PipeDream's warm-up depths, where round-robin's flush schedules run the deeper ones
// their search finds, which can outweigh a dealing's gain on replicas of near speeds. Both are
// timed by `makespan` where given (the simulator, on a profile), else on the spec's pipeline
// (detail::probe_makespan_slowed), each rank slowed by its seconds over its stage's fastest
// replica's.
Schedule schedule_by_speed(const std::string& name, const ScheduleSpec& spec,
                           std::span<const double> seconds_per_rank,
                           const std::function<double(const Schedule&)>& makespan = {});

// How many of a minibatch's microbatches each replica of `stage` gets under `schedule`'s dealing,
// for minibatch `minibatch` (for reports: "6:2").
std::vector<int> dealt_counts(const Schedule& schedule, int stage, int minibatch = 0);

}  // namespace pipeline
