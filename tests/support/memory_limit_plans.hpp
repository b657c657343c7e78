// A planner's answer to a memory limit that stashing exceeds and recomputing meets: the protocol
// the partitioner tests of each kind of plan share.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/plan/partition.hpp>

#include <doctest/doctest.h>

#include <algorithm>

namespace pipeline::testing {

// The most memory a plan puts on one rank.
inline double most_memory(const Plan& plan) {
  return static_cast<double>(*std::max_element(plan.predicted.peak_memory_bytes.begin(),
                                               plan.predicted.peak_memory_bytes.end()));
}

struct LimitedPlans {
  Plan stashing;     // no limit, no recomputation
  Plan recomputing;  // no limit, every stage recomputing
  Plan fits;         // the limit, --recompute auto
  Topology limited;  // the topology with the limit
};

// Plans `p` on `t` with `o` (its recompute option aside) stashing and recomputing every stage,
// then under a memory limit halfway between their largest ranks: without recomputation the
// partitioner refuses, naming --recompute auto, and with it the plan fits.
inline LimitedPlans plan_under_halfway_limit(const Profile& p, const Topology& t,
                                             PartitionOptions o) {
  LimitedPlans out;
  o.recompute = Recompute::None;
  out.stashing = partition(p, t, o);
  o.recompute = Recompute::All;
  out.recomputing = partition(p, t, o);
  REQUIRE(most_memory(out.recomputing) < most_memory(out.stashing));
  out.limited = t;
  out.limited.memory_bytes_per_worker =
      (most_memory(out.stashing) + most_memory(out.recomputing)) / 2;
  o.recompute = Recompute::None;
  CHECK_THROWS_WITH_AS(partition(p, out.limited, o), doctest::Contains("--recompute auto"),
                       ConfigError);
  o.recompute = Recompute::Auto;
  out.fits = partition(p, out.limited, o);
  CHECK(most_memory(out.fits) <= *out.limited.memory_bytes_per_worker);
  return out;
}

}  // namespace pipeline::testing
