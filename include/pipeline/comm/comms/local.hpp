// In-process communicator: N ranks in one process, one thread each, sharing a LocalHub.
//
// Used by tests (a whole pipeline in one process, deterministic and debuggable) and for several
// stages sharing one device. Semantics are those of communicator.hpp, plus:
//  - sends are eager: isend copies the tensor and completes at once, so a send never waits;
//  - allreduce_sum sums the members' tensors once, in group order, and hands every member that
//    one result, so results are bitwise identical on all members; iallreduce_sum joins the round
//    and returns, and the last member to join does the sum for everyone (so a Request may
//    complete without being tested);
//  - abort() (or hub.abort) wakes every rank blocked in a wait and makes it, and every later
//    call, throw CommAbortedError naming the rank that aborted and why;
//  - tensors may live on the CPU or on GPUs (an in-process pipeline on one GPU, every rank's
//    thread with its own stream). A device tensor is sent as a copy queued on the sender's
//    current stream, with an event after it; the receiver's stream waits for that event (on the
//    device, not the host) and copies into its buffer when its Request is tested or waited for,
//    so Request completion means "ordered before later work on the receiver's stream", as for
//    NCCL. The last member of an allreduce of device tensors sums them on its own stream after
//    waiting for every member's arrival event, and every member's stream waits for the sum's
//    event. The caching allocator is told which blocks another stream used, so that none is
//    reused early. Members on different GPUs are reduced through copies that complete on the
//    host before they return.
//
//   LocalHub hub(4);
//   auto comm = hub.endpoint(2);   // the communicator of rank 2; the hub may be destroyed first
//
//   run_local(4, [&](Communicator& comm) { ... });  // 4 threads, rethrows the first failure
#pragma once

#include <pipeline/comm/communicator.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

namespace detail {
struct LocalHubState;
}

class LocalCommunicator;

class LocalHub {
 public:
  explicit LocalHub(int size);

  int size() const;
  // The communicator of `rank`; each rank's endpoint must be used by one thread at a time.
  std::unique_ptr<LocalCommunicator> endpoint(int rank);

  // Ends the job: every blocked and later call of every endpoint throws CommAbortedError. The
  // first reason wins; later calls do nothing.
  void abort(int by_rank, const std::string& reason);
  bool aborted() const;

 private:
  std::shared_ptr<detail::LocalHubState> m_state;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<detail::LocalHubState> hub, int rank);
  ~LocalCommunicator() override;

  int rank() const override { return m_rank; }
  int size() const override;
  std::string_view backend() const override { return "local"; }

  Request isend(const Tensor& tensor, int peer, Tag tag) override;
  Request irecv(Tensor& into, int peer, Tag tag) override;

  Group create_group(std::vector<int> ranks) override;
  const Group& world() const override { return m_world; }
  Request iallreduce_sum(std::span<Tensor> tensors, const Group& group) override;
  using Communicator::iallreduce_sum;  // the one-tensor overload
  void barrier() override;

  [[noreturn]] void abort(const std::string& reason) override;

 private:
  // Joins the group's next collective round: iallreduce_sum, and barrier (a sum of no tensors
  // over the world); `op` names it in errors.
  Request join_round(std::span<Tensor> tensors, const Group& group, std::string_view op);

  std::shared_ptr<detail::LocalHubState> m_hub;
  int m_rank = 0;
  Group m_world;
};

// Runs fn on `size` threads, each with its own endpoint of a fresh hub, and returns when all
// have ended. When one throws, the hub is aborted so that the others stop waiting (their calls
// throw CommAbortedError) instead of hanging, and the first exception thrown is rethrown here.
void run_local(int size, const std::function<void(Communicator&)>& fn);

// The same on an existing hub (for tests that configure endpoints, e.g. a short timeout).
void run_local(LocalHub& hub, const std::function<void(Communicator&)>& fn);

}  // namespace pipeline
