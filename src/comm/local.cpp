// In-process communicator: mailboxes and collectives under one mutex per hub.
//
// One mutex and one condition variable serve the whole hub: the ranks of a test or of stages
// sharing a device are few, and the messages large, so contention on the lock is not what
// limits throughput, while a single lock makes matching, aborting and timing out easy to get
// right.
#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/log.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace pipeline {
namespace detail {

namespace {

// A posted receive waiting for its message.
struct PendingRecv {
  Tensor into;
  bool done = false;
  std::string error;  // set when the message did not fit `into`
};

// Messages and receives of one (destination, source, tag).
struct Channel {
  std::deque<Tensor> messages;
  std::deque<std::shared_ptr<PendingRecv>> receives;
};

struct ChannelKey {
  int dst;
  int src;
  TagKind kind;
  std::int32_t stage;
  std::int32_t microbatch;
  bool operator<(const ChannelKey& o) const {
    return std::tie(dst, src, kind, stage, microbatch) <
           std::tie(o.dst, o.src, o.kind, o.stage, o.microbatch);
  }
};

// One collective call of a group (the n-th allreduce or barrier every member makes on it):
// members arrive with their tensors; the last to arrive sums them in group order and writes the
// sum into every member's tensors. Several rounds of a group may be open at once (non-blocking
// allreduces of gradient buckets), each member filling them in its own call order.
struct Round {
  int arrived = 0;
  bool done = false;
  std::vector<std::vector<Tensor>> slots;
  std::string error;
};

// A group's open rounds by call number, and every member's next call number.
struct Collective {
  std::vector<std::uint64_t> next;
  std::map<std::uint64_t, std::shared_ptr<Round>> rounds;
};

std::string describe_tensor(const Tensor& t) {
  return fmt::format("{} {} elements (shape {})", t.numel(), dtype_name(t.dtype()),
                     t.shape().str());
}

// Error text when `msg` cannot be received into `into`, empty when it fits.
std::string mismatch(const Tensor& msg, const Tensor& into, int me, int src, const Tag& tag) {
  if (msg.numel() == into.numel() && msg.dtype() == into.dtype()) return {};
  return fmt::format(
      "rank {}: the message {} from rank {} holds {} but the receive tensor holds {}; sender "
      "and receiver must agree on the tensor's size and type",
      me, tag.str(), src, describe_tensor(msg), describe_tensor(into));
}

}  // namespace

struct LocalHubState {
  explicit LocalHubState(int n) : size(n) {}

  int size;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  int abort_rank = -1;
  std::string abort_reason;
  std::map<ChannelKey, Channel> channels;
  std::map<std::vector<int>, Collective> collectives;

  // Caller holds mu.
  [[noreturn]] void throw_aborted(int me) const {
    throw CommAbortedError(
        fmt::format("rank {}: the job was aborted by rank {}: {}", me, abort_rank, abort_reason));
  }
  void check_not_aborted(int me) const {
    if (aborted) throw_aborted(me);
  }

  Channel& channel(int dst, int src, const Tag& t) {
    return channels[ChannelKey{dst, src, t.kind, t.stage, t.microbatch}];
  }
  void drop_if_empty(int dst, int src, const Tag& t) {
    auto it = channels.find(ChannelKey{dst, src, t.kind, t.stage, t.microbatch});
    if (it != channels.end() && it->second.messages.empty() && it->second.receives.empty())
      channels.erase(it);
  }
};

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class LocalRecvRequest final : public RequestImpl {
 public:
  LocalRecvRequest(std::shared_ptr<LocalHubState> hub, std::shared_ptr<WaitSettings> settings,
                   std::shared_ptr<PendingRecv> pending, int me, int peer, Tag tag)
      : m_hub(std::move(hub)),
        m_settings(std::move(settings)),
        m_pending(std::move(pending)),
        m_me(me),
        m_peer(peer),
        m_tag(tag) {}

  ~LocalRecvRequest() override {
    // A receive abandoned before its message arrived must not be filled later.
    std::lock_guard lock(m_hub->mu);
    if (!m_pending->done) unlink();
  }

  bool test() override {
    std::lock_guard lock(m_hub->mu);
    if (m_pending->done) return finish();
    m_hub->check_not_aborted(m_me);
    return false;
  }

  void wait() override {
    auto t0 = Clock::now();
    std::unique_lock lock(m_hub->mu);
    bool ready = m_hub->cv.wait_until(lock, deadline_after(m_settings->timeout_s),
                                      [&] { return m_pending->done || m_hub->aborted; });
    if (m_pending->done) {
      finish();
      return;
    }
    if (ready) m_hub->throw_aborted(m_me);
    unlink();
    m_pending->done = true;  // so the destructor does not unlink twice
    lock.unlock();
    throw_timeout(*m_settings, m_me,
                  fmt::format("a receive of {} from rank {}", m_tag.str(), m_peer),
                  seconds_since(t0));
  }

 private:
  bool finish() {
    if (!m_pending->error.empty()) throw Error(m_pending->error);
    return true;
  }
  // Caller holds the hub's mutex.
  void unlink() {
    auto& q = m_hub->channel(m_me, m_peer, m_tag).receives;
    q.erase(std::remove(q.begin(), q.end(), m_pending), q.end());
    m_hub->drop_if_empty(m_me, m_peer, m_tag);
  }

  std::shared_ptr<LocalHubState> m_hub;
  std::shared_ptr<WaitSettings> m_settings;
  std::shared_ptr<PendingRecv> m_pending;
  int m_me;
  int m_peer;
  Tag m_tag;
};

// A member's part in one round of a group's collective.
class LocalCollectiveRequest final : public RequestImpl {
 public:
  LocalCollectiveRequest(std::shared_ptr<LocalHubState> hub, std::shared_ptr<WaitSettings> settings,
                         std::shared_ptr<Round> round, int me, std::string what, int members)
      : m_hub(std::move(hub)),
        m_settings(std::move(settings)),
        m_round(std::move(round)),
        m_me(me),
        m_what(std::move(what)),
        m_members(members) {}

  // A round left before it completed keeps this member's tensors (and their storage) and fills
  // them when the others arrive; nothing to undo.
  ~LocalCollectiveRequest() override = default;

  bool test() override {
    std::lock_guard lock(m_hub->mu);
    if (m_round->done) return finish();
    m_hub->check_not_aborted(m_me);
    return false;
  }

  void wait() override {
    auto t0 = Clock::now();
    std::unique_lock lock(m_hub->mu);
    bool ready = m_hub->cv.wait_until(lock, deadline_after(m_settings->timeout_s),
                                      [&] { return m_round->done || m_hub->aborted; });
    if (m_round->done) {
      finish();
      return;
    }
    if (ready) m_hub->throw_aborted(m_me);
    const int arrived = m_round->arrived;
    lock.unlock();
    throw_timeout(*m_settings, m_me,
                  fmt::format("{} ({} of {} members arrived)", m_what, arrived, m_members),
                  seconds_since(t0));
  }

 private:
  bool finish() {
    if (!m_round->error.empty()) throw Error(m_round->error);
    return true;
  }

  std::shared_ptr<LocalHubState> m_hub;
  std::shared_ptr<WaitSettings> m_settings;
  std::shared_ptr<Round> m_round;
  int m_me;
  std::string m_what;
  int m_members;
};

}  // namespace
}  // namespace detail

LocalHub::LocalHub(int size) {
  PIPELINE_CHECK_AS(ConfigError, size >= 1, "LocalHub: size {} must be >= 1", size);
  m_state = std::make_shared<detail::LocalHubState>(size);
}

int LocalHub::size() const {
  return m_state->size;
}

std::unique_ptr<LocalCommunicator> LocalHub::endpoint(int rank) {
  PIPELINE_CHECK_AS(ConfigError, rank >= 0 && rank < m_state->size,
                    "LocalHub::endpoint: rank {} out of range [0, {})", rank, m_state->size);
  return std::make_unique<LocalCommunicator>(m_state, rank);
}

void LocalHub::abort(int by_rank, const std::string& reason) {
  {
    std::lock_guard lock(m_state->mu);
    if (m_state->aborted) return;
    m_state->aborted = true;
    m_state->abort_rank = by_rank;
    m_state->abort_reason = reason;
  }
  m_state->cv.notify_all();
}

bool LocalHub::aborted() const {
  std::lock_guard lock(m_state->mu);
  return m_state->aborted;
}

LocalCommunicator::LocalCommunicator(std::shared_ptr<detail::LocalHubState> hub, int rank)
    : m_hub(std::move(hub)), m_rank(rank) {
  std::vector<int> all(static_cast<std::size_t>(m_hub->size));
  for (int r = 0; r < m_hub->size; ++r) all[static_cast<std::size_t>(r)] = r;
  m_world = Group(std::move(all), rank, this, nullptr);
}

LocalCommunicator::~LocalCommunicator() = default;

int LocalCommunicator::size() const {
  return m_hub->size;
}

Request LocalCommunicator::isend(const Tensor& tensor, int peer, Tag tag) {
  check_p2p(tensor, peer, tag, "isend");
  PIPELINE_CHECK(tensor.device().is_cpu(),
                 "isend of {} to rank {}: the in-process communicator moves CPU tensors only, "
                 "this one is on {}",
                 tag.str(), peer, tensor.device().str());
  std::unique_lock lock(m_hub->mu);
  m_hub->check_not_aborted(m_rank);
  auto& ch = m_hub->channel(peer, m_rank, tag);
  if (!ch.receives.empty()) {
    // Deliver straight into the oldest posted receive: receives match in posting order.
    auto pending = std::move(ch.receives.front());
    ch.receives.pop_front();
    pending->error = detail::mismatch(tensor, pending->into, peer, m_rank, tag);
    if (pending->error.empty()) pending->into.copy_from(tensor);
    pending->done = true;
    m_hub->drop_if_empty(peer, m_rank, tag);
    lock.unlock();
    m_hub->cv.notify_all();
  } else {
    ch.messages.push_back(tensor.clone());
  }
  return Request();
}

Request LocalCommunicator::irecv(Tensor& into, int peer, Tag tag) {
  check_p2p(into, peer, tag, "irecv");
  PIPELINE_CHECK(into.device().is_cpu(),
                 "irecv of {} from rank {}: the in-process communicator moves CPU tensors only, "
                 "this one is on {}",
                 tag.str(), peer, into.device().str());
  std::lock_guard lock(m_hub->mu);
  m_hub->check_not_aborted(m_rank);
  auto& ch = m_hub->channel(m_rank, peer, tag);
  if (ch.receives.empty() && !ch.messages.empty()) {
    Tensor msg = std::move(ch.messages.front());
    ch.messages.pop_front();
    m_hub->drop_if_empty(m_rank, peer, tag);
    std::string error = detail::mismatch(msg, into, m_rank, peer, tag);
    if (!error.empty()) throw Error(error);
    into.copy_from(msg);
    return Request();
  }
  auto pending = std::make_shared<detail::PendingRecv>();
  pending->into = into;
  ch.receives.push_back(pending);
  return Request(std::make_unique<detail::LocalRecvRequest>(m_hub, wait_settings(), pending, m_rank,
                                                            peer, tag));
}

Group LocalCommunicator::create_group(std::vector<int> ranks) {
  int index = check_new_group(ranks);
  return Group(std::move(ranks), index, this, nullptr);
}

Request LocalCommunicator::iallreduce_sum(std::span<Tensor> tensors, const Group& group) {
  return join_round(tensors, group, "allreduce_sum");
}

void LocalCommunicator::barrier() {
  join_round(std::span<Tensor>(), m_world, "barrier").wait();
}

Request LocalCommunicator::join_round(std::span<Tensor> tensors, const Group& group,
                                      std::string_view op) {
  check_group(group, op);
  for (const Tensor& t : tensors)
    PIPELINE_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == DType::Float32,
                   "{}: tensors must be defined float32 CPU tensors, got {} on {}", op,
                   dtype_name(t.dtype()), t.device().str());
  const int n = group.size();
  std::unique_lock lock(m_hub->mu);
  m_hub->check_not_aborted(m_rank);
  auto& c = m_hub->collectives[group.ranks()];
  if (c.next.size() != static_cast<std::size_t>(n)) c.next.resize(static_cast<std::size_t>(n), 0);
  const std::uint64_t call = c.next[static_cast<std::size_t>(group.index())]++;
  auto& slot = c.rounds[call];
  if (!slot) {
    slot = std::make_shared<detail::Round>();
    slot->slots.resize(static_cast<std::size_t>(n));
  }
  std::shared_ptr<detail::Round> round = slot;
  round->slots[static_cast<std::size_t>(group.index())].assign(tensors.begin(), tensors.end());
  if (++round->arrived == n) {
    // Last to arrive: check that the members agree, then sum in group order and hand the one
    // result to everyone, so all members hold the same bits.
    const auto& first = round->slots[0];
    for (int m = 1; m < n && round->error.empty(); ++m) {
      const auto& other = round->slots[static_cast<std::size_t>(m)];
      bool same = other.size() == first.size();
      for (std::size_t i = 0; same && i < first.size(); ++i)
        same = other[i].numel() == first[i].numel();
      if (!same)
        round->error = fmt::format(
            "{} over ranks [{}]: rank {} passed {} tensors and rank {} passed {}, or their "
            "element counts differ; every member must pass the same shapes",
            op, fmt::join(group.ranks(), ", "), group.ranks()[0], first.size(),
            group.ranks()[static_cast<std::size_t>(m)], other.size());
    }
    if (round->error.empty()) {
      for (std::size_t i = 0; i < first.size(); ++i) {
        Tensor sum = first[i].clone();
        float* s = sum.data<float>();
        const std::int64_t count = sum.numel();
        for (int m = 1; m < n; ++m) {
          const float* x = round->slots[static_cast<std::size_t>(m)][i].data<float>();
          for (std::int64_t k = 0; k < count; ++k) s[k] += x[k];
        }
        for (int m = 0; m < n; ++m) round->slots[static_cast<std::size_t>(m)][i].copy_from(sum);
      }
    }
    for (auto& s : round->slots) s.clear();
    round->done = true;
    c.rounds.erase(call);
    lock.unlock();
    m_hub->cv.notify_all();
  }
  return Request(std::make_unique<detail::LocalCollectiveRequest>(
      m_hub, wait_settings(), std::move(round), m_rank,
      fmt::format("{} over ranks [{}]", op, fmt::join(group.ranks(), ", ")), n));
}

void LocalCommunicator::abort(const std::string& reason) {
  log(LogLevel::Error, "rank {} aborts the job: {}", m_rank, reason);
  {
    std::lock_guard lock(m_hub->mu);
    if (!m_hub->aborted) {
      m_hub->aborted = true;
      m_hub->abort_rank = m_rank;
      m_hub->abort_reason = reason;
    }
  }
  m_hub->cv.notify_all();
  throw CommAbortedError(fmt::format("rank {} aborted the job: {}", m_rank, reason));
}

void run_local(int size, const std::function<void(Communicator&)>& fn) {
  LocalHub hub(size);
  run_local(hub, fn);
}

void run_local(LocalHub& hub, const std::function<void(Communicator&)>& fn) {
  const int n = hub.size();
  std::vector<std::unique_ptr<LocalCommunicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(hub.endpoint(r));
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        hub.abort(r, fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        hub.abort(r, fmt::format("rank {} failed with a non-standard exception", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace pipeline
