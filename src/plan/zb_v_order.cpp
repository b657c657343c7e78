#include <pipeline/plan/zb_v_order.hpp>

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

namespace pipeline {

namespace {

double stage_at(const std::vector<double>& v, int stage) {
  return v[static_cast<std::size_t>(stage)];
}

// The transfer into stage s of a V of p ranks: none within a rank (stage p's input).
double message_into(const StagePassTimes& times, int p, int s) {
  return s == p ? 0.0 : stage_at(times.message_s, s);
}

// The list schedule of the header's comment, in event order: the rank whose next action can
// start first runs it (ties: the lower rank), choosing among what is ready then an I (oldest
// microbatch, later stage), else a forward (later stage), else its oldest W, and when nothing is
// ready yet the action that is ready first. A rank's first-stage forward keeps room for up to
// `reserve` of the microbatches whose second-stage forward is still to come; nullopt when it
// stalls (too little room reserved).
std::optional<PassOrder> v_order_with(int p, int m, int reserve, const StagePassTimes& times) {
  const int stages = 2 * p, last = stages - 1;
  const int limit = 2 * p;  // stage activations a rank holds (header comment)
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
  PassOrder out(static_cast<std::size_t>(p));
  // A candidate: when it can start, then its rank in the order of preference.
  struct Candidate {
    double ready = 0;
    int kind_rank = 0;  // I 0, F 1, W 2
    int microbatch = 0;
    int minus_stage = 0;
    StagePass pass{};
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
        const double gradient =
            s < last ? at(i_end, s + 1, u) + message_into(times, p, s + 1) : 0.0;
        c[n++] = {std::max(at(f_end, s, u), gradient), 0, u, -s, {PassKind::Input, s, u}};
      }
      if (held[ri] < limit)
        for (int s : {second, first}) {
          const int u = next_f[static_cast<std::size_t>(s)];
          if (u >= m || (s > 0 && at(f_end, s - 1, u) == kNotYet)) continue;
          const int coming_back =
              next_f[static_cast<std::size_t>(first)] - next_f[static_cast<std::size_t>(second)];
          if (s == first && held[ri] + std::min(reserve, coming_back) + 2 > limit) continue;
          const double input = s > 0 ? at(f_end, s - 1, u) + message_into(times, p, s) : 0.0;
          c[n++] = {input, 1, u, -s, {PassKind::Forward, s, u}};
        }
      if (!pending_w[ri].empty()) {
        auto [s, u] = pending_w[ri].front();
        c[n++] = {0.0, 2, u, -s, {PassKind::Weight, s, u}};
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
    const StagePass a = pick->pass;
    const auto& length = a.kind == PassKind::Forward ? times.forward_s
                         : a.kind == PassKind::Input ? times.input_s
                                                     : times.weight_s;
    const double end = pick_start + stage_at(length, a.stage);
    free_at[ri] = end;
    out[ri].push_back(a);
    if (a.kind == PassKind::Forward) {
      at(f_end, a.stage, a.microbatch) = end;
      ++next_f[static_cast<std::size_t>(a.stage)];
      ++held[ri];
    } else if (a.kind == PassKind::Input) {
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

}  // namespace

std::vector<int> v_stage_ranks(int p) {
  std::vector<int> ranks;
  for (int k = 0; k < 2 * p; ++k) ranks.push_back(k < p ? k : 2 * p - 1 - k);
  return ranks;
}

StagePassTimes v_times_in_thirds(int p, const std::vector<double>& seconds,
                                 const std::vector<double>& message_s) {
  const auto stages = static_cast<std::size_t>(2 * p);
  const bool given = seconds.size() == stages &&
                     std::all_of(seconds.begin(), seconds.end(), [](double x) { return x > 0; });
  StagePassTimes t;
  for (std::size_t k = 0; k < stages; ++k) t.forward_s.push_back(given ? seconds[k] / 3 : 1.0);
  t.input_s = t.weight_s = t.forward_s;
  t.message_s = message_s.size() == stages ? message_s : std::vector<double>(stages, 0.0);
  return t;
}

PassOrder zero_bubble_v_order(int p, int m, const StagePassTimes& times) {
  PIPELINE_CHECK(p >= 1 && m >= 1, "internal: a V pipeline of {} ranks and {} microbatches", p, m);
  const auto stages = static_cast<std::size_t>(2 * p);
  PIPELINE_CHECK(times.forward_s.size() == stages && times.input_s.size() == stages &&
                     times.weight_s.size() == stages && times.message_s.size() == stages,
                 "internal: times of {} stages for a V of {}", times.forward_s.size(), stages);
  // Reserving room for every microbatch still to come back never stalls; reserving less lets
  // the first stages run further ahead, which at some counts saves a little (a handful of
  // settings tried; the shortest kept, the first on a tie).
  const StagePassTimes unit = v_times_in_thirds(p, {}, {});
  const bool timed = times.forward_s != unit.forward_s || times.input_s != unit.input_s ||
                     times.weight_s != unit.weight_s || times.message_s != unit.message_s;
  const std::vector<int> ranks = v_stage_ranks(p);
  std::optional<PassOrder> best;
  double best_makespan = 0;
  for (const StagePassTimes* t : {&times, &unit}) {
    if (t == &unit && !timed) break;
    for (int reserve : {m, 3, 2, 1, 0}) {
      std::optional<PassOrder> o = v_order_with(p, m, reserve, *t);
      if (!o) continue;
      const double makespan = walk_passes(*o, ranks, m, times, 2).makespan_s;
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

}  // namespace pipeline
