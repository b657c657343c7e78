// SGD with momentum, Nesterov momentum and L2 weight decay, as torch.optim.SGD.
// The momentum buffer is created on the first update as a copy of the (decayed) gradient.
#pragma once

#include <pipeline/ops/optimizer_update.hpp>
#include <pipeline/optim/optimizer.hpp>

#include <span>
#include <vector>

namespace pipeline {

struct SgdOptions {
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  explicit Sgd(SgdOptions o = {}) : m_options(o) {
    PIPELINE_CHECK_AS(ConfigError, o.momentum >= 0.f, "SGD momentum must be >= 0, got {}",
                      o.momentum);
    PIPELINE_CHECK_AS(ConfigError, o.weight_decay >= 0.f, "SGD weight decay must be >= 0, got {}",
                      o.weight_decay);
    PIPELINE_CHECK_AS(ConfigError, !o.nesterov || (o.momentum > 0.f && o.dampening == 0.f),
                      "Nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, "
                      "dampening {})",
                      o.momentum, o.dampening);
  }

  std::string kind() const override { return "sgd"; }
  std::vector<std::string> buffer_names() const override {
    if (m_options.momentum == 0.f) return {};
    return {"momentum_buffer"};
  }
  const SgdOptions& options() const { return m_options; }
  std::vector<float> step_scalars(float lr, std::int64_t) const override {
    return ops::sgd_step_scalars(params_for(lr));
  }

 protected:
  void update(Tensor& param, const Tensor& grad, ParamState& s, float lr) override {
    const ops::SgdParams p = params_for(lr);
    Tensor* buffer = s.buffers.empty() ? nullptr : &s.buffers[0];
    ops::sgd_update(param, grad, buffer, s.step == 1, p);
  }
  void update_all(std::span<Tensor> params, std::span<const Tensor> grads, float lr) override {
    if (params.empty() || !uniform_steps()) return Optimizer::update_all(params, grads, lr);
    ops::sgd_update_many(params, grads, momentum_buffers(), state().front().step == 1,
                         params_for(lr), step_scalars_tensor());
  }
  void update_all_and_zero(std::span<Tensor> params, std::span<Tensor> grads, float lr,
                           std::span<double> sums) override {
    if (params.empty() || !uniform_steps() || step_scalars_tensor())
      return Optimizer::update_all_and_zero(params, grads, lr, sums);
    ops::sgd_update_many(params, grads, momentum_buffers(), state().front().step == 1,
                         params_for(lr), {sums, true});
  }

 private:
  std::vector<Tensor*> momentum_buffers() {
    std::vector<Tensor*> buffers;
    for (ParamState& s : state()) buffers.push_back(s.buffers.empty() ? nullptr : &s.buffers[0]);
    return buffers;
  }
  ops::SgdParams params_for(float lr) const {
    return {lr, m_options.momentum, m_options.dampening, m_options.weight_decay,
            m_options.nesterov};
  }

  SgdOptions m_options;
};

}  // namespace pipeline
