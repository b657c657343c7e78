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

// A sent tensor not yet copied into its receive: a copy the sender made, and for a device
// tensor the mark (an event on the sender's stream) after which the copy is complete.
struct Message {
  Tensor tensor;
  std::shared_ptr<void> ready;
};

// A posted receive waiting for its message. CPU messages are copied into `into` by the sender;
// a message that involves a device is handed over in `message` and copied by the receiver, on
// its own stream, when it tests or waits (deliver()).
struct PendingRecv {
  Tensor into;
  bool done = false;
  std::string error;  // set when the message did not fit `into`
  Message message;
};

// Messages and receives of one (destination, source, tag).
struct Channel {
  std::deque<Message> messages;
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
// allreduces of gradient buckets), each member filling them in its own call order. Device
// tensors: each member's arrival marks its stream (arrived_marks), the last member's stream
// waits for those marks, sums and copies, and marks `summed`, which every member's stream waits
// for when its Request completes.
struct Round {
  int arrived = 0;
  bool done = false;
  std::vector<std::vector<Tensor>> slots;
  std::vector<std::shared_ptr<void>> arrived_marks;
  std::shared_ptr<void> summed;
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

// The copy a message is sent as: for a device tensor queued on the sender's stream and marked.
Message make_message(const Tensor& t) {
  Message m{t.clone(), nullptr};
  if (t.device().is_cuda()) m.ready = device_functions(t.device()).mark(t.device().index);
  return m;
}

// The device whose current stream a copy between `a` and `b` runs on (core/allocator.hpp).
Device copy_device(const Tensor& dst, const Tensor& src) {
  return dst.device().is_cuda() ? dst.device() : src.device();
}

// Copies `msg` into `into` on the calling thread's stream once the sender's copy is done, and
// keeps the message's block from reuse until then. A copy that involves the CPU or two GPUs
// completes before it returns (core/allocator.hpp), so only a same-device copy needs the latter.
void deliver(const Message& msg, Tensor& into) {
  const Device d = copy_device(into, msg.tensor);
  if (msg.ready) device_functions(d).wait_for(msg.ready, d.index);
  into.copy_from(msg.tensor);
  if (d.is_cuda() && msg.tensor.device() == d)
    device_functions(d).used_here(msg.tensor.storage_id(), d.index);
}

bool involves_device(const Tensor& a, const Tensor& b) {
  return a.device().is_cuda() || b.device().is_cuda();
}

// The last member's part of a round of device tensors, on its own stream of `device` (its
// tensors' GPU): wait for every member's arrival mark, sum in group order into a new tensor,
// copy the sum into every member's tensors, and mark the end. Members' tensors on other GPUs
// are copied over, and the sum back through the host (copies that complete before they return).
void sum_on_device(Round& round, Device device) {
  const DeviceAllocator& f = device_functions(device);
  for (const auto& m : round.arrived_marks) f.wait_for(m, device.index);
  auto use = [&](const Tensor& t) {
    if (t.device() == device) f.used_here(t.storage_id(), device.index);
  };
  for (std::size_t i = 0; i < round.slots[0].size(); ++i) {
    Tensor sum = Tensor::empty(round.slots[0][i].shape(), DType::Float32, device);
    sum.copy_from(round.slots[0][i]);
    use(round.slots[0][i]);
    for (std::size_t m = 1; m < round.slots.size(); ++m) {
      const Tensor x = round.slots[m][i].to(device);
      f.add(sum.device_data<float>(), x.device_data<float>(), device.index,
            static_cast<std::size_t>(sum.numel()));
      use(round.slots[m][i]);
    }
    Tensor host_sum;  // for members on other GPUs
    for (std::size_t m = 0; m < round.slots.size(); ++m) {
      Tensor& t = round.slots[m][i];
      if (t.device() == device) {
        t.copy_from(sum);
        use(t);
        continue;
      }
      if (!host_sum.defined()) host_sum = sum.to(Device::cpu());
      f.wait_for(round.arrived_marks[m], t.device().index);
      t.copy_from(host_sum);
    }
  }
  round.summed = f.mark(device.index);
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
    bool ready = m_hub->cv.wait_until(lock, detail::deadline_after(m_settings->timeout_s),
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
  // Caller holds the hub's mutex.
  bool finish() {
    if (!m_pending->error.empty()) throw Error(m_pending->error);
    if (m_pending->message.tensor.defined()) {
      deliver(m_pending->message, m_pending->into);
      m_pending->message = {};
    }
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
                         std::shared_ptr<Round> round, Device device, int me, std::string what,
                         int members)
      : m_hub(std::move(hub)),
        m_settings(std::move(settings)),
        m_round(std::move(round)),
        m_device(device),
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
    bool ready = m_hub->cv.wait_until(lock, detail::deadline_after(m_settings->timeout_s),
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
  // Caller holds the hub's mutex.
  bool finish() {
    if (!m_round->error.empty()) throw Error(m_round->error);
    if (m_round->summed && m_device.is_cuda())
      device_functions(m_device).wait_for(m_round->summed, m_device.index);
    return true;
  }

  std::shared_ptr<LocalHubState> m_hub;
  std::shared_ptr<WaitSettings> m_settings;
  std::shared_ptr<Round> m_round;
  Device m_device;  // of the member's tensors (the CPU for none)
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
  std::unique_lock lock(m_hub->mu);
  m_hub->check_not_aborted(m_rank);
  auto& ch = m_hub->channel(peer, m_rank, tag);
  if (!ch.receives.empty()) {
    // Deliver to the oldest posted receive: receives match in posting order. CPU to CPU copies
    // straight into it; a device is involved, the receiver copies on its own stream.
    auto pending = std::move(ch.receives.front());
    ch.receives.pop_front();
    pending->error = detail::mismatch(tensor, pending->into, peer, m_rank, tag);
    if (pending->error.empty()) {
      if (detail::involves_device(tensor, pending->into))
        pending->message = detail::make_message(tensor);
      else
        pending->into.copy_from(tensor);
    }
    pending->done = true;
    m_hub->drop_if_empty(peer, m_rank, tag);
    lock.unlock();
    m_hub->cv.notify_all();
  } else {
    ch.messages.push_back(detail::make_message(tensor));
  }
  return Request();
}

Request LocalCommunicator::irecv(Tensor& into, int peer, Tag tag) {
  check_p2p(into, peer, tag, "irecv");
  std::lock_guard lock(m_hub->mu);
  m_hub->check_not_aborted(m_rank);
  auto& ch = m_hub->channel(m_rank, peer, tag);
  if (ch.receives.empty() && !ch.messages.empty()) {
    detail::Message msg = std::move(ch.messages.front());
    ch.messages.pop_front();
    m_hub->drop_if_empty(m_rank, peer, tag);
    std::string error = detail::mismatch(msg.tensor, into, m_rank, peer, tag);
    if (!error.empty()) throw Error(error);
    detail::deliver(msg, into);
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
  const Device device = tensors.empty() ? Device::cpu() : tensors[0].device();
  for (const Tensor& t : tensors)
    PIPELINE_CHECK(t.defined() && t.dtype() == DType::Float32 && t.device().kind == device.kind,
                   "{}: tensors must be defined float32 tensors all on the CPU or all on GPUs, "
                   "got {} on {} beside {}",
                   op, dtype_name(t.dtype()), t.device().str(), device.str());
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
  if (device.is_cuda()) {
    round->arrived_marks.resize(static_cast<std::size_t>(n));
    round->arrived_marks[static_cast<std::size_t>(group.index())] =
        device_functions(device).mark(device.index);
  }
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
    if (round->error.empty() && device.is_cuda()) {
      detail::sum_on_device(*round, device);
    } else if (round->error.empty()) {
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
      m_hub, wait_settings(), std::move(round), device, m_rank,
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
