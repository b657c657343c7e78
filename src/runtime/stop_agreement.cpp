// The stop agreement's messages and its margin.
#include <pipeline/runtime/stop_agreement.hpp>

#include <pipeline/core/log.hpp>
#include <pipeline/runtime/preemption.hpp>

#include <algorithm>

namespace pipeline {
namespace {

// Control-message numbers: a rank's request to the coordinator, the coordinator's decision.
constexpr int kStopRequest = 6;
constexpr int kStopDecision = 7;

}  // namespace

std::int64_t stop_margin(const Schedule& schedule) {
  const bool stash = schedule.policy == UpdatePolicy::Stash;
  std::int64_t lead = 1;
  for (const auto& actions : schedule.ranks) {
    std::int64_t position = 0, frontier = -1;
    for (const Action& a : actions) {
      const auto replicas =
          static_cast<std::int64_t>(schedule.stage_ranks[static_cast<std::size_t>(a.stage)].size());
      if (a.kind == ActionKind::Step) {
        position = (std::int64_t{a.microbatch} + 1) * (stash ? replicas : 1);
        continue;
      }
      if (a.kind == ActionKind::AllReduce) continue;
      frontier =
          std::max<std::int64_t>(frontier, a.microbatch / std::max(1, schedule.microbatches));
      lead = std::max(lead, frontier + 1 - position);
    }
  }
  return 2 * lead + 2;
}

StopAgreement::StopAgreement(Communicator& comm, int coordinator, std::int64_t margin,
                             int granularity, std::function<bool()> asked)
    : m_comm(&comm),
      m_asked(asked ? std::move(asked) : std::function<bool()>(preemption_requested)),
      m_coordinator(coordinator),
      m_margin(margin),
      m_granularity(std::max(1, granularity)) {
  if (comm.rank() == coordinator) {
    m_requests_in.resize(static_cast<std::size_t>(comm.size()));
    m_request_recvs.resize(static_cast<std::size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) {
      if (r == coordinator) continue;
      m_requests_in[static_cast<std::size_t>(r)] = Tensor::empty(Shape{2}, DType::Int32);
      m_request_recvs[static_cast<std::size_t>(r)] =
          comm.irecv(m_requests_in[static_cast<std::size_t>(r)], r, Tag::control(0, kStopRequest));
    }
  } else {
    m_decision_in = Tensor::empty(Shape{2}, DType::Int32);
    m_decision_recv = comm.irecv(m_decision_in, coordinator, Tag::control(0, kStopDecision));
  }
}

// Pending receives are cancelled by their Requests' destructors; sends of a few bytes have
// completed or complete on their own.
StopAgreement::~StopAgreement() = default;

void StopAgreement::decide(std::int64_t position) {
  std::int64_t k = position + m_margin;
  k = (k + m_granularity - 1) / m_granularity * m_granularity;
  m_decided = k;
  log_info("stop requested: every rank stops before minibatch {}", k);
  for (int r = 0; r < m_comm->size(); ++r) {
    if (r == m_coordinator) continue;
    m_send_buffers.push_back(int64_message(k));
    m_sends.push_back(m_comm->isend(m_send_buffers.back(), r, Tag::control(0, kStopDecision)));
  }
}

std::optional<std::int64_t> StopAgreement::poll(std::int64_t position) {
  std::erase_if(m_sends, [](Request& r) { return r.test(); });
  if (m_decided) return m_decided;
  if (m_comm->rank() == m_coordinator) {
    bool asked = m_asked();
    for (auto& r : m_request_recvs)
      if (r.pending() && r.test()) asked = true;
    if (asked) decide(position);
    return m_decided;
  }
  if (!m_told && m_asked()) {
    m_request_out = int64_message(position);
    m_sends.push_back(m_comm->isend(m_request_out, m_coordinator, Tag::control(0, kStopRequest)));
    m_told = true;
  }
  if (m_decision_recv.pending() && m_decision_recv.test())
    m_decided = int64_from_message(m_decision_in);
  return m_decided;
}

bool StopAgreement::any_requested() {
  Tensor flag = Tensor::zeros(Shape{1});
  flag.data<float>()[0] = m_asked() || m_decided ? 1.f : 0.f;
  m_comm->allreduce_sum(flag, m_comm->world());
  return flag.data<float>()[0] > 0.f;
}

}  // namespace pipeline
