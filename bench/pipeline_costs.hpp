// What the pipeline benchmarks measure besides their runs, to give the simulator the machine's
// costs: medians, the time of one optimizer step over a stage's weights, and the one-way time of
// a message between two ranks.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/sgd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pipeline::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Median seconds of one SGD (momentum) step over a stage's parameters and of one copy of them
// (what a 1f1b-stash step adds when an in-flight microbatch still holds the current version).
struct StepCost {
  double step_s = 0;
  double copy_s = 0;
};

inline StepCost time_step(const Sequential& model, LayerRange r) {
  using Clock = std::chrono::steady_clock;
  ModelParams params = model.init(1, r), copy = model.init(2, r);
  ModelGrads grads = model.zero_grads(r);
  Sgd sgd(SgdOptions{.momentum = 0.9f});
  std::vector<Tensor> p = flatten_params(params), g = flatten_grads(grads),
                      c = flatten_params(copy);
  std::vector<double> steps, copies;
  for (int i = 0; i < 25; ++i) {
    auto t0 = Clock::now();
    sgd.step(p, g, 1e-3f);
    for (auto& t : g) t.zero();  // the executor clears the gradients after every step
    const double s = seconds_since(t0);
    t0 = Clock::now();
    for (std::size_t k = 0; k < p.size(); ++k) c[k].copy_from(p[k]);
    const double cs = seconds_since(t0);
    if (i >= 5) {
      steps.push_back(s);
      copies.push_back(cs);
    }
  }
  return {median(steps), median(copies)};
}

// Seconds of this core per byte of a peer's gradients in the runtime's CPU allreduce: the copy
// out of the transport (a memcpy of the received buffer) and the sum into the local gradient,
// over buffers of `bytes` (large enough to leave the caches, as 13 MB of gradients do); median
// of 15 after 3 untimed.
inline double reduce_cost_per_byte(std::int64_t bytes = std::int64_t{16} << 20) {
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(bytes / 4, 1));
  std::vector<float> peer(n, 1.f), received(n), sum(n, 2.f);
  std::vector<double> per_byte;
  for (int i = 0; i < 18; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(received.data(), peer.data(), n * sizeof(float));
    for (std::size_t k = 0; k < n; ++k) sum[k] += received[k];
    const double s = seconds_since(t0);
    if (i >= 3) per_byte.push_back(s / static_cast<double>(n * sizeof(float)));
  }
  volatile float keep = sum[n / 2];  // the sums are used: not optimised away
  (void)keep;
  return median(per_byte);
}

// Seconds of each rank's core per byte of a peer's gradients in a whole allreduce: a blocking
// allreduce_sum of `bytes` over all ranks of `comm` (median of 10 after 3 untimed, between
// barriers) divided by (ranks - 1) x bytes; 0 on one rank. Ranks of one host move the bytes with
// their own cores (MPI's shared-memory copies), so this is what an allreduce takes from the
// replicas' compute, the transport's copies as well as the sum. Collective.
inline double allreduce_cost_per_byte(Communicator& comm, std::int64_t bytes = std::int64_t{16}
                                                                               << 20) {
  if (comm.size() < 2) return 0;
  Tensor t = Tensor::full(Shape{std::max<std::int64_t>(1, bytes / 4)}, 1.f);
  std::vector<double> seconds;
  for (int i = 0; i < 13; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    comm.allreduce_sum(t, comm.world());
    if (i >= 3) seconds.push_back(seconds_since(t0));
  }
  return median(seconds) / (static_cast<double>(comm.size() - 1) * static_cast<double>(bytes));
}

// One-way time of a message of `bytes` between ranks 0 and 1 (half a ping-pong round trip,
// median of 50); 0 on other ranks and on a 1-rank job. Collective over ranks 0 and 1.
inline double ping_pong(Communicator& comm, std::int64_t bytes) {
  using Clock = std::chrono::steady_clock;
  if (comm.size() < 2 || comm.rank() > 1) return 0;
  Tensor t = Tensor::zeros(Shape{std::max<std::int64_t>(1, bytes / 4)});
  const int peer = 1 - comm.rank();
  std::vector<double> rtt;
  for (int i = 0; i < 60; ++i) {
    auto t0 = Clock::now();
    if (comm.rank() == 0) {
      comm.send(t, peer, Tag::control(0, 2));
      comm.recv(t, peer, Tag::control(0, 3));
    } else {
      comm.recv(t, peer, Tag::control(0, 2));
      comm.send(t, peer, Tag::control(0, 3));
    }
    if (i >= 10) rtt.push_back(seconds_since(t0));
  }
  return median(rtt) / 2;
}

}  // namespace pipeline::bench
