// The order of one stage's passes in a straight pipeline under 1F1B (flush and stash) and ZB-H1:
// the schedule generators emit these passes as actions, and the partitioner walks them
// (pass_walk.hpp) to time its flush plans.
#pragma once

#include <pipeline/plan/pass_walk.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <vector>

namespace pipeline {

// How many of a replica's n microbatches have run their forward before the backward of each one:
// 1F1B's warm-up of `warmup` forwards, then one more per backward.
inline std::vector<int> forwards_before(std::size_t n, int warmup) {
  std::vector<int> out(n);
  for (std::size_t k = 0; k < n; ++k)
    out[k] = static_cast<int>(std::min(n, k + 1 + static_cast<std::size_t>(std::max(warmup, 0))));
  return out;
}

// Each stage's 1F1B warm-up from its default (`warmups`: PipeDream's depth, one forward per rank
// after it) and its planned in-flight count (`in_flight`, 0 or absent where the plan gives none):
// in_flight − 1, taken as the warm-up (`deepen`) or only as a cap on the default; then at most
// `cap` − 1 on every stage (cap > 0), and never rising along the pipeline.
inline std::vector<int> capped_warmups(std::vector<int> warmups, const std::vector<int>& in_flight,
                                       bool deepen, int cap = 0) {
  for (std::size_t s = 0; s < warmups.size(); ++s) {
    int& w = warmups[s];
    if (s < in_flight.size() && in_flight[s] > 0)
      w = deepen ? in_flight[s] - 1 : std::min(w, in_flight[s] - 1);
    if (cap > 0) w = std::min(w, cap - 1);
    if (s > 0) w = std::min(w, warmups[s - 1]);
    w = std::max(w, 0);
  }
  return warmups;
}

// Forwards and backwards (oldest first) of the microbatches `mbs`, with `before[k]` forwards run
// before the k-th backward (forwards_before): emit(kind, microbatch) for each pass in order.
template <class Emit>
void one_f_one_b_passes(const std::vector<int>& mbs, const std::vector<int>& before, Emit&& emit) {
  std::size_t f = 0;
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    for (; f < static_cast<std::size_t>(before[k]); ++f) emit(PassKind::Forward, mbs[f]);
    emit(PassKind::Backward, mbs[k]);
  }
}

// ZB-H1's order: 1F1B's of forwards and input gradients (I); each W follows once `lag` I's are
// pending, and the last ones close the list.
template <class Emit>
void zero_bubble_passes(const std::vector<int>& mbs, const std::vector<int>& before, int lag,
                        Emit&& emit) {
  std::deque<int> pending;  // microbatches whose I ran and whose W has not
  std::size_t f = 0;
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    for (; f < static_cast<std::size_t>(before[k]); ++f) emit(PassKind::Forward, mbs[f]);
    emit(PassKind::Input, mbs[k]);
    pending.push_back(mbs[k]);
    if (static_cast<int>(pending.size()) > lag) {
      emit(PassKind::Weight, pending.front());
      pending.pop_front();
    }
  }
  for (int u : pending) emit(PassKind::Weight, u);
}

// ZB-H1's lag on each stage: it defers its W's by the warm-up it runs short of the first stage's
// (s on a straight pipeline under 1F1B's depths), so every stage holds as many microbatches as the
// first does under 1F1B, and the delayed W's fill the cool-down while the I's race down the
// pipeline.
inline int zero_bubble_lag(const std::vector<int>& warmups, int stage) {
  return std::max(0, warmups.front() - warmups[static_cast<std::size_t>(stage)]);
}

}  // namespace pipeline
