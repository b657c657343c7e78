// Validation of a schedule, generated or hand-written: that it is well-formed, that the runtime
// can execute it without hanging, and how much it stashes.
//
// validate() checks, and throws ConfigError naming the rank, the action's index in the rank's
// list and its token on the first failure:
//  - every action names an existing stage held by the rank, a microbatch of the run dealt to
//    this replica (u % replicas), and for sends/receives the peer that holds the neighbour stage;
//  - on each rank every microbatch of the stage gets one forward and one backward (or I then W),
//    the backward after its forward, a forward after the receive of its input, a backward after
//    the receive of its output gradient, a send after the compute that produces its data; every
//    send has its receive and every receive its send;
//  - Flush: step k closes minibatch k, after every backward of the minibatch and (replicated
//    stages) its allreduce, before any forward of the next; Stash: one step per backward;
//    DoubleBuffered (2BW): step k closes minibatch k as under Flush, and every forward and
//    backward of minibatch k runs after step k − 2 (its weights exist) and before step k;
//  - replicas of a stage run the same allreduces;
//  - the ranks, each running its list in order with non-blocking sends and blocking receives,
//    all finish; otherwise the ranks and actions that wait on each other are named.
// It also counts, per rank, the peak activations stashed (forwards whose backward has not
// finished) and the peak weight versions held (weight stashing; with vertical sync every version
// between the oldest in use and the newest).
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <string>
#include <vector>

namespace pipeline {

// The ranks of a schedule wait on each other forever (or on a rank that has finished): thrown
// by validate() and simulate(); `ranks` are the ranks of the cycle, in wait-for order.
class ScheduleDeadlock : public ConfigError {
 public:
  ScheduleDeadlock(const std::string& message, std::vector<int> ranks)
      : ConfigError(message), m_ranks(std::move(ranks)) {}
  const std::vector<int>& ranks() const { return m_ranks; }

 private:
  std::vector<int> m_ranks;
};

struct RankStash {
  int rank = 0;
  int peak_activations = 0;
  int peak_weight_versions = 1;
};

struct ValidationReport {
  std::vector<RankStash> ranks;
};

ValidationReport validate(const Schedule& schedule);

// The same check, reporting the message instead of throwing; empty when valid.
std::string validation_error(const Schedule& schedule);

}  // namespace pipeline
