// bench_kernels: the effective bandwidth of the custom CUDA kernels as a fraction of a
// device-to-device copy timed in the same run, optionally beside PyTorch's own kernels
// (bench/torch_kernels.py, same shapes, same byte formulas).
//
//   bench_kernels [--runs 20] [--warmup 5] [--torch] [--python python3] [--results
//   bench/RESULTS.md]
//
// effective bandwidth = the fewest bytes the operation must read and write / its time, where
// the time is the median of --runs runs (after --warmup) each timed with CUDA events on the
// current stream of device 0; fraction of copy = that bandwidth / the copy's, the copy being
// cudaMemcpyAsync of a 1 GiB buffer device to device (2 GiB moved: read once, written once).
// All tensors float32 (4 bytes an element; labels int32), N elements, R rows of F features, C
// classes:
//   activation forward (GELU, ReLU)  N = 64M         read x, write y            8·N
//   activation backward (GELU, ReLU) N = 64M         read x and dy, write dx    12·N
//   bias gradient                    R×F 65536×1024  read dy, read+write dbias  4·R·F + 8·F
//   layer norm forward               R×F 65536×1024  read x, weight, bias; write y, mean, rstd
//                                                    4·(2·R·F + 2·F + 2·R)
//   layer norm forward + backward    R×F 65536×1024  the forward, then read x, dy, weight, mean,
//                                                    rstd, read+write dweight, dbias; write dx
//                                                    4·(2·R·F + 2·F + 2·R) + 4·(3·R·F + 5·F + 2·R)
//   softmax cross-entropy fwd + bwd  R×C 65536×256, 16384×32000
//                                                    read logits and labels, write grad
//                                                    4·(2·R·C + R)
// (softmax_cross_entropy returns the loss to the host, so its time includes that read, as does
// PyTorch's loss.item(); the second softmax row leaves the totals on the device, as
// softmax_cross_entropy_accumulate does in a graphed training step, against PyTorch without
// .item().)
// Without a CUDA device it says so and exits with 77 (as the gpu tests do).
#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/check.hpp>
#include <pipeline/cuda/stream.hpp>
#include <pipeline/ops/activation.hpp>
#include <pipeline/ops/bias.hpp>
#include <pipeline/ops/norm.hpp>
#include <pipeline/ops/softmax_xent.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>

#include "bench_util.hpp"

#ifndef PIPELINE_BENCH_DIR
#define PIPELINE_BENCH_DIR "bench"
#endif

using namespace pipeline;

namespace {

const Device kGpu = Device::cuda(0);

// Median milliseconds of `runs` calls of f after `warmup` calls, each timed with CUDA events.
double time_ms(const std::function<void()>& f, int warmup, int runs) {
  const cudaStream_t stream = cuda::current_stream(0);
  for (int i = 0; i < warmup; ++i) f();
  cuda::Event start = cuda::Event::create(0, true), end = cuda::Event::create(0, true);
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    start.record(stream);
    f();
    end.record(stream);
    end.synchronize();
    t.push_back(cuda::Event::elapsed_ms(start, end));
  }
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// A float tensor of `shape` on the GPU with values uniform in [lo, hi) (drawn on the CPU).
Tensor random_gpu(Shape shape, float lo, float hi, std::uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape));
  Rng rng(seed, "bench_kernels");
  rng.fill_uniform(t, lo, hi);
  return t.to(kGpu);
}

Tensor labels_gpu(std::int64_t rows, std::int64_t classes, std::uint64_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(rows));
  Rng rng(seed, "bench_kernels.labels");
  for (auto& x : v)
    x = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(classes));
  return Tensor::from_ints({rows}, v).to(kGpu);
}

struct Row {
  std::string kernel, shape, formula;
  double bytes = 0, ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 20, warmup = 5;
  bool torch = false;
  std::string python = "python3", results;
  std::string torch_script = std::string(PIPELINE_BENCH_DIR) + "/torch_kernels.py";
  CLI::App app{"Effective bandwidth of the custom CUDA kernels against a device copy"};
  app.add_option("--runs", runs)->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 100000));
  app.add_flag("--torch", torch, "also run bench/torch_kernels.py and show PyTorch's fraction");
  app.add_option("--python", python, "the python that has PyTorch");
  app.add_option("--torch-script", torch_script);
  app.add_option("--results", results, "append the table to this file (bench/RESULTS.md)");
  CLI11_PARSE(app, argc, argv);

  if (cuda::device_count() == 0) {
    fmt::print(stderr, "no CUDA device: nothing to measure\n");
    return 77;
  }
  try {
    // The reference: a 1 GiB device-to-device copy, 2 GiB of traffic.
    const std::size_t copy_bytes = std::size_t{1} << 30;
    void* src = nullptr;
    void* dst = nullptr;
    PIPELINE_CUDA_CHECK(cudaSetDevice(0));
    PIPELINE_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
    PIPELINE_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
    PIPELINE_CUDA_CHECK(cudaMemset(src, 0, copy_bytes));
    const cudaStream_t stream = cuda::current_stream(0);
    const double copy_ms = time_ms(
        [&] {
          PIPELINE_CUDA_CHECK(
              cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream));
        },
        warmup, runs);
    PIPELINE_CUDA_CHECK(cudaFree(src));
    PIPELINE_CUDA_CHECK(cudaFree(dst));
    const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e6);

    std::vector<Row> rows;
    {
      // Elementwise activations: 64M floats.
      const std::int64_t n = std::int64_t{64} << 20;
      Tensor x = random_gpu({n}, -3.f, 3.f, 1), dy = random_gpu({n}, -1.f, 1.f, 2);
      Tensor y = Tensor::empty({n}, DType::Float32, kGpu);
      Tensor dx = Tensor::empty({n}, DType::Float32, kGpu);
      const std::string shape = "64M";
      const auto N = static_cast<double>(n);
      for (auto a : {ops::Activation::GELU, ops::Activation::ReLU}) {
        const std::string name(ops::activation_name(a));
        // forward: read x, write y = 8·N bytes.
        rows.push_back({name + " forward", shape, "8·N", 8 * N,
                        time_ms([&] { ops::activation_forward(a, x, y); }, warmup, runs)});
        // backward (from the input x): read x and dy, write dx = 12·N bytes.
        rows.push_back({name + " backward", shape, "12·N", 12 * N,
                        time_ms([&] { ops::activation_backward(a, x, dy, dx); }, warmup, runs)});
      }
    }
    {
      // Bias gradient: dbias[f] += Σ_r dy[r, f]; read dy, read and write dbias = 4·R·F + 8·F.
      const std::int64_t r = 65536, f = 1024;
      Tensor dy = random_gpu({r, f}, -1.f, 1.f, 3);
      Tensor db = Tensor::zeros({f}, DType::Float32, kGpu);
      const auto R = static_cast<double>(r), F = static_cast<double>(f);
      rows.push_back({"bias gradient", "65536×1024", "4·R·F + 8·F", 4 * R * F + 8 * F,
                      time_ms([&] { ops::bias_grad(dy, db); }, warmup, runs)});
    }
    {
      const std::int64_t r = 65536, f = 1024;
      Tensor x = random_gpu({r, f}, -1.f, 1.f, 4), dy = random_gpu({r, f}, -1.f, 1.f, 5);
      Tensor w = random_gpu({f}, 0.5f, 1.5f, 6), b = random_gpu({f}, -0.5f, 0.5f, 7);
      Tensor y = Tensor::empty({r, f}, DType::Float32, kGpu);
      Tensor dx = Tensor::empty({r, f}, DType::Float32, kGpu);
      Tensor mean = Tensor::empty({r}, DType::Float32, kGpu);
      Tensor rstd = Tensor::empty({r}, DType::Float32, kGpu);
      Tensor dw = Tensor::zeros({f}, DType::Float32, kGpu);
      Tensor dbias = Tensor::zeros({f}, DType::Float32, kGpu);
      const auto R = static_cast<double>(r), F = static_cast<double>(f);
      // forward: read x, weight, bias; write y, mean, rstd = 4·(2·R·F + 2·F + 2·R).
      const double fwd = 4 * (2 * R * F + 2 * F + 2 * R);
      // backward: read x, dy, weight, mean, rstd; read and write dweight and dbias; write dx
      //   = 4·(3·R·F + 5·F + 2·R).
      const double bwd = 4 * (3 * R * F + 5 * F + 2 * R);
      rows.push_back(
          {"layer norm forward", "65536×1024", "4·(2·R·F + 2·F + 2·R)", fwd,
           time_ms([&] { ops::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd); }, warmup, runs)});
      rows.push_back({"layer norm forward + backward", "65536×1024",
                      "4·(2·R·F + 2·F + 2·R) + 4·(3·R·F + 5·F + 2·R)", fwd + bwd,
                      time_ms(
                          [&] {
                            ops::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
                            ops::layer_norm_backward(x, w, mean, rstd, dy, &dx, &dw, &dbias);
                          },
                          warmup, runs)});
    }
    for (auto [r, c] : {std::pair<std::int64_t, std::int64_t>{65536, 256}, {16384, 32000}}) {
      // Fused softmax cross-entropy forward and backward: read logits and labels, write grad
      //   = 4·(2·R·C + R).
      Tensor logits = random_gpu({r, c}, -4.f, 4.f, 8);
      Tensor labels = labels_gpu(r, c, 9);
      Tensor grad = Tensor::empty({r, c}, DType::Float32, kGpu);
      const auto R = static_cast<double>(r), C = static_cast<double>(c);
      const float scale = 1.f / static_cast<float>(r);
      rows.push_back({"softmax cross-entropy forward + backward", fmt::format("{}×{}", r, c),
                      "4·(2·R·C + R)", 4 * (2 * R * C + R),
                      time_ms([&] { ops::softmax_cross_entropy(logits, labels, scale, grad); },
                              warmup, runs)});
      // What a graphed training step queues: the totals added up on the device, nothing waits.
      Tensor totals = Tensor::zeros({4}, DType::Int64, kGpu);  // 32 bytes for four doubles
      rows.push_back(
          {"softmax cross-entropy forward + backward, loss left on the device",
           fmt::format("{}×{}", r, c), "4·(2·R·C + R)", 4 * (2 * R * C + R),
           time_ms(
               [&] { ops::softmax_cross_entropy_accumulate(logits, labels, scale, grad, totals); },
               warmup, runs)});
      if (c > 8192) {
        // Long rows the other way: one block a row, the row in shared memory (the kernel of GPUs
        // without thread-block clusters), for the comparison with the cluster kernel.
        ops::set_softmax_xent_clusters(false);
        rows.push_back(
            {"softmax cross-entropy forward + backward, loss left on the device, no clusters",
             fmt::format("{}×{}", r, c), "4·(2·R·C + R)", 4 * (2 * R * C + R),
             time_ms(
                 [&] {
                   ops::softmax_cross_entropy_accumulate(logits, labels, scale, grad, totals);
                 },
                 warmup, runs)});
        ops::set_softmax_xent_clusters(true);
      }
    }

    // PyTorch: one JSON line per row {"kernel", "shape", "median_ms"} plus {"kernel": "copy"}.
    std::map<std::pair<std::string, std::string>, double> torch_ms;
    double torch_copy_ms = 0;
    std::string torch_version = "-";
    if (torch) {
      const std::string cmd = fmt::format("{} {} --runs {} --warmup {}", bench::shell_quote(python),
                                          bench::shell_quote(torch_script), runs, warmup);
      int status = 0;
      for (const auto& line : bench::run_lines(cmd, &status)) {
        if (line.empty() || line.front() != '{') continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("kernel")) continue;
        const std::string k = j["kernel"].get<std::string>();
        if (j.contains("torch")) torch_version = j["torch"].get<std::string>();
        if (k == "copy")
          torch_copy_ms = j["median_ms"].get<double>();
        else
          torch_ms[{k, j["shape"].get<std::string>()}] = j["median_ms"].get<double>();
      }
      if (status != 0) fmt::print(stderr, "{}: failed (status {})\n", cmd, status);
    }

    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
    const std::string header = fmt::format(
        "bench_kernels on {} ({}); PyTorch {}\ncommand: {}\n"
        "time: median of {} runs after {} warm-up, CUDA events; GB/s = bytes / time / 1e9; "
        "fraction of copy = GB/s / copy GB/s\n"
        "copy: cudaMemcpyAsync of 1 GiB device to device, 2·2^30 bytes in {:.3f} ms = {:.1f} GB/s"
        "{}\n"
        "N elements, R rows × F features or C classes, 4-byte floats and labels; PyTorch's "
        "fraction uses the same bytes over its own time and its own copy (x.copy_ of 1 GiB)\n",
        cuda::device_description(0), date, torch_version, command, runs, warmup, copy_ms, copy_gbs,
        torch_copy_ms > 0
            ? fmt::format(" (PyTorch's: {:.1f} GB/s)",
                          2.0 * static_cast<double>(copy_bytes) / (torch_copy_ms * 1e6))
            : "");
    std::string table =
        "| kernel | shape | bytes | ours GB/s | fraction of copy | PyTorch fraction |\n"
        "|---|---|---|---|---|---|\n";
    for (const Row& r : rows) {
      const double gbs = r.bytes / (r.ms * 1e6);
      std::string theirs = "-";
      auto t = torch_ms.find({r.kernel, r.shape});
      if (t != torch_ms.end() && torch_copy_ms > 0) {
        const double t_gbs = r.bytes / (t->second * 1e6);
        const double t_copy = 2.0 * static_cast<double>(copy_bytes) / (torch_copy_ms * 1e6);
        theirs = fmt::format("{:.2f}", t_gbs / t_copy);
      } else if (torch) {
        theirs = "missing";
      }
      table += fmt::format("| {} | {} | {} = {:.3g} GB | {:.1f} | {:.2f} | {} |\n", r.kernel,
                           r.shape, r.formula, r.bytes / 1e9, gbs, gbs / copy_gbs, theirs);
    }
    fmt::print("{}\n{}", header, table);
    if (!results.empty() && !bench::append_results(results, header + "\n", table)) return 1;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
