// The runtime's gradient buckets of a replicated stage: its layers' weight gradients are reduced in
// buckets from the last layer down, each as soon as its layers' backward is done (as DDP does), so
// most of a stage's allreduce runs during its closing backward. The partitioner and the simulator
// time that overlap from the same buckets.
#pragma once

#include <cstdint>
#include <vector>

namespace pipeline {

// The executor's bucket size (ExecutorOptions::allreduce_bucket_bytes), which the partitioner
// plans for.
inline constexpr std::int64_t kAllreduceBucketBytes = std::int64_t{4} << 20;

struct AllreduceBucket {
  double ready = 1;  // the fraction of the stage's closing backward after which it is complete
  double share = 0;  // its part of the stage's parameter bytes
};

// The buckets of a stage whose layers (in forward order) take `backward_s` and hold
// `parameter_bytes`: layers from the last one down until a bucket holds `bucket_bytes`, the first
// layer closing the last; parameterless layers go with the bucket below them, and a stage without
// backward time completes each bucket at its end.
std::vector<AllreduceBucket> allreduce_buckets(const std::vector<double>& backward_s,
                                               const std::vector<double>& parameter_bytes,
                                               std::int64_t bucket_bytes);

// How long an allreduce in `buckets` (each its share of `bandwidth_s`, plus `latency_s`) runs on
// after a closing backward of `backward_s`: each bucket leaves once it is complete and the one
// before it is through the link.
double allreduce_after_backward_s(const std::vector<AllreduceBucket>& buckets, double bandwidth_s,
                                  double latency_s, double backward_s);

}  // namespace pipeline
