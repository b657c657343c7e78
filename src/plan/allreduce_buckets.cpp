#include <pipeline/plan/allreduce_buckets.hpp>

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <cstddef>

namespace pipeline {

std::vector<AllreduceBucket> allreduce_buckets(const std::vector<double>& backward_s,
                                               const std::vector<double>& parameter_bytes,
                                               std::int64_t bucket_bytes) {
  PIPELINE_CHECK(backward_s.size() == parameter_bytes.size(),
                 "internal: {} backward times for {} layers", backward_s.size(),
                 parameter_bytes.size());
  double total_s = 0, total_bytes = 0;
  for (std::size_t l = 0; l < backward_s.size(); ++l) {
    total_s += backward_s[l];
    total_bytes += parameter_bytes[l];
  }
  const auto limit = static_cast<double>(std::max<std::int64_t>(1, bucket_bytes));
  std::vector<AllreduceBucket> buckets;
  double done_s = 0, bytes = 0;
  for (std::size_t i = backward_s.size(); i-- > 0;) {
    done_s += backward_s[i];
    bytes += parameter_bytes[i];
    if (bytes >= limit || i == 0) {
      buckets.push_back({total_s > 0 && i > 0 ? done_s / total_s : 1.0,
                         total_bytes > 0 ? bytes / total_bytes : 0.0});
      bytes = 0;
    }
  }
  return buckets;
}

double allreduce_after_backward_s(const std::vector<AllreduceBucket>& buckets, double bandwidth_s,
                                  double latency_s, double backward_s) {
  double link = 0;
  for (const AllreduceBucket& b : buckets)
    link = std::max(link, b.ready * backward_s) + b.share * bandwidth_s + latency_s;
  return std::max(0.0, link - backward_s);
}

}  // namespace pipeline
