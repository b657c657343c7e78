// MPI communicator: non-blocking point-to-point with polled, timed waits; deterministic,
// non-blocking allreduce over point-to-point messages (sums in group order); RAII for MPI itself,
// the library's duplicate communicator and group sub-communicators.
#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/comm/mpi_check.hpp>
#include <pipeline/core/log.hpp>

#include <fmt/ranges.h>

#include <bit>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pipeline {
namespace detail {

namespace {

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

int to_mpi_level(MpiThreadLevel l) {
  switch (l) {
    case MpiThreadLevel::Single:
      return MPI_THREAD_SINGLE;
    case MpiThreadLevel::Funneled:
      return MPI_THREAD_FUNNELED;
    case MpiThreadLevel::Serialized:
      return MPI_THREAD_SERIALIZED;
    case MpiThreadLevel::Multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

MpiThreadLevel from_mpi_level(int l) {
  if (l >= MPI_THREAD_MULTIPLE) return MpiThreadLevel::Multiple;
  if (l >= MPI_THREAD_SERIALIZED) return MpiThreadLevel::Serialized;
  if (l >= MPI_THREAD_FUNNELED) return MpiThreadLevel::Funneled;
  return MpiThreadLevel::Single;
}

const char* level_name(MpiThreadLevel l) {
  switch (l) {
    case MpiThreadLevel::Single:
      return "MPI_THREAD_SINGLE";
    case MpiThreadLevel::Funneled:
      return "MPI_THREAD_FUNNELED";
    case MpiThreadLevel::Serialized:
      return "MPI_THREAD_SERIALIZED";
    case MpiThreadLevel::Multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

// The MPI datatype that moves one element of `t`; 16-bit floats travel as raw 16-bit words.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::BFloat16:
    case DType::Float16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// MPI counts are int: a larger tensor has to be split by the caller.
int mpi_count(std::int64_t numel, std::string_view what) {
  PIPELINE_CHECK(numel <= INT_MAX,
                 "{}: {} elements exceed MPI's int element count ({}); split the tensor", what,
                 numel, INT_MAX);
  return static_cast<int>(numel);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string describe_tensor(const Tensor& t) {
  return fmt::format("{} {} elements (shape {})", t.numel(), dtype_name(t.dtype()),
                     t.shape().str());
}

}  // namespace

// An operation that was still pending when its Request was dropped (error paths): kept, with the
// buffer it reads or writes, until MPI reports it complete.
struct Orphan {
  MPI_Request request = MPI_REQUEST_NULL;
  Tensor buffer;
};

// What the communicator and its Requests share; freed when the last of them goes.
struct MpiShared {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<Orphan> orphans;

  // Completes what it can of the orphans without blocking.
  void sweep() {
    std::erase_if(orphans, [](Orphan& o) {
      int flag = 0;
      if (MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;
      return flag != 0;
    });
  }

  ~MpiShared() {
    if (mpi_finalized()) return;
    sweep();
    for (Orphan& o : orphans) {
      // Still pending at shutdown: the job is failing. Let MPI drop the request and keep its
      // buffer alive on purpose, since MPI may still touch it.
      MPI_Request_free(&o.request);
      new Tensor(std::move(o.buffer));
    }
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

namespace {

class MpiP2pRequest final : public RequestImpl {
 public:
  MpiP2pRequest(std::shared_ptr<MpiShared> shared, std::shared_ptr<WaitSettings> settings,
                MPI_Request request, Tensor buffer, bool is_recv, int me, int peer, Tag tag)
      : m_shared(std::move(shared)),
        m_settings(std::move(settings)),
        m_request(request),
        m_buffer(std::move(buffer)),
        m_is_recv(is_recv),
        m_me(me),
        m_peer(peer),
        m_tag(tag) {}

  ~MpiP2pRequest() override {
    if (m_request == MPI_REQUEST_NULL || mpi_finalized()) return;
    // A receive nobody waits for is cancelled; either way MPI may still use the buffer, so the
    // communicator keeps both until MPI reports the request complete.
    if (m_is_recv) MPI_Cancel(&m_request);
    m_shared->orphans.push_back(Orphan{m_request, std::move(m_buffer)});
  }

  bool test() override {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&m_request, &flag, &status);
    if (rc != MPI_SUCCESS) {
      m_request = MPI_REQUEST_NULL;  // a failed request is not retried or cancelled
      int cls = 0;
      MPI_Error_class(rc, &cls);
      if (m_is_recv && cls == MPI_ERR_TRUNCATE)
        throw Error(fmt::format(
            "{}rank {}: the message {} from rank {} is larger than the receive tensor, which "
            "holds {}; sender and receiver must agree on the tensor's size and type",
            rank_prefix(), m_me, m_tag.str(), m_peer, describe_tensor(m_buffer)));
      // A dead peer's broken connection can surface here instead of as mpirun's SIGTERM.
      throw MpiError(fmt::format(
          "{}rank {} ({}): {} failed with {}: rank {} may have died or lost its connection; "
          "find its own error, or the rank mpirun names, in the job's output",
          rank_prefix(), m_me, host_and_pid(), what(), mpi_error_string(rc), m_peer));
    }
    if (!flag) return false;
    m_request = MPI_REQUEST_NULL;
    if (m_is_recv) {
      int count = 0;
      PIPELINE_MPI_CHECK(MPI_Get_count(&status, mpi_type(m_buffer.dtype()), &count));
      PIPELINE_CHECK(count == m_buffer.numel(),
                     "rank {}: the message {} from rank {} holds {} elements but the receive "
                     "tensor holds {}; sender and receiver must agree on the tensor's size and "
                     "type",
                     m_me, m_tag.str(), m_peer, count, describe_tensor(m_buffer));
    }
    return true;
  }

  void wait() override {
    auto t0 = Clock::now();
    if (test()) return;
    const WaitNote note([&] { return what(); }, *m_settings);
    if (!poll_until([&] { return test(); }, m_settings->timeout_s))
      throw_timeout(*m_settings, m_me, what(), seconds_since(t0));
  }

 private:
  std::string what() const {
    return m_is_recv ? fmt::format("a receive of {} from rank {}", m_tag.str(), m_peer)
                     : fmt::format("a send of {} to rank {}", m_tag.str(), m_peer);
  }

  std::shared_ptr<MpiShared> m_shared;
  std::shared_ptr<WaitSettings> m_settings;
  MPI_Request m_request;
  Tensor m_buffer;  // keeps the storage alive while MPI uses it
  bool m_is_recv;
  int m_me;
  int m_peer;
  Tag m_tag;
};

// A group's own communicator (the world group's is a duplicate of the library's), which carries
// only the group's allreduce messages, tagged with the call's number so that the messages of
// several allreduces in flight (gradient buckets) never match each other's receives.
class MpiGroup final : public GroupImpl {
 public:
  explicit MpiGroup(MPI_Comm comm) : m_comm(comm) {}
  ~MpiGroup() override {
    if (m_comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&m_comm);
  }
  MPI_Comm comm() const { return m_comm; }
  // The tag of the group's next collective call (MPI guarantees tags up to 32767).
  int next_tag() { return static_cast<int>(m_calls++ % 32768u); }

 private:
  MPI_Comm m_comm;
  std::uint32_t m_calls = 0;
};

// One allreduce_sum of a group, as a state machine that test() advances without blocking:
//  1. gather: in a group of up to `direct_limit` members every member sends its data to every
//     other one; in a larger group the members send theirs to the first member only;
//  2. sum: who has everything (every member, or the first) sums element by element in group
//     order, ((x0 + x1) + x2) + ..., into its own buffer; then (larger groups) the first member
//     sends the sum to the others (3. scatter).
// Every member thus holds the same bits, and the result of an element does not depend on how the
// tensors were split into calls or on MPI's choice of collective algorithm. A two-member group
// (data parallelism on two ranks) moves each gradient once each way, at the same time.
// Point-to-point messages rather than MPI_Iallreduce because Open MPI's non-blocking collectives
// move a large buffer in 16 KiB fragments that each wait for the next MPI_Test, so a collective
// polled between layers hardly moves; a large point-to-point message goes in one copy (CMA) after
// one or two tests.
class MpiAllreduceRequest final : public RequestImpl {
 public:
  MpiAllreduceRequest(std::shared_ptr<MpiShared> shared, std::shared_ptr<WaitSettings> settings,
                      MPI_Comm comm, int tag, std::vector<Tensor> tensors, std::int64_t total,
                      int index, std::vector<int> ranks, int me, bool direct)
      : m_shared(std::move(shared)),
        m_settings(std::move(settings)),
        m_comm(comm),
        m_tag(tag),
        m_tensors(std::move(tensors)),
        m_count(static_cast<int>(total)),
        m_index(index),
        m_ranks(std::move(ranks)),
        m_me(me),
        m_direct(direct) {
    const int n = static_cast<int>(m_ranks.size());
    make_parts();
    // Every member posts its messages part by part in the same order, so MPI's non-overtaking
    // rule matches each receive with the same part's send.
    for (Part& part : m_parts) {
      part.others.resize(static_cast<std::size_t>(n));
      if (m_direct || m_index == 0) {
        for (int m = 0; m < n; ++m) {
          if (m == m_index) continue;
          Tensor& other = part.others[static_cast<std::size_t>(m)];
          other = Tensor::empty(part.buffer.shape());
          post(other, m, /*recv=*/true);
        }
      }
      if (m_direct) {
        for (int m = 0; m < n; ++m)
          if (m != m_index) post(part.buffer, m, /*recv=*/false);
      } else if (m_index != 0) {
        post(part.buffer, 0, /*recv=*/false);
      }
    }
  }

  ~MpiAllreduceRequest() override {
    if (mpi_finalized()) return;
    // Dropped before completion (an error elsewhere): MPI may still use the buffers, so the
    // communicator keeps them until MPI reports each message complete.
    for (Pending& p : m_pending)
      if (p.request != MPI_REQUEST_NULL) {
        if (p.recv) MPI_Cancel(&p.request);
        m_shared->orphans.push_back(Orphan{p.request, p.buffer});
      }
  }

  bool test() override {
    if (m_phase == Phase::Gather) {
      if (!test_pending()) return false;
      if (m_direct || m_index == 0) sum_in_group_order();
      m_pending.clear();
      if (m_direct) {
        m_phase = Phase::Done;
      } else {
        m_phase = Phase::Scatter;
        const int n = static_cast<int>(m_ranks.size());
        for (Part& part : m_parts) {
          if (m_index == 0)
            for (int m = 1; m < n; ++m) post(part.buffer, m, /*recv=*/false);
          else
            post(part.buffer, 0, /*recv=*/true);
        }
      }
    }
    if (m_phase == Phase::Scatter) {
      if (!test_pending()) return false;
      m_pending.clear();
      m_phase = Phase::Done;
    }
    if (!m_unpacked) {
      for (Part& part : m_parts) {
        if (part.count == 1) continue;  // reduced in place
        std::size_t at = 0;
        const float* b = part.buffer.data<float>();
        for (std::size_t i = part.first; i < part.first + part.count; ++i) {
          std::memcpy(m_tensors[i].raw(), b + at, m_tensors[i].nbytes());
          at += static_cast<std::size_t>(m_tensors[i].numel());
        }
      }
      m_unpacked = true;
    }
    return true;
  }

  void wait() override {
    auto t0 = Clock::now();
    if (test()) return;
    const WaitNote note([&] { return what(); }, *m_settings);
    if (!poll_until([&] { return test(); }, m_settings->timeout_s, PollMode::Spin))
      throw_timeout(*m_settings, m_me, what(), seconds_since(t0));
  }

 private:
  enum class Phase { Gather, Scatter, Done };
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    Tensor buffer;
    int member = 0;
    bool recv = false;
  };

  void post(const Tensor& buffer, int member, bool recv) {
    Pending p;
    p.buffer = buffer;
    p.member = member;
    p.recv = recv;
    const int count = static_cast<int>(buffer.numel());
    if (recv)
      PIPELINE_MPI_CHECK(
          MPI_Irecv(p.buffer.raw(), count, MPI_FLOAT, member, m_tag, m_comm, &p.request));
    else
      PIPELINE_MPI_CHECK(
          MPI_Isend(p.buffer.raw(), count, MPI_FLOAT, member, m_tag, m_comm, &p.request));
    m_pending.push_back(std::move(p));
  }

  // Tests every message of the phase; true once all are complete.
  bool test_pending() {
    bool all = true;
    for (Pending& p : m_pending) {
      if (p.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&p.request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        p.request = MPI_REQUEST_NULL;
        int cls = 0;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE)
          throw Error(fmt::format(
              "{}rank {}: {}: rank {} sent more than the {} floats this rank expects; every "
              "member must pass the same shapes",
              rank_prefix(), m_me, what(), m_ranks[static_cast<std::size_t>(p.member)],
              p.buffer.numel()));
        throw MpiError(fmt::format(
            "{}rank {} ({}): {} failed with {}: rank {} may have died or lost its connection; "
            "find its own error, or the rank mpirun names, in the job's output",
            rank_prefix(), m_me, host_and_pid(), what(), mpi_error_string(rc),
            m_ranks[static_cast<std::size_t>(p.member)]));
      }
      if (!flag) {
        all = false;
        continue;
      }
      if (p.recv) {
        int count = 0;
        PIPELINE_MPI_CHECK(MPI_Get_count(&status, MPI_FLOAT, &count));
        PIPELINE_CHECK(count == p.buffer.numel(),
                       "rank {}: {}: rank {} passed {} floats where this rank has {}; every "
                       "member must pass the same shapes",
                       m_me, what(), m_ranks[static_cast<std::size_t>(p.member)], count,
                       p.buffer.numel());
      }
    }
    return all;
  }

  // Splits the call's tensors into messages: a large tensor goes as itself and is reduced in
  // place; runs of small ones are packed into one message each, so that a bucket of many biases
  // is not many tiny messages and a bucket of large weights is not copied twice.
  void make_parts() {
    constexpr std::size_t kInPlaceBytes = std::size_t{256} << 10;
    const auto add = [&](std::size_t begin, std::size_t end) {
      if (begin == end) return;
      Part part;
      part.first = begin;
      part.count = end - begin;
      if (part.count == 1) {
        part.buffer = m_tensors[begin];
      } else {
        std::int64_t floats = 0;
        for (std::size_t i = begin; i < end; ++i) floats += m_tensors[i].numel();
        part.buffer = Tensor::empty(Shape{floats});
        float* b = part.buffer.data<float>();
        for (std::size_t i = begin; i < end; ++i) {
          std::memcpy(b, m_tensors[i].raw(), m_tensors[i].nbytes());
          b += m_tensors[i].numel();
        }
      }
      m_parts.push_back(std::move(part));
    };
    std::size_t run = 0;  // the first tensor of the run of small ones in progress
    for (std::size_t i = 0; i < m_tensors.size(); ++i)
      if (m_tensors[i].nbytes() >= kInPlaceBytes) {
        add(run, i);
        add(i, i + 1);
        run = i + 1;
      }
    add(run, m_tensors.size());
  }

  // out[k] = ((x0[k] + x1[k]) + x2[k]) + ..., this member's own data standing as its x, in
  // blocks that stay in the cache; part by part.
  void sum_in_group_order() {
    const int n = static_cast<int>(m_ranks.size());
    std::vector<const float*> x(static_cast<std::size_t>(n));
    constexpr int kBlock = 4096;
    float acc[kBlock];
    for (Part& part : m_parts) {
      for (int m = 0; m < n; ++m)
        x[static_cast<std::size_t>(m)] =
            m == m_index ? part.buffer.data<float>()
                         : part.others[static_cast<std::size_t>(m)].data<float>();
      float* out = part.buffer.data<float>();
      const std::int64_t count = part.buffer.numel();
      for (std::int64_t b = 0; b < count; b += kBlock) {
        const int len = static_cast<int>(std::min<std::int64_t>(kBlock, count - b));
        std::memcpy(acc, x[0] + b, static_cast<std::size_t>(len) * sizeof(float));
        for (int m = 1; m < n; ++m) {
          const float* xm = x[static_cast<std::size_t>(m)] + b;
          for (int k = 0; k < len; ++k) acc[k] += xm[k];
        }
        std::memcpy(out + b, acc, static_cast<std::size_t>(len) * sizeof(float));
      }
      part.others.clear();  // back to the allocator's cache
    }
  }

  std::string what() const {
    return fmt::format(
        "allreduce_sum of {} floats over ranks [{}] ({})", m_count, fmt::join(m_ranks, ", "),
        m_phase == Phase::Gather
            ? (m_direct ? "exchange among the members" : "gather to the group's first rank")
            : "broadcast of the sum");
  }

  std::shared_ptr<MpiShared> m_shared;
  std::shared_ptr<WaitSettings> m_settings;
  MPI_Comm m_comm;
  int m_tag;
  // One message's data: tensor `first` in place (count 1), or tensors [first, first + count)
  // packed.
  struct Part {
    Tensor buffer;
    std::size_t first = 0;
    std::size_t count = 1;
    std::vector<Tensor> others;  // the other members' data, by group index
  };
  std::vector<Tensor> m_tensors;
  std::vector<Part> m_parts;
  int m_count;
  int m_index;
  std::vector<int> m_ranks;
  int m_me;
  bool m_direct;
  Phase m_phase = Phase::Gather;
  bool m_unpacked = false;
  std::vector<Pending> m_pending;
};

// Stage capacity of the tag codec when the caller does not choose: up to 1024 stages, as many
// as leave a microbatch window of kMinMicrobatchWindow under tag_ub, at least `size`.
int default_max_stages(std::int64_t tag_ub, int size) {
  int value_bits = std::bit_width(static_cast<std::uint64_t>(tag_ub + 1)) - 1;
  int window_bits = std::bit_width(static_cast<std::uint64_t>(kMinMicrobatchWindow)) - 1;
  int stage_bits = std::min(10, value_bits - kTagKindBits - window_bits);
  int needed = std::bit_width(static_cast<std::uint32_t>(std::max(size, 1) - 1));
  return 1 << std::max(stage_bits, needed);
}

// Group creation tag: equal on all members, different for different member lists.
int group_tag(const std::vector<int>& ranks) {
  std::uint32_t h = 2166136261u;
  for (int r : ranks) h = (h ^ static_cast<std::uint32_t>(r)) * 16777619u;
  return static_cast<int>(h % 32768u);
}

// Device staging: MPI moves host memory, so a device tensor travels as a host copy. A send
// copies to the host first (the copy completes before MPI sees the buffer, and runs on the
// caller's current stream, after the work that wrote the tensor); a receive or an allreduce
// works on host copies and, when its request completes, copies them back to the device tensors
// on the stream of the thread that completed it (the rank's own).
class StagedRequest final : public RequestImpl {
 public:
  StagedRequest(Request inner, std::vector<Tensor> host, std::vector<Tensor> device)
      : m_inner(std::move(inner)), m_host(std::move(host)), m_device(std::move(device)) {}

  bool test() override {
    if (!m_inner.test()) return false;
    copy_back();
    return true;
  }
  void wait() override {
    m_inner.wait();
    copy_back();
  }

 private:
  void copy_back() {
    for (std::size_t i = 0; i < m_device.size(); ++i) m_device[i].copy_from(m_host[i]);
    m_device.clear();
  }

  Request m_inner;
  std::vector<Tensor> m_host;
  std::vector<Tensor> m_device;
};

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------------------

MpiSession::MpiSession(int* argc, char*** argv, MpiThreadLevel required) {
  int initialized = 0;
  PIPELINE_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    PIPELINE_MPI_CHECK(MPI_Init_thread(argc, argv, detail::to_mpi_level(required), &provided));
    m_owns = true;
  } else {
    PIPELINE_MPI_CHECK(MPI_Query_thread(&provided));
  }
  m_provided = detail::from_mpi_level(provided);
  PIPELINE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &m_rank));
  PIPELINE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &m_size));
  detail::current_rank() = m_rank;
  if (m_provided < required) {
    std::string message = fmt::format(
        "MPI provides thread support {} but {} is needed: use an MPI library built with thread "
        "support",
        detail::level_name(m_provided), detail::level_name(required));
    if (m_owns) MPI_Finalize();
    PIPELINE_FAIL(MpiError, "{}", message);
  }
}

MpiSession::~MpiSession() {
  if (m_owns && !detail::mpi_finalized()) MPI_Finalize();
}

// ---------------------------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int max_stages)
    : m_shared(std::make_shared<detail::MpiShared>()) {
  int initialized = 0;
  PIPELINE_MPI_CHECK(MPI_Initialized(&initialized));
  PIPELINE_CHECK(initialized && !detail::mpi_finalized(),
                 "MpiCommunicator: MPI is not initialised (create a pipeline::MpiSession first)");
  PIPELINE_MPI_CHECK(MPI_Comm_dup(comm, &m_shared->comm));
  PIPELINE_MPI_CHECK(MPI_Comm_set_errhandler(m_shared->comm, MPI_ERRORS_RETURN));
  PIPELINE_MPI_CHECK(MPI_Comm_rank(m_shared->comm, &m_rank));
  PIPELINE_MPI_CHECK(MPI_Comm_size(m_shared->comm, &m_size));

  void* value = nullptr;
  int found = 0;
  PIPELINE_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found));
  std::int64_t tag_ub = found ? *static_cast<int*>(value) : 32767;
  m_codec =
      TagCodec(tag_ub, max_stages > 0 ? max_stages : detail::default_max_stages(tag_ub, m_size));

  std::vector<int> all(static_cast<std::size_t>(m_size));
  for (int r = 0; r < m_size; ++r) all[static_cast<std::size_t>(r)] = r;
  // The world group's allreduce messages get a communicator of their own, apart from the
  // point-to-point traffic whose tags fill the library communicator's tag space.
  MPI_Comm world_group = MPI_COMM_NULL;
  PIPELINE_MPI_CHECK(MPI_Comm_dup(m_shared->comm, &world_group));
  PIPELINE_MPI_CHECK(MPI_Comm_set_errhandler(world_group, MPI_ERRORS_RETURN));
  m_world = Group(std::move(all), m_rank, this, std::make_shared<detail::MpiGroup>(world_group));
}

MpiCommunicator::~MpiCommunicator() = default;

MPI_Comm MpiCommunicator::handle() const {
  return m_shared->comm;
}

Request MpiCommunicator::isend(const Tensor& tensor, int peer, Tag tag) {
  check_p2p(tensor, peer, tag, "isend");
  if (!tensor.device().is_cpu()) return isend(tensor.to(Device::cpu()), peer, tag);  // staged
  int count = detail::mpi_count(tensor.numel(), "isend");
  int mpi_tag = m_codec.encode(tag);
  m_shared->sweep();
  MPI_Request request = MPI_REQUEST_NULL;
  PIPELINE_MPI_CHECK(MPI_Isend(tensor.raw(), count, detail::mpi_type(tensor.dtype()), peer, mpi_tag,
                               m_shared->comm, &request));
  return Request(std::make_unique<detail::MpiP2pRequest>(m_shared, wait_settings(), request, tensor,
                                                         false, m_rank, peer, tag));
}

Request MpiCommunicator::irecv(Tensor& into, int peer, Tag tag) {
  check_p2p(into, peer, tag, "irecv");
  if (!into.device().is_cpu()) {  // staged: received on the host, copied over on completion
    Tensor host = Tensor::empty(into.shape(), into.dtype(), Device::cpu());
    Request inner = irecv(host, peer, tag);
    return Request(std::make_unique<detail::StagedRequest>(
        std::move(inner), std::vector<Tensor>{host}, std::vector<Tensor>{into}));
  }
  int count = detail::mpi_count(into.numel(), "irecv");
  int mpi_tag = m_codec.encode(tag);
  m_shared->sweep();
  MPI_Request request = MPI_REQUEST_NULL;
  PIPELINE_MPI_CHECK(MPI_Irecv(into.raw(), count, detail::mpi_type(into.dtype()), peer, mpi_tag,
                               m_shared->comm, &request));
  return Request(std::make_unique<detail::MpiP2pRequest>(m_shared, wait_settings(), request, into,
                                                         true, m_rank, peer, tag));
}

Group MpiCommunicator::create_group(std::vector<int> ranks) {
  int index = check_new_group(ranks);
  if (ranks.size() == 1) return Group(std::move(ranks), index, this, nullptr);
  MPI_Group all = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  PIPELINE_MPI_CHECK(MPI_Comm_group(m_shared->comm, &all));
  PIPELINE_MPI_CHECK(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &members));
  MPI_Comm sub = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(m_shared->comm, members, detail::group_tag(ranks), &sub);
  MPI_Group_free(&members);
  MPI_Group_free(&all);
  PIPELINE_MPI_CHECK(rc);
  auto impl = std::make_shared<detail::MpiGroup>(sub);
  PIPELINE_MPI_CHECK(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
  return Group(std::move(ranks), index, this, std::move(impl));
}

Request MpiCommunicator::iallreduce_sum(std::span<Tensor> tensors, const Group& group) {
  check_group(group, "allreduce_sum");
  std::int64_t total = 0;
  bool staged = false;
  for (const Tensor& t : tensors) {
    PIPELINE_CHECK(t.defined() && t.dtype() == DType::Float32,
                   "allreduce_sum: tensors must be defined float32 tensors, got {} on {}",
                   dtype_name(t.dtype()), t.device().str());
    total += t.numel();
    staged = staged || !t.device().is_cpu();
  }
  if (staged && group.size() > 1) {
    std::vector<Tensor> host, staged_host, device;
    for (const Tensor& t : tensors) {
      host.push_back(t.to(Device::cpu()));  // a CPU tensor is itself: reduced in place
      if (t.device().is_cpu()) continue;
      staged_host.push_back(host.back());
      device.push_back(t);
    }
    Request inner = iallreduce_sum(std::span<Tensor>(host), group);
    return Request(std::make_unique<detail::StagedRequest>(std::move(inner), std::move(staged_host),
                                                           std::move(device)));
  }
  if (group.size() == 1 || tensors.empty()) return Request();
  detail::mpi_count(total, "allreduce_sum");
  auto* g = dynamic_cast<detail::MpiGroup*>(group.impl());
  PIPELINE_CHECK(g != nullptr, "allreduce_sum: the group has no MPI communicator");
  m_shared->sweep();
  return Request(std::make_unique<detail::MpiAllreduceRequest>(
      m_shared, wait_settings(), g->comm(), g->next_tag(),
      std::vector<Tensor>(tensors.begin(), tensors.end()), total, group.index(), group.ranks(),
      m_rank, group.size() <= m_direct_limit));
}

void MpiCommunicator::set_allreduce_direct_limit(int members) {
  PIPELINE_CHECK_AS(ConfigError, members >= 1,
                    "allreduce direct limit {}: must be at least 1 member", members);
  m_direct_limit = members;
}

void MpiCommunicator::barrier() {
  auto t0 = detail::Clock::now();
  MPI_Request request = MPI_REQUEST_NULL;
  PIPELINE_MPI_CHECK(MPI_Ibarrier(m_shared->comm, &request));
  const detail::WaitNote note([&] { return fmt::format("a barrier of all {} ranks", m_size); },
                              *wait_settings());
  bool done = detail::poll_until(
      [&] {
        int flag = 0;
        PIPELINE_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
        return flag != 0;
      },
      timeout(), detail::PollMode::Spin);
  if (!done)
    detail::throw_timeout(*wait_settings(), m_rank,
                          fmt::format("a barrier of all {} ranks", m_size),
                          detail::seconds_since(t0));
}

void MpiCommunicator::abort(const std::string& reason) {
  detail::note_aborting();
  log(LogLevel::Error, "{}: aborting the job on every rank: {}", detail::host_and_pid(), reason);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

}  // namespace pipeline
