// ZB-V: list scheduling of a V pipeline's F, I and W actions on unit times.
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/schedule/schedules/zb_v.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

namespace pipeline {

namespace {

// Each rank's compute actions in order.
using VOrder = std::vector<std::vector<Action>>;

// Seconds of one microbatch's F, I and W on each stage: a third each of the stage's time, or 1
// each without times.
struct StageTimes {
  std::vector<double> third;  // per stage
  double of(int stage) const { return third[static_cast<std::size_t>(stage)]; }
};

StageTimes stage_times(const std::vector<double>& seconds, int stages) {
  StageTimes t;
  const bool given = static_cast<int>(seconds.size()) == stages &&
                     std::all_of(seconds.begin(), seconds.end(), [](double x) { return x > 0; });
  for (int k = 0; k < stages; ++k)
    t.third.push_back(given ? seconds[static_cast<std::size_t>(k)] / 3 : 1.0);
  return t;
}

// The list schedule of the module comment, in event order: the rank whose next action can start
// first runs it (ties: the lower rank), choosing among what is ready then an I (oldest
// microbatch, later stage), else a forward (later stage), else its oldest W, and when nothing is
// ready yet the action that is ready first. A rank's first-stage forward keeps room for up to
// `reserve` of the microbatches whose second-stage forward is still to come; nullopt when it
// stalls (too little room reserved).
std::optional<VOrder> v_order_with(int p, int m, int reserve, const StageTimes& times) {
  const int stages = 2 * p, last = stages - 1;
  const int limit = 2 * p;  // stage activations a rank holds (module comment)
  constexpr double kNotYet = -1;
  // When each (stage, microbatch)'s F and I end, kNotYet before they are scheduled.
  std::vector<std::vector<double>> f_end(static_cast<std::size_t>(stages),
                                         std::vector<double>(static_cast<std::size_t>(m), kNotYet));
  auto i_end = f_end;
  const auto at = [](std::vector<std::vector<double>>& v, int s, int u) -> double& {
    return v[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)];
  };
  std::vector<int> next_f(static_cast<std::size_t>(stages), 0), next_i = next_f;
  std::vector<std::deque<std::pair<int, int>>> pending_w(static_cast<std::size_t>(p));
  std::vector<int> held(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  VOrder out(static_cast<std::size_t>(p));
  // A candidate: when it can start, then its rank in the order of preference.
  struct Candidate {
    double ready = 0;
    int kind_rank = 0;  // I 0, F 1, W 2
    int microbatch = 0;
    int minus_stage = 0;
    Action action{};
    auto key() const { return std::tuple{kind_rank, microbatch, minus_stage}; }
  };
  const int total = 3 * stages * m;
  for (int ran = 0; ran < total; ++ran) {
    int rank = -1;
    std::optional<Candidate> pick;
    double pick_start = 0;
    for (int r = 0; r < p; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      const int first = r, second = last - r;  // the rank's stages, in forward order
      // At most an I and a forward of each of its two stages, and a W.
      std::array<Candidate, 5> c;
      std::size_t n = 0;
      for (int s : {second, first}) {
        const int u = next_i[static_cast<std::size_t>(s)];
        if (u >= m || at(f_end, s, u) == kNotYet) continue;
        if (s < last && at(i_end, s + 1, u) == kNotYet) continue;
        const double ready = std::max(at(f_end, s, u), s < last ? at(i_end, s + 1, u) : 0.0);
        c[n++] = {ready, 0, u, -s, {ActionKind::BackwardInput, s, u, -1}};
      }
      if (held[ri] < limit)
        for (int s : {second, first}) {
          const int u = next_f[static_cast<std::size_t>(s)];
          if (u >= m || (s > 0 && at(f_end, s - 1, u) == kNotYet)) continue;
          const int coming_back =
              next_f[static_cast<std::size_t>(first)] - next_f[static_cast<std::size_t>(second)];
          if (s == first && held[ri] + std::min(reserve, coming_back) + 2 > limit) continue;
          c[n++] = {s > 0 ? at(f_end, s - 1, u) : 0.0, 1, u, -s, {ActionKind::Forward, s, u, -1}};
        }
      if (!pending_w[ri].empty()) {
        auto [s, u] = pending_w[ri].front();
        c[n++] = {0.0, 2, u, -s, {ActionKind::BackwardWeight, s, u, -1}};
      }
      if (n == 0) continue;
      const std::span<const Candidate> cands(c.data(), n);
      const double now = free_at[ri];
      const Candidate* best = nullptr;
      for (const Candidate& x : cands) {
        if (x.ready > now) continue;
        if (!best || x.key() < best->key()) best = &x;
      }
      if (!best)  // nothing ready yet: what is ready first
        for (const Candidate& x : cands)
          if (!best || std::pair{x.ready, x.key()} < std::pair{best->ready, best->key()}) best = &x;
      const double start = std::max(now, best->ready);
      if (rank < 0 || start < pick_start) {
        rank = r;
        pick = *best;
        pick_start = start;
      }
    }
    if (rank < 0) return std::nullopt;
    const auto ri = static_cast<std::size_t>(rank);
    const Action a = pick->action;
    const double end = pick_start + times.of(a.stage);
    free_at[ri] = end;
    out[ri].push_back(a);
    if (a.kind == ActionKind::Forward) {
      at(f_end, a.stage, a.microbatch) = end;
      ++next_f[static_cast<std::size_t>(a.stage)];
      ++held[ri];
    } else if (a.kind == ActionKind::BackwardInput) {
      at(i_end, a.stage, a.microbatch) = end;
      ++next_i[static_cast<std::size_t>(a.stage)];
      pending_w[ri].emplace_back(a.stage, a.microbatch);
    } else {
      pending_w[ri].pop_front();
      --held[ri];
    }
  }
  return out;
}

// The makespan of two minibatches of per-rank orders run on `times` (each action as soon as its
// rank is free and its inputs are there; a rank starts the second minibatch after its own part of
// the first, as the flush lets it): what the simulator gives for the order, warm-up and the
// overlap of consecutive minibatches included. The orders are complete and feasible.
double makespan_of(const VOrder& order, int m, const StageTimes& times) {
  constexpr int kMinibatches = 2;
  const int p = static_cast<int>(order.size()), stages = 2 * p, n = kMinibatches * m;
  std::vector<std::vector<Action>> ranks(order.size());
  for (std::size_t r = 0; r < order.size(); ++r)
    for (int j = 0; j < kMinibatches; ++j)
      for (Action a : order[r]) {
        a.microbatch += j * m;
        ranks[r].push_back(a);
      }
  constexpr double kNotYet = -1;
  std::vector<double> f_end(static_cast<std::size_t>(stages * n), kNotYet), i_end = f_end;
  const auto cell = [n](int s, int u) { return static_cast<std::size_t>(s * n + u); };
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      for (; next[ri] < ranks[ri].size(); ++next[ri]) {
        const Action& a = ranks[ri][next[ri]];
        double ready = 0;
        if (a.kind == ActionKind::Forward && a.stage > 0)
          ready = f_end[cell(a.stage - 1, a.microbatch)];
        if (a.kind == ActionKind::BackwardInput)
          ready = a.stage + 1 < stages ? i_end[cell(a.stage + 1, a.microbatch)] : 0.0;
        if (ready == kNotYet) break;  // its input comes from a rank further behind
        const double end = std::max(free_at[ri], ready) + times.of(a.stage);
        free_at[ri] = end;
        if (a.kind == ActionKind::Forward) f_end[cell(a.stage, a.microbatch)] = end;
        if (a.kind == ActionKind::BackwardInput) i_end[cell(a.stage, a.microbatch)] = end;
        moved = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

std::vector<std::vector<Action>> detail::zero_bubble_v_order(int p, int m,
                                                             const std::vector<double>& seconds) {
  PIPELINE_CHECK(p >= 1 && m >= 1, "internal: a V pipeline of {} ranks and {} microbatches", p, m);
  const StageTimes times = stage_times(seconds, 2 * p);
  // Reserving room for every microbatch still to come back never stalls; reserving less lets
  // the first stages run further ahead, which at some counts saves a little (a handful of
  // settings tried; the shortest kept, the first on a tie).
  // With stage times, the orders built on unit times compete too, so the result is never slower
  // on those times than the order without them. Each is judged by two minibatches run on the
  // times (a rank's part of one minibatch may overlap the next).
  const StageTimes unit = stage_times({}, 2 * p);
  const bool timed = times.third != unit.third;
  std::optional<VOrder> best;
  double best_makespan = 0;
  for (const StageTimes* t : {&times, &unit}) {
    if (t == &unit && !timed) break;
    for (int reserve : {m, 3, 2, 1, 0}) {
      std::optional<VOrder> o = v_order_with(p, m, reserve, *t);
      if (!o) continue;
      const double makespan = makespan_of(*o, m, times);
      if (!best || makespan < best_makespan) {
        best = std::move(o);
        best_makespan = makespan;
      }
    }
  }
  PIPELINE_CHECK(best.has_value(),
                 "internal: the ZB-V order of {} ranks and {} microbatches stalls", p, m);
  return std::move(*best);
}

Schedule zero_bubble_v_schedule(const ScheduleSpec& spec) {
  const std::string name = "zb-v";
  check_spec(spec, /*one_stage_per_rank=*/false);
  detail::require_round_robin(spec, name);
  const InterleavedShape shape = interleaved_shape(spec.stage_ranks);
  PIPELINE_CHECK_AS(ConfigError, shape.placement == StagePlacement::V,
                    "zb-v runs a V-shape layout (2 stages per rank, stage k and 2p - 1 - k on rank "
                    "k; pipeline-partition --stage-placement v plans one), but these "
                    "{} stages on {} ranks per pipeline are {} with {} stages per rank{}",
                    spec.num_stages(), shape.positions, to_string(shape.placement),
                    shape.stages_per_rank,
                    shape.stages_per_rank == 2 ? "; run it with interleaved-1f1b" : "");
  const int p = shape.positions, replicas = shape.replicas;
  PIPELINE_CHECK_AS(ConfigError, spec.microbatches >= replicas,
                    "zb-v deals microbatches round-robin to its {} pipelines, so a minibatch needs "
                    "at least {} microbatches; got {}",
                    replicas, replicas, spec.microbatches);
  Schedule sched = detail::empty_schedule(spec, name, UpdatePolicy::Flush);
  std::map<int, std::vector<std::vector<Action>>> orders;  // by microbatches per pipeline
  for (int pipe = 0; pipe < replicas; ++pipe)
    for (int j = 0; j < spec.minibatches; ++j) {
      // This pipeline's microbatches of the minibatch (round-robin: pipe, pipe + r, ...).
      const std::vector<int> mbs =
          detail::replica_microbatches(spec, 0, pipe, j * spec.microbatches, spec.microbatches);
      const int m = static_cast<int>(mbs.size());
      auto it = orders.find(m);
      if (it == orders.end())
        it = orders.emplace(m, detail::zero_bubble_v_order(p, m, spec.stage_seconds)).first;
      for (int r = 0; r < p; ++r) {
        auto& out = sched.ranks[static_cast<std::size_t>(spec.stage_ranks[r][pipe])];
        const auto& mine = it->second[static_cast<std::size_t>(r)];
        // Room for the communication too, which insert_communication adds in place.
        if (j == 0)
          out.reserve(static_cast<std::size_t>(spec.minibatches) * (mine.size() * 7 / 3 + 4));
        for (Action a : mine) {
          a.microbatch = mbs[static_cast<std::size_t>(a.microbatch)];
          out.push_back(a);
        }
        const int stages_of_rank[] = {r, 2 * p - 1 - r};
        if (replicas > 1)
          for (int s : stages_of_rank) out.push_back({ActionKind::AllReduce, s, j, -1});
        for (int s : stages_of_rank) out.push_back({ActionKind::Step, s, j, -1});
      }
    }
  insert_communication(sched);
  return sched;
}

}  // namespace pipeline
