// Comparing a stage's parameters with a whole model's, for the runtime tests.
#pragma once

#include <pipeline/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

namespace pipeline::testing {

// The largest |a - b| / (1 + |b|) over every parameter of layers [r.begin, r.end), where `got`
// holds those layers (got[0] is layer r.begin) and `want` the whole model's.
inline double max_rel_diff(const ModelParams& got, const ModelParams& want, LayerRange r) {
  double worst = 0;
  for (int i = r.begin; i < r.end; ++i) {
    const auto& g = got[static_cast<std::size_t>(i - r.begin)].params;
    const auto& w = want[static_cast<std::size_t>(i)].params;
    REQUIRE(g.size() == w.size());
    for (std::size_t k = 0; k < g.size(); ++k) {
      auto gv = g[k].values();
      auto wv = w[k].values();
      REQUIRE(gv.size() == wv.size());
      for (std::size_t e = 0; e < gv.size(); ++e)
        worst = std::max(worst,
                         std::abs(double(gv[e]) - double(wv[e])) / (1.0 + std::abs(double(wv[e]))));
    }
  }
  return worst;
}

}  // namespace pipeline::testing
