// Straggler mitigation among replicas at run time: between segments of a run the ranks share how
// fast each computed (seconds per microbatch of its last segment, without the time it waited for
// others), and the next segment's flush schedule deals each replicated stage's microbatches by
// those speeds (schedule/dealing.hpp), so a replica that falls behind hands microbatches to its
// faster peers instead of the stage waiting for it at every allreduce (FlexRR's peer
// re-assignment, at the granularity of a segment of minibatches).
//
// Every rank computes the same estimates from the same exchanged numbers, so the ranks always
// agree on the dealing; every microbatch is dealt to exactly one replica, so each sample is
// still trained on once per epoch.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <vector>

namespace pipeline {

class SpeedRebalancer {
 public:
  // `smoothing`: the weight of the newest segment in each rank's estimate (an exponential
  // average; 1 keeps only the newest), in (0, 1].
  explicit SpeedRebalancer(Communicator& comm, double smoothing = 0.5);

  // Collective over every rank of the communicator: shares this rank's speed in `segment` (its
  // compute seconds over its forwards) and updates every rank's estimate. A rank that ran no
  // forward in the segment keeps its previous estimate.
  void observe(const TrainResult& segment);

  // Seconds per microbatch of every rank (empty before the first observe()).
  const std::vector<double>& seconds_per_microbatch() const { return m_seconds; }

 private:
  Communicator* m_comm;
  double m_smoothing;
  std::vector<double> m_seconds;
};

}  // namespace pipeline
