// Dataflow execution of a schedule: timing, stash accounting and deadlock detection.
#include "engine.hpp"

#include <pipeline/core/rng.hpp>
#include <pipeline/schedule/validate.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <unordered_map>

namespace pipeline::detail {
namespace {

// A first-in first-out queue in one vector that keeps its capacity: the engine pushes and pops
// tens of millions of messages and in-flight records, and std::deque would allocate and free a
// block every few of them. Removal from the middle (a receive out of order) shifts the tail.
template <typename T>
class Fifo {
 public:
  using iterator = typename std::vector<T>::iterator;
  bool empty() const { return m_head == m_items.size(); }
  std::size_t size() const { return m_items.size() - m_head; }
  iterator begin() { return m_items.begin() + static_cast<std::ptrdiff_t>(m_head); }
  iterator end() { return m_items.end(); }
  T& front() { return m_items[m_head]; }
  T& back() { return m_items.back(); }
  const T& at(std::size_t i) const { return m_items[m_head + i]; }
  void push_back(const T& v) {
    if (m_head == m_items.size()) {
      m_items.clear();
      m_head = 0;
    } else if (m_head >= 64 && m_head * 2 >= m_items.size()) {
      m_items.erase(m_items.begin(), m_items.begin() + static_cast<std::ptrdiff_t>(m_head));
      m_head = 0;
    }
    m_items.push_back(v);
  }
  void pop_front() { ++m_head; }
  void erase(iterator it) {
    if (it == begin())
      pop_front();
    else
      m_items.erase(it);
  }

 private:
  std::vector<T> m_items;
  std::size_t m_head = 0;
};

struct Message {
  std::int32_t stage;  // the sender's stage
  std::int32_t unit;
  std::int32_t version;  // weight version the input stage used (vertical sync)
  std::int32_t flow;
  double arrival;
};

// Messages from one rank to another of one kind (activations or gradients), in the inbox of the
// receiver. A link carries one message at a time.
struct Channel {
  int src = 0;
  bool gradient = false;
  Fifo<Message> pending;
  double link_free = 0;
};

struct InFlight {
  std::int32_t stage;
  std::int32_t unit;
  std::int32_t version;
  bool input_grad_done;
};

// Weight versions of one stage held by one rank.
struct StageSlot {
  int stage = 0;
  int version = 0;    // optimizer steps taken so far
  int requested = 0;  // DoubleBuffered, vertical sync: the newest version a forward has used
  // Versions referenced by in-flight microbatches, as runs (version, count), oldest first.
  Fifo<std::pair<int, int>> runs;
  // A replica's gradient sets: rounds whose gradients are complete and await their allreduce,
  // and whether a backward of a round not yet complete has run since.
  int unreduced_rounds = 0;
  bool open_round = false;
};

struct RankState {
  std::size_t pc = 0;
  double clock = 0;
  double busy = 0;
  bool done = false;
  bool queued = false;
  bool at_allreduce = false;  // arrived at the allreduce at pc, waiting for the others
  // EngineCosts::global_norm_steps: the latest step number whose norm the rank has joined, and
  // whether it waits at the step at pc for the others.
  int norm_joined = -1;
  bool at_norm = false;
  int wait_channel = -1;      // blocked on a receive from this inbox channel
  std::vector<Channel> inbox;
  // (sender, kind) -> inbox position, once the inbox outgrows a scan: a stage after one with
  // hundreds of replicas hears from each of them, and a search per message made simulating
  // such a plan quadratic.
  std::unordered_map<std::int64_t, int> inbox_index;
  std::vector<StageSlot> slots;
  Fifo<InFlight> inflight;
  std::vector<std::pair<std::int64_t, int>> received_versions;  // (stage<<32|unit, version)
  std::int64_t activation_bytes = 0;
  int forwards_seen = 0;
  int window_open = 0, window_close = 0;  // the forwards that open and close its window
  // Overlapped allreduce: by action index, the allreduce round whose gradients the backward
  // there completes, or -1 (closing_backwards).
  std::vector<std::int32_t> closes;
  std::optional<Rng> jitter;  // with EngineCosts::jitter_cv > 0
  // Shared cores: the compute action at pc has had its job done, so advance() finishes it.
  bool resumed = false;
  double last_start = 0, last_length = 0;  // the span of the rank's latest compute action
};

// A compute action on the shared cores (EngineCosts::shared_cores): from `start` on, it runs at
// the speed the cores give it until `remaining` seconds of its own-core time are done.
struct Job {
  int rank;
  double start;
  double remaining;
  double work;
};

// One allreduce round of a stage: each replica's contribution, by replica index — the start and
// length of its closing backward when the allreduce overlaps the backward, its arrival at the AR
// (length 0) when it does not or the replica ran no backward of the round.
struct Round {
  std::size_t contributed = 0;
  std::size_t passed = 0;  // replicas whose AR has completed
  std::vector<double> start, length;
  double done = -1;  // when the allreduce ends, once every replica has contributed
};

// The rounds of a stage still open, from round number `first` on.
struct Group {
  int first = 0;
  std::deque<Round> rounds;
};

std::int64_t key(int stage, int unit) {
  return (static_cast<std::int64_t>(stage) << 32) | static_cast<std::uint32_t>(unit);
}

class Engine {
 public:
  Engine(const Schedule& s, const EngineCosts* costs, bool trace)
      : m_s(s),
        m_costs(costs),
        m_trace(trace),
        m_ranks(s.ranks.size()),
        m_groups(s.stage_ranks.size()) {
    m_result.ranks.resize(s.ranks.size());
    if (costs != nullptr && costs->jitter_cv > 0) {
      // Lognormal of mean 1 and coefficient of variation cv: sigma^2 = ln(1 + cv^2), mu =
      // -sigma^2/2.
      m_jitter_sigma = std::sqrt(std::log1p(costs->jitter_cv * costs->jitter_cv));
      for (std::size_t r = 0; r < s.ranks.size(); ++r)
        m_ranks[r].jitter.emplace(costs->jitter_seed, fmt::format("jitter.rank{}", r));
    }
    if (costs != nullptr && costs->shared_cores > 0) {
      // Cores in units of what one computing rank takes.
      const double slots = static_cast<double>(costs->shared_cores) /
                           static_cast<double>(std::max(1, costs->threads_per_rank));
      if (slots < static_cast<double>(s.ranks.size())) m_cores = slots;
    }
    m_steps.assign(s.ranks.size(), 0);
    for (std::size_t r = 0; costs != nullptr && costs->global_norm_steps && r < s.ranks.size();
         ++r) {
      m_steps[r] = std::any_of(s.ranks[r].begin(), s.ranks[r].end(),
                               [](const Action& a) { return a.kind == ActionKind::Step; });
      m_norm_ranks += m_steps[r] ? 1 : 0;
    }
    m_replica.assign(s.ranks.size(), 0);
    for (int st = 0; st < s.num_stages(); ++st)
      for (std::size_t i = 0; i < s.stage_ranks[st].size(); ++i) {
        const int r = s.stage_ranks[st][i];
        m_ranks[r].slots.push_back({st, 0, 0, {}, 0, false});
        // Replicated stages have a rank each; a rank of several stages is replica 0 of them.
        m_replica[static_cast<std::size_t>(r)] = static_cast<int>(i);
      }
    // The closing backwards (as the executor's): where overlapped allreduces start, and where a
    // replica's gradients of a round are complete, so that a backward after it needs a second set.
    m_overlap =
        costs != nullptr && std::any_of(costs->stages.begin(), costs->stages.end(),
                                        [](const StageCosts& c) { return !c.bucket_s.empty(); });
    const bool replicated = std::any_of(s.stage_ranks.begin(), s.stage_ranks.end(),
                                        [](const std::vector<int>& g) { return g.size() > 1; });
    for (std::size_t r = 0; (m_overlap || replicated) && r < s.ranks.size(); ++r)
      m_ranks[r].closes = closing_backwards(s.ranks[r], s.policy, s.microbatches);
    // Only schedules without flushes (stash, 2BW) have a steady-state period, measured over the
    // window; skip the pass over every action otherwise.
    const bool window = costs != nullptr && s.policy != UpdatePolicy::Flush;
    for (std::size_t r = 0; window && r < s.ranks.size(); ++r) {
      // The window opens at forward n/4, or after the rank's warm-up where that is longer: a rank
      // whose forwards are fast runs its warm-up at once and then waits a whole round trip for
      // its first gradient, which is the fill, not the period.
      int n = 0, warmup = -1;
      for (auto& a : s.ranks[r]) {
        if (warmup < 0 && (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput))
          warmup = n;
        n += a.kind == ActionKind::Forward ? 1 : 0;
      }
      RankState& st = m_ranks[r];
      st.window_open = std::max(n / 4, warmup);
      st.window_close = n * 3 / 4;
      if (n >= 4 && st.window_close > st.window_open)
        m_result.ranks[r].window_forwards = st.window_close - st.window_open;
    }
  }

  EngineResult run() {
    for (int r = static_cast<int>(m_ranks.size()) - 1; r >= 0; --r) enqueue(r);
    for (;;) {
      while (!m_work.empty()) {
        int r = m_work.back();
        m_work.pop_back();
        m_ranks[r].queued = false;
        advance(r);
      }
      if (m_jobs.empty()) break;
      share_cores();
    }
    for (std::size_t r = 0; r < m_ranks.size(); ++r)
      if (!m_ranks[r].done) report_deadlock();
    for (std::size_t r = 0; r < m_ranks.size(); ++r) {
      auto& out = m_result.ranks[r];
      out.finish_s = m_ranks[r].clock;
      out.busy_s = m_ranks[r].busy;
    }
    return std::move(m_result);
  }

 private:
  void enqueue(int r) {
    if (m_ranks[r].queued || m_ranks[r].done) return;
    m_ranks[r].queued = true;
    m_work.push_back(r);
    // The rank resumes soon, at an action that has long left the cache (the engine hops between
    // ranks every few actions): start loading it now.
    __builtin_prefetch(m_s.ranks[r].data() + m_ranks[r].pc);
  }

  StageSlot& slot(RankState& st, int stage) {
    for (auto& sl : st.slots)
      if (sl.stage == stage) return sl;
    return st.slots.front();  // unreachable after check_local
  }

  const StageCosts* stage_costs(int stage) const {
    return m_costs && stage < static_cast<int>(m_costs->stages.size()) ? &m_costs->stages[stage]
                                                                       : nullptr;
  }

  void account_memory(int r) {
    RankState& st = m_ranks[r];
    RankRecord& rec = m_result.ranks[r];
    int versions = 0;
    std::int64_t weight_bytes = 0, state_bytes = 0, backward_gradient = 0, workspace_bytes = 0;
    for (auto& sl : st.slots) {
      int v;
      if (m_s.policy == UpdatePolicy::DoubleBuffered) {
        // The runtime's store keeps what in-flight microbatches use and every version a later
        // minibatch may still ask for: from the one after version - 1 steps on.
        int oldest = std::max(sl.version - 1, sl.requested);
        if (!sl.runs.empty()) oldest = std::min(oldest, sl.runs.front().first);
        v = sl.version - oldest + 1;
      } else if (m_s.vertical_sync) {
        // The store keeps every version from the one the latest forward used on: a microbatch
        // still on its way from the input stage may ask for any of them (requests never go back).
        int oldest = sl.requested;
        if (!sl.runs.empty()) oldest = std::min(oldest, sl.runs.front().first);
        v = sl.version - oldest + 1;
      } else
        v = static_cast<int>(sl.runs.size()) +
            (sl.runs.empty() || sl.runs.back().first != sl.version ? 1 : 0);
      versions += v;
      if (auto* c = stage_costs(sl.stage)) {
        if (v > 0) weight_bytes += c->parameter_bytes + c->version_bytes * (v - 1);
        const int gradient_sets = std::max(1, sl.unreduced_rounds + (sl.open_round ? 1 : 0));
        state_bytes += c->gradient_bytes * gradient_sets + c->optimizer_bytes;
        backward_gradient = std::max(backward_gradient, c->backward_gradient_bytes);
        workspace_bytes = std::max(workspace_bytes, c->workspace_bytes);
      }
    }
    rec.peak_activations = std::max(rec.peak_activations, static_cast<int>(st.inflight.size()));
    rec.peak_weight_versions = std::max(rec.peak_weight_versions, versions);
    rec.peak_activation_bytes = std::max(rec.peak_activation_bytes, st.activation_bytes);
    rec.peak_weight_bytes = std::max(rec.peak_weight_bytes, weight_bytes);
    state_bytes += backward_gradient;
    rec.peak_state_bytes = std::max(rec.peak_state_bytes, state_bytes);
    rec.workspace_bytes = workspace_bytes;
    rec.peak_memory_bytes = std::max(
        rec.peak_memory_bytes, st.activation_bytes + weight_bytes + state_bytes + workspace_bytes);
  }

  void on_forward(int r, const Action& a) {
    RankState& st = m_ranks[r];
    StageSlot& sl = slot(st, a.stage);
    int version = sl.version;
    if (m_s.policy == UpdatePolicy::DoubleBuffered) {
      version = double_buffered_version(a.microbatch / m_s.microbatches);
      sl.requested = std::max(sl.requested, version);
    } else if (m_s.vertical_sync && a.stage > 0) {
      auto k = key(a.stage, a.microbatch);
      for (std::size_t i = 0; i < st.received_versions.size(); ++i)
        if (st.received_versions[i].first == k) {
          version = st.received_versions[i].second;
          st.received_versions[i] = st.received_versions.back();
          st.received_versions.pop_back();
          break;
        }
    }
    if (m_s.vertical_sync) sl.requested = std::max(sl.requested, version);
    st.inflight.push_back({a.stage, a.microbatch, version, false});
    if (!sl.runs.empty() && sl.runs.back().first == version)
      ++sl.runs.back().second;
    else
      sl.runs.push_back({version, 1});
    if (auto* c = stage_costs(a.stage)) st.activation_bytes += c->activation_bytes;
    account_memory(r);
  }

  // A recomputing stage's rebuilt activations: taken at the start of B (or I), given back at the
  // end of B (or W).
  void hold_recomputed(int r, const StageCosts* c, int sign) {
    if (!c || c->recompute_bytes == 0) return;
    m_ranks[r].activation_bytes += sign * c->recompute_bytes;
    if (sign > 0) account_memory(r);
  }

  // The layer-output gradients an I keeps for its W.
  void hold_split_gradients(int r, const StageCosts* c, int sign) {
    if (!c || c->split_gradient_bytes == 0) return;
    m_ranks[r].activation_bytes += sign * c->split_gradient_bytes;
    if (sign > 0) account_memory(r);
  }

  // Releases the microbatch's activations (at B, or at W of a split backward).
  void on_release(int r, const Action& a) {
    RankState& st = m_ranks[r];
    for (auto it = st.inflight.begin(); it != st.inflight.end(); ++it) {
      if (it->stage != a.stage || it->unit != a.microbatch) continue;
      StageSlot& sl = slot(st, a.stage);
      for (auto run = sl.runs.begin(); run != sl.runs.end(); ++run)
        if (run->first == it->version) {
          if (--run->second == 0) sl.runs.erase(run);
          break;
        }
      if (it == st.inflight.begin())
        st.inflight.pop_front();
      else
        st.inflight.erase(it);
      if (auto* c = stage_costs(a.stage)) st.activation_bytes -= c->activation_bytes;
      return;
    }
  }

  int version_of(RankState& st, const Action& a) const {
    for (std::size_t i = st.inflight.size(); i-- > 0;) {
      const InFlight& f = st.inflight.at(i);
      if (f.stage == a.stage && f.unit == a.microbatch) return f.version;
    }
    return 0;
  }

  Channel& channel(int dst, int src, bool gradient) {
    constexpr std::size_t kScanned = 8;  // most ranks hear from one or two peers
    RankState& st = m_ranks[dst];
    auto& inbox = st.inbox;
    const auto key = [](int sender, bool grad) {
      return std::int64_t{sender} * 2 + (grad ? 1 : 0);
    };
    if (inbox.size() <= kScanned) {
      for (auto& c : inbox)
        if (c.src == src && c.gradient == gradient) return c;
    } else if (const auto it = st.inbox_index.find(key(src, gradient));
               it != st.inbox_index.end()) {
      return inbox[static_cast<std::size_t>(it->second)];
    }
    inbox.push_back({src, gradient, {}, 0});
    if (inbox.size() > kScanned) {
      if (st.inbox_index.empty())
        for (std::size_t i = 0; i < inbox.size(); ++i)
          st.inbox_index.emplace(key(inbox[i].src, inbox[i].gradient), static_cast<int>(i));
      else
        st.inbox_index.emplace(key(src, gradient), static_cast<int>(inbox.size() - 1));
    }
    return inbox.back();
  }

  void record(int r, const Action& a, double start, double end, int flow = -1) {
    if (m_trace) m_result.events.push_back({r, a, start, end, flow});
  }

  void advance(int r) {
    RankState& st = m_ranks[r];
    const auto& actions = m_s.ranks[r];
    while (st.pc < actions.size()) {
      const Action& a = actions[st.pc];
      const StageCosts* c = stage_costs(a.stage);
      switch (a.kind) {
        // Compute: what comes before the work, the work (with shared cores the rank returns
        // here resumed once its job is done), what comes after it.
        case ActionKind::Forward:
          if (!st.resumed) {
            note_window(r);
            on_forward(r, a);
            if (!compute(r, straggle(r, c ? c->forward_s : 0))) return;
          }
          computed(st);
          break;
        case ActionKind::Backward:
          if (!st.resumed) {
            open_gradients(r, a);
            hold_recomputed(r, c, 1);
            if (!compute(r, straggle(r, c ? c->backward_s : 0))) return;
          }
          note_close(r, a);
          on_release(r, a);
          hold_recomputed(r, c, -1);
          computed(st);
          break;
        case ActionKind::BackwardInput:
          if (!st.resumed) {
            hold_recomputed(r, c, 1);
            hold_split_gradients(r, c, 1);
            if (!compute(r, straggle(r, c ? c->backward_input_s : 0))) return;
          }
          computed(st);
          break;
        case ActionKind::BackwardWeight:
          if (!st.resumed) {
            open_gradients(r, a);
            if (!compute(r, straggle(r, c ? c->backward_weight_s : 0))) return;
          }
          note_close(r, a);
          on_release(r, a);
          hold_recomputed(r, c, -1);
          hold_split_gradients(r, c, -1);
          computed(st);
          break;
        case ActionKind::Step:
          if (!st.resumed && m_norm_ranks > 0 && a.microbatch > st.norm_joined) {
            // The first of the rank's steps of this number: the world sum of the norm.
            NormRound& n = norm_round(a.microbatch);
            if (!st.at_norm) {
              st.at_norm = true;
              n.latest = std::max(n.latest, st.clock);
              if (++n.joined == m_norm_ranks) {
                for (std::size_t m = 0; m < m_ranks.size(); ++m)
                  if (static_cast<int>(m) != r && m_ranks[m].at_norm) enqueue(static_cast<int>(m));
              }
            }
            if (n.joined < m_norm_ranks) return;  // woken by the last to join
            st.clock = std::max(st.clock, n.latest + m_costs->global_norm_s);
            st.at_norm = false;
            st.norm_joined = a.microbatch;
          }
          if (!st.resumed && !compute(r, c ? c->step_s : 0)) return;
          ++slot(st, a.stage).version;
          account_memory(r);
          computed(st);
          break;
        case ActionKind::SendActivation:
        case ActionKind::SendGradient: {
          bool grad = a.kind == ActionKind::SendGradient;
          Channel& ch = channel(a.peer, r, grad);
          double t =
              m_costs && m_costs->transfer_s ? m_costs->transfer_s(r, a.peer, a.stage, a.kind) : 0;
          double arrival = std::max(st.clock, ch.link_free) + t;
          ch.link_free = arrival;
          int version = m_s.vertical_sync && !grad ? version_of(st, a) : 0;
          int flow = m_trace ? m_next_flow++ : -1;
          ch.pending.push_back({a.stage, a.microbatch, version, flow, arrival});
          record(r, a, st.clock, arrival, flow);
          RankState& peer = m_ranks[a.peer];
          if (peer.wait_channel >= 0 && &peer.inbox[peer.wait_channel] == &ch) {
            peer.wait_channel = -1;
            enqueue(a.peer);
          }
          ++st.pc;
          break;
        }
        case ActionKind::RecvActivation:
        case ActionKind::RecvGradient: {
          bool grad = a.kind == ActionKind::RecvGradient;
          int sender_stage = grad ? a.stage + 1 : a.stage - 1;
          Channel& ch = channel(r, a.peer, grad);
          auto it = ch.pending.begin();
          while (it != ch.pending.end() && (it->unit != a.microbatch || it->stage != sender_stage))
            ++it;
          if (it == ch.pending.end()) {
            st.wait_channel = static_cast<int>(&ch - st.inbox.data());
            return;
          }
          double start = st.clock;
          st.clock = std::max(st.clock, it->arrival);
          if (m_s.vertical_sync && !grad)
            st.received_versions.emplace_back(key(a.stage, a.microbatch), it->version);
          record(r, a, start, st.clock, it->flow);
          if (it == ch.pending.begin())
            ch.pending.pop_front();
          else
            ch.pending.erase(it);
          ++st.pc;
          break;
        }
        case ActionKind::AllReduce: {
          // A replica's AR ends once every replica has contributed its gradients and the
          // allreduce has run; it never waits for the others to reach their AR.
          const auto& members = m_s.stage_ranks[a.stage];
          Round& round = round_of(a.stage, a.microbatch);
          if (!st.at_allreduce) {
            st.at_allreduce = true;
            contribute(a.stage, a.microbatch, r, st.clock, 0);
          }
          if (round.contributed < members.size()) return;  // woken by the last contribution
          if (round.done < 0) round.done = allreduce_end(a.stage, round, c);
          const double end = std::max(st.clock, round.done);
          record(r, a, st.clock, end);
          st.clock = end;
          st.at_allreduce = false;
          StageSlot& sl = slot(st, a.stage);
          sl.unreduced_rounds = std::max(0, sl.unreduced_rounds - 1);
          ++st.pc;
          ++round.passed;
          Group& g = m_groups[static_cast<std::size_t>(a.stage)];
          while (!g.rounds.empty() && g.rounds.front().passed == members.size()) {
            g.rounds.pop_front();
            ++g.first;
          }
          break;
        }
      }
    }
    st.done = true;
  }

  // The steady-state window of a stash schedule opens and closes at forwards.
  void note_window(int r) {
    RankState& st = m_ranks[r];
    RankRecord& rec = m_result.ranks[r];
    if (rec.window_forwards) {
      if (st.forwards_seen == st.window_open) {
        rec.window_begin_s = st.clock;
        rec.window_begin_busy_s = st.busy;
      } else if (st.forwards_seen == st.window_close) {
        rec.window_end_s = st.clock;
        rec.window_end_busy_s = st.busy;
      }
    }
    ++st.forwards_seen;
  }

  // After a backward: when it completed the gradients of an overlapped allreduce's round, the
  // replica's contribution started with it.
  void note_close(int r, const Action& a) {
    RankState& st = m_ranks[r];
    if (st.closes.empty() || st.closes[st.pc] < 0) return;
    if (m_s.stage_ranks[static_cast<std::size_t>(a.stage)].size() < 2) return;
    StageSlot& sl = slot(st, a.stage);
    ++sl.unreduced_rounds;
    sl.open_round = false;
    if (m_overlap) contribute(a.stage, st.closes[st.pc], r, st.last_start, st.last_length);
  }

  // Before a replica's backward that makes weight gradients (B or W): a round under way, in a
  // second gradient set where a closed one still awaits its allreduce.
  void open_gradients(int r, const Action& a) {
    if (m_s.stage_ranks[static_cast<std::size_t>(a.stage)].size() < 2) return;
    StageSlot& sl = slot(m_ranks[r], a.stage);
    if (sl.open_round) return;
    sl.open_round = true;
    if (sl.unreduced_rounds > 0) account_memory(r);
  }

  Round& round_of(int stage, int number) {
    Group& g = m_groups[static_cast<std::size_t>(stage)];
    const std::size_t n = m_s.stage_ranks[static_cast<std::size_t>(stage)].size();
    while (g.first + static_cast<int>(g.rounds.size()) <= number)
      g.rounds.push_back({0, 0, std::vector<double>(n, -1), std::vector<double>(n, 0), -1});
    return g.rounds[static_cast<std::size_t>(number - g.first)];
  }

  // Rank r's gradients of `round` are ready for the allreduce from `start` on, over `length`
  // (its closing backward; 0 at its AR). The first contribution counts; the last one wakes the
  // replicas waiting at their AR.
  void contribute(int stage, int number, int r, double start, double length) {
    if (number < m_groups[static_cast<std::size_t>(stage)].first) return;  // a round long done
    Round& round = round_of(stage, number);
    const auto i = static_cast<std::size_t>(m_replica[static_cast<std::size_t>(r)]);
    if (round.start[i] >= 0) return;
    round.start[i] = start;
    round.length[i] = length;
    const auto& members = m_s.stage_ranks[static_cast<std::size_t>(stage)];
    if (++round.contributed < members.size()) return;
    for (int m : members)
      if (m != r && m_ranks[m].at_allreduce) enqueue(m);
  }

  // When the allreduce of a round whose replicas have all contributed ends: the blocking one
  // after the last contribution plus its time; the overlapped one when its last bucket is through
  // (bucket j is ready once every replica's closing backward has run bucket_ready[j] of its
  // time; the link takes one bucket at a time). The replicas' CPU share follows the last
  // contribution either way.
  double allreduce_end(int stage, const Round& round, const StageCosts* c) const {
    const auto& members = m_s.stage_ranks[static_cast<std::size_t>(stage)];
    double latest = 0;
    for (std::size_t i = 0; i < members.size(); ++i)
      latest = std::max(latest, round.start[i] + round.length[i]);
    const double cpu = c ? c->allreduce_cpu_s * contention(members.size()) : 0;
    if (!c || c->bucket_s.empty()) return latest + (c ? c->allreduce_s : 0) + cpu;
    double link = 0;
    for (std::size_t j = 0; j < c->bucket_s.size(); ++j) {
      double ready = 0;
      for (std::size_t i = 0; i < members.size(); ++i)
        ready = std::max(ready, round.start[i] + c->bucket_ready[j] * round.length[i]);
      link = std::max(link, ready) + c->bucket_s[j];
    }
    return std::max(latest + cpu, link);
  }

  // How much longer CPU work of `joining` more ranks takes on the shared cores now: they join
  // the jobs running (an allreduce's copies and sums, whose length is not simulated job by job).
  double contention(std::size_t joining) const {
    if (m_cores == 0) return 1.0;
    std::size_t running = joining;
    for (const Job& j : m_jobs) running += j.start <= m_now ? 1 : 0;
    return std::max(1.0, static_cast<double>(running) / m_cores);
  }

  // A compute action's time on rank r under the costs' slowdown and jitter.
  double straggle(int r, double d) {
    if (!m_costs) return d;
    if (static_cast<std::size_t>(r) < m_costs->rank_slowdown.size())
      d *= m_costs->rank_slowdown[static_cast<std::size_t>(r)];
    if (auto& g = m_ranks[r].jitter)
      d *= std::exp(m_jitter_sigma * static_cast<double>(g->normal()) -
                    m_jitter_sigma * m_jitter_sigma / 2);
    return d;
  }

  // The compute action at rank r's pc does `work` seconds of own-core time: at once on a core
  // of its own (true), or as a job on the shared cores that resumes the rank when done (false).
  bool compute(int r, double work) {
    RankState& st = m_ranks[r];
    m_result.ranks[r].work_s += work;
    if (m_cores == 0 || work <= 0) {
      ran(r, st.clock + work);
      return true;
    }
    m_jobs.push_back({r, st.clock, work, work});
    return false;
  }

  // Rank r's compute action at pc ran from the rank's clock until `end`.
  void ran(int r, double end) {
    RankState& st = m_ranks[r];
    record(r, m_s.ranks[r][st.pc], st.clock, end);
    st.last_start = st.clock;
    st.last_length = end - st.clock;
    st.busy += end - st.clock;
    st.clock = end;
  }

  static void computed(RankState& st) {
    st.resumed = false;
    ++st.pc;
  }

  // Moves the shared cores' timeline to its next event — a job starting, or the first running
  // one finishing while k run at min(1, cores / k) of their speed — and resumes the ranks whose
  // jobs are done. A job never starts before m_now: ranks start them at their clocks, which
  // only the jobs' ends (at m_now) and messages sent later than that move.
  void share_cores() {
    double next_start = std::numeric_limits<double>::infinity();
    int running = 0;
    for (const Job& j : m_jobs)
      if (j.start <= m_now)
        ++running;
      else
        next_start = std::min(next_start, j.start);
    if (running == 0) {
      m_now = next_start;
      return;
    }
    const double speed = std::min(1.0, m_cores / running);
    double step = std::numeric_limits<double>::infinity();
    for (const Job& j : m_jobs)
      if (j.start <= m_now) step = std::min(step, j.remaining / speed);
    const double before = m_now;
    m_now = step >= next_start - m_now ? next_start : m_now + step;
    const double done = speed * (m_now - before);
    for (std::size_t i = 0; i < m_jobs.size();) {
      Job& j = m_jobs[i];
      if (j.start > before) {
        ++i;
        continue;
      }
      j.remaining -= done;
      if (j.remaining > 1e-9 * j.work) {
        ++i;
        continue;
      }
      ran(j.rank, m_now);
      m_ranks[j.rank].resumed = true;
      enqueue(j.rank);
      j = m_jobs.back();
      m_jobs.pop_back();
    }
  }

  // Who a blocked rank waits for: the sender of its receive, or a replica that has not
  // contributed to the allreduce yet.
  int waits_for(int r) const {
    const RankState& st = m_ranks[r];
    const Action& a = m_s.ranks[r][st.pc];
    if (is_recv(a.kind)) return a.peer;
    if (st.at_norm) {  // a rank that steps and has not joined this step's norm
      for (std::size_t m = 0; m < m_ranks.size(); ++m)
        if (m_steps[m] && !(m_ranks[m].at_norm || m_ranks[m].norm_joined >= a.microbatch))
          return static_cast<int>(m);
      return r;
    }
    const Group& g = m_groups[static_cast<std::size_t>(a.stage)];
    const auto k = static_cast<std::size_t>(a.microbatch - g.first);
    const auto& members = m_s.stage_ranks[static_cast<std::size_t>(a.stage)];
    for (std::size_t i = 0; i < members.size(); ++i)
      if (k >= g.rounds.size() || g.rounds[k].start[i] < 0) return members[i];
    return r;
  }

  std::string describe(int r) const {
    const RankState& st = m_ranks[r];
    return fmt::format("rank {} waits at action #{} `{}`", r, st.pc,
                       to_string(m_s.ranks[r][st.pc]));
  }

  [[noreturn]] void report_deadlock() const {
    int start = 0;
    int blocked = 0;
    for (std::size_t r = 0; r < m_ranks.size(); ++r)
      if (!m_ranks[r].done) {
        if (!blocked) start = static_cast<int>(r);
        ++blocked;
      }
    // Follow the wait-for edges until a rank repeats (a cycle) or one has finished.
    std::vector<int> seen(m_ranks.size(), -1);
    std::vector<int> path;
    int r = start;
    while (seen[r] < 0 && !m_ranks[r].done) {
      seen[r] = static_cast<int>(path.size());
      path.push_back(r);
      r = waits_for(r);
    }
    std::string msg;
    if (m_ranks[r].done) {
      const Action& a = m_s.ranks[path.back()][m_ranks[path.back()].pc];
      for (std::size_t i = 0; i < path.size(); ++i) {
        if (i) msg += "; ";
        msg +=
            describe(path[i]) + fmt::format(" for rank {}", i + 1 < path.size() ? path[i + 1] : r);
      }
      throw ScheduleDeadlock(
          fmt::format("{}schedule cannot finish: {}, which has finished without {} ({} ranks "
                      "blocked) ({}:{})",
                      detail::rank_prefix(), msg,
                      is_recv(a.kind)              ? "sending it"
                      : a.kind == ActionKind::Step ? "reaching its step (the gradient norm's sum)"
                                                   : "reaching the allreduce",
                      blocked, __FILE__, __LINE__),
          path);
    }
    std::vector<int> cycle(path.begin() + seen[r], path.end());
    for (std::size_t i = static_cast<std::size_t>(seen[r]); i < path.size(); ++i) {
      if (!msg.empty()) msg += "; ";
      msg += describe(path[i]) +
             fmt::format(" for rank {}", i + 1 < path.size() ? path[i + 1] : path[seen[r]]);
    }
    throw ScheduleDeadlock(fmt::format("{}deadlock: {} ({} ranks blocked in all) ({}:{})",
                                       detail::rank_prefix(), msg, blocked, __FILE__, __LINE__),
                           std::move(cycle));
  }

  const Schedule& m_s;
  const EngineCosts* m_costs;
  bool m_trace;
  bool m_overlap = false;  // some stage reduces its gradients in buckets during its backward
  // EngineCosts::global_norm_steps: the ranks that step (m_steps[r]) and how many; each step
  // number's norm, by step number.
  struct NormRound {
    std::size_t joined = 0;
    double latest = 0;  // the last rank's arrival
  };
  std::vector<char> m_steps;
  std::size_t m_norm_ranks = 0;
  std::vector<NormRound> m_norms;
  NormRound& norm_round(int step) {
    if (static_cast<std::size_t>(step) >= m_norms.size())
      m_norms.resize(static_cast<std::size_t>(step) + 1);
    return m_norms[static_cast<std::size_t>(step)];
  }
  std::vector<RankState> m_ranks;
  double m_jitter_sigma = 0;
  std::vector<Group> m_groups;
  std::vector<int> m_replica;  // rank -> its replica index within its stage
  std::vector<int> m_work;
  // EngineCosts::shared_cores over its threads_per_rank when fewer than the ranks, else 0.
  double m_cores = 0;
  std::vector<Job> m_jobs;
  double m_now = 0;  // the shared cores' timeline
  int m_next_flow = 0;
  EngineResult m_result;
};

}  // namespace

EngineResult execute_schedule(const Schedule& schedule, const EngineCosts* costs,
                              bool record_trace) {
  return Engine(schedule, costs, record_trace).run();
}

}  // namespace pipeline::detail
