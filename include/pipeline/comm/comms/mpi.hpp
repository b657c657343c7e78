// MPI communicator (OpenMPI): the transport that carries a pipeline across hosts under mpirun.
//
//   int main(int argc, char** argv) {
//     pipeline::MpiSession mpi(&argc, &argv);          // MPI_Init_thread ... MPI_Finalize
//     pipeline::MpiCommunicator comm;                   // a private duplicate of MPI_COMM_WORLD
//     try { ... } catch (const std::exception& e) { comm.abort(e.what()); }
//   }
//
// Semantics are those of communicator.hpp, and:
//  - point-to-point uses MPI_Isend/MPI_Irecv with the element count of the tensor and the MPI
//    datatype of its dtype (MPI_FLOAT for float32); waits poll MPI_Test with a yield/sleep
//    backoff, so that a rank waiting on an oversubscribed machine leaves the core to its peer;
//  - tags are packed by a TagCodec sized from MPI_TAG_UB (tag.hpp): microbatches wrap modulo
//    tag_codec().microbatch_window();
//  - iallreduce_sum (and allreduce_sum, which waits for it) packs the tensors into one buffer
//    and moves it with non-blocking point-to-point messages on the group's own communicator:
//    groups of up to allreduce_direct_limit() members (4) exchange their buffers directly, each
//    member summing them in group order; larger groups send theirs to the first member, which
//    sums in group order and sends the result back. Every member gets bitwise the same result,
//    independent of the split into calls and of MPI's collective algorithms. Waits poll without
//    sleeping (PollMode::Spin) and time out like receives;
//  - device tensors are staged through the host (the transport of ranks that share a GPU or
//    have no NCCL): a send copies the tensor to the host first, a receive or an allreduce works
//    on host copies and copies them back to the device when its request completes. Copies run
//    on the calling thread's current stream and complete before they return;
//  - create_group is MPI_Comm_create_group, collective over the group's members only; it has
//    no timeout (MPI offers no non-blocking form), which is why groups are made at start-up;
//  - the communicator works on its own duplicate of the given MPI communicator with
//    MPI_ERRORS_RETURN, so library traffic never mixes with the program's, and every MPI error
//    is raised as pipeline::MpiError by PIPELINE_MPI_CHECK (mpi_check.hpp);
//  - after a TimeoutError from a collective the communicator is not usable any more (MPI cannot
//    cancel a collective): report and abort();
//  - abort() calls MPI_Abort on MPI_COMM_WORLD: mpirun ends every rank;
//  - a peer that dies: mpirun ends the survivors with SIGTERM, which report_termination_on_sigterm
//    turns into one line per survivor saying where it was; an MPI error that a failing
//    connection returns instead (MPI_ERRORS_RETURN) becomes an MpiError naming the peer.
#pragma once

#include <pipeline/comm/communicator.hpp>

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

enum class MpiThreadLevel { Single, Funneled, Serialized, Multiple };

// RAII for MPI_Init_thread/MPI_Finalize. If MPI is already initialised (a test main, a host
// program) the session only checks the thread level and does not finalise. Either way it sets
// pipeline::detail::current_rank(), so every error and log line carries the world rank.
class MpiSession {
 public:
  // Funneled is enough for a runtime whose MPI calls all come from one thread.
  explicit MpiSession(int* argc = nullptr, char*** argv = nullptr,
                      MpiThreadLevel required = MpiThreadLevel::Funneled);
  ~MpiSession();  // finalises if this session initialised MPI; never throws
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return m_rank; }
  int size() const { return m_size; }
  // True when this session called MPI_Init_thread (and will call MPI_Finalize).
  bool owns_mpi() const { return m_owns; }
  MpiThreadLevel provided() const { return m_provided; }

 private:
  bool m_owns = false;
  int m_rank = 0;
  int m_size = 1;
  MpiThreadLevel m_provided = MpiThreadLevel::Single;
};

namespace detail {
struct MpiShared;

bool termination_report_installed();
void note_wait(std::string_view what, const WaitSettings& settings);
void note_wait_ended();
// This rank is aborting the job over its own error, which it has printed: mpirun's SIGTERM then
// ends it without the report that points at another rank.
void note_aborting();

// While alive, records for report_termination_on_sigterm() what this process waits for
// (`describe()`, e.g. "a receive of ... from rank 2") and where its caller is (the settings'
// context); when it ends the record stays as "the last wait". Unless the report is installed it
// costs one atomic load: `describe` is not called.
class WaitNote {
 public:
  template <typename Describe>
  WaitNote(Describe&& describe, const WaitSettings& settings) {
    if (!termination_report_installed()) return;
    note_wait(describe(), settings);
    m_active = true;
  }
  ~WaitNote() {
    if (m_active) note_wait_ended();
  }
  WaitNote(const WaitNote&) = delete;
  WaitNote& operator=(const WaitNote&) = delete;

 private:
  bool m_active = false;
};
}  // namespace detail

// For programs started by mpirun. When a rank dies, mpirun ends the other ranks with SIGTERM and
// they vanish without a word. After this call a rank that receives SIGTERM first writes one line
// to stderr: its rank, host and pid, the communicator wait it is blocked in (operation, peer,
// tag) or its last one, and where its caller was (set_context: stage, action of the schedule);
// then it dies of the signal as before. The handler only write(2)s text that the waits prepared,
// so it is async-signal-safe. Call once, after the MpiSession; a program with its own SIGTERM
// handling should not call it.
void report_termination_on_sigterm();

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (a collective over it). max_stages: how many stages tags must tell apart;
  // 0 picks up to 1024, as many as MPI_TAG_UB allows with a microbatch window of at least
  // kMinMicrobatchWindow, and never fewer than the communicator's size.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, int max_stages = 0);
  ~MpiCommunicator() override;

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  std::string_view backend() const override { return "mpi"; }

  Request isend(const Tensor& tensor, int peer, Tag tag) override;
  Request irecv(Tensor& into, int peer, Tag tag) override;

  Group create_group(std::vector<int> ranks) override;
  const Group& world() const override { return m_world; }
  Request iallreduce_sum(std::span<Tensor> tensors, const Group& group) override;
  using Communicator::iallreduce_sum;  // the one-tensor overload
  void barrier() override;

  // Groups of at most this many members exchange allreduce data directly (every member sends
  // its buffer to every other one: (n - 1) buffers each way per member, one round); larger groups
  // gather to their first member and receive its sum (two rounds, the first member moving
  // 2 (n - 1) buffers). Both give the same bits. Default 4.
  void set_allreduce_direct_limit(int members);
  int allreduce_direct_limit() const { return m_direct_limit; }

  [[noreturn]] void abort(const std::string& reason) override;

  // The library's duplicate communicator (for tests and for bootstrapping NCCL).
  MPI_Comm handle() const;
  const TagCodec& tag_codec() const { return m_codec; }

 private:
  std::shared_ptr<detail::MpiShared> m_shared;
  int m_rank = 0;
  int m_size = 1;
  TagCodec m_codec;
  Group m_world;
  int m_direct_limit = 4;
};

}  // namespace pipeline
