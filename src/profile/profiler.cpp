#include <pipeline/profile/profiler.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/core/threads.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace pipeline {

namespace {

using Clock = std::chrono::steady_clock;

// Median and interquartile range with linear interpolation between order statistics, so that
// a handful of repeats still gives a stable middle value.
struct Summary {
  double median = 0;
  double spread = 0;
};

double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return {quantile(samples, 0.5), quantile(samples, 0.75) - quantile(samples, 0.25)};
}

// Runs `fn` warmup + repeat times and returns the timed durations in seconds.
template <typename Fn>
std::vector<double> time_runs(int warmup, int repeat, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(repeat));
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = Clock::now();
    fn();
    out.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return out;
}

Tensor random_input(const Shape& shape, const ProfileOptions& o) {
  Rng rng(o.seed, "profile.input");
  if (o.input_dtype == DType::Int32) {
    Tensor t = Tensor::empty(shape, DType::Int32);
    std::int32_t* p = t.data<std::int32_t>();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      p[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(o.input_int_bound)));
    return t;
  }
  Tensor t = Tensor::empty(shape, DType::Float32);
  rng.fill_normal(t, 0.f, 1.f);
  return t;
}

void check_arguments(const Sequential& model, const Shape& input_shape, int batch, Device device,
                     const ProfileOptions& o) {
#ifdef PIPELINE_WITH_CUDA
  PIPELINE_CHECK_AS(ConfigError, device.is_cpu(),
                    "profiling on {} is not supported yet: the layers run on the CPU only; "
                    "profile with device cpu",
                    device.str());
#else
  PIPELINE_CHECK_AS(ConfigError, device.is_cpu(),
                    "cannot profile on {}: this build has no CUDA support (rebuild with "
                    "-DPIPELINE_WITH_CUDA=ON on a machine with a CUDA compiler), or profile with "
                    "device cpu",
                    device.str());
#endif
  PIPELINE_CHECK_AS(ConfigError, model.size() > 0, "model '{}' has no layers to profile",
                    model.name());
  PIPELINE_CHECK_AS(ConfigError, batch >= 1, "profile batch size must be at least 1, got {}",
                    batch);
  PIPELINE_CHECK_AS(ConfigError, o.repeat >= 1, "profile repeat count must be at least 1, got {}",
                    o.repeat);
  PIPELINE_CHECK_AS(ConfigError, o.warmup >= 0, "profile warmup count must be >= 0, got {}",
                    o.warmup);
  PIPELINE_CHECK_AS(ConfigError, o.input_dtype == DType::Float32 || o.input_dtype == DType::Int32,
                    "profile input dtype must be float32 or int32, got {}",
                    dtype_name(o.input_dtype));
  PIPELINE_CHECK_AS(ConfigError, o.input_dtype != DType::Int32 || o.input_int_bound >= 1,
                    "int32 profile input needs input_int_bound >= 1 (the vocabulary), got {}",
                    o.input_int_bound);
  PIPELINE_CHECK_AS(ConfigError, input_shape.rank() >= 1,
                    "profile input shape must have at least one dimension (one sample, without "
                    "the batch), got {}",
                    input_shape);
}

}  // namespace

std::string cpu_device_description(int threads) {
  std::string name;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; name.empty() && std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) name = line.substr(begin);
  }
  if (name.empty()) name = "unknown CPU";
  return fmt::format("cpu: {} ({} thread{})", name, threads, threads == 1 ? "" : "s");
}

Profile profile(const Sequential& model, const Shape& input_shape, int batch, Device device,
                const ProfileOptions& options) {
  check_arguments(model, input_shape, batch, device, options);
  // num_threads() is what the runtime's ops use; hand it to Eigen and OpenMP too, which keep
  // their own defaults until set_num_threads is called.
  const int threads = num_threads();
  set_num_threads(threads);

  const Shape batch_shape = input_shape.batched(batch);
  const std::vector<Shape> shapes = model.shapes(batch_shape, model.all());

  Profile out;
  out.model = model.name();
  out.batch_size = batch;
  out.device = cpu_device_description(threads);
  out.dtype = "float32";

  ForwardContext ctx;
  ctx.mode = Mode::Train;
  ctx.seed = options.seed;

  Tensor x = random_input(batch_shape, options);
  for (int i = 0; i < model.size(); ++i) {
    const Layer& layer = model.layer(i);
    LayerParams params = layer.init(options.seed);
    std::vector<Tensor> grads = layer.zero_grads();
    const bool has_weights = !grads.empty();

    Saved saved;
    Tensor y;
    const auto fwd = time_runs(options.warmup, options.repeat, [&] {
      saved = Saved{};
      y = layer.forward(params, x, saved, ctx);
    });
    PIPELINE_CHECK(y.shape() == shapes[static_cast<std::size_t>(i) + 1],
                   "layer '{}' ({}) produced shape {} but reports output shape {}", layer.name(),
                   layer.kind(), y.shape(), shapes[static_cast<std::size_t>(i) + 1]);

    // The output gradient stands for what the loss and later layers would send back.
    Tensor dy = Tensor::empty(y.shape(), DType::Float32);
    Rng(options.seed, "profile.grad." + layer.name()).fill_normal(dy, 0.f, 1.f);
    std::span<Tensor> g(grads);
    const auto backward_with = [&](GradParts parts) {
      return time_runs(options.warmup, options.repeat,
                       [&] { (void)layer.backward(params, saved, dy, g, parts); });
    };

    LayerProfile lp;
    lp.name = layer.name();
    lp.kind = layer.kind();
    const Summary f = summarize(fwd);
    const Summary b = summarize(backward_with(GradParts::Both));
    lp.forward_s = f.median;
    lp.forward_spread_s = f.spread;
    lp.backward_s = b.median;
    lp.backward_spread_s = b.spread;
    if (options.split_backward) {
      if (has_weights) {
        lp.backward_input_s = summarize(backward_with(GradParts::Input)).median;
        lp.backward_weight_s = summarize(backward_with(GradParts::Weight)).median;
      } else {
        lp.backward_input_s = lp.backward_s;  // no weights: the whole backward is dL/dx
      }
    }
    lp.output_bytes = static_cast<std::int64_t>(y.nbytes());
    lp.parameter_bytes = static_cast<std::int64_t>(layer.parameter_bytes());
    lp.flops = layer.flops(shapes[static_cast<std::size_t>(i)]);
    out.layers.push_back(std::move(lp));

    x = y;  // the next layer runs on this layer's real output
  }
  return out;
}

Profile profile(const ZooModel& model, int batch, Device device, ProfileOptions options) {
  options.input_dtype = model.input_dtype;
  if (model.input_dtype == DType::Int32) options.input_int_bound = model.num_classes;
  return profile(model.model, model.sample_shape, batch, device, options);
}

}  // namespace pipeline
