// bench_gpu_step: the time of one training step (forward, backward, optimizer) of zoo models on
// one CUDA device, and the device memory it needs, optionally side by side with PyTorch eager
// (bench/torch_gpu_step.py: same models, batches, optimizers and precision) on the same GPU.
//
//   bench_gpu_step [--cases fashion-cnn-b64,fashion-cnn-b1024,vgg16-b64,transformer-lm-b16]
//                  [--precision fp32,tf32,bf16 | --dtype bf16] [--warmup 10] [--steps 50]
//                  [--nondeterministic] [--transformed-convolutions]
//                  [--torch [--torch-compile]] [--python python3]
//                  [--results bench/RESULTS.md]
//
// Cases (all by default):
//   fashion-cnn-b64     fashion-cnn, 1×28×28, 10 classes, batch 64, SGD momentum 0.9
//   fashion-cnn-b1024   the same at batch 1024
//   vgg16-b64           VGG-16 (configuration D), 3×224×224, 1000 classes, batch 64, SGD momentum
//   0.9 transformer-lm-b16  vocab 256, seq_len 1024, dim 1024, 16 heads, 24 blocks, batch 16, AdamW
// Precision fp32 turns TF32 off in cuBLASLt and cuDNN (pipeline::cuda::set_allow_tf32(false)),
// tf32 turns it on; PyTorch's run sets torch.backends.{cuda.matmul,cudnn}.allow_tf32 the same way.
// bf16 (--dtype bf16) trains under ops::ComputeDTypeScope(bf16) — bf16 products, fp32 master
// weights and optimizer — against PyTorch eager under torch.autocast(bfloat16); --torch-compile
// adds PyTorch with the model through torch.compile.
// Model TFLOP/s = 3 × the model's forward FLOPs (Layer::flops: forward, and a backward of twice
// that) / ms/step; MFU = that over the dense matrix rate this GPU measures for the precision (an
// 8192³ product through ops::gemm, the median of 20).
//
// Each (case, precision) runs in a child process of its own (this program with --json), so that
// the caching pool's peak is that case's alone: a SequentialTrainer on cuda:0 (parameters
// to_device(model.init(1))), one synthetic batch moved to the device once, --warmup steps, then
// --steps steps each timed with CUDA events recorded on the current stream of device 0 around
// trainer.step (which includes the trainer's host reads of the loss and of the gradient norm).
//   ms/step = median of the --steps step times; IQR = first to third quartile
//   peak MiB = pipeline::cuda::device_memory_stats(0).peak_in_use_bytes / 2^20 (the caching pool's
//              largest in-use total: parameters, gradients, optimizer state, activations and
//              workspaces, counted in the pool's size classes)
//   PyTorch peak MiB = torch.cuda.max_memory_allocated() / 2^20 over the same steps
//   ours/PyTorch speed = PyTorch ms/step / ours ms/step (above 1: we are faster)
// Without a CUDA device it says so and exits with 77 (as the gpu tests do).
#include <pipeline/core/rng.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/dnn.hpp>
#include <pipeline/cuda/stream.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include "bench_util.hpp"

#ifndef PIPELINE_BENCH_DIR
#define PIPELINE_BENCH_DIR "bench"
#endif

using namespace pipeline;

namespace {

struct CaseSpec {
  std::string name;
  std::string model;
  ZooOptions options;
  std::int64_t batch = 0;
  bool adamw = false;
  std::string what;  // for the table
};

// lm_blocks: the transformer's depth (24 in the table's rows; fewer to profile a step's kernels).
std::vector<CaseSpec> all_cases(int lm_blocks = 24) {
  std::vector<CaseSpec> c;
  c.push_back(
      {"fashion-cnn-b64", "fashion-cnn", {}, 64, false, "fashion-cnn 1×28×28, batch 64, SGD-m"});
  c.push_back({"fashion-cnn-b1024",
               "fashion-cnn",
               {},
               1024,
               false,
               "fashion-cnn 1×28×28, batch 1024, SGD-m"});
  ZooOptions vgg;
  vgg.image_size = 224;
  vgg.num_classes = 1000;
  c.push_back(
      {"vgg16-b64", "vgg16", vgg, 64, false, "vgg16 3×224×224, 1000 classes, batch 64, SGD-m"});
  ZooOptions lm;
  lm.vocab = 256;
  lm.seq_len = 1024;
  lm.dim = 1024;
  lm.heads = 16;
  lm.blocks = lm_blocks;
  c.push_back(
      {"transformer-lm-b16", "transformer-lm", lm, 16, true,
       fmt::format("transformer-lm T1024 d1024 h16 ×{}, vocab 256, batch 16, AdamW", lm_blocks)});
  return c;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The value at fraction q of sorted `v` (linear interpolation between neighbours).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

struct Measure {
  double median_ms = 0, q1_ms = 0, q3_ms = 0;
  std::int64_t peak_bytes = 0;
  double loss = 0;
};

// One synthetic batch of `c` on the CPU: Gaussian images with SyntheticDataset's labels, or
// uniform random tokens with uniform random next-token labels for the language model.
Batch make_batch(const CaseSpec& c, const ZooModel& z) {
  if (z.input_dtype == DType::Int32) {
    const std::int64_t n = c.batch * z.sample_shape.numel();
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), labels(ids.size());
    Rng rng(3, "bench_gpu_step.tokens");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] =
          static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(z.num_classes));
      labels[i] =
          static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(z.num_classes));
    }
    return {Tensor::from_ints(z.input_shape(c.batch), ids),
            Tensor::from_ints(z.input_shape(c.batch), labels)};
  }
  SyntheticDataset data(z.sample_shape, static_cast<int>(z.num_classes), c.batch, 3);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(c.batch));
  std::iota(idx.begin(), idx.end(), 0);
  return data.get(idx);
}

// The dtype a precision name computes its products in.
DType product_dtype(const std::string& precision) {
  return precision == "bf16" ? DType::BFloat16 : DType::Float32;
}

// Forward plus backward FLOPs of one step of `c` (the backward counted as twice the forward).
double step_flops(const CaseSpec& c) {
  const ZooModel z = make_model(c.model, c.options);
  const auto shapes = z.model.shapes(z.input_shape(c.batch), z.model.all());
  double f = 0;
  for (int i = 0; i < z.model.size(); ++i)
    f += z.model.layer(i).flops(shapes[static_cast<std::size_t>(i)]);
  return 3.0 * f;
}

// TFLOP/s of an n×n×n product through ops::gemm in `precision` (median of 20 after 3).
double matrix_tflops(const std::string& precision, std::int64_t n = 8192) {
  cuda::set_allow_tf32(precision == "tf32");
  const ops::ComputeDTypeScope scope(product_dtype(precision));
  const Device device = Device::cuda(0);
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n});
  Rng(5).fill_uniform(a, -1, 1);
  Rng(6).fill_uniform(b, -1, 1);
  a = a.to(device);
  b = b.to(device);
  Tensor c = Tensor::empty({n, n}, DType::Float32, device);
  const cudaStream_t stream = cuda::current_stream(0);
  cuda::Event start = cuda::Event::create(0, true), end = cuda::Event::create(0, true);
  std::vector<double> ms;
  for (int i = 0; i < 23; ++i) {
    start.record(stream);
    ops::gemm(a, false, b, false, c);
    end.record(stream);
    end.synchronize();
    if (i >= 3) ms.push_back(cuda::Event::elapsed_ms(start, end));
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         (quantile(ms, 0.5) * 1e-3) / 1e12;
}

Measure measure(const CaseSpec& c, const std::string& precision, int warmup, int steps,
                bool cuda_graphs) {
  cuda::set_allow_tf32(precision == "tf32");
  const ops::ComputeDTypeScope scope(product_dtype(precision));
  const Device device = Device::cuda(0);
  ZooModel z = make_model(c.model, c.options);
  Batch b = make_batch(c, z);
  b.inputs = b.inputs.to(device);
  b.labels = b.labels.to(device);
  std::unique_ptr<Optimizer> opt;
  float lr = 0;
  if (c.adamw) {
    opt = std::make_unique<AdamW>(AdamWOptions{});
    lr = 1e-4f;
  } else {
    opt = std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f});
    lr = 1e-3f;
  }
  SequentialTrainer trainer(z.model, to_device(z.model.init(1), device), std::move(opt), 1);
  if (cuda_graphs) trainer.use_cuda_graphs();
  const cudaStream_t stream = cuda::current_stream(0);
  Measure m;
  for (int i = 0; i < warmup; ++i) m.loss = trainer.step(b, lr).loss;
  cuda::Event start = cuda::Event::create(0, true), end = cuda::Event::create(0, true);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    start.record(stream);
    m.loss = trainer.step(b, lr).loss;
    end.record(stream);
    end.synchronize();
    times.push_back(cuda::Event::elapsed_ms(start, end));
  }
  m.median_ms = quantile(times, 0.5);
  m.q1_ms = quantile(times, 0.25);
  m.q3_ms = quantile(times, 0.75);
  m.peak_bytes = cuda::device_memory_stats(0).peak_in_use_bytes;
  return m;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases_flag, precision_flag = "fp32,tf32", dtype, python = "python3", results;
  std::string torch_script = std::string(PIPELINE_BENCH_DIR) + "/torch_gpu_step.py";
  int warmup = 10, steps = 50, lm_blocks = 24;
  bool torch = false, torch_compile = false, json = false, nondeterministic = false,
       transformed = false;
  bool cuda_graphs = false;
  CLI::App app{"Training-step time and peak device memory of zoo models on one GPU"};
  app.add_option("--cases", cases_flag,
                 "comma-separated: fashion-cnn-b64, fashion-cnn-b1024, vgg16-b64, "
                 "transformer-lm-b16 (default all)");
  app.add_option("--precision", precision_flag, "comma-separated: fp32, tf32, bf16");
  app.add_option("--dtype", dtype,
                 "bf16: mixed precision only (--precision bf16); float32: --precision fp32")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 100000));
  app.add_option("--steps", steps)->check(CLI::Range(1, 100000));
  app.add_option("--lm-blocks", lm_blocks,
                 "transformer-lm-b16 with this many blocks (profiling a step's kernels; the "
                 "PyTorch columns need the default 24)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--nondeterministic", nondeterministic,
               "let cuDNN choose non-deterministic convolution algorithms too (PyTorch's default; "
               "ours is cuda::set_deterministic(true))");
  app.add_flag("--transformed-convolutions", transformed,
               "let float32 convolutions take cuDNN's FFT and non-fused Winograd algorithms, as "
               "PyTorch's cudnn.benchmark does (cuda::set_transformed_convolutions)");
  app.add_flag("--cuda-graphs", cuda_graphs,
               "our steps captured into a CUDA graph and replayed (warm-up steps capture it; "
               "PyTorch stays eager)");
  app.add_flag("--torch", torch, "also run bench/torch_gpu_step.py and compare");
  app.add_flag("--torch-compile", torch_compile,
               "with --torch: PyTorch also with the model through torch.compile");
  app.add_option("--python", python, "the python that has PyTorch");
  app.add_option("--torch-script", torch_script);
  app.add_option("--results", results, "append the table to this file (bench/RESULTS.md)");
  app.add_flag("--json", json,
               "measure in this process and print one JSON line per (case, precision); the "
               "table mode runs itself with --json once per pair");
  CLI11_PARSE(app, argc, argv);

  std::vector<CaseSpec> cases;
  {
    const std::vector<CaseSpec> known = all_cases(lm_blocks);
    std::vector<std::string> names;
    for (const auto& k : known) names.push_back(k.name);
    const std::vector<std::string> wanted = cases_flag.empty() ? names : split(cases_flag);
    for (const auto& w : wanted) {
      auto it =
          std::find_if(known.begin(), known.end(), [&](const CaseSpec& k) { return k.name == w; });
      if (it == known.end()) {
        fmt::print(stderr, "unknown case '{}': choose from {}\n", w, fmt::join(names, ", "));
        return 2;
      }
      cases.push_back(*it);
    }
  }
  if (!dtype.empty()) precision_flag = dtype == "bf16" ? "bf16" : "fp32";
  const std::vector<std::string> precisions = split(precision_flag);
  for (const auto& p : precisions)
    if (p != "fp32" && p != "tf32" && p != "bf16") {
      fmt::print(stderr, "unknown precision '{}': fp32, tf32 or bf16\n", p);
      return 2;
    }

  if (cuda::device_count() == 0) {
    fmt::print(stderr, "no CUDA device: nothing to measure\n");
    return 77;
  }

  if (torch && lm_blocks != 24) {
    fmt::print(stderr, "--torch compares the 24-block transformer only: drop --lm-blocks\n");
    return 2;
  }
  cuda::set_deterministic(!nondeterministic);
  if (transformed) cuda::set_transformed_convolutions(true);
  if (json) {
    try {
      for (const auto& c : cases)
        for (const auto& p : precisions) {
          Measure m = measure(c, p, warmup, steps, cuda_graphs);
          nlohmann::json j{{"case", c.name},   {"precision", p},   {"median_ms", m.median_ms},
                           {"q1_ms", m.q1_ms}, {"q3_ms", m.q3_ms}, {"peak_bytes", m.peak_bytes},
                           {"loss", m.loss}};
          fmt::print("{}\n", j.dump());
          std::fflush(stdout);
        }
      return 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      return 1;
    }
  }

  // Table mode: one child per (case, precision) for a per-case memory peak.
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::map<std::pair<std::string, std::string>, nlohmann::json> ours, theirs;
  for (const auto& c : cases)
    for (const auto& p : precisions) {
      const std::string child = fmt::format(
          "{} --json --cases {} --precision {} --warmup {} --steps {} --lm-blocks {}{}{}{}",
          bench::shell_quote(ec ? std::string(argv[0]) : self), c.name, p, warmup, steps, lm_blocks,
          nondeterministic ? " --nondeterministic" : "", cuda_graphs ? " --cuda-graphs" : "",
          transformed ? " --transformed-convolutions" : "");
      int status = 0;
      for (const auto& line : bench::run_lines(child, &status))
        if (!line.empty() && line.front() == '{') ours[{c.name, p}] = nlohmann::json::parse(line);
      if (status != 0)
        fmt::print(stderr, "{} {}: the measuring process failed (status {})\n", c.name, p, status);
    }
  std::string torch_version = "-";
  if (torch) {
    std::vector<std::string> names;
    for (const auto& c : cases) names.push_back(c.name);
    const std::string cmd = fmt::format(
        "{} {} --cases {} --precision {} --warmup {} --steps {}{}", bench::shell_quote(python),
        bench::shell_quote(torch_script), fmt::join(names, ","), precision_flag, warmup, steps,
        torch_compile ? " --compile" : "");
    int status = 0;
    for (const auto& line : bench::run_lines(cmd, &status)) {
      if (line.empty() || line.front() != '{') continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("case")) continue;
      theirs[{j["case"].get<std::string>(), j["precision"].get<std::string>()}] = j;
      if (j.contains("torch")) torch_version = j["torch"].get<std::string>();
    }
    if (status != 0) fmt::print(stderr, "{}: failed (status {})\n", cmd, status);
  }
  // The dense matrix rate of each precision, for the model FLOP utilisation.
  std::map<std::string, double> rate;
  try {
    for (const auto& p : precisions) rate[p] = matrix_tflops(p);
  } catch (const std::exception& e) {
    fmt::print(stderr, "matrix rate: {}\n", e.what());
  }
  std::string rates;
  for (const auto& [p, r] : rate)
    rates += fmt::format("{}{} {:.1f}", rates.empty() ? "" : ", ", p, r);

  const double mib = 1024.0 * 1024.0;
  std::string header = fmt::format(
      "bench_gpu_step on {} ({}); PyTorch {}\ncommand: {}\n"
      "ms/step: median of {} SequentialTrainer::step{} after {} warm-up steps, CUDA events "
      "around each step; IQR: first–third quartile; cuDNN algorithms: {}\n"
      "ours peak MiB: caching pool peak_in_use_bytes / 2^20 (one process per row); PyTorch peak "
      "MiB: torch.cuda.max_memory_allocated / 2^20\n"
      "ours/PyTorch speed = PyTorch ms/step / ours ms/step; PyTorch is eager with "
      "cudnn.benchmark = True (bf16: under torch.autocast){}\n"
      "model TFLOP/s = 3 x forward FLOPs / ms/step; MFU against this GPU's measured 8192^3 "
      "product rate in TFLOP/s: {}\n",
      cuda::device_description(0), today(), torch_version, command, steps,
      cuda_graphs ? " replayed from a CUDA graph" : "", warmup,
      fmt::format(
          "{}{}",
          nondeterministic ? "any (--nondeterministic, as PyTorch's default)"
                           : "deterministic only",
          transformed ? "; float32 may take FFT and Winograd (--transformed-convolutions)" : ""),
      torch_compile ? "; compile: the same with torch.compile(model)" : "",
      rates.empty() ? "-" : rates);
  std::string table =
      "| case | precision | ours ms/step (IQR) | ours peak MiB | model TFLOP/s (MFU) | PyTorch "
      "ms/step | PyTorch peak MiB | ours/PyTorch speed |";
  table +=
      torch_compile
          ? " compile ms/step | ours/compile speed |\n|---|---|---|---|---|---|---|---|---|---|\n"
          : "\n|---|---|---|---|---|---|---|---|\n";
  bool failed = false;
  for (const auto& c : cases)
    for (const auto& p : precisions) {
      auto o = ours.find({c.name, p});
      auto t = theirs.find({c.name, p});
      std::string our_ms = "failed", our_mem = "-", mfu = "-", t_ms = "-", t_mem = "-", speed = "-";
      std::string c_ms = "-", c_speed = "-";
      if (o != ours.end()) {
        const auto& j = o->second;
        const double ms = j["median_ms"].get<double>();
        our_ms = fmt::format("{:.3f} ({:.3f}–{:.3f})", ms, j["q1_ms"].get<double>(),
                             j["q3_ms"].get<double>());
        our_mem =
            fmt::format("{:.0f}", static_cast<double>(j["peak_bytes"].get<std::int64_t>()) / mib);
        const double tflops = step_flops(c) / (ms * 1e-3) / 1e12;
        mfu = rate.count(p) ? fmt::format("{:.1f} ({:.0f}%)", tflops, 100.0 * tflops / rate[p])
                            : fmt::format("{:.1f}", tflops);
      } else {
        failed = true;
      }
      if (t != theirs.end()) {
        const auto& j = t->second;
        t_ms = fmt::format("{:.3f}", j["median_ms"].get<double>());
        t_mem =
            fmt::format("{:.0f}", static_cast<double>(j["peak_bytes"].get<std::int64_t>()) / mib);
        if (o != ours.end())
          speed = fmt::format("{:.2f}×",
                              j["median_ms"].get<double>() / o->second["median_ms"].get<double>());
        if (j.contains("compile_median_ms")) {
          c_ms = fmt::format("{:.3f}", j["compile_median_ms"].get<double>());
          if (o != ours.end())
            c_speed = fmt::format("{:.2f}×", j["compile_median_ms"].get<double>() /
                                                 o->second["median_ms"].get<double>());
        }
      } else if (torch) {
        t_ms = "failed";
      }
      table += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |", c.what, p, our_ms, our_mem,
                           mfu, t_ms, t_mem, speed);
      table += torch_compile ? fmt::format(" {} | {} |\n", c_ms, c_speed) : std::string("\n");
    }
  fmt::print("{}\n{}", header, table);
  if (!results.empty() && !bench::append_results(results, header + "\n", table)) return 1;
  return failed ? 1 : 0;
}
