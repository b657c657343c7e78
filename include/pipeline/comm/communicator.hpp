// Communicator: how the ranks of a pipeline exchange tensors — point-to-point activations and
// gradients between neighbouring stages, sums of gradients among a stage's replicas, and the
// global sums (gradient norm, metrics) every rank must agree on.
//
// Implementations: comms/local.hpp (in-process, one thread per rank), comms/mpi.hpp (MPI). A
// device implementation (NCCL) plugs in behind the same calls: tensors carry their device, the
// communicator owns its stream, and Request::wait() then means "ordered before later work on
// that stream" instead of "done on the host"; callers do not change.
//
// Contract
//  - Point-to-point: isend/irecv are non-blocking and return a move-only Request. The tensor
//    handed to isend must not be modified, and the one handed to irecv must not be read or
//    written, until its Request has completed (the Request keeps the storage alive). irecv's
//    tensor must have exactly the element count and dtype of the message; anything else is an
//    error, never a silent truncation. Messages from one peer with one tag are received in the
//    order they were sent. A Request must complete or be destroyed before its communicator.
//  - Collectives (allreduce_sum, iallreduce_sum, barrier, create_group) must be called by every
//    member of the group in the same order. allreduce_sum is in place, float32 only, the tensors'
//    shapes must match across members, and every member receives bitwise the same result
//    (replicas stay identical and all ranks compute the same clip factor): each element is the
//    sum over the members taken in group order, ((x0 + x1) + x2) + ..., so the result does not
//    depend on how tensors are split into calls (a bucketed gradient allreduce equals one call
//    over all of them, bit for bit).
//  - iallreduce_sum is allreduce_sum without the wait: it returns a Request at once, and several
//    may be in flight on one group (one per gradient bucket). Until the Request completes the
//    tensors must not be read or written; then they hold the sum. The sum progresses when its
//    Request is tested or waited for (MPI moves its messages also while other Requests are), so
//    a caller that tests it between pieces of compute overlaps the two, without a thread.
//  - Every wait — Request::wait, allreduce_sum, barrier — gives up after timeout() seconds with
//    a pipeline::TimeoutError that names the operation, the peer and tag, how long it waited,
//    the caller's context (set_context) and how to raise the limit. The default limit is
//    kDefaultCommTimeoutSeconds, or the environment variable PIPELINE_COMM_TIMEOUT (seconds).
//  - abort(reason) ends the job on every rank (MPI_Abort for MPI; for the in-process
//    communicator every rank's pending and future calls throw CommAbortedError), so that no
//    peer waits for a rank that has failed.
//  - A communicator is used by one thread at a time.
#pragma once

#include <pipeline/comm/tag.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/tensor.hpp>

#include <fmt/format.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace pipeline {

// Used when PIPELINE_COMM_TIMEOUT is not set: long enough for the slowest stage of a large model
// to finish a microbatch, short enough that a dead peer ends the job within minutes.
inline constexpr double kDefaultCommTimeoutSeconds = 300.0;

// Thrown on every rank of an in-process job after one rank called abort().
class CommAbortedError : public Error {
 public:
  using Error::Error;
};

// The timeout from PIPELINE_COMM_TIMEOUT (positive seconds), or kDefaultCommTimeoutSeconds.
inline double comm_timeout_from_env() {
  const char* v = std::getenv("PIPELINE_COMM_TIMEOUT");
  if (v == nullptr || *v == '\0') return kDefaultCommTimeoutSeconds;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  PIPELINE_CHECK_AS(ConfigError, end != v && *end == '\0' && std::isfinite(s) && s > 0,
                    "PIPELINE_COMM_TIMEOUT='{}' is not a positive number of seconds", v);
  return s;
}

namespace detail {

// "host node1, pid 4242": where a failing process runs, for messages read from mpirun's output.
inline std::string host_and_pid() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  return fmt::format("host {}, pid {}", host, static_cast<long>(::getpid()));
}

// What every wait of one communicator shares: its limit and the caller's "where am I" hook.
// Held by shared_ptr so that Requests read the current settings when they wait.
struct WaitSettings {
  double timeout_s = kDefaultCommTimeoutSeconds;
  std::function<std::string()> context;
};

[[noreturn]] inline void throw_timeout(const WaitSettings& s, int rank, std::string_view what,
                                       double waited_s) {
  std::string where;
  if (s.context) {
    try {
      where = s.context();
    } catch (...) {
      where = "(the context hook threw)";
    }
  }
  throw TimeoutError(fmt::format(
      "{}rank {} ({}) timed out after {:.3g} s (limit {:.3g} s) waiting for {}{}{}; the peer may "
      "have failed or be stuck, or the limit is too short for this model: raise it with "
      "--comm-timeout SECONDS or the environment variable PIPELINE_COMM_TIMEOUT",
      rank_prefix(), rank, host_and_pid(), waited_s, s.timeout_s, what,
      where.empty() ? "" : " while at ", where));
}

// Lowers the calling thread's timer slack to 1 us, once per thread. Linux lets a sleep of a
// normal thread overrun by up to its slack (50 us by default) so that wake-ups can be merged;
// a wait loop that sleeps 10-50 us at a time would otherwise sleep 60-100 us, and a message
// that arrives while the receiver sleeps would be noticed that much later.
inline void tighten_timer_slack() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
}

// Polls `done` until it returns true or the limit passes. For the first 100 us it only yields
// (cheap when the peer runs on another core, and most small messages arrive by then); then it
// sleeps, so that ranks of an oversubscribed machine leave the core to the peer they wait for,
// with a pause that grows from 10 us to at most 50 us and a timer slack of 1 us. The pause bounds
// how late a waiting rank notices its message, and in a pipeline every message on the critical
// path is waited for. bench_pipeline (2-stage mlp, 192 KiB activations, one rank per core;
// bench/RESULTS.md) measures from a send's post to the end of the receiver's wait a median of
// ~170-240 us with the former 20-200 us pauses at Linux's default 50 us slack, ~100-145 us with
// these, against ~40 us for the transfer itself (one way of a ping-pong); 80-100 of the run's
// ~200 messages are waited for, so that is ~1.5 % of its time. Yielding for 1 ms instead gave
// ~75 us on a quiet machine but ~2 ms once another program shared a rank's core, so waits sleep.
//
// PollMode::Spin never sleeps: for MPI's non-blocking collectives, which advance only inside
// MPI_Test — a large allreduce is many rounds of fragments, each waiting for the next test, so
// sleeping between tests stretched a 13 MB gradient allreduce of a 2-rank data-parallel
// fashion-cnn to ~210 ms and made it slower than one rank. Spinning still yields the core.
// Returns false on timeout.
enum class PollMode { Sleep, Spin };

// The time `seconds` from now. A limit beyond any run is taken as about 31 years: the clock's
// nanoseconds overflow near 9.2e9 s, where a longer timeout (meant as "never") ended every wait
// at once.
inline std::chrono::steady_clock::time_point deadline_after(double seconds) {
  using Clock = std::chrono::steady_clock;
  constexpr double kLongest_s = 1e9;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::min(seconds, kLongest_s)));
}

template <typename Done>
bool poll_until(Done&& done, double timeout_s, PollMode mode = PollMode::Sleep) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = deadline_after(timeout_s);
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    if (done()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return done();
    if (mode == PollMode::Spin || now - start < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else {
      tighten_timer_slack();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(50));
    }
  }
}

}  // namespace detail

// The implementation side of a Request.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;  // a pending operation is cancelled or detached, never thrown
  // Makes progress without blocking; true once complete. Throws when the operation failed.
  virtual bool test() = 0;
  // Blocks until complete; throws TimeoutError after the communicator's timeout.
  virtual void wait() = 0;
};

// Completion handle of a non-blocking send or receive. Move-only; an empty Request is complete.
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : m_impl(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // True once the operation has completed (then the Request becomes empty).
  bool test() {
    if (!m_impl) return true;
    bool done = false;
    try {
      done = m_impl->test();
    } catch (...) {
      m_impl.reset();
      throw;
    }
    if (done) m_impl.reset();
    return done;
  }

  // Blocks until complete, at most the communicator's timeout (then TimeoutError).
  void wait() {
    if (!m_impl) return;
    auto impl = std::move(m_impl);
    impl->wait();
  }

  bool pending() const { return m_impl != nullptr; }

 private:
  std::unique_ptr<RequestImpl> m_impl;
};

// Waits for every request in order (each with its own timeout).
inline void wait_all(std::span<Request> requests) {
  for (auto& r : requests) r.wait();
}

// The implementation side of a Group (an MPI sub-communicator, an NCCL communicator, ...).
class GroupImpl {
 public:
  virtual ~GroupImpl() = default;
};

// A set of ranks that reduce together: the replicas of one stage, or the whole world. Created by
// Communicator::create_group (collective over its members); copies share the handle.
class Group {
 public:
  Group() = default;
  Group(std::vector<int> ranks, int index, const void* owner, std::shared_ptr<GroupImpl> impl)
      : m_ranks(std::move(ranks)), m_index(index), m_owner(owner), m_impl(std::move(impl)) {}

  // Communicator ranks of the members, in the order given at creation.
  const std::vector<int>& ranks() const { return m_ranks; }
  int size() const { return static_cast<int>(m_ranks.size()); }
  // The calling rank's position in ranks().
  int index() const { return m_index; }
  bool contains(int rank) const {
    return std::find(m_ranks.begin(), m_ranks.end(), rank) != m_ranks.end();
  }
  bool valid() const { return m_owner != nullptr; }
  // The communicator that created the group (identity only).
  const void* owner() const { return m_owner; }
  GroupImpl* impl() const { return m_impl.get(); }

 private:
  std::vector<int> m_ranks;
  int m_index = -1;
  const void* m_owner = nullptr;
  std::shared_ptr<GroupImpl> m_impl;
};

// An int64 (a weight version tag, a minibatch position) as a message: two int32s, the low 31
// bits and the rest, since messages carry int32 and float32 tensors.
inline Tensor int64_message(std::int64_t v) {
  return Tensor::from_ints(
      Shape{2}, {static_cast<std::int32_t>(v & 0x7fffffff), static_cast<std::int32_t>(v >> 31)});
}
inline std::int64_t int64_from_message(const Tensor& t) {
  const std::int32_t* v = t.data<std::int32_t>();
  return static_cast<std::int64_t>(v[0]) | (static_cast<std::int64_t>(v[1]) << 31);
}

class Communicator {
 public:
  Communicator() : m_wait(std::make_shared<detail::WaitSettings>()) {
    m_wait->timeout_s = comm_timeout_from_env();
  }
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "local", ...
  virtual std::string_view backend() const = 0;

  // Non-blocking point-to-point; see the contract at the top of this file.
  virtual Request isend(const Tensor& tensor, int peer, Tag tag) = 0;
  virtual Request irecv(Tensor& into, int peer, Tag tag) = 0;
  void send(const Tensor& tensor, int peer, Tag tag) { isend(tensor, peer, tag).wait(); }
  void recv(Tensor& into, int peer, Tag tag) { irecv(into, peer, tag).wait(); }

  // Collective over the listed ranks only (distinct, in [0, size()), including the caller).
  virtual Group create_group(std::vector<int> ranks) = 0;
  // All ranks, in rank order.
  virtual const Group& world() const = 0;

  // In-place elementwise sum of each tensor over the group's members: iallreduce_sum, waited for.
  void allreduce_sum(std::span<Tensor> tensors, const Group& group) {
    iallreduce_sum(tensors, group).wait();
  }
  void allreduce_sum(Tensor& tensor, const Group& group) {
    allreduce_sum(std::span<Tensor>(&tensor, 1), group);
  }
  // Non-blocking allreduce_sum; see the contract at the top of this file. A Request of a group of
  // one member is complete at once.
  virtual Request iallreduce_sum(std::span<Tensor> tensors, const Group& group) = 0;
  Request iallreduce_sum(Tensor& tensor, const Group& group) {
    return iallreduce_sum(std::span<Tensor>(&tensor, 1), group);
  }
  virtual void barrier() = 0;

  // Ends the job on every rank; logs the reason with this rank first.
  [[noreturn]] virtual void abort(const std::string& reason) = 0;

  // Limit of every wait, in seconds (> 0).
  void set_timeout(double seconds) {
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(seconds) && seconds > 0,
                      "communication timeout {} s: must be a positive number of seconds", seconds);
    m_wait->timeout_s = seconds;
  }
  double timeout() const { return m_wait->timeout_s; }

  // Called only when a wait times out; its text says where the caller is (e.g. "stage 1, action
  // 17 of 40 (1RA5@0)") and is added to the TimeoutError. Pass {} to clear.
  void set_context(std::function<std::string()> context) { m_wait->context = std::move(context); }

 protected:
  // For implementations: the settings their Requests wait with.
  const std::shared_ptr<detail::WaitSettings>& wait_settings() const { return m_wait; }

  // Common argument checks of isend/irecv; throws with the operation named.
  void check_p2p(const Tensor& t, int peer, const Tag& tag, std::string_view op) const {
    PIPELINE_CHECK_AS(ConfigError, peer >= 0 && peer < size(),
                      "{} of {}: peer rank {} out of range [0, {})", op, tag.str(), peer, size());
    PIPELINE_CHECK(t.defined(), "{} of {} with rank {}: the tensor has no storage", op, tag.str(),
                   peer);
  }
  // Checks that `group` was made by this communicator and contains the caller.
  void check_group(const Group& group, std::string_view op) const {
    PIPELINE_CHECK(group.valid() && group.owner() == static_cast<const void*>(this),
                   "{}: the group was not created by this communicator (use create_group)", op);
    PIPELINE_CHECK(group.contains(rank()), "{}: rank {} is not a member of the group", op, rank());
  }
  // Validates create_group's argument and returns the caller's index in it.
  int check_new_group(const std::vector<int>& ranks) const {
    PIPELINE_CHECK_AS(ConfigError, !ranks.empty(), "create_group: empty rank list");
    int index = -1;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      PIPELINE_CHECK_AS(ConfigError, ranks[i] >= 0 && ranks[i] < size(),
                        "create_group: rank {} out of range [0, {})", ranks[i], size());
      PIPELINE_CHECK_AS(ConfigError,
                        std::find(ranks.begin(), ranks.begin() + static_cast<long>(i), ranks[i]) ==
                            ranks.begin() + static_cast<long>(i),
                        "create_group: rank {} listed twice", ranks[i]);
      if (ranks[i] == rank()) index = static_cast<int>(i);
    }
    PIPELINE_CHECK_AS(ConfigError, index >= 0,
                      "create_group: the calling rank {} must be a member of the group", rank());
    return index;
  }

 private:
  std::shared_ptr<detail::WaitSettings> m_wait;
};

}  // namespace pipeline
