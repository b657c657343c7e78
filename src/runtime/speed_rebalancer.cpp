#include <pipeline/runtime/speed_rebalancer.hpp>

#include <pipeline/core/error.hpp>

#include <cmath>

namespace pipeline {

SpeedRebalancer::SpeedRebalancer(Communicator& comm, double smoothing)
    : m_comm(&comm), m_smoothing(smoothing) {
  PIPELINE_CHECK_AS(ConfigError, smoothing > 0 && smoothing <= 1,
                    "SpeedRebalancer: smoothing must be in (0, 1], got {}", smoothing);
}

void SpeedRebalancer::observe(const TrainResult& segment) {
  const int n = m_comm->size();
  // Two numbers per rank, each rank filling its own: the allreduce is an allgather.
  Tensor shared = Tensor::zeros(Shape{2 * std::int64_t{n}});
  float* v = shared.data<float>();
  v[2 * m_comm->rank()] = static_cast<float>(segment.compute_seconds);
  v[2 * m_comm->rank() + 1] = static_cast<float>(segment.forwards);
  m_comm->allreduce_sum(shared, m_comm->world());
  if (m_seconds.empty()) m_seconds.assign(static_cast<std::size_t>(n), 0.0);
  for (int r = 0; r < n; ++r) {
    const double seconds = v[2 * r], forwards = v[2 * r + 1];
    if (!(forwards > 0) || !(seconds > 0) || !std::isfinite(seconds)) continue;
    const double now = seconds / forwards;
    double& estimate = m_seconds[static_cast<std::size_t>(r)];
    estimate = estimate > 0 ? m_smoothing * now + (1 - m_smoothing) * estimate : now;
  }
  // Ranks never measured (no forward yet) count as the fastest measured one, so they are dealt
  // work and measured next time.
  double fastest = 0;
  for (double t : m_seconds)
    if (t > 0 && (fastest == 0 || t < fastest)) fastest = t;
  for (double& t : m_seconds)
    if (!(t > 0)) t = fastest > 0 ? fastest : 1.0;
}

}  // namespace pipeline
