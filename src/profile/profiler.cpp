#include <pipeline/profile/profiler.hpp>

#include <pipeline/core/allocator.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/optimizer_update.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/sgd.hpp>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/stream.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
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

// What the layers before a range would hand it: float32 activations, normal(0, 1).
Tensor random_activations(const Shape& shape, const ProfileOptions& o) {
  Tensor t = Tensor::empty(shape, DType::Float32);
  Rng(o.seed, "profile.activations").fill_normal(t, 0.f, 1.f);
  return t;
}

// Times regions of one training pass. On the CPU each region is wall time around it. On a CUDA
// device a region is the device time between two events recorded on the current stream around
// it, read once the pass has ended (one synchronisation per pass, so the host keeps queueing
// work ahead of the device as a training step does).
//
// It also measures each region's temporaries: the most the device's allocator had in use during
// the region beyond what was in use at its start or its end (LayerProfile::workspace_bytes). On a
// GPU that is the allocator's view in the order the host queues the work, which is the order
// the stream-ordered pool reuses blocks in.
class PassTimer {
 public:
  explicit PassTimer(Device device) : m_device(device) {}

  // Runs fn, timing it into `into` (if given); returns its temporaries' bytes.
  std::int64_t time(std::vector<double>* into, const std::function<void()>& fn) {
    reset_memory_peak(m_device);
    m_start_in_use = memory_use(m_device).in_use_bytes;
#if PIPELINE_WITH_CUDA
    if (m_device.is_cuda()) {
      const cudaStream_t stream = cuda::current_stream(m_device.index);
      Pending p{into, cuda::Event::create(m_device.index, true),
                cuda::Event::create(m_device.index, true)};
      p.start.record(stream);
      fn();
      p.end.record(stream);
      m_pending.push_back(std::move(p));
      return temporaries();
    }
#endif
    const auto t0 = Clock::now();
    fn();
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (into) into->push_back(t);
    return temporaries();
  }

  // Ends the pass: the device regions' times go where they were asked for.
  void finish() {
#if PIPELINE_WITH_CUDA
    for (auto& p : m_pending) {
      p.end.synchronize();
      if (p.into) p.into->push_back(1e-3 * cuda::Event::elapsed_ms(p.start, p.end));
    }
    m_pending.clear();
#endif
  }

 private:
  // Beyond the larger of the start and the end: a pass that frees what it was handed (the weight
  // half of a split backward lets go of the output gradients the input half kept) has not made
  // those bytes as temporaries, and a stage charges them apart (split_kept_bytes).
  std::int64_t temporaries() const {
    const MemoryUse use = memory_use(m_device);
    return std::max<std::int64_t>(
        0, use.peak_in_use_bytes - std::max(use.in_use_bytes, m_start_in_use));
  }

  Device m_device;
  std::int64_t m_start_in_use = 0;
#if PIPELINE_WITH_CUDA
  struct Pending {
    std::vector<double>* into;
    cuda::Event start, end;
  };
  std::vector<Pending> m_pending;
#endif
};

void check_arguments(const Sequential& model, const Shape& input_shape, int batch, Device device,
                     const ProfileOptions& o) {
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const int n = cuda::device_count();
    PIPELINE_CHECK_AS(ConfigError, device.index < n,
                      "cannot profile on {}: this process sees {} CUDA device(s); profile with "
                      "device cpu or on a machine with a GPU",
                      device.str(), n);
  }
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
  PIPELINE_CHECK_AS(ConfigError, o.layers_per_pass >= 0,
                    "layers per profiling pass must be >= 0 (0: all at once), got {}",
                    o.layers_per_pass);
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

// One layer's optimizers for each update rule, stepped with learning rate 0 so that the
// parameters the passes use stay as they are while the arithmetic and memory traffic are a real
// step's. An optimizer keys its state by position, so every layer has its own.
struct LayerRules {
  Sgd sgd;
  Sgd momentum{SgdOptions{.momentum = 0.9f}};
  AdamW adamw;
  static constexpr int kCount = 3;
  static constexpr std::array<const char*, kCount> kNames = {"sgd", "momentum", "adamw"};
  Optimizer& rule(int k) {
    if (k == 0) return sgd;
    if (k == 1) return momentum;
    return adamw;
  }
};

// One step of `rule` over a layer, as the runtime's stage executor steps: the gradients' sums
// of squares (its overflow check), the update (all of the layer's tensors at once) and the
// zeroing of the gradients.
void step_layer(Optimizer& rule, std::vector<Tensor>& params, std::vector<Tensor>& grads) {
  (void)ops::sums_of_squares(grads);
  rule.step(params, grads, 0.f);
  zero_all(grads);
}

// Bytes of a weight version of `layer` stashed under bf16 compute (WeightStore::set_bf16_stash):
// its product operands in bf16, the rest as they are.
std::int64_t bf16_stash_bytes(const Layer& layer) {
  std::int64_t n = 0;
  for (const ParamSpec& s : layer.parameters())
    n += s.shape.numel() * static_cast<std::int64_t>(s.product_operand ? dtype_size(DType::BFloat16)
                                                                       : dtype_size(s.dtype));
  return n;
}

// Profiles the layers of `range` in whole training passes of their own (see profile()),
// appending their LayerProfiles to `out`. shapes: the model's activation shapes at the batch.
void profile_range(const Sequential& model, LayerRange range, const std::vector<Shape>& shapes,
                   Device device, const ProfileOptions& options, bool bf16,
                   const ForwardContext& ctx, std::vector<LayerProfile>& out) {
  const auto R = [](int i) { return static_cast<std::size_t>(i); };
  // Every repetition is a whole training pass, as the runtime runs it: the forward of every layer
  // in order, then the backward of every layer in reverse, each layer timed on its own inside
  // the pass. Timing one layer many times in a row instead keeps its weights and buffers hot in
  // the caches, and a layer inside a real step was up to 14% slower than that (bench/RESULTS.md).
  const int first = range.begin, n = range.size();
  const auto N = static_cast<std::size_t>(n);
  // Layers run in the model's order for the range (Sequential::runs_at: a ReLU after the max pool
  // that follows it), as a stage holding the range runs them; everything below is kept per layer,
  // indexed by its place in the range.
  std::vector<std::size_t> order(N);
  for (int i = 0; i < n; ++i) order[R(i)] = R(model.runs_at(range, first + i) - first);
  std::vector<LayerParams> params;
  std::vector<std::vector<Tensor>> grads;
  for (int i = 0; i < n; ++i) {
    params.push_back(model.layer(first + i).init(options.seed).to(device));
    grads.push_back(model.layer(first + i).zero_grads(device));
  }
  std::vector<Saved> saved(N);
  std::vector<Tensor> outputs(N), output_grads(N);
  std::vector<std::vector<double>> fwd(N), bwd(N), bwd_input(N), bwd_weight(N);
  // Each layer's largest temporaries over the timed passes (LayerProfile::workspace_bytes).
  std::vector<std::int64_t> workspace(N, 0);
  // What an input-gradient pass keeps for the weight pass: the layer's output gradient and, in a
  // composite, its children's (Saved::child_output_grads), each allocation once.
  std::vector<std::int64_t> split_kept(N, 0);
  // Each layer's output gradient and input gradient, held at once (LayerProfile::gradient_bytes).
  std::vector<std::int64_t> gradient_pair(N, 0);
  auto split_kept_bytes = [](const Saved& s, const Tensor& dy) {
    std::set<const void*> seen{dy.storage_id()};
    std::int64_t bytes = static_cast<std::int64_t>(dy.storage_end());
    auto visit = [&](auto&& self, const Saved& node) -> void {
      for (const Tensor& t : node.child_output_grads)
        if (t.defined() && seen.insert(t.storage_id()).second)
          bytes += static_cast<std::int64_t>(t.storage_end());
      for (const Saved& c : node.children) self(self, c);
    };
    visit(visit, s);
    return bytes;
  };
  // The model's input, or random activations of the shape the layers before the range make.
  const Tensor input = (first == 0 ? random_input(shapes[0], options)
                                   : random_activations(shapes[R(first)], options))
                           .to(device);
  // The model's output gradient (or the next layer's input gradient) stands for what the loss
  // would send back.
  Tensor loss_grad = Tensor::empty(shapes[R(range.end)], DType::Float32);
  Rng(options.seed, "profile.grad").fill_normal(loss_grad, 0.f, 1.f);
  loss_grad = loss_grad.to(device);
  // The optimizer steps are timed inside the passes, where the executor takes them: after the
  // backward, every layer in order, on the caches the pass left. Timed alone, again and again,
  // a layer's step ran on hot caches, and a training step's was up to 2.5x longer (AdamW over a
  // transformer's weights, bench/RESULTS.md). Each pass times every rule, first a different one
  // in turn; their state exists before the first pass (one untimed step each).
  std::vector<LayerRules> rules(N);
  std::array<std::vector<std::vector<double>>, LayerRules::kCount> step_times;
  for (auto& t : step_times) t.resize(N);
  for (std::size_t I = 0; I < N; ++I)
    for (int k = 0; !grads[I].empty() && k < LayerRules::kCount; ++k)
      step_layer(rules[I].rule(k), params[I].params, grads[I]);
  PassTimer timer(device);
  // The layers under first_dx compute no input gradient in training: below them nothing has
  // weights (a Flatten under the first Linear), so the first stage skips it.
  const int first_dx = model.first_input_grad_layer(model.all(), false) - first;
  for (int rep = 0; rep < options.warmup + options.repeat; ++rep) {
    const bool record = rep >= options.warmup;
    auto into = [record](std::vector<double>& v) { return record ? &v : nullptr; };
    auto keep = [&](std::size_t layer, std::int64_t temporaries) {
      if (record) workspace[layer] = std::max(workspace[layer], temporaries);
    };
    for (int i = 0; i < n; ++i) {
      const std::size_t I = order[R(i)];
      const Layer& layer = model.layer(first + static_cast<int>(I));
      const Tensor& x = i == 0 ? input : outputs[order[R(i - 1)]];
      saved[I] = Saved{};  // the last pass's, which a training step would have freed by now
      outputs[I] = Tensor{};
      keep(I, timer.time(into(fwd[I]),
                         [&] { outputs[I] = layer.forward(params[I], x, saved[I], ctx); }));
      const Shape reported = layer.output_shape(x.shape());
      PIPELINE_CHECK(outputs[I].shape() == reported,
                     "layer '{}' ({}) produced shape {} but reports output shape {}", layer.name(),
                     layer.kind(), outputs[I].shape(), reported);
    }
    for (int i = n - 1; i >= 0; --i) {
      const std::size_t I = order[R(i)];
      if (i == n - 1) output_grads[I] = loss_grad;
      std::span<Tensor> g(grads[I]);
      Tensor dx;
      // As training runs it: no input gradient under first_dx (Sequential::backward).
      const bool input = i >= first_dx;
      keep(I, timer.time(into(bwd[I]), [&] {
        if (input || !g.empty())
          dx = model.layer(first + static_cast<int>(I))
                   .backward(params[I], saved[I], output_grads[I], g,
                             input ? GradParts::Both : GradParts::Weight);
      }));
      const Tensor& dy = output_grads[I];
      // (No gradient arrives at a layer whose backward does not run: the first under first_dx.)
      gradient_pair[I] = (dy.defined() ? static_cast<std::int64_t>(dy.storage_end()) : 0) +
                         (dx.defined() && dx.storage_id() != dy.storage_id()
                              ? static_cast<std::int64_t>(dx.storage_end())
                              : 0);
      if (i > 0) output_grads[order[R(i - 1)]] = dx;
    }
    for (int k = 0; k < LayerRules::kCount; ++k) {
      const int rule = (rep + k) % LayerRules::kCount;
      for (std::size_t I = 0; I < N; ++I)
        if (!grads[I].empty())
          keep(I, timer.time(into(step_times[static_cast<std::size_t>(rule)][I]),
                             [&] { step_layer(rules[I].rule(rule), params[I].params, grads[I]); }));
    }
    if (!options.split_backward || !record) {
      timer.finish();
      continue;
    }
    // The split halves, each as its own pass over the layers with weights (the schedules that
    // split the backward run all input gradients first, the weight gradients later).
    for (int i = n - 1; i >= 0; --i) {
      const auto I = static_cast<std::size_t>(i);
      if (grads[I].empty()) continue;
      std::span<Tensor> g(grads[I]);
      Tensor dx;  // kept to the region's end, as the runtime keeps (sends) it
      keep(I, timer.time(&bwd_input[I], [&] {
        if (i >= first_dx)
          dx = model.layer(first + i).backward(params[I], saved[I], output_grads[I], g,
                                               GradParts::Input);
      }));
      split_kept[I] = split_kept_bytes(saved[I], output_grads[I]);
    }
    for (int i = n - 1; i >= 0; --i) {
      const auto I = static_cast<std::size_t>(i);
      if (grads[I].empty()) continue;
      std::span<Tensor> g(grads[I]);
      keep(I, timer.time(&bwd_weight[I], [&] {
        (void)model.layer(first + i).backward(params[I], saved[I], output_grads[I], g,
                                              GradParts::Weight);
      }));
    }
    timer.finish();
  }

  // Saved storage, each allocation counted at the first layer that keeps it; of that, the bytes
  // of the layer's own input (`input_storage`).
  std::set<const void*> kept;
  auto saved_bytes = [&](const Saved& s, const void* input_storage, std::int64_t& input_bytes) {
    std::int64_t bytes = 0;
    auto visit = [&](auto&& self, const Saved& node) -> void {
      for (const Tensor& t : node.tensors)
        if (t.defined() && kept.insert(t.storage_id()).second) {
          bytes += static_cast<std::int64_t>(t.storage_end());
          if (t.storage_id() == input_storage)
            input_bytes = static_cast<std::int64_t>(t.storage_end());
        }
      for (const Saved& c : node.children) self(self, c);
    };
    visit(visit, s);
    return bytes;
  };
  // Whether the layer keeps any tensor on that storage, whichever layer kept it first.
  auto keeps_storage = [](const Saved& s, const void* storage) {
    auto visit = [&](auto&& self, const Saved& node) -> bool {
      for (const Tensor& t : node.tensors)
        if (t.defined() && t.storage_id() == storage) return true;
      for (const Saved& c : node.children)
        if (self(self, c)) return true;
      return false;
    };
    return visit(visit, s);
  };
  for (int i = 0; i < n; ++i) {
    const auto I = static_cast<std::size_t>(i);
    const Layer& layer = model.layer(first + i);
    LayerProfile lp;
    lp.name = layer.name();
    lp.kind = layer.kind();
    const Summary f = summarize(fwd[I]);
    const Summary b = summarize(bwd[I]);
    lp.forward_s = f.median;
    lp.forward_spread_s = f.spread;
    lp.backward_s = b.median;
    lp.backward_spread_s = b.spread;
    if (options.split_backward) {
      if (!grads[I].empty()) {
        lp.backward_input_s = summarize(bwd_input[I]).median;
        lp.backward_weight_s = summarize(bwd_weight[I]).median;
      } else {
        lp.backward_input_s = lp.backward_s;  // no weights: the whole backward is dL/dx
      }
    }
    // What the layer declares (a stage ending at it sends that), though a layer that runs after
    // the next one (Sequential::runs_at) made a smaller tensor here.
    lp.output_bytes = shapes[R(first + i + 1)].numel() *
                      static_cast<std::int64_t>(dtype_size(outputs[I].dtype()));
    lp.parameter_bytes = static_cast<std::int64_t>(layer.parameter_bytes());
    if (bf16) lp.stashed_parameter_bytes = bf16_stash_bytes(layer);
    // The model's input is the data's, not a layer's; a range's later input is a layer's output:
    // what a stage starting at this layer receives. That flows into the layer that runs first
    // from this layer's place on (the next one, where this one runs after it), from the layer
    // that ran just before (`order` swaps pairs, so it is its own inverse: order[I] is where
    // layer I ran).
    const std::size_t at = std::min(order[I], I);
    const void* input_storage = at > 0      ? outputs[order[at - 1]].storage_id()
                                : first > 0 ? input.storage_id()
                                            : nullptr;
    lp.saved_bytes = saved_bytes(saved[I], input_storage, lp.saved_input_bytes);
    lp.frees_input = input_storage && !keeps_storage(saved[I], input_storage) &&
                     outputs[I].storage_id() != input_storage;
    lp.split_kept_bytes = split_kept[I];
    lp.workspace_bytes = workspace[I];
    lp.gradient_bytes = gradient_pair[I];
    lp.flops = layer.flops(shapes[R(first + i)]);
    for (int k = 0; !grads[I].empty() && k < LayerRules::kCount; ++k)
      lp.step_s.of(LayerRules::kNames[static_cast<std::size_t>(k)]) =
          summarize(step_times[static_cast<std::size_t>(k)][I]).median;
    out.push_back(std::move(lp));
  }
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
#if PIPELINE_WITH_CUDA
  out.device =
      device.is_cuda() ? cuda::device_description(device.index) : cpu_device_description(threads);
#else
  out.device = cpu_device_description(threads);
#endif
  if (!device.is_cuda()) out.threads = threads;
  const ops::ComputeDTypeScope precision(options.compute_dtype);
  const bool bf16 = options.compute_dtype == DType::BFloat16;
  out.dtype = bf16 ? "bfloat16" : "float32";

  ForwardContext ctx;
  ctx.mode = Mode::Train;
  ctx.seed = options.seed;
  // What the device holds before the profiler makes anything: the rest, once everything the
  // profiler made is gone again, the runtime keeps for itself (Profile::runtime_bytes).
  const std::int64_t entry_bytes = memory_use(device).in_use_bytes;
  // The layers in groups of options.layers_per_pass, each group's passes alone (all of them at
  // once by default); each group's tensors are freed before the next group's are made.
  // A group never ends at a layer that runs after the next one (a ReLU before its max pool): it
  // would run there as a stage ending at it does, and its in-stage costs would be those.
  const int per_pass = options.layers_per_pass > 0 ? options.layers_per_pass : model.size();
  for (int begin = 0, end = 0; begin < model.size(); begin = end) {
    end = std::min(model.size(), begin + per_pass);
    while (end < model.size() && model.runs_after_next(end - 1)) ++end;
    profile_range(model, {begin, end}, shapes, device, options, bf16, ctx, out.layers);
  }
  // A layer that runs after the next one inside a range (Sequential::runs_at) runs first, on the
  // full-size tensor, in a stage that ends at it: profiled again as such a stage runs it, as the
  // last layer of a range, after the layer whose output it reads.
  for (int i = 0; i + 1 < model.size(); ++i) {
    if (!model.runs_after_next(i)) continue;
    std::vector<LayerProfile> ending;
    profile_range(model, {std::max(0, i - 1), i + 1}, shapes, device, options, bf16, ctx, ending);
    out.layers[static_cast<std::size_t>(i)].at_stage_end = stage_end_costs(ending.back());
  }
  out.runtime_bytes = std::max<std::int64_t>(0, memory_use(device).in_use_bytes - entry_bytes);
  // The loss's gradient has the logits' shape in float32 (SoftmaxCrossEntropy, nn/loss.hpp).
  out.loss_gradient_bytes =
      shapes.back().numel() * static_cast<std::int64_t>(dtype_size(DType::Float32));
  out.input_bytes =
      shapes.front().numel() * static_cast<std::int64_t>(dtype_size(options.input_dtype));
  return out;
}

Profile profile(const ZooModel& model, int batch, Device device, ProfileOptions options) {
  options.input_dtype = model.input_dtype;
  if (model.input_dtype == DType::Int32) options.input_int_bound = model.num_classes;
  Profile p = profile(model.model, model.sample_shape, batch, device, options);
  p.architecture = model.architecture;
  return p;
}

}  // namespace pipeline
