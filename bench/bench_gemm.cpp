// bench_gemm: the CPU products of a training step (ops::gemm) at each thread count, and what
// waking the threads costs.
//
// A training step's products are small (the mlp's largest is 64 x 784 x 256 multiply-adds) and
// come between loops that use few threads, so how fast a product is depends on how fast a team
// of threads starts after idling as much as on the kernel. For each shape and thread count the
// table gives the median time of a product run back to back ("hot") and of one run after the
// calling thread worked alone for --gap microseconds ("after gap", the threads idle meanwhile),
// and the same for an empty parallel region of that many threads (the fork and join alone).
// Two more columns time the product after the calling thread alone wrote one of its operands, as
// a training step does between products: "C by caller" zeroes the result first and accumulates
// into it (gradients zeroed, then dW += dyᵀ·x), "B by caller" rewrites the weight operand (an
// optimizer step on one thread). The other threads then fetch those lines from one core's cache.
//
// Shapes: the forward, input-gradient and weight-gradient products of the mlp's fc1 and fc2 and
// of fashion-cnn's fc1 at batch 64 (Linear: y = x·Wᵀ, dx = dy·W, dW += dyᵀ·x).
//
// Usage: bench_gemm [--threads 1,2,4,8,16] [--gap 200] [--min-seconds 0.3]
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/gemm.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"

using namespace pipeline;

namespace {

using Clock = std::chrono::steady_clock;

// The calling thread busy for `us` microseconds (the other threads idle meanwhile).
void work_alone(double us) {
  const auto end = Clock::now() + std::chrono::duration<double, std::micro>(us);
  while (Clock::now() < end) {
  }
}

// Median microseconds of fn, each call preceded by `before` (untimed) and gap_us of work on the
// calling thread alone.
double median_us(const std::function<void()>& fn, double gap_us, double min_seconds,
                 const std::function<void()>& before = {}) {
  fn();
  std::vector<double> runs;
  const auto start = Clock::now();
  while (runs.size() < 20 ||
         (std::chrono::duration<double>(Clock::now() - start).count() < min_seconds &&
          runs.size() < 20000)) {
    if (before) before();
    if (gap_us > 0) work_alone(gap_us);
    const auto t0 = Clock::now();
    fn();
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::nth_element(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(runs.size() / 2),
                   runs.end());
  return runs[runs.size() / 2];
}

struct Product {
  std::string name;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts{1, 2, 4, 8, 16};
  double gap_us = 200, min_seconds = 0.3;
  CLI::App app{"Each matrix product of a training step at each thread count"};
  app.add_option("--threads", thread_counts, "thread counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--gap", gap_us, "microseconds the calling thread works alone before a call")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--min-seconds", min_seconds, "time each measurement at least this long")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::int64_t b = 64;
  auto linear = [&](const std::string& layer, std::int64_t in, std::int64_t out) {
    return std::vector<Product>{{layer + " forward", b, out, in, false, true, 0.f},
                                {layer + " input grad", b, in, out, false, false, 0.f},
                                {layer + " weight grad", out, in, b, true, false, 1.f}};
  };
  std::vector<Product> products;
  for (auto& list : {linear("mlp fc1", 784, 256), linear("mlp fc2", 256, 256),
                     linear("fashion-cnn fc1", 3136, 1024)})
    products.insert(products.end(), list.begin(), list.end());

  fmt::print("bench_gemm on {}, {} CPUs allowed; gap {} us; median us per call\n\n",
             bench::cpu_name(), allowed_cpus(), gap_us);
  fmt::print(
      "| product | m x n x k | threads | hot us | after gap us | C by caller us | B by caller "
      "us | GFLOP/s hot | speed-up hot (vs first count) |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  for (int t : thread_counts) {
    set_num_threads(t);
    const double hot = median_us(
        [t] {
#pragma omp parallel num_threads(t)
          { asm volatile("" ::: "memory"); }
        },
        0, min_seconds);
    const double cold = median_us(
        [t] {
#pragma omp parallel num_threads(t)
          { asm volatile("" ::: "memory"); }
        },
        gap_us, min_seconds);
    fmt::print("| empty parallel region | - | {} | {:.2f} | {:.2f} | - | - | - | - |\n", t, hot,
               cold);
  }
  for (const Product& p : products) {
    const Tensor a = bench::random_tensor(p.trans_a ? Shape{p.k, p.m} : Shape{p.m, p.k}, 1);
    Tensor w = bench::random_tensor(p.trans_b ? Shape{p.n, p.k} : Shape{p.k, p.n}, 2);
    Tensor c = bench::random_tensor({p.m, p.n}, 3);
    double one_thread = 0;
    for (int t : thread_counts) {
      set_num_threads(t);
      auto call = [&] { ops::gemm(a, p.trans_a, w, p.trans_b, c, 1.f, p.beta); };
      const double hot = median_us(call, 0, min_seconds);
      const double cold = median_us(call, gap_us, min_seconds);
      // The caller's writes: plain loops on this thread (zero_bytes would spread them).
      float* cd = c.data<float>();
      float* wd = w.data<float>();
      const double c_by_caller =
          median_us([&] { ops::gemm(a, p.trans_a, w, p.trans_b, c, 1.f, 1.f); }, 0, min_seconds,
                    [&] { std::fill(cd, cd + c.numel(), 0.f); });
      const double b_by_caller = median_us(call, 0, min_seconds, [&] {
        for (std::int64_t i = 0; i < w.numel(); ++i) wd[i] = wd[i] * 0.999f + 1e-4f;
      });
      if (t == thread_counts.front()) one_thread = hot;  // speed-ups are against the first count
      const double flops = 2.0 * static_cast<double>(p.m * p.n * p.k);
      fmt::print(
          "| {} | {} x {} x {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f}x |\n",
          p.name, p.m, p.n, p.k, t, hot, cold, c_by_caller, b_by_caller, flops / hot * 1e-3,
          one_thread / hot);
    }
  }
  return 0;
}
