// bench_conv: forward, backward-data and backward-filter time of fashion-cnn's two convolutions
// and one of vgg16's 3x3 ones at batch 64, through the library's CPU ops with each algorithm:
// "lowered" (im2col per sample + Eigen gemm, samples over threads) and "automatic" (Winograd's
// transforms where they apply, ops/conv.hpp); the last column is lowered time / automatic time.
//
// FLOPs of each of the three passes = 2 · N · M · OH · OW · C · KH · KW (a multiply-add is 2).
// For comparison the table ends with a plain gemm of the same FLOPs as conv2 done as one
// whole-batch product ([M, C·KH·KW] x [C·KH·KW, N·OH·OW], Eigen threaded): the ceiling of the
// whole-batch-im2col alternative before its lowering and transposes are paid.
//
// Columns: GFLOP/s at the median and at the best wall-clock time, and GF/cpu-s, the FLOPs per
// second of CPU time summed over threads (on a quiet machine, GFLOP/s ≈ threads · GF/cpu-s; on a
// shared one the wall-clock columns drop while GF/cpu-s still shows the kernels' efficiency).
//
// Usage: bench_conv [--threads N] [--batch N] [--min-seconds S] [--layer NAME] [--pass NAME]
//                   [--algorithm NAME] [--results FILE]
// --layer, --pass and --algorithm keep only the rows named (for profiling one pass alone).
// With --results the table is appended to FILE (e.g. bench/RESULTS.md) with the machine and date.
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/conv.hpp>
#include <pipeline/ops/gemm.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"

using namespace pipeline;
using bench::cpu_name;
using bench::cpu_seconds;
using bench::load_average;

namespace {

struct Timing {
  double median_s, best_s, median_cpu_s;  // wall clock, and process CPU time of all threads
};

Timing time_it(const std::function<void()>& fn, double min_seconds) {
  fn();  // warm-up: first-touch of buffers, thread pool start
  std::vector<double> runs, cpu;
  const auto start = std::chrono::steady_clock::now();
  while (runs.size() < 5 ||
         (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
              min_seconds &&
          runs.size() < 200)) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu.push_back(cpu_seconds() - c0);
  }
  std::sort(runs.begin(), runs.end());
  std::sort(cpu.begin(), cpu.end());
  return {runs[runs.size() / 2], runs.front(), cpu[cpu.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = default_num_threads();
  std::int64_t batch = 64;
  double min_seconds = 1.0;
  std::string results, only_layer, only_pass, only_algorithm;
  CLI::App app{
      "fashion-cnn's and a VGG-16 layer's convolutions on the CPU: each algorithm, each pass"};
  app.add_option("--threads", threads, "CPU threads (default: the machine's cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--batch", batch, "samples per call")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--min-seconds", min_seconds, "time each measurement at least this long")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--results", results, "also write the table here");
  app.add_option("--layer", only_layer, "only this layer: conv1, conv2 or vgg16")
      ->check(CLI::IsMember({"conv1", "conv2", "vgg16"}));
  app.add_option("--pass", only_pass, "only this pass: forward, backward-data or backward-filter")
      ->check(CLI::IsMember({"forward", "backward-data", "backward-filter"}));
  app.add_option("--algorithm", only_algorithm, "only this algorithm: lowered or automatic")
      ->check(CLI::IsMember({"lowered", "automatic"}));
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);

  struct Conv {
    const char* name;
    std::int64_t c, h, w, m, k, pad;
  };
  const std::vector<Conv> convs = {{"conv1 1->32 5x5 p2 28x28", 1, 28, 28, 32, 5, 2},
                                   {"conv2 32->64 5x5 p2 14x14", 32, 14, 14, 64, 5, 2},
                                   {"vgg16 64->64 3x3 p1 32x32", 64, 32, 32, 64, 3, 1}};

  std::string table = fmt::format("{:<28} {:<16} {:<10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
                                  "layer", "pass", "algorithm", "GFLOP", "median ms", "GFLOP/s",
                                  "best GF/s", "GF/cpu-s", "speed-up");
  table += std::string(117, '-') + "\n";
  // GFLOP/s count the direct convolution's FLOPs whatever the algorithm computes.
  auto row = [&](const std::string& layer, const char* pass, const char* algorithm, double flop,
                 Timing t, double speedup) {
    table +=
        fmt::format("{:<28} {:<16} {:<10} {:>8.3f} {:>10.3f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8}\n",
                    layer, pass, algorithm, flop * 1e-9, t.median_s * 1e3, flop / t.median_s * 1e-9,
                    flop / t.best_s * 1e-9, flop / t.median_cpu_s * 1e-9,
                    speedup > 0 ? fmt::format("{:.2f}x", speedup) : std::string());
  };
  // Each pass under both algorithms, the lowered one first (those the filters keep).
  auto both = [&](const std::string& layer, const char* pass, double flop,
                  const std::function<void()>& fn) {
    std::string pass_flag = pass;
    std::replace(pass_flag.begin(), pass_flag.end(), ' ', '-');
    if ((!only_layer.empty() && !layer.starts_with(only_layer + " ")) ||
        (!only_pass.empty() && pass_flag != only_pass))
      return;
    Timing lowered{}, automatic{};
    if (only_algorithm != "automatic") {
      ops::set_cpu_conv_algorithm(ops::CpuConvAlgorithm::Lowered);
      lowered = time_it(fn, min_seconds);
      row(layer, pass, "lowered", flop, lowered, 0);
    }
    if (only_algorithm != "lowered") {
      ops::set_cpu_conv_algorithm(ops::CpuConvAlgorithm::Automatic);
      automatic = time_it(fn, min_seconds);
      row(layer, pass, "automatic", flop, automatic,
          only_algorithm.empty() ? lowered.median_s / automatic.median_s : 0);
    }
  };

  for (const Conv& c : convs) {
    const ops::Window2d win = ops::Window2d::square(c.k, 1, c.pad);
    Tensor x = bench::random_tensor({batch, c.c, c.h, c.w}, 1);
    Tensor w = bench::random_tensor({c.m, c.c, c.k, c.k}, 2);
    Tensor b = bench::random_tensor({c.m}, 3);
    Tensor y = Tensor::empty(ops::conv2d_output_shape(x.shape(), w.shape(), win));
    Tensor dy = bench::random_tensor(y.shape(), 4);
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = Tensor::zeros(w.shape());
    const double flop = 2.0 * static_cast<double>(y.numel()) * c.c * c.k * c.k;
    both(c.name, "forward", flop, [&] { ops::conv2d_forward(x, w, b, y, win); });
    both(c.name, "backward data", flop, [&] { ops::conv2d_backward_data(dy, w, dx, win); });
    both(c.name, "backward filter", flop, [&] { ops::conv2d_backward_filter(x, dy, dw, win); });
  }
  if (only_layer.empty() && only_pass.empty() && only_algorithm.empty()) {
    const std::int64_t m = 64, k = 32 * 25, n = batch * 14 * 14;
    Tensor a = bench::random_tensor({m, k}, 5), bm = bench::random_tensor({k, n}, 6),
           cm = Tensor::empty({m, n});
    row(fmt::format("gemm {}x{}x{}", m, k, n), "whole batch", "", 2.0 * m * k * n,
        time_it([&] { ops::gemm(a, false, bm, false, cm); }, min_seconds), 0);
  }

  const std::string header =
      fmt::format("bench_conv: batch {}, {} threads, {}, load average {}, {:%Y-%m-%d}\n", batch,
                  threads, cpu_name(), load_average(), fmt::localtime(std::time(nullptr)));
  std::fputs((header + table).c_str(), stdout);
  if (!results.empty() && !bench::append_results(results, header, table)) return 1;
  return 0;
}
