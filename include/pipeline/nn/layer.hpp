// Layer: the functional interface every layer implements.
//
// A layer owns no parameters and keeps no per-microbatch state. forward() is given the parameter
// version to use and fills a Saved record with whatever backward needs; backward() is given that
// record, the same parameter version and the output gradient, and returns the input gradient
// while *accumulating* parameter gradients into the caller's buffers (so k microbatches summed
// into one buffer equal one batch of k times the size when the loss is a sum over samples).
// Weight stashing (PipeDream) is then only "keep the version pointer with the Saved record".
//
// Shapes are batch-first. A layer reports its output shape, forward FLOPs and parameters for an
// input shape, so the profiler and partitioner can reason about a model without running it.
#pragma once

#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace pipeline {

// How a parameter is initialised. Defaults follow PyTorch so that models start alike.
struct Init {
  enum class Kind { Zeros, Ones, Uniform, Normal } kind = Kind::Zeros;
  float a = 0.f;  // Uniform: bound (values in [-a, a]); Normal: standard deviation
  static Init zeros() { return {Kind::Zeros, 0.f}; }
  static Init ones() { return {Kind::Ones, 0.f}; }
  static Init uniform(float bound) { return {Kind::Uniform, bound}; }
  static Init normal(float stddev) { return {Kind::Normal, stddev}; }
};

// One named tensor of a layer: `weight`, `bias`, `running_mean`, ...
struct ParamSpec {
  std::string name;
  Shape shape;
  Init init;
  DType dtype = DType::Float32;
  // Read only as an operand of products (gemm, convolution: ops/precision.hpp), which under a
  // bf16 compute dtype round it to bf16 anyway: a stashed weight version may keep it in bf16.
  bool product_operand = false;
};

// One version of a layer's parameters plus its non-trainable buffers (batch-norm running
// statistics), in the order of Layer::parameters() and Layer::buffers().
struct LayerParams {
  std::vector<Tensor> params;
  std::vector<Tensor> buffers;
  std::size_t bytes() const {
    std::size_t n = 0;
    for (auto& t : params) n += t.nbytes();
    for (auto& t : buffers) n += t.nbytes();
    return n;
  }
  // A deep copy.
  LayerParams clone() const {
    LayerParams c;
    for (auto& t : params) c.params.push_back(t.clone());
    for (auto& t : buffers) c.buffers.push_back(t.clone());
    return c;
  }
  // The same values on `device` (shared, not copied, where a tensor is already there).
  LayerParams to(Device device) const {
    LayerParams c;
    for (auto& t : params) c.params.push_back(t.to(device));
    for (auto& t : buffers) c.buffers.push_back(t.to(device));
    return c;
  }
};

enum class Mode { Train, Eval };

struct ForwardContext {
  Mode mode = Mode::Train;
  // Seed for stochastic layers (dropout), unique per microbatch; layers mix in their own name so
  // that the same microbatch draws the same mask on any rank.
  std::uint64_t seed = 0;
  bool training() const { return mode == Mode::Train; }
};

// What forward keeps for backward. Composite layers keep one child record per sub-layer.
struct Saved {
  std::vector<Tensor> tensors;
  std::vector<Saved> children;
  // A composite's input-gradient-only pass keeps here the output gradient of each child with
  // weights (indexed like its children), so that its weight pass runs each child's weight
  // gradient directly instead of the input gradients through the children again. Written during
  // backward, whose record is const: hence mutable.
  mutable std::vector<Tensor> child_output_grads;
  std::size_t bytes() const {
    std::size_t n = 0;
    for (auto& t : tensors) n += t.nbytes();
    for (auto& c : children) n += c.bytes();
    for (auto& t : child_output_grads) n += t.nbytes();
    return n;
  }
};

// Which gradients backward computes. Splitting them lets schedules run the input gradient (on
// the critical path) before the weight gradient (which can fill bubbles).
enum class GradParts : unsigned { Input = 1, Weight = 2, Both = 3 };
constexpr bool has_part(GradParts p, GradParts q) {
  return (static_cast<unsigned>(p) & static_cast<unsigned>(q)) != 0;
}

class Layer {
 public:
  explicit Layer(std::string name) : m_name(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return m_name; }
  virtual std::string kind() const = 0;

  // Output shape for an input shape (batch first); throws ConfigError when the input does not fit.
  virtual Shape output_shape(const Shape& input) const = 0;
  // Forward floating-point operations (a multiply-add counts 2) for an input shape.
  virtual double flops(const Shape& input) const = 0;
  // Trainable parameters and non-trainable buffers, with their shapes and initialisers.
  virtual std::vector<ParamSpec> parameters() const { return {}; }
  virtual std::vector<ParamSpec> buffers() const { return {}; }
  // Direct sub-layers of a composite layer (names are qualified: "block1.conv1").
  virtual std::vector<const Layer*> children() const { return {}; }
  // Whether its training forward draws random numbers (dropout) from the step's seed, which a
  // replayed CUDA graph cannot change: such models train without graphs.
  virtual bool draws_random_numbers() const {
    for (const Layer* c : children())
      if (c->draws_random_numbers()) return true;
    return false;
  }

  // Whether a Sequential may run this layer after `next`, the layer that directly follows it,
  // and get the same output and gradients; only layers without parameters say yes. A ReLU before
  // a max pool does: the ReLU then runs on the pooled tensor, a quarter of the elements under a
  // 2x2 pool, and keeps that for backward instead of the full-size one (Sequential::runs_at).
  virtual bool commutes_with_next(const Layer& /*next*/) const { return false; }

  std::size_t parameter_bytes() const {
    std::size_t n = 0;
    for (auto& p : parameters()) n += static_cast<std::size_t>(p.shape.numel()) * dtype_size(p.dtype);
    return n;
  }

  // Fresh parameters. Each tensor is drawn from Rng(seed, "<layer>.<param>"), so the values do
  // not depend on which process builds the layer or in which order.
  LayerParams init(std::uint64_t seed) const {
    LayerParams out;
    for (auto& s : parameters()) out.params.push_back(make_initialised(s, seed));
    for (auto& s : buffers()) out.buffers.push_back(make_initialised(s, seed));
    return out;
  }

  // Zeroed gradient buffers matching parameters(), on `device`.
  std::vector<Tensor> zero_grads(Device device = Device::cpu()) const {
    std::vector<Tensor> g;
    for (auto& s : parameters()) g.push_back(Tensor::zeros(s.shape, s.dtype, device));
    return g;
  }

  // Validates and computes. Buffers may be updated in training mode (running statistics).
  Tensor forward(LayerParams& p, const Tensor& x, Saved& saved, const ForwardContext& ctx) const {
    check_params(p);
    return forward_impl(p, x, saved, ctx);
  }
  // Returns dL/dx (an undefined Tensor when Input is not requested) and adds dL/dparams into
  // grads, which must have the shapes of parameters().
  Tensor backward(const LayerParams& p, const Saved& saved, const Tensor& dy,
                  std::span<Tensor> grads, GradParts parts = GradParts::Both) const {
    check_params(p);
    if (has_part(parts, GradParts::Weight))
      PIPELINE_CHECK(grads.size() == p.params.size(), "layer '{}': {} gradient buffers for {} parameters",
                     m_name, grads.size(), p.params.size());
    return backward_impl(p, saved, dy, grads, parts);
  }

 protected:
  virtual Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                              const ForwardContext& ctx) const = 0;
  virtual Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                               std::span<Tensor> grads, GradParts parts) const = 0;

  std::string qualified(const std::string& param) const { return m_name + "." + param; }

 private:
  Tensor make_initialised(const ParamSpec& s, std::uint64_t seed) const {
    Tensor t = Tensor::empty(s.shape, s.dtype);
    Rng rng(seed, qualified(s.name));
    switch (s.init.kind) {
      case Init::Kind::Zeros: t.zero(); break;
      case Init::Kind::Ones: t.fill(1.f); break;
      case Init::Kind::Uniform: rng.fill_uniform(t, -s.init.a, s.init.a); break;
      case Init::Kind::Normal: rng.fill_normal(t, 0.f, s.init.a); break;
    }
    return t;
  }
  void check_params(const LayerParams& p) const {
    // parameters() builds its specs anew; the shapes are fixed at construction, so they are
    // taken once rather than on every forward and backward.
    std::call_once(m_declared_once, [&] {
      for (const ParamSpec& s : parameters()) m_declared_params.push_back(s.shape);
      for (const ParamSpec& s : buffers()) m_declared_buffers.push_back(s.shape);
    });
    PIPELINE_CHECK(p.params.size() == m_declared_params.size() &&
                       p.buffers.size() == m_declared_buffers.size(),
                   "layer '{}' ({}) expects {} parameters and {} buffers, got {} and {}", m_name,
                   kind(), m_declared_params.size(), m_declared_buffers.size(), p.params.size(),
                   p.buffers.size());
    // Parameters of another model (another width) would fail deep inside an op, unnamed.
    const auto check_shapes = [&](const std::vector<Shape>& want, const std::vector<Tensor>& got,
                                  bool buffer) {
      for (std::size_t i = 0; i < want.size(); ++i)
        PIPELINE_CHECK(got[i].shape() == want[i],
                       "layer '{}' ({}) expects its '{}' of shape {}, got {}: parameters of "
                       "another model, or of this one built with other sizes",
                       m_name, kind(), (buffer ? buffers() : parameters())[i].name, want[i],
                       got[i].shape());
    };
    check_shapes(m_declared_params, p.params, false);
    check_shapes(m_declared_buffers, p.buffers, true);
  }

  std::string m_name;
  mutable std::once_flag m_declared_once;
  mutable std::vector<Shape> m_declared_params, m_declared_buffers;
};

using LayerPtr = std::unique_ptr<Layer>;

}  // namespace pipeline
