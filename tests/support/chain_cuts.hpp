// Every way of cutting a chain of layers into contiguous stages: the exhaustive reference the
// partitioner tests hold their dynamic programs to.
#pragma once

#include <pipeline/profile/profile.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

namespace pipeline::testing {

// Calls visit(cuts) for every cut of `layers` layers into `stages` non-empty ranges, stage k over
// layers [cuts[k], cuts[k + 1]) (cuts.front() == 0, cuts.back() == layers).
inline void for_each_cut(int layers, int stages,
                         const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> cuts{0};
  std::function<void(int)> go = [&](int k) {
    if (k == stages - 1) {
      cuts.push_back(layers);
      visit(cuts);
      cuts.pop_back();
      return;
    }
    for (int e = cuts.back() + 1; e <= layers - (stages - 1 - k); ++e) {
      cuts.push_back(e);
      go(k + 1);
      cuts.pop_back();
    }
  };
  go(0);
}

// The least, over every cut of `p`'s layers into `stages`, of the slowest stage's cost, a stage
// k over [begin, end) costing max(its forward and backward time, extra(k, begin, end)).
inline double least_slowest_stage(
    const Profile& p, int stages,
    const std::function<double(int, int, int)>& extra = [](int, int, int) { return 0.0; }) {
  double best = std::numeric_limits<double>::infinity();
  for_each_cut(p.size(), stages, [&](const std::vector<int>& cuts) {
    double worst = 0;
    for (int k = 0; k < stages; ++k) {
      const auto b = static_cast<std::size_t>(k);
      double c = 0;
      for (int l = cuts[b]; l < cuts[b + 1]; ++l)
        c += p.layers[static_cast<std::size_t>(l)].forward_s +
             p.layers[static_cast<std::size_t>(l)].backward_s;
      worst = std::max(worst, std::max(c, extra(k, cuts[b], cuts[b + 1])));
    }
    best = std::min(best, worst);
  });
  return best;
}

}  // namespace pipeline::testing
