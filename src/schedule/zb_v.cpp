// ZB-V: list scheduling of a V pipeline's F, I and W actions on unit times.
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/schedule/schedules/zb_v.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>

namespace pipeline {

namespace {

struct VOrder {
  std::vector<std::vector<Action>> ranks;
  int ticks = 0;  // makespan on unit times
};

// The list schedule of module comment, a rank's first-stage forward keeping room for up to
// `reserve` of the microbatches whose second-stage forward is still to come; nullopt when it
// stalls (every rank idle with work left: too little room reserved).
std::optional<VOrder> v_order_with(int p, int m, int reserve) {
  const int stages = 2 * p, last = stages - 1;
  const int limit = 2 * p;  // stage activations a rank holds (module comment)
  constexpr int kNotYet = -1;
  // The tick each (stage, microbatch)'s F and I end, kNotYet before.
  std::vector<std::vector<int>> f_end(static_cast<std::size_t>(stages),
                                      std::vector<int>(static_cast<std::size_t>(m), kNotYet));
  auto i_end = f_end;
  std::vector<int> next_f(static_cast<std::size_t>(stages), 0), next_i = next_f;
  std::vector<std::deque<std::pair<int, int>>> pending_w(static_cast<std::size_t>(p));
  std::vector<int> held(static_cast<std::size_t>(p), 0), busy_until = held;
  VOrder out;
  out.ranks.resize(static_cast<std::size_t>(p));
  const auto at = [](std::vector<std::vector<int>>& v, int s, int u) -> int& {
    return v[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)];
  };
  const auto done_by = [](int end, int t) { return end != kNotYet && end <= t; };
  const int total = 3 * stages * m;
  for (int t = 0, ran = 0; ran < total; ++t) {
    bool progress = false;
    for (int r = 0; r < p; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      if (busy_until[ri] > t) {
        progress = true;
        continue;
      }
      const int first = r, second = last - r;  // the rank's stages, in forward order
      std::optional<Action> act;
      // An I that is ready: the oldest microbatch, then the later stage (more backward after it).
      for (int s : {second, first}) {
        const int u = next_i[static_cast<std::size_t>(s)];
        if (u >= m || !done_by(at(f_end, s, u), t)) continue;
        if (s < last && !done_by(at(i_end, s + 1, u), t)) continue;
        if (!act || u < act->microbatch) act = Action{ActionKind::BackwardInput, s, u, -1};
      }
      // Else a forward that is ready, the later stage first (it leads to a backward sooner).
      for (int s : {second, first}) {
        if (act || held[ri] >= limit) break;
        const int u = next_f[static_cast<std::size_t>(s)];
        if (u >= m || (s > 0 && !done_by(at(f_end, s - 1, u), t))) continue;
        const int coming_back =
            next_f[static_cast<std::size_t>(first)] - next_f[static_cast<std::size_t>(second)];
        if (s == first && held[ri] + std::min(reserve, coming_back) + 2 > limit) continue;
        act = Action{ActionKind::Forward, s, u, -1};
      }
      if (!act && !pending_w[ri].empty()) {
        auto [s, u] = pending_w[ri].front();
        pending_w[ri].pop_front();
        act = Action{ActionKind::BackwardWeight, s, u, -1};
      }
      if (!act) continue;
      const int s = act->stage, u = act->microbatch;
      busy_until[ri] = t + 1;
      out.ticks = t + 1;
      progress = true;
      ++ran;
      out.ranks[ri].push_back(*act);
      if (act->kind == ActionKind::Forward) {
        at(f_end, s, u) = t + 1;
        ++next_f[static_cast<std::size_t>(s)];
        ++held[ri];
      } else if (act->kind == ActionKind::BackwardInput) {
        at(i_end, s, u) = t + 1;
        ++next_i[static_cast<std::size_t>(s)];
        pending_w[ri].emplace_back(s, u);
      } else {
        --held[ri];
      }
    }
    if (!progress) return std::nullopt;
  }
  return out;
}

}  // namespace

std::vector<std::vector<Action>> detail::zero_bubble_v_order(int p, int m) {
  PIPELINE_CHECK(p >= 1 && m >= 1, "internal: a V pipeline of {} ranks and {} microbatches", p, m);
  // Reserving room for every microbatch still to come back never stalls; reserving less lets
  // the first stages run further ahead, which at some counts saves a few ticks (a handful of
  // settings tried; the shortest kept, the first on a tie).
  std::optional<VOrder> best;
  for (int reserve : {m, 3, 2, 1, 0}) {
    std::optional<VOrder> o = v_order_with(p, m, reserve);
    if (o && (!best || o->ticks < best->ticks)) best = std::move(o);
  }
  PIPELINE_CHECK(best.has_value(),
                 "internal: the ZB-V order of {} ranks and {} microbatches stalls", p, m);
  return std::move(best->ranks);
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
      if (it == orders.end()) it = orders.emplace(m, detail::zero_bubble_v_order(p, m)).first;
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
