// The partitioner over a mixed cluster: PipeDream's dynamic program extended over worker types.
//
// A topology with worker types (Topology::types, one network level of bandwidth B) and a profile
// per type (DeviceProfiles). A plan is a sequence of stages, each a contiguous range of antichain
// states (for a chain: of layers) placed on one type t with r replicas of that type; its time per
// minibatch is that of the slowest stage under the pipeline cost model (cost_model.hpp) with
// stage compute, forward (recomputation), parameters, activations and boundary bytes from type
// t's profile:
//   stage(s..j, t, r) = max((C_t(s, j) + sync(P_t(s, j), r, B)) / r,
//                           transfer(a_t(s), r, B), transfer(a_t(j), r, B))
// (no transfers for the first stage, no output transfer for the last, as partition() charges
// them), and memory per worker, with its minibatches in flight from the workers at and after it,
// within type t's memory (recomputing the stage where PartitionOptions::recompute allows it).
//
// The state is (s, v): the layers after state s, to be planned on exactly v_t workers of each
// type t. Its best time is
//   T(s, v) = min over j > s, t, 1 <= r <= v_t of max(stage(s..j, t, r), T(j, v - r e_t)),
//   T(last, 0) = 0,
// solved from the last state backwards, so a stage knows how many workers follow it (its
// in-flight minibatches, hence its memory) exactly. Every usage vector 0 <= v <= counts is solved
// at once, which is what cost planning (plan/cost_plan.hpp) needs: using fewer workers is how
// cost trades against time. Ties: fewer stages, then the earliest end state, type and replica
// count in loop order.
//
// Complexity: O(S^2 · U · Σ_t n_t) time and O(S · U) memory, with S states, n_t workers of type
// t and U = Π_t (n_t + 1) usage vectors: for 8 + 16 workers U = 153, for one type of N workers
// O(S^2 N^2), PipeDream's one-level bound. On chains the scan over end states stops once a
// stage's compute alone exceeds the best time. Requests with more than 2^25 (state, usage)
// cells are refused with ConfigError.
//
// Restrictions (ConfigError otherwise): the pipeline cost model, one stage per worker
// (virtual_stages 1). `straight` allows one replica per stage; `allow_idle` is implied (a plan
// may leave workers of any type unused).
#pragma once

#include <pipeline/plan/device_profiles.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/plan/topology.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace pipeline {

class TypedPartitioner {
 public:
  // Solves every usage vector. `profiles` holds one profile per type of `topology` (which must
  // be typed), keyed by type name; check_device_profiles() must hold for them. Neither is kept:
  // the solver holds what it derived from them.
  TypedPartitioner(const DeviceProfiles& profiles, const Topology& topology,
                   const PartitionOptions& options = {});
  ~TypedPartitioner();
  TypedPartitioner(TypedPartitioner&&) noexcept;
  TypedPartitioner& operator=(TypedPartitioner&&) noexcept;

  int num_types() const;
  // Usage vectors are indexed 0..num_usages()-1 in mixed radix (type 0 the fastest digit).
  std::size_t num_usages() const;
  std::vector<int> usage(std::size_t index) const;  // workers of each type, topology order
  std::size_t usage_index(const std::vector<int>& usage) const;
  // The best time per minibatch on exactly these workers (infinity when no plan uses exactly
  // them, e.g. the model does not fit).
  double best_time(std::size_t usage_index) const;
  // The best plan on exactly these workers; ConfigError when there is none.
  Plan plan(std::size_t usage_index) const;
  // The usage with the fastest plan (ties: fewer workers, then the smaller index); ConfigError
  // naming what is missing when no usage has a plan.
  std::size_t fastest() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m;
};

// The fastest plan over a mixed cluster, on any subset of its workers.
Plan partition_typed(const DeviceProfiles& profiles, const Topology& topology,
                     const PartitionOptions& options = {});

}  // namespace pipeline
