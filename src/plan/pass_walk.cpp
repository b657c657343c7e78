#include <pipeline/plan/pass_walk.hpp>

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <utility>

namespace pipeline {

PassWalk walk_passes(const PassOrder& order, const std::vector<int>& rank_of_stage, int m,
                     const StagePassTimes& times, int minibatches) {
  const int ranks = static_cast<int>(order.size());
  const int stages = static_cast<int>(rank_of_stage.size()), last = stages - 1;
  const int n = minibatches * m;
  const auto of = [](const std::vector<double>& v, int stage) {
    return v[static_cast<std::size_t>(stage)];
  };
  constexpr double kNotYet = -1;
  // When a microbatch's input reaches stage k, and its output gradient (from stage k + 1); kept
  // between calls, as the planner walks an order for every cut it times.
  thread_local std::vector<double> input, gradient;
  input.assign(static_cast<std::size_t>(stages) * static_cast<std::size_t>(n), kNotYet);
  gradient.assign(input.size(), kNotYet);
  const auto cell = [n](int s, int u) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(n) + static_cast<std::size_t>(u);
  };
  for (int u = 0; u < n; ++u) {
    input[cell(0, u)] = 0;
    gradient[cell(last, u)] = 0;  // (after its forward, in order)
  }
  struct Link {
    int to;
    bool gradient;
    double free;
  };
  struct Rank {
    std::size_t next = 0;  // in the rank's order
    int minibatch = 0;     // the one `next` is in
    double clock = 0;
    std::vector<Link> links;  // (a pipeline's rank talks to one or two others)
  };
  std::vector<Rank> state(static_cast<std::size_t>(ranks));
  PassWalk walk;
  walk.closing_end_s.assign(static_cast<std::size_t>(stages), 0.0);
  std::vector<int> ready;
  for (int r = ranks - 1; r >= 0; --r) ready.push_back(r);
  // Rank r's message into stage `to` (its activation, or its gradient), over `message_s`.
  const auto send = [&](int r, int to, bool is_gradient, double message_s,
                        std::vector<double>& arrival, int u) {
    Rank& from = state[static_cast<std::size_t>(r)];
    const int dst = rank_of_stage[static_cast<std::size_t>(to)];
    double& when = arrival[cell(to, u)];
    if (dst == r) {
      when = from.clock;
      return;  // (the rank runs on)
    }
    auto link = std::find_if(from.links.begin(), from.links.end(), [&](const Link& l) {
      return l.to == dst && l.gradient == is_gradient;
    });
    if (link == from.links.end()) link = from.links.insert(from.links.end(), {dst, is_gradient, 0});
    link->free = std::max(from.clock, link->free) + message_s;
    when = link->free;
    ready.push_back(dst);
  };
  while (!ready.empty()) {
    const int r = ready.back();
    ready.pop_back();
    Rank& rank = state[static_cast<std::size_t>(r)];
    const std::vector<StagePass>& mine = order[static_cast<std::size_t>(r)];
    const auto advance = [&] {
      if (++rank.next < mine.size()) return;
      rank.next = 0;
      ++rank.minibatch;
    };
    for (; rank.minibatch < minibatches && !mine.empty(); advance()) {
      const StagePass& a = mine[rank.next];
      const int s = a.stage, u = a.microbatch + rank.minibatch * m;
      switch (a.kind) {
        case PassKind::Forward:
          if (input[cell(s, u)] == kNotYet) break;
          rank.clock = std::max(rank.clock, input[cell(s, u)]) + of(times.forward_s, s);
          if (s < last) send(r, s + 1, false, of(times.message_s, s + 1), input, u);
          continue;
        case PassKind::Backward:
        case PassKind::Input: {
          if (gradient[cell(s, u)] == kNotYet) break;
          const bool whole = a.kind == PassKind::Backward;
          rank.clock = std::max(rank.clock, gradient[cell(s, u)]) +
                       of(whole ? times.backward_s : times.input_s, s);
          if (whole) walk.closing_end_s[static_cast<std::size_t>(s)] = rank.clock;
          if (s > 0) send(r, s - 1, true, of(times.message_s, s), gradient, u);
          continue;
        }
        case PassKind::Weight:
          rank.clock += of(times.weight_s, s);
          walk.closing_end_s[static_cast<std::size_t>(s)] = rank.clock;
          continue;
      }
      break;  // its input or gradient is still to come
    }
  }
  for (std::size_t r = 0; r < state.size(); ++r) {
    PIPELINE_CHECK(state[r].minibatch == minibatches || order[r].empty(),
                   "internal: the order of {} ranks waits on itself at rank {}, pass {} of "
                   "minibatch {}",
                   ranks, r, state[r].next, state[r].minibatch);
    walk.rank_end_s.push_back(state[r].clock);
    walk.makespan_s = std::max(walk.makespan_s, state[r].clock);
  }
  return walk;
}

}  // namespace pipeline
