// StopAgreement: how the ranks of a running pipeline agree, without draining it, on the minibatch
// before which all of them stop when any one is asked to stop (SIGTERM/SIGINT, preemption.hpp).
//
// Every rank calls poll(position) after each optimizer step (StageExecutor's step-done callback).
// A rank that has been asked to stop tells the coordinator, once. The coordinator, on its own
// request or the first one it receives, decides the stop position K — its own position plus a
// margin, rounded up to the schedule's granularity — and sends K to every rank; poll() returns K
// on each rank once it has arrived, and the rank passes it to StageExecutor::stop_before(K).
//
// The margin (stop_margin) is twice the furthest any rank of the schedule runs ahead of its own
// steps, plus slack: ranks of a pipeline are at most that far apart, so none has started minibatch
// K when K reaches it (stop_before checks this). A decided K past the end of the current
// schedule run is simply not reached; between runs the ranks settle it collectively
// (any_requested), stopping at the run's end.
//
// Messages are control-tagged point-to-point sends that poll() tests without blocking; a
// StopAgreement is made collectively (same coordinator, margin and granularity everywhere).
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace pipeline {

// The margin in minibatches for a schedule: 2 × the largest lead of any rank (the highest
// minibatch it has started, plus one, minus the minibatches its steps have absorbed) + 2.
std::int64_t stop_margin(const Schedule& schedule);

class StopAgreement {
 public:
  // `asked` says whether this rank has been asked to stop (default: a received SIGTERM/SIGINT).
  StopAgreement(Communicator& comm, int coordinator, std::int64_t margin, int granularity,
                std::function<bool()> asked = {});
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // After a step that brought this rank to `position`: the agreed stop position, once known.
  std::optional<std::int64_t> poll(std::int64_t position);
  std::optional<std::int64_t> decided() const { return m_decided; }

  // Collective: whether any rank has been asked to stop (or knows a decision). Call between
  // schedule runs, where every rank stands at the same position.
  bool any_requested();

 private:
  void decide(std::int64_t position);

  Communicator* m_comm;
  std::function<bool()> m_asked;
  int m_coordinator;
  std::int64_t m_margin;
  int m_granularity;
  bool m_told = false;
  std::optional<std::int64_t> m_decided;
  Tensor m_request_out, m_decision_in;
  std::vector<Tensor> m_requests_in;     // coordinator: one per rank
  std::vector<Request> m_request_recvs;  // coordinator: one per rank
  Request m_decision_recv;               // others
  std::vector<Request> m_sends;
  std::vector<Tensor> m_send_buffers;
};

}  // namespace pipeline
