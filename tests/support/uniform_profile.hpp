// Profiles and plans of equal layers, for the simulator and planner tests whose expected figures
// follow in closed form.
#pragma once

#include <pipeline/plan/plan.hpp>
#include <pipeline/profile/profile.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace pipeline::testing {

// `layers` layers of equal cost; forward 1 ms, backward 2 ms per minibatch of 32.
inline Profile uniform_profile(int layers, double fwd = 1e-3, double bwd = 2e-3,
                               std::int64_t out_bytes = 1000, std::int64_t par_bytes = 500) {
  Profile p;
  p.model = "uniform";
  p.batch_size = 32;
  for (int i = 0; i < layers; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.forward_s = fwd;
    l.backward_s = bwd;
    l.output_bytes = out_bytes;
    l.parameter_bytes = par_bytes;
    p.layers.push_back(l);
  }
  return p;
}

// Stages given as (layer count, replicas), ranks in order.
inline Plan make_plan(const std::vector<std::pair<int, int>>& stages) {
  Plan plan;
  int layer = 0, rank = 0;
  for (auto [n, r] : stages) {
    PlanStage s;
    s.begin = layer;
    s.end = layer + n;
    s.replicas = r;
    for (int i = 0; i < r; ++i) s.ranks.push_back(rank++);
    layer += n;
    plan.stages.push_back(s);
  }
  plan.workers = rank;
  return plan;
}

}  // namespace pipeline::testing
