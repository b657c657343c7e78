// NCCL communicator: one MPI rank per GPU, activations and gradients moving GPU to GPU.
//
//   pipeline::MpiSession mpi_session(&argc, &argv);
//   pipeline::MpiCommunicator mpi;                      // bootstraps NCCL, and MPI_Abort
//   pipeline::NcclCommunicator comm(mpi, local_rank);   // binds cuda:<local_rank>
//
// Semantics are those of communicator.hpp for device tensors, and:
//  - Bootstrap: rank 0 makes the NCCL unique ids and broadcasts them over the MPI communicator
//    (which must outlive this one); every rank binds its GPU (cudaSetDevice for the calling
//    thread) and creates its communicators non-blocking (ncclConfig_t::blocking = 0), polling
//    ncclCommGetAsyncError until they are ready, at most timeout() (then TimeoutError). The MPI
//    broadcasts themselves have no timeout, like MpiCommunicator::create_group.
//  - Streams and events: every NCCL communicator has its own communication stream. An operation
//    first makes that stream wait (cudaStreamWaitEvent) for an event recorded on the caller's
//    current stream when it was posted (so a send reads what compute wrote, and a receive writes
//    a buffer only after compute's earlier uses of it), then runs, then records a completion
//    event. Request::wait() makes the caller's current stream wait for that event on the device
//    and returns at once: "ordered before later work on the caller's stream", not "done on the
//    host". Request::test() polls the event (cudaEventQuery). Nothing here synchronises the host
//    with compute; synchronize() and barrier() wait on the host for communication only.
//  - Host tensors (the runtime's small statistics and agreements) go over the MPI communicator:
//    point-to-point with MPI's semantics, and each group keeps an MPI group of the same members
//    for their sums (created with it). Device tensors must be on this communicator's device.
//  - Point-to-point of device tensors: NCCL has no tags: a receive matches the peer's next
//    send in issue order, so the two sides of every pair of ranks must post their messages in
//    the same order (the schedules do: both sides derive them from one schedule). The tag only
//    names the message in errors. Sizes must agree as for MPI; NCCL cannot check it (a mismatch
//    hangs until the watchdog fires, or corrupts).
//  - Why a rank that sends to and receives from one peer (pipeline depth 2) cannot deadlock:
//    an NCCL operation occupies its stream until the peer's matching operation runs, so two
//    ranks that each queued "send to the other, then receive from the other" on one stream would
//    wait for each other forever once a message exceeds NCCL's buffers. Point-to-point traffic
//    therefore runs on two communicators with a stream each: one carries every message from a
//    lower to a higher rank (and to itself), the other every message from a higher to a lower
//    rank. On each, a pair of ranks only ever moves data one way, so the sends of one side and
//    the receives of the other are queued in the same order (above) and every operation's
//    partner is at the head of the peer's queue once the peer's earlier operations, which
//    depend only on ranks further down that direction's chain, are done. Each isend/irecv is
//    its own NCCL group (ncclGroupStart/End) and is launched at once; begin_batch()/end_batch()
//    put several into one group, which NCCL runs concurrently — required for a rank that sends
//    to itself (the send and the receive must be one group), and cheaper for many messages.
//  - Groups: create_group makes a new NCCL communicator for the members only (a unique id from
//    the first member, broadcast over an MPI sub-communicator of the members), so it is
//    collective over the members only, as the contract asks (ncclCommSplit would need every
//    rank). Groups of one member have no communicator and their allreduce is complete at once.
//    iallreduce_sum is ncclAllReduce (float32, sum, in place) on the group's stream, one NCCL
//    group per call. Every member gets the same bits (NCCL's ring and tree algorithms end with
//    every rank holding one copy of each reduced chunk), but unlike MpiCommunicator the order
//    of the summation is NCCL's, not group order, and may change with the split into calls.
//  - Watchdog: while operations are pending, a thread of the communicator polls their completion
//    events and every NCCL communicator's ncclCommGetAsyncError (every 2 ms). When an operation
//    that someone waits for (Request::wait, synchronize, barrier) has not completed within
//    timeout() of that wait, or NCCL reports an asynchronous error (a peer died, a network
//    failure), it calls ncclCommAbort on every NCCL communicator of this rank, which ends their
//    kernels (so a stream stuck in a receive moves on instead of hanging the process). The next
//    call on the communicator or one of its Requests then throws TimeoutError (the message of
//    communicator.hpp: rank, host, operation, peer, waited time, the caller's context) or
//    NcclError; the communicator stays failed, and the job should abort().
//  - abort(reason) aborts the NCCL communicators, then the MPI job (MPI_Abort).
//  - Destruction never throws: with nothing pending the communicators are finalised and
//    destroyed, otherwise aborted (buffers of unfinished operations are leaked, as NCCL may still
//    touch them).
//  - Used by one thread at a time (the watchdog is internal). Defined in PIPELINE_WITH_CUDA
//    builds only (src/cuda/nccl.cpp); this header includes no CUDA header.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/comm/comms/mpi.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

namespace detail {
struct NcclShared;
}  // namespace detail

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `mpi`'s ranks. `device`: the CUDA device of this rank (its node-local rank,
  // see transport.hpp). Takes `mpi`'s timeout.
  NcclCommunicator(MpiCommunicator& mpi, int device);
  ~NcclCommunicator() override;

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  std::string_view backend() const override { return "nccl"; }
  int device() const { return m_device; }

  Request isend(const Tensor& tensor, int peer, Tag tag) override;
  Request irecv(Tensor& into, int peer, Tag tag) override;

  // isend/irecv between begin_batch() and end_batch() are launched together at end_batch() as
  // one NCCL group per direction (see the top of this file). Their Requests may be tested or
  // waited for only after end_batch(). Batches nest; the outermost end_batch launches.
  void begin_batch();
  void end_batch();

  Group create_group(std::vector<int> ranks) override;
  const Group& world() const override { return m_world; }
  Request iallreduce_sum(std::span<Tensor> tensors, const Group& group) override;
  using Communicator::iallreduce_sum;  // the one-tensor overload

  // An allreduce of one float over all ranks, waited for on the host (at most timeout()).
  void barrier() override;

  // Blocks the host until every operation posted so far has completed on the device, at most
  // timeout() (then TimeoutError, after aborting the NCCL communicators).
  void synchronize();

  [[noreturn]] void abort(const std::string& reason) override;

  // For tests of the watchdog: a Request that looks like a receive of `tag` from `peer` into
  // `into` but, instead of NCCL, holds this rank's point-to-point stream in a host function for
  // `stall_s` seconds, so that a wait for it times out without a peer.
  Request inject_stalled_receive(Tensor& into, int peer, Tag tag, double stall_s);

 private:
  Request post_p2p(const Tensor& tensor, int peer, Tag tag, bool is_recv);

  MpiCommunicator& m_mpi;
  int m_device = 0;
  int m_rank = 0;
  int m_size = 1;
  std::shared_ptr<detail::NcclShared> m_shared;
  Group m_world;
};

}  // namespace pipeline
