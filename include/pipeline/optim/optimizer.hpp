// Optimizer: the interface of the parameter-update rules (SGD, AdamW, ...).
//
// An optimizer updates one stage's trainable tensors, given as a flat list (see flatten.hpp) in a
// fixed order; gradients come in the same order. Its per-parameter state — a step count and the
// rule's buffers (momentum, Adam moments) — is plain data, visible through state(), created
// lazily on the first step and keyed by position. A later step with another number of tensors
// or other shapes is a bug in the caller (the stage's layers changed) and throws.
//
// For checkpoints, state_tensors() names every state tensor `<param>.<buffer>` (`<param>.step`
// holds the step count as an int32 scalar), with <param> taken from the given parameter names
// (`conv1.weight`, so a run can resume under another partition) or the position when none are
// given; load_state_tensors() is its inverse.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/ops/optimizer_update.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

// What an optimizer keeps for one parameter tensor.
struct ParamState {
  Shape shape;                  // the parameter's shape when the state was created
  std::int64_t step = 0;        // updates applied so far
  std::vector<Tensor> buffers;  // one per Optimizer::buffer_names(), each of `shape`
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual std::string kind() const = 0;
  // Names of the per-parameter buffers, e.g. {"momentum_buffer"} or {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> buffer_names() const = 0;

  // One update of every params[i] from grads[i] with learning rate lr.
  void step(std::span<Tensor> params, std::span<const Tensor> grads, float lr) {
    begin_step(params, grads);
    update_all(params, grads, lr);
  }

  // step(), then the gradients zeroed, in one pass over them on the CPU (ops::GradientTail);
  // sums_of_squares[i] gets grads[i]'s before the update, as ops::sums_of_squares gives it. For a
  // step without clipping, whose norm is only reported: a separate pass for the norm, the update
  // and one for the zeroing read or wrote every gradient three times.
  void step_and_zero(std::span<Tensor> params, std::span<Tensor> grads, float lr,
                     std::span<double> sums_of_squares) {
    PIPELINE_CHECK(sums_of_squares.size() == grads.size(),
                   "{} step: {} sums of squares for {} gradients", kind(), sums_of_squares.size(),
                   grads.size());
    begin_step(params, grads);
    update_all_and_zero(params, grads, lr, sums_of_squares);
  }

  // CUDA graphs. A replayed graph runs the captured update with the arguments it was captured
  // with; after read_step_scalars_from(), the values that change from step to step (learning rate,
  // bias corrections) are read from `scalars` instead: a float32 device tensor into which the
  // caller writes step_scalars() before each replay. Only the one-launch update of parameters
  // sharing one step count reads them (which a captured step checks for).
  void read_step_scalars_from(Tensor scalars) { m_step_scalars = std::move(scalars); }
  // What the update numbered `step` (1-based) with learning rate `lr` reads from there.
  virtual std::vector<float> step_scalars(float lr, std::int64_t step) const = 0;
  // Counts an update that a replayed graph made (its launches were not made here).
  void count_replayed_step() {
    for (ParamState& s : m_state) ++s.step;
  }
  // Whether every parameter's state shares one step count (and so updates in one launch).
  bool uniform_steps() const {
    for (const ParamState& s : m_state)
      if (s.step != m_state.front().step) return false;
    return true;
  }

  const std::vector<ParamState>& state() const { return m_state; }
  std::vector<ParamState>& state() { return m_state; }
  void reset() { m_state.clear(); }

  // The state as named tensors (handles sharing the optimizer's storage; clone to snapshot).
  NamedTensors state_tensors(std::span<const std::string> param_names = {}) const {
    check_names(param_names);
    NamedTensors out;
    const auto names = buffer_names();
    for (std::size_t i = 0; i < m_state.size(); ++i) {
      const std::string base = param_names.empty() ? std::to_string(i) : param_names[i];
      const auto& s = m_state[i];
      PIPELINE_CHECK(s.step <= std::numeric_limits<std::int32_t>::max(),
                     "step count {} does not fit the int32 checkpoint field", s.step);
      out.emplace_back(base + ".step",
                       Tensor::from_ints(Shape{}, {static_cast<std::int32_t>(s.step)}));
      for (std::size_t b = 0; b < names.size(); ++b)
        out.emplace_back(base + "." + names[b], s.buffers[b]);
    }
    return out;
  }

  // Restores the state written by state_tensors() for parameters of the given shapes (in the
  // flattened order), copying the data. Missing or mis-shaped tensors throw IoError naming them.
  void load_state_tensors(const NamedTensors& tensors, std::span<const Shape> param_shapes,
                          std::span<const std::string> param_names = {}) {
    PIPELINE_CHECK(param_names.empty() || param_names.size() == param_shapes.size(),
                   "load_state_tensors: {} names for {} parameters", param_names.size(),
                   param_shapes.size());
    std::map<std::string, const Tensor*> by_name;
    for (auto& [name, t] : tensors) by_name[name] = &t;
    std::vector<std::string> problems;
    auto find = [&](const std::string& name, const Shape& shape, DType dtype) -> const Tensor* {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        problems.push_back(fmt::format("'{}' is missing", name));
        return nullptr;
      }
      if (it->second->shape() != shape || it->second->dtype() != dtype) {
        problems.push_back(fmt::format("'{}' has shape {} {} but {} {} was expected", name,
                                       it->second->shape(), dtype_name(it->second->dtype()), shape,
                                       dtype_name(dtype)));
        return nullptr;
      }
      return it->second;
    };
    std::vector<ParamState> loaded;
    const auto names = buffer_names();
    for (std::size_t i = 0; i < param_shapes.size(); ++i) {
      const std::string base = param_names.empty() ? std::to_string(i) : param_names[i];
      ParamState s = fresh_state(param_shapes[i]);
      if (const Tensor* t = find(base + ".step", Shape{}, DType::Int32))
        s.step = t->data<std::int32_t>()[0];
      for (std::size_t b = 0; b < names.size(); ++b)
        if (const Tensor* t = find(base + "." + names[b], param_shapes[i], DType::Float32))
          s.buffers[b].copy_from(*t);
      loaded.push_back(std::move(s));
    }
    if (!problems.empty())
      PIPELINE_FAIL(IoError, "cannot restore {} optimizer state: {}", kind(),
                    fmt::join(problems, "; "));
    m_state = std::move(loaded);
  }

 protected:
  // What every update does first: state for new parameters, checks, the step counts advanced.
  void begin_step(std::span<Tensor> params, std::span<const Tensor> grads) {
    PIPELINE_CHECK(params.size() == grads.size(), "{} step: {} parameters but {} gradients", kind(),
                   params.size(), grads.size());
    if (m_state.empty() && !params.empty()) {
      for (auto& p : params) m_state.push_back(fresh_state(p.shape(), p.device()));
    }
    PIPELINE_CHECK(m_state.size() == params.size(),
                   "{} step: the optimizer holds state for {} parameters but was given {}; the "
                   "stage's parameters must stay the same between steps",
                   kind(), m_state.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      PIPELINE_CHECK(params[i].shape() == m_state[i].shape,
                     "{} step: parameter {} has shape {} but its optimizer state was made for {}",
                     kind(), i, params[i].shape(), m_state[i].shape);
      PIPELINE_CHECK(grads[i].shape() == params[i].shape(),
                     "{} step: gradient {} has shape {} but its parameter has shape {}", kind(), i,
                     grads[i].shape(), params[i].shape());
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      ParamState& s = m_state[i];
      // State restored from a file is on the CPU; it follows its parameter to the device.
      for (auto& b : s.buffers)
        if (b.device() != params[i].device()) b = b.to(params[i].device());
      ++s.step;
    }
  }

  // Applies one update; s.step has already been incremented (1 on the first update).
  virtual void update(Tensor& param, const Tensor& grad, ParamState& s, float lr) = 0;
  // Updates every parameter (state()[i] belongs to params[i]); the default updates them one by
  // one. A rule overrides it to update them all at once (one multi-tensor launch on a GPU) when
  // uniform_steps() says they share one step count, as they do unless restored otherwise.
  virtual void update_all(std::span<Tensor> params, std::span<const Tensor> grads, float lr) {
    for (std::size_t i = 0; i < params.size(); ++i) update(params[i], grads[i], m_state[i], lr);
  }
  // update_all with a tail (step_and_zero): sums[i] = sum_of_squares(grads[i]) before the update,
  // the gradients zeroed after. The default makes them passes of their own.
  virtual void update_all_and_zero(std::span<Tensor> params, std::span<Tensor> grads, float lr,
                                   std::span<double> sums) {
    const std::vector<double> before = ops::sums_of_squares(grads);
    std::copy(before.begin(), before.end(), sums.begin());
    update_all(params, grads, lr);
    zero_all(grads);
  }
  const Tensor* step_scalars_tensor() const {
    return m_step_scalars.defined() ? &m_step_scalars : nullptr;
  }

 private:
  ParamState fresh_state(const Shape& shape, Device device = Device::cpu()) const {
    ParamState s;
    s.shape = shape;
    for (std::size_t b = 0; b < buffer_names().size(); ++b)
      s.buffers.push_back(Tensor::zeros(shape, DType::Float32, device));
    return s;
  }
  void check_names(std::span<const std::string> names) const {
    PIPELINE_CHECK(names.empty() || names.size() == m_state.size(),
                   "{} state_tensors: {} names for {} parameters", kind(), names.size(),
                   m_state.size());
  }

  std::vector<ParamState> m_state;
  Tensor m_step_scalars;
};

}  // namespace pipeline
