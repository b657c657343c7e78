// Sequential: a model as an ordered list of uniquely named layers.
//
// This is the unit the profiler measures, the partitioner splits into contiguous stages and the
// runtime executes: a stage is a half-open range [begin, end) of layer indices, and every helper
// here takes such a range so that a rank touches only its own layers. Parameters live outside
// the model, one LayerParams per layer (ModelParams), so several versions can coexist.
#pragma once

#include <pipeline/nn/layer.hpp>

#include <fmt/format.h>

#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pipeline {

using ModelParams = std::vector<LayerParams>;
using ModelGrads = std::vector<std::vector<Tensor>>;

// `params` on `device` (tensors already there are shared, not copied).
inline ModelParams to_device(const ModelParams& params, Device device) {
  ModelParams out;
  for (auto& p : params) out.push_back(p.to(device));
  return out;
}

// The device of the first tensor of `params` (the CPU when there is none).
inline Device device_of(const ModelParams& params) {
  for (auto& p : params)
    for (auto& t : p.params) return t.device();
  return Device::cpu();
}

// A deep copy of every layer's parameters and buffers.
inline ModelParams clone_params(const ModelParams& params) {
  ModelParams out;
  out.reserve(params.size());
  for (auto& layer : params) out.push_back(layer.clone());
  return out;
}

struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

class Sequential {
 public:
  Sequential() = default;
  explicit Sequential(std::string name) : m_name(std::move(name)) {}

  Sequential& add(LayerPtr layer) {
    PIPELINE_CHECK_AS(ConfigError, layer != nullptr, "Sequential::add: null layer");
    PIPELINE_CHECK_AS(ConfigError, m_names.insert(layer->name()).second,
                      "model '{}' already has a layer named '{}': layer names must be unique",
                      m_name, layer->name());
    m_trainable.push_back(!layer->parameters().empty());
    if (!m_layers.empty()) {
      const Layer& before = *m_layers.back();
      m_commutes_with_next.back() = before.parameters().empty() && layer->parameters().empty() &&
                                    before.commutes_with_next(*layer);
    }
    m_commutes_with_next.push_back(false);
    m_layers.push_back(std::move(layer));
    return *this;
  }
  template <typename L, typename... Args>
  Sequential& emplace(Args&&... args) {
    return add(std::make_unique<L>(std::forward<Args>(args)...));
  }

  const std::string& name() const { return m_name; }
  int size() const { return static_cast<int>(m_layers.size()); }
  const Layer& layer(int i) const { return *m_layers.at(i); }
  LayerRange all() const { return {0, size()}; }
  int index_of(const std::string& layer_name) const {
    for (int i = 0; i < size(); ++i)
      if (m_layers[i]->name() == layer_name) return i;
    PIPELINE_FAIL(ConfigError, "model '{}' has no layer named '{}'", m_name, layer_name);
  }

  // Input shape of each layer in the range followed by the range's output shape (size + 1 shapes).
  std::vector<Shape> shapes(const Shape& input, LayerRange r) const {
    check_range(r);
    std::vector<Shape> out{input};
    for (int i = r.begin; i < r.end; ++i) out.push_back(m_layers[i]->output_shape(out.back()));
    return out;
  }
  Shape output_shape(const Shape& input) const { return shapes(input, all()).back(); }

  ModelParams init(std::uint64_t seed, LayerRange r) const {
    check_range(r);
    ModelParams p;
    for (int i = r.begin; i < r.end; ++i) p.push_back(m_layers[i]->init(seed));
    return p;
  }
  ModelParams init(std::uint64_t seed) const { return init(seed, all()); }

  ModelGrads zero_grads(LayerRange r, Device device = Device::cpu()) const {
    ModelGrads g;
    for (int i = r.begin; i < r.end; ++i) g.push_back(m_layers[i]->zero_grads(device));
    return g;
  }

  // The layer that runs at position i of range r's forward (backward: in reverse). It is layer i
  // but where a layer commutes with the next (Layer::commutes_with_next: a ReLU before a max
  // pool) and both lie in r: those two run in the other order, with the same output and
  // gradients for less work. Records stay per layer (saved[k], grads[k] and params[k] belong to
  // layer r.begin + k); only the order changes, and never across the range's ends, so what a
  // stage receives and sends is what the layers declare.
  int runs_at(LayerRange r, int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (i + 1 < r.end && m_commutes_with_next[u]) return i + 1;
    if (i > r.begin && m_commutes_with_next[u - 1]) return i - 1;
    return i;
  }
  // Whether layer i runs after layer i + 1 when a range holds both (see runs_at).
  bool runs_after_next(int i) const { return m_commutes_with_next[static_cast<std::size_t>(i)]; }

  // Forward through layers [r.begin, r.end) (in the order of runs_at); params[k] belongs to layer
  // r.begin + k.
  Tensor forward(LayerRange r, ModelParams& params, const Tensor& x, std::vector<Saved>& saved,
                 const ForwardContext& ctx) const {
    check_range(r);
    PIPELINE_CHECK(static_cast<int>(params.size()) == r.size(),
                   "forward over {} layers with parameters for {}", r.size(), params.size());
    saved.assign(r.size(), Saved{});
    Tensor h = x;
    for (int i = r.begin; i < r.end; ++i) {
      const int j = runs_at(r, i);
      h = m_layers[j]->forward(params[j - r.begin], h, saved[j - r.begin], ctx);
    }
    return h;
  }

  // Backward through the range in reverse; accumulates into grads. Returns dL/dx of the range's
  // input, or an undefined tensor when need_input_grad is false (the first stage skips it). Each
  // layer's output gradient is let go once that layer's backward is done: a caller that moves dy
  // in holds no more than one layer's gradient pair at a time (the memory model's assumption).
  Tensor backward(LayerRange r, const ModelParams& params, const std::vector<Saved>& saved,
                  Tensor dy, ModelGrads& grads, bool need_input_grad = true) const {
    return backward_through(r, params, saved, std::move(dy), grads, need_input_grad);
  }
  // The same, consuming the saved records: each layer's goes once its backward is done, as
  // autograd frees a node's saved tensors, so the layers below never hold the ones above.
  Tensor backward(LayerRange r, const ModelParams& params, std::vector<Saved>&& saved, Tensor dy,
                  ModelGrads& grads, bool need_input_grad = true) const {
    return backward_through(r, params, saved, std::move(dy), grads, need_input_grad);
  }

  // The lowest layer of r whose backward computes its input gradient: r.begin when the range's
  // input gradient is needed, else the layer above the lowest one with parameters. A layer's
  // input gradient serves only the layers below it, and below that one there are no weights to
  // train: the mlp's first Linear, over a Flatten, skips its input-gradient product (as autograd
  // does for an input that needs no gradient). Layers under the returned one compute nothing,
  // but for the weight gradients of the one just under it.
  int first_input_grad_layer(LayerRange r, bool need_input_grad) const {
    if (need_input_grad) return r.begin;
    int i = r.begin;
    while (i < r.end && !m_trainable[static_cast<std::size_t>(i)]) ++i;
    return std::min(i + 1, r.end);
  }

 private:
  // Releases each layer's saved record after its backward where the records are not const.
  template <class SavedRecords>
  Tensor backward_through(LayerRange r, const ModelParams& params, SavedRecords& saved, Tensor dy,
                          ModelGrads& grads, bool need_input_grad) const {
    check_range(r);
    PIPELINE_CHECK(saved.size() == static_cast<std::size_t>(r.size()),
                   "backward over {} layers with saved records for {}", r.size(), saved.size());
    Tensor g = std::move(dy);
    const int first = first_input_grad_layer(r, need_input_grad);
    for (int i = r.end - 1; i >= r.begin; --i) {
      const int j = runs_at(r, i);
      const auto k = static_cast<std::size_t>(j - r.begin);
      if (i >= first) {
        g = m_layers[j]->backward(params[k], saved[k], g, grads[k], GradParts::Both);
      } else if (!grads[k].empty()) {
        (void)m_layers[j]->backward(params[k], saved[k], g, grads[k], GradParts::Weight);
      }
      if constexpr (!std::is_const_v<SavedRecords>) saved[k] = Saved{};
    }
    return need_input_grad ? g : Tensor{};
  }

  void check_range(LayerRange r) const {
    PIPELINE_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= size(),
                   "layer range [{}, {}) out of bounds for model '{}' with {} layers", r.begin,
                   r.end, m_name, size());
  }

  std::string m_name;
  std::vector<LayerPtr> m_layers;
  std::vector<bool> m_trainable;  // per layer: it has parameters (asked once, not per backward)
  std::vector<bool> m_commutes_with_next;  // per layer: runs_at may swap it with the next
  std::set<std::string> m_names;
};

}  // namespace pipeline
