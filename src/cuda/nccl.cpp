// NCCL communicator: MPI bootstrap, non-blocking NCCL communicators, point-to-point on two
// direction communicators, allreduce on per-group communicators, completion events, and the
// watchdog thread that aborts NCCL when a wait passes the timeout or NCCL reports an error.
// The design and its reasons are at the top of include/pipeline/comm/comms/nccl.hpp.
#include <pipeline/comm/comms/nccl.hpp>
#include <pipeline/comm/mpi_check.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/nccl_check.hpp>
#include <pipeline/cuda/stream.hpp>

#include <fmt/ranges.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace pipeline {
namespace detail {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float16:
      return ncclFloat16;
  }
  return ncclUint8;
}

// MPI_Comm_create_group's tag for the bootstrap of a group's NCCL communicator.
constexpr int kGroupBootstrapTag = 0x4e43;

}  // namespace

// One NCCL communicator and the stream its operations run on.
struct NcclComm {
  ncclComm_t comm = nullptr;  // null once destroyed or aborted
  cuda::Stream stream;
  std::string name;  // "point-to-point to higher ranks", "world", "group [0, 2]"
};

enum class NcclOpKind { Send, Recv, AllReduce, Stall };

// One posted operation, shared by its Request and the pending list (which keeps the buffers
// alive until the completion event has fired, also when the Request is gone).
struct NcclOp {
  NcclOpKind kind = NcclOpKind::Send;
  std::string what;  // "a receive of activation(stage 0, microbatch 3) from rank 1"
  int peer = -1;
  std::shared_ptr<NcclComm> comm;
  std::vector<Tensor> buffers;
  cuda::Event ready;  // recorded on the caller's stream when posted
  cuda::Event done;   // recorded on the communication stream after the operation
  bool issued = false;
  bool complete = false;
  std::optional<Clock::time_point> waited_since;
};

// A new operation on `buffers`, ordered after the work queued so far on the calling thread's
// current stream of `device` (its `ready` event), with its completion event.
std::shared_ptr<NcclOp> new_op(NcclOpKind kind, std::string what, std::vector<Tensor> buffers,
                               int device) {
  auto op = std::make_shared<NcclOp>();
  op->kind = kind;
  op->what = std::move(what);
  op->buffers = std::move(buffers);
  op->ready = cuda::Event::create(device);
  op->ready.record(cuda::current_stream(device));
  op->done = cuda::Event::create(device);
  return op;
}

struct NcclFailure {
  bool timeout = false;
  std::string what;  // the operation waited for (timeouts)
  double waited_s = 0;
  std::string message;  // NCCL or CUDA errors
};

struct NcclShared {
  std::mutex mutex;  // everything below, and every NCCL call on these communicators
  int device = 0;
  int rank = 0;
  std::shared_ptr<WaitSettings> settings;
  std::vector<std::shared_ptr<NcclComm>> comms;
  std::shared_ptr<NcclComm> up;    // point-to-point from lower to higher ranks and to self
  std::shared_ptr<NcclComm> down;  // point-to-point from higher to lower ranks
  std::shared_ptr<NcclComm> world;
  std::vector<std::shared_ptr<NcclOp>> pending;
  std::vector<std::shared_ptr<NcclOp>> batch;
  int batch_depth = 0;
  std::optional<NcclFailure> failure;

  std::thread watchdog;
  std::condition_variable wake;
  bool stop = false;

  // ncclCommAbort on every communicator: ends their kernels so that no stream stays stuck.
  void abort_all_locked() noexcept {
    for (auto& c : comms)
      if (c->comm != nullptr) {
        (void)ncclCommAbort(c->comm);
        c->comm = nullptr;
      }
  }

  void fail_locked(NcclFailure f) noexcept {
    if (!failure) failure = std::move(f);
    abort_all_locked();
  }

  // Throws the recorded failure, if any (every call after one does).
  void check_failed_locked() const {
    if (!failure) return;
    if (failure->timeout) throw_timeout(*settings, rank, failure->what, failure->waited_s);
    throw NcclError(failure->message);
  }

  std::string pending_summary_locked() const {
    std::string s;
    int n = 0;
    for (const auto& op : pending) {
      if (op->complete || !op->issued) continue;
      if (n++ < 3) s += (s.empty() ? "" : "; ") + op->what;
    }
    if (n > 3) s += fmt::format("; and {} more", n - 3);
    return s.empty() ? "nothing" : s;
  }

  // Completion events and NCCL's asynchronous errors, without blocking; records a failure (and
  // aborts) for an error or for a waited-for operation past the timeout.
  void scan_locked() noexcept {
    if (failure) return;
    const auto now = Clock::now();
    bool any = false;
    for (auto& op : pending) {
      if (!op->issued || op->complete) continue;
      const cudaError_t q = cudaEventQuery(op->done.get());
      if (q == cudaSuccess) {
        op->complete = true;
        continue;
      }
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail_locked({false, op->what, 0,
                     fmt::format("{}rank {} ({}): CUDA error {} ({}) on cuda:{} while waiting for "
                                 "{}; the NCCL communicators were aborted",
                                 rank_prefix(), rank, host_and_pid(), cudaGetErrorName(q),
                                 cudaGetErrorString(q), device, op->what)});
        return;
      }
      any = true;
      if (op->waited_since &&
          std::chrono::duration<double>(now - *op->waited_since).count() > settings->timeout_s) {
        fail_locked({true, op->what,
                     std::chrono::duration<double>(now - *op->waited_since).count(), {}});
        return;
      }
    }
    if (!any) return;
    for (auto& c : comms) {
      if (c->comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(c->comm, &state);
      if (rc != ncclSuccess) state = rc;
      if (state == ncclSuccess || state == ncclInProgress) continue;
      fail_locked({false, {}, 0,
                   fmt::format("{}rank {} ({}): NCCL reported an asynchronous error on its "
                               "communicator '{}' (cuda:{}): {}; pending: {}. A peer may have "
                               "died or lost its connection; the NCCL communicators were aborted",
                               rank_prefix(), rank, host_and_pid(), c->name, device,
                               cuda::nccl_error_text(state, c->comm), pending_summary_locked())});
      return;
    }
  }

  // Drops completed operations (on the caller's thread: freeing tensors is not the watchdog's).
  void sweep_locked() {
    std::erase_if(pending, [](const std::shared_ptr<NcclOp>& op) { return op->complete; });
  }

  // After a call on a non-blocking communicator: polls ncclCommGetAsyncError until the state
  // leaves ncclInProgress, at most the timeout. Throws (after aborting) on error or timeout.
  void settle_locked(NcclComm& c, const std::string& what) {
    const auto t0 = Clock::now();
    ncclResult_t state = ncclInProgress;
    const bool settled = poll_until(
        [&] {
          if (c.comm == nullptr) {
            state = ncclInvalidUsage;
            return true;
          }
          const ncclResult_t rc = ncclCommGetAsyncError(c.comm, &state);
          if (rc != ncclSuccess) state = rc;
          return state != ncclInProgress;
        },
        settings->timeout_s, PollMode::Spin);
    if (!settled) {
      fail_locked({true, what, seconds_since(t0), {}});
      check_failed_locked();
    }
    if (state != ncclSuccess) {
      fail_locked({false, what, 0,
                   fmt::format("{}rank {} ({}): {} failed on NCCL communicator '{}' (cuda:{}): "
                               "{}; the NCCL communicators were aborted",
                               rank_prefix(), rank, host_and_pid(), what, c.name, device,
                               cuda::nccl_error_text(state, c.comm))});
      check_failed_locked();
    }
  }

  // Runs `enqueue` (NCCL calls on c) as one NCCL group on c's stream, after each op's ready
  // event, and records each op's completion event. Errors abort and throw.
  template <typename Enqueue>
  void issue_locked(NcclComm& c, std::span<const std::shared_ptr<NcclOp>> ops,
                    const std::string& what, Enqueue&& enqueue) {
    bool in_group = false;
    try {
      PIPELINE_CHECK(c.comm != nullptr, "{}: the NCCL communicator '{}' was destroyed", what,
                     c.name);
      for (const auto& op : ops) op->ready.block(c.stream.get());
      PIPELINE_NCCL_CHECK(ncclGroupStart());
      in_group = true;
      enqueue();
      in_group = false;
      PIPELINE_NCCL_CHECK_ASYNC(ncclGroupEnd());
    } catch (const Error& e) {
      // Close the group: NCCL's group state is per thread, and later communicators (also new
      // ones) would otherwise find themselves inside it.
      if (in_group) (void)ncclGroupEnd();
      fail_locked({false, what, 0,
                   fmt::format("{} (while posting {}; the NCCL communicators were aborted)",
                               e.what(), what)});
      throw;
    }
    settle_locked(c, what);
    for (const auto& op : ops) {
      op->done.record(c.stream.get());
      for (const Tensor& b : op->buffers) cuda::record_stream(b, c.stream.get());
      op->ready = cuda::Event();
      op->issued = true;
    }
    wake.notify_all();
  }

  void issue_p2p_locked(std::span<const std::shared_ptr<NcclOp>> ops) {
    for (NcclComm* c : {up.get(), down.get()}) {
      std::vector<std::shared_ptr<NcclOp>> mine;
      for (const auto& op : ops)
        if (op->comm.get() == c) mine.push_back(op);
      if (mine.empty()) continue;
      const std::string what = mine.size() == 1 ? mine[0]->what
                                                : fmt::format("a group of {} messages, the first "
                                                              "{}",
                                                              mine.size(), mine[0]->what);
      issue_locked(*c, mine, what, [&] {
        for (const auto& op : mine) {
          Tensor& t = op->buffers[0];
          const auto n = static_cast<std::size_t>(t.numel());
          if (op->kind == NcclOpKind::Send)
            PIPELINE_NCCL_CHECK_ASYNC(
                ncclSend(t.raw(), n, nccl_type(t.dtype()), op->peer, c->comm, c->stream.get()));
          else
            PIPELINE_NCCL_CHECK_ASYNC(
                ncclRecv(t.raw(), n, nccl_type(t.dtype()), op->peer, c->comm, c->stream.get()));
        }
      });
    }
  }

  // A new non-blocking NCCL communicator of `n` ranks, this one `r` in it, ready to use.
  std::shared_ptr<NcclComm> make_comm(const ncclUniqueId& id, int n, int r, std::string name) {
    auto c = std::make_shared<NcclComm>();
    c->name = std::move(name);
    c->stream = cuda::Stream::create(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::unique_lock lock(mutex);
    check_failed_locked();
    PIPELINE_NCCL_CHECK_ASYNC(ncclCommInitRankConfig(&c->comm, n, id, r, &config));
    comms.push_back(c);
    settle_locked(*c, fmt::format("the creation of the NCCL communicator '{}' of {} ranks (every "
                                  "one of them must create it)",
                                  c->name, n));
    return c;
  }

  void watchdog_loop() noexcept {
    (void)cudaSetDevice(device);
    std::unique_lock lock(mutex);
    while (!stop) {
      const bool busy = !pending.empty() && !failure;
      wake.wait_for(lock, busy ? std::chrono::milliseconds(2) : std::chrono::milliseconds(100));
      if (stop) break;
      if (!pending.empty()) scan_locked();
    }
  }
};

namespace {

// A group's NCCL communicator for device tensors, and the same members' MPI group for the host
// tensors (statistics, agreements) that the runtime also sums.
class NcclGroup final : public GroupImpl {
 public:
  NcclGroup(std::shared_ptr<NcclComm> comm, Group host)
      : m_comm(std::move(comm)), m_host(std::move(host)) {}
  const std::shared_ptr<NcclComm>& comm() const { return m_comm; }
  const Group& host() const { return m_host; }

 private:
  std::shared_ptr<NcclComm> m_comm;
  Group m_host;
};

class NcclRequest final : public RequestImpl {
 public:
  NcclRequest(std::shared_ptr<NcclShared> shared, std::shared_ptr<NcclOp> op)
      : m_shared(std::move(shared)), m_op(std::move(op)) {}

  // The operation stays in the pending list (with its buffers) until its event fires.
  ~NcclRequest() override = default;

  bool test() override {
    std::lock_guard lock(m_shared->mutex);
    m_shared->check_failed_locked();
    require_issued();
    m_shared->scan_locked();
    m_shared->check_failed_locked();
    return m_op->complete;
  }

  // Device-side: the caller's current stream waits for the operation; the watchdog times the
  // operation from now on.
  void wait() override {
    std::lock_guard lock(m_shared->mutex);
    m_shared->check_failed_locked();
    require_issued();
    if (!m_op->waited_since) m_op->waited_since = Clock::now();
    m_shared->scan_locked();
    m_shared->check_failed_locked();
    if (!m_op->complete) m_op->done.block(cuda::current_stream(m_shared->device));
    m_shared->wake.notify_all();
  }

 private:
  void require_issued() const {
    PIPELINE_CHECK(m_op->issued,
                   "{}: this operation is part of an open batch; call end_batch() before testing "
                   "or waiting for its Request",
                   m_op->what);
  }

  std::shared_ptr<NcclShared> m_shared;
  std::shared_ptr<NcclOp> m_op;
};

// Owns its argument: the Request and the communicator may be gone before it runs.
void CUDART_CB stall_host_function(void* seconds) {
  const double s = *static_cast<double*>(seconds);
  delete static_cast<double*>(seconds);
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(MpiCommunicator& mpi, int device)
    : m_mpi(mpi),
      m_device(device),
      m_rank(mpi.rank()),
      m_size(mpi.size()),
      m_shared(std::make_shared<detail::NcclShared>()) {
  const int devices = cuda::device_count();
  PIPELINE_CHECK_AS(ConfigError, device >= 0 && device < devices,
                    "NcclCommunicator on rank {}: device cuda:{} does not exist ({} CUDA devices "
                    "visible); NCCL needs one GPU per rank (see choose_transport)",
                    m_rank, device, devices);
  PIPELINE_CUDA_CHECK(cudaSetDevice(device));
  set_timeout(mpi.timeout());
  m_shared->device = device;
  m_shared->rank = m_rank;
  m_shared->settings = wait_settings();

  // Rank 0 makes one id per communicator; one broadcast carries them all.
  std::array<ncclUniqueId, 3> ids{};
  if (m_rank == 0)
    for (auto& id : ids) PIPELINE_NCCL_CHECK(ncclGetUniqueId(&id));
  PIPELINE_MPI_CHECK(MPI_Bcast(ids.data(), static_cast<int>(sizeof(ids)), MPI_BYTE, 0,
                               mpi.handle()));
  try {
    m_shared->up = m_shared->make_comm(ids[0], m_size, m_rank, "point-to-point to higher ranks");
    m_shared->down = m_shared->make_comm(ids[1], m_size, m_rank, "point-to-point to lower ranks");
    m_shared->world = m_shared->make_comm(ids[2], m_size, m_rank, "world");
  } catch (...) {
    std::lock_guard lock(m_shared->mutex);
    m_shared->abort_all_locked();  // the destructor does not run for a failed constructor
    throw;
  }

  std::vector<int> all(static_cast<std::size_t>(m_size));
  for (int r = 0; r < m_size; ++r) all[static_cast<std::size_t>(r)] = r;
  m_world = Group(std::move(all), m_rank, this,
                  std::make_shared<detail::NcclGroup>(m_shared->world, m_mpi.world()));
  auto* shared = m_shared.get();
  m_shared->watchdog = std::thread([shared] { shared->watchdog_loop(); });
}

NcclCommunicator::~NcclCommunicator() {
  auto& s = *m_shared;
  {
    std::lock_guard lock(s.mutex);
    s.stop = true;
  }
  s.wake.notify_all();
  if (s.watchdog.joinable()) s.watchdog.join();
  try {
    std::lock_guard lock(s.mutex);
    s.scan_locked();
    bool clean = !s.failure;
    for (auto& op : s.pending)
      if (!op->complete) clean = false;
    if (!clean) {
      s.abort_all_locked();
      // NCCL or the stream may still touch the buffers of unfinished operations: leak them.
      for (auto& op : s.pending)
        if (!op->complete)
          for (Tensor& b : op->buffers) new Tensor(std::move(b));
    } else {
      const double limit = s.settings->timeout_s;
      for (auto& c : s.comms) {
        if (c->comm == nullptr) continue;
        ncclResult_t state = ncclCommFinalize(c->comm);
        if (state == ncclInProgress)
          detail::poll_until(
              [&] {
                if (ncclCommGetAsyncError(c->comm, &state) != ncclSuccess) state = ncclSystemError;
                return state != ncclInProgress;
              },
              limit);
        if (state == ncclSuccess)
          (void)ncclCommDestroy(c->comm);
        else
          (void)ncclCommAbort(c->comm);
        c->comm = nullptr;
      }
    }
    s.pending.clear();
  } catch (...) {
    // Never throw from a destructor; what is left is the process's to clean up.
  }
}

Request NcclCommunicator::isend(const Tensor& tensor, int peer, Tag tag) {
  return post_p2p(tensor, peer, tag, false);
}

Request NcclCommunicator::irecv(Tensor& into, int peer, Tag tag) {
  return post_p2p(into, peer, tag, true);
}

Request NcclCommunicator::post_p2p(const Tensor& tensor, int peer, Tag tag, bool is_recv) {
  const char* op_name = is_recv ? "irecv" : "isend";
  check_p2p(tensor, peer, tag, op_name);
  if (tensor.device().is_cpu()) {  // host tensors travel over MPI
    Tensor t = tensor;
    return is_recv ? m_mpi.irecv(t, peer, tag) : m_mpi.isend(t, peer, tag);
  }
  PIPELINE_CHECK_AS(ConfigError, tensor.device().index == m_device,
                    "{} of {} with rank {}: the tensor is on {} but this rank's NCCL "
                    "communicator is bound to cuda:{}",
                    op_name, tag.str(), peer, tensor.device().str(), m_device);
  auto& s = *m_shared;
  auto op = detail::new_op(is_recv ? detail::NcclOpKind::Recv : detail::NcclOpKind::Send,
                           is_recv ? fmt::format("a receive of {} from rank {}", tag.str(), peer)
                                   : fmt::format("a send of {} to rank {}", tag.str(), peer),
                           {tensor}, m_device);
  op->peer = peer;
  // Sends to a higher rank (or to self) and receives from a lower rank (or self) use `up`.
  const bool upward = is_recv ? peer <= m_rank : peer >= m_rank;

  std::lock_guard lock(s.mutex);
  s.check_failed_locked();
  s.sweep_locked();
  op->comm = upward ? s.up : s.down;
  s.pending.push_back(op);
  if (s.batch_depth > 0)
    s.batch.push_back(op);
  else
    s.issue_p2p_locked(std::span<const std::shared_ptr<detail::NcclOp>>(&op, 1));
  return Request(std::make_unique<detail::NcclRequest>(m_shared, op));
}

void NcclCommunicator::begin_batch() {
  std::lock_guard lock(m_shared->mutex);
  ++m_shared->batch_depth;
}

void NcclCommunicator::end_batch() {
  auto& s = *m_shared;
  std::lock_guard lock(s.mutex);
  PIPELINE_CHECK(s.batch_depth > 0, "end_batch() without begin_batch()");
  if (--s.batch_depth > 0) return;
  auto ops = std::move(s.batch);
  s.batch.clear();
  s.check_failed_locked();
  s.issue_p2p_locked(ops);
}

Group NcclCommunicator::create_group(std::vector<int> ranks) {
  const int index = check_new_group(ranks);
  if (ranks.size() == 1) return Group(std::move(ranks), index, this, nullptr);
  Group host = m_mpi.create_group(ranks);
  MPI_Group all = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  PIPELINE_MPI_CHECK(MPI_Comm_group(m_mpi.handle(), &all));
  PIPELINE_MPI_CHECK(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &members));
  MPI_Comm sub = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(m_mpi.handle(), members, detail::kGroupBootstrapTag, &sub);
  MPI_Group_free(&members);
  MPI_Group_free(&all);
  PIPELINE_MPI_CHECK(rc);
  ncclUniqueId id{};
  try {
    if (index == 0) PIPELINE_NCCL_CHECK(ncclGetUniqueId(&id));
    PIPELINE_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, sub));
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MPI_Comm_free(&sub);
  auto comm = m_shared->make_comm(id, static_cast<int>(ranks.size()), index,
                                  fmt::format("group {}", ranks));
  return Group(std::move(ranks), index, this,
               std::make_shared<detail::NcclGroup>(comm, std::move(host)));
}

namespace {

// Queues an in-place float32 sum of `buffers` over `comm` after the work queued so far on the
// calling thread's current stream (iallreduce_sum and barrier); `waited`: the operation is
// waited for from now on (its timeout runs).
std::shared_ptr<detail::NcclOp> post_allreduce(detail::NcclShared& s,
                                               std::shared_ptr<detail::NcclComm> comm,
                                               std::vector<Tensor> buffers, std::string what,
                                               int device, bool waited) {
  auto op =
      detail::new_op(detail::NcclOpKind::AllReduce, std::move(what), std::move(buffers), device);
  op->comm = std::move(comm);
  std::lock_guard lock(s.mutex);
  s.check_failed_locked();
  s.sweep_locked();
  s.pending.push_back(op);
  detail::NcclComm& c = *op->comm;
  s.issue_locked(c, std::span<const std::shared_ptr<detail::NcclOp>>(&op, 1), op->what, [&] {
    for (Tensor& t : op->buffers)
      PIPELINE_NCCL_CHECK_ASYNC(ncclAllReduce(t.raw(), t.raw(), static_cast<std::size_t>(t.numel()),
                                              ncclFloat32, ncclSum, c.comm, c.stream.get()));
  });
  if (waited) op->waited_since = detail::Clock::now();
  return op;
}

}  // namespace

Request NcclCommunicator::iallreduce_sum(std::span<Tensor> tensors, const Group& group) {
  check_group(group, "allreduce_sum");
  std::int64_t total = 0;
  const bool host = !tensors.empty() && tensors[0].defined() && tensors[0].device().is_cpu();
  for (const Tensor& t : tensors) {
    PIPELINE_CHECK(t.defined() && t.dtype() == DType::Float32 &&
                       t.device() == (host ? Device::cpu() : Device::cuda(m_device)),
                   "allreduce_sum: the NCCL communicator reduces float32 tensors all on cuda:{} "
                   "(over NCCL) or all on the CPU (over MPI), got {} on {}",
                   m_device, dtype_name(t.dtype()), t.device().str());
    total += t.numel();
  }
  if (group.size() == 1 || tensors.empty()) return Request();
  auto* g = dynamic_cast<detail::NcclGroup*>(group.impl());
  PIPELINE_CHECK(g != nullptr, "allreduce_sum: the group has no NCCL communicator");
  if (host) return m_mpi.iallreduce_sum(tensors, g->host());
  auto op = post_allreduce(*m_shared, g->comm(), {tensors.begin(), tensors.end()},
                           fmt::format("an allreduce_sum of {} elements in {} tensors over ranks {}",
                                       total, tensors.size(), group.ranks()),
                           m_device, /*waited=*/false);
  return Request(std::make_unique<detail::NcclRequest>(m_shared, op));
}

void NcclCommunicator::barrier() {
  auto& s = *m_shared;
  auto op = post_allreduce(s, s.world, {Tensor::zeros(Shape{1}, DType::Float32, Device::cuda(m_device))},
                           fmt::format("a barrier of all {} ranks", m_size), m_device,
                           /*waited=*/true);
  s.wake.notify_all();
  // Only this allreduce is waited for: a receive posted earlier may match a send that a peer
  // posts after the barrier.
  const bool done = detail::poll_until(
      [&] {
        std::lock_guard lock(s.mutex);
        s.scan_locked();
        return op->complete || s.failure.has_value();
      },
      timeout());
  std::lock_guard lock(s.mutex);
  if (!done && !s.failure)
    s.fail_locked({true, op->what, detail::seconds_since(*op->waited_since), {}});
  s.check_failed_locked();
  s.sweep_locked();
}

void NcclCommunicator::synchronize() {
  auto& s = *m_shared;
  const auto t0 = detail::Clock::now();
  {
    std::lock_guard lock(s.mutex);
    s.check_failed_locked();
    PIPELINE_CHECK(s.batch_depth == 0, "synchronize() inside a batch: call end_batch() first");
    for (auto& op : s.pending)
      if (!op->waited_since) op->waited_since = t0;
  }
  s.wake.notify_all();
  const auto all_done = [&] {
    std::lock_guard lock(s.mutex);
    s.scan_locked();
    if (s.failure) return true;
    s.sweep_locked();
    return s.pending.empty();
  };
  const bool done = detail::poll_until(all_done, timeout());
  std::lock_guard lock(s.mutex);
  if (!done && !s.failure && !s.pending.empty())
    s.fail_locked({true, s.pending.front()->what, detail::seconds_since(t0), {}});
  s.check_failed_locked();
}

void NcclCommunicator::abort(const std::string& reason) {
  log(LogLevel::Error, "{}: aborting the NCCL communicators and the job on every rank: {}",
      detail::host_and_pid(), reason);
  {
    std::lock_guard lock(m_shared->mutex);
    m_shared->abort_all_locked();
  }
  m_mpi.abort(reason);
}

Request NcclCommunicator::inject_stalled_receive(Tensor& into, int peer, Tag tag, double stall_s) {
  check_p2p(into, peer, tag, "inject_stalled_receive");
  auto& s = *m_shared;
  auto op = std::make_shared<detail::NcclOp>();
  op->kind = detail::NcclOpKind::Stall;
  op->what = fmt::format("a receive of {} from rank {}", tag.str(), peer);
  op->peer = peer;
  op->done = cuda::Event::create(m_device);
  std::lock_guard lock(s.mutex);
  s.check_failed_locked();
  s.sweep_locked();
  op->comm = s.up;
  cudaStream_t stream = op->comm->stream.get();
  PIPELINE_CUDA_CHECK(
      cudaLaunchHostFunc(stream, detail::stall_host_function, new double(stall_s)));
  op->done.record(stream);
  op->issued = true;
  s.pending.push_back(op);
  s.wake.notify_all();
  return Request(std::make_unique<detail::NcclRequest>(m_shared, op));
}

}  // namespace pipeline
