// AdamW (decoupled weight decay, bias-corrected moments), as torch.optim.AdamW; with
// `decoupled = false` it is torch.optim.Adam with L2 weight decay.
#pragma once

#include <pipeline/ops/optimizer_update.hpp>
#include <pipeline/optim/optimizer.hpp>

#include <span>
#include <vector>

namespace pipeline {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  bool decoupled = true;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(AdamWOptions o = {}) : m_options(o) {
    PIPELINE_CHECK_AS(ConfigError,
                      o.beta1 >= 0.f && o.beta1 < 1.f && o.beta2 >= 0.f && o.beta2 < 1.f,
                      "Adam betas must lie in [0, 1), got ({}, {})", o.beta1, o.beta2);
    PIPELINE_CHECK_AS(ConfigError, o.eps >= 0.f && o.weight_decay >= 0.f,
                      "Adam eps and weight decay must be >= 0, got {} and {}", o.eps,
                      o.weight_decay);
  }

  std::string kind() const override { return m_options.decoupled ? "adamw" : "adam"; }
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  const AdamWOptions& options() const { return m_options; }
  std::vector<float> step_scalars(float lr, std::int64_t step) const override {
    return ops::adamw_step_scalars(step, params_for(lr));
  }

 protected:
  void update(Tensor& param, const Tensor& grad, ParamState& s, float lr) override {
    ops::adamw_update(param, grad, s.buffers[0], s.buffers[1], s.step, params_for(lr));
  }
  void update_all(std::span<Tensor> params, std::span<const Tensor> grads, float lr) override {
    if (params.empty() || !uniform_steps()) return Optimizer::update_all(params, grads, lr);
    auto [m, v] = moments();
    ops::adamw_update_many(params, grads, m, v, state().front().step, params_for(lr),
                           step_scalars_tensor());
  }
  void update_all_and_zero(std::span<Tensor> params, std::span<Tensor> grads, float lr,
                           std::span<double> sums) override {
    if (params.empty() || !uniform_steps() || step_scalars_tensor())
      return Optimizer::update_all_and_zero(params, grads, lr, sums);
    auto [m, v] = moments();
    ops::adamw_update_many(params, grads, m, v, state().front().step, params_for(lr), {sums, true});
  }

 private:
  // Handles sharing the state's storage: the first and second moments.
  std::pair<std::vector<Tensor>, std::vector<Tensor>> moments() {
    std::vector<Tensor> m, v;
    for (ParamState& s : state()) {
      m.push_back(s.buffers[0]);
      v.push_back(s.buffers[1]);
    }
    return {std::move(m), std::move(v)};
  }
  ops::AdamWParams params_for(float lr) const {
    return {lr,          m_options.beta1,        m_options.beta2,
            m_options.eps, m_options.weight_decay, m_options.decoupled};
  }

  AdamWOptions m_options;
};

}  // namespace pipeline
