// Independent sequential references of PipeDream's weight stashing (1F1B-stash) and of
// PipeDream-2BW's double-buffered weights, for the runtime tests: they never run the executor,
// only the model's forward and backward with weight version histories.
#pragma once

#include <pipeline/data/dataset.hpp>
#include <pipeline/nn/loss.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/grad_clip.hpp>
#include <pipeline/optim/optimizer.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

namespace pipeline::testing {

// --- an independent reference of PipeDream's weight stashing --------------------------------
//
// Each stage j keeps its history of weight versions W_j[0], W_j[1], ... (W_j[k] = after k
// optimizer steps). Stage j with r_j replicas runs minibatch u on replica u % r_j as the m-th
// (m = u / r_j) minibatch of that replica; 1F1B admits w_j forwards before the first backward and
// then alternates, so the forward of the m-th minibatch comes after max(0, m - w_j) steps of the
// stage, or max(0, m - w_j - 1) on a replica that steps only after its next backward (delaying).
// The forward and the backward of u both use that version (stashing). With vertical sync every
// stage uses instead the version whose absorbed-minibatch count (tag = steps · r_j) is the newest
// not above the input stage's tag for u. Step k of stage j applies the mean gradient of minibatches
// [k r_j, (k + 1) r_j), each computed with the versions above.
struct StashReference {
  const Sequential& model;
  std::uint64_t seed;
  float lr;
  std::function<std::unique_ptr<Optimizer>()> make_optimizer;
  std::function<Batch(std::int64_t)> minibatch;
  std::vector<LayerRange> stages;
  std::vector<int> replicas;
  std::vector<int> warmup;
  bool vertical_sync = false;
  // Per stage, how many of its first replicas step only after their next backward (empty: none).
  std::vector<int> delaying;

  // The steps stage j has taken at the forward of minibatch u.
  int own_version(int j, int u) const {
    const int r = replicas[static_cast<std::size_t>(j)];
    const bool delays = static_cast<std::size_t>(j) < delaying.size() &&
                        u % r < delaying[static_cast<std::size_t>(j)];
    return std::max(0, u / r - warmup[static_cast<std::size_t>(j)] - (delays ? 1 : 0));
  }

  // The step count of stage j whose weights minibatch u uses.
  int version(int j, int u) const {
    const int own = own_version(j, u);
    if (!vertical_sync) return own;
    const int input_tag = replicas[0] * own_version(0, u);
    return std::min(own, input_tag / replicas[static_cast<std::size_t>(j)]);
  }

  // Replicas, warm-ups and delays as `s` runs them (its own lists, read independently of the
  // executor).
  void follow(const Schedule& s);

  ModelParams run(int minibatches) const {
    const int p = static_cast<int>(stages.size());
    std::vector<std::vector<ModelParams>> history(static_cast<std::size_t>(p));
    std::vector<std::unique_ptr<Optimizer>> opt;
    for (int j = 0; j < p; ++j) {
      history[j].push_back(model.init(seed, stages[j]));
      opt.push_back(make_optimizer());
    }
    std::vector<std::vector<ModelGrads>> grads(static_cast<std::size_t>(p));
    for (int u = 0; u < minibatches; ++u) {
      Batch b = minibatch(u);
      // Forward through every stage with its version for u, then backward.
      std::vector<std::vector<Saved>> saved(static_cast<std::size_t>(p));
      std::vector<ModelParams*> w(static_cast<std::size_t>(p));
      Tensor h = b.inputs;
      ForwardContext ctx{Mode::Train, microbatch_seed(seed, u, 0)};
      for (int j = 0; j < p; ++j) {
        const int v = version(j, u);
        PIPELINE_CHECK(v < static_cast<int>(history[j].size()),
                       "reference: stage {} needs version {} for minibatch {}", j, v, u);
        w[j] = &history[j][static_cast<std::size_t>(v)];
        h = model.forward(stages[j], *w[j], h, saved[j], ctx);
      }
      LossResult l = SoftmaxCrossEntropy{}(h, b.labels, 1.f / static_cast<float>(b.size()));
      Tensor g = l.grad;
      for (int j = p - 1; j >= 0; --j) {
        ModelGrads gj = model.zero_grads(stages[j]);
        g = model.backward(stages[j], *w[j], saved[j], g, gj, j > 0);
        grads[j].push_back(std::move(gj));
      }
      // Steps whose minibatches are all done.
      for (int j = 0; j < p; ++j) {
        const int r = replicas[j];
        const int k = static_cast<int>(history[j].size()) - 1;
        if (static_cast<int>(grads[j].size()) < (k + 1) * r) continue;
        std::vector<Tensor> sum = flatten_grads(grads[j][static_cast<std::size_t>(k * r)]);
        for (int i = 1; i < r; ++i) {
          std::vector<Tensor> gi = flatten_grads(grads[j][static_cast<std::size_t>(k * r + i)]);
          for (std::size_t t = 0; t < sum.size(); ++t) {
            auto sv = sum[t].values();
            auto iv = gi[t].values();
            for (std::size_t e = 0; e < sv.size(); ++e) sv[e] += iv[e];
          }
        }
        if (r > 1) scale(std::span<Tensor>(sum), 1.f / static_cast<float>(r));
        ModelParams next = clone_params(history[j].back());
        std::vector<Tensor> flat = flatten_params(next);
        opt[j]->step(flat, sum, lr);
        history[j].push_back(std::move(next));
      }
    }
    // The whole model's final parameters, stage after stage.
    ModelParams out;
    for (int j = 0; j < p; ++j)
      for (auto& lp : history[j].back()) out.push_back(lp);
    return out;
  }
};

// Steps before the forward of `u` on `rank` in the schedule's own list: the generator's order,
// read independently of the executor, to check the reference's closed form.
inline int steps_before_forward(const Schedule& s, int rank, int u) {
  int steps = 0;
  for (const Action& a : s.ranks[static_cast<std::size_t>(rank)]) {
    if (a.kind == ActionKind::Forward && a.microbatch == u) return steps;
    if (a.kind == ActionKind::Step) ++steps;
  }
  PIPELINE_FAIL(Error, "no forward of {} on rank {}", u, rank);
}

// The warm-up depth `rank` runs under: its forwards before its first backward, less one.
inline int schedule_warmup(const Schedule& s, int rank) {
  int forwards = 0;
  for (const Action& a : s.ranks[static_cast<std::size_t>(rank)]) {
    if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) break;
    if (a.kind == ActionKind::Forward) ++forwards;
  }
  return std::max(0, forwards - 1);
}

// Whether `rank` steps only after its next backward: a second backward before its first step.
inline bool schedule_delays(const Schedule& s, int rank) {
  int backwards = 0;
  for (const Action& a : s.ranks[static_cast<std::size_t>(rank)]) {
    if (a.kind == ActionKind::Step) return false;
    if (a.kind == ActionKind::Backward && ++backwards == 2) return true;
  }
  return false;
}

inline void StashReference::follow(const Schedule& s) {
  replicas.clear();
  warmup.clear();
  delaying.clear();
  for (const auto& ranks : s.stage_ranks) {
    replicas.push_back(static_cast<int>(ranks.size()));
    warmup.push_back(schedule_warmup(s, ranks.front()));
    int d = 0;
    while (d < static_cast<int>(ranks.size()) &&
           schedule_delays(s, ranks[static_cast<std::size_t>(d)]))
      ++d;
    for (std::size_t i = static_cast<std::size_t>(d); i < ranks.size(); ++i)
      PIPELINE_CHECK(!schedule_delays(s, ranks[i]),
                     "reference: replica {} of a stage delays its steps but replica {} does not", i,
                     d);
    delaying.push_back(d);
  }
}

// PipeDream-2BW, independently of the executor: minibatch j's gradient, accumulated over its
// `micro` microbatches, is taken at the weights after max(0, j - 1) steps and applied to the
// latest.
inline ModelParams two_buffered_reference(
    const Sequential& model, std::uint64_t seed, float lr,
    const std::function<std::unique_ptr<Optimizer>()>& make_optimizer,
    const std::function<Batch(std::int64_t)>& minibatch, int minibatches, int micro) {
  std::vector<ModelParams> history;
  history.push_back(model.init(seed));
  auto opt = make_optimizer();
  for (int j = 0; j < minibatches; ++j) {
    ModelParams& w = history[static_cast<std::size_t>(double_buffered_version(j))];
    ModelGrads g = model.zero_grads(model.all());
    const Batch b = minibatch(j);
    int i = 0;
    for (const Batch& mb : split_microbatches(b, micro)) {
      std::vector<Saved> saved;
      ForwardContext ctx{Mode::Train, microbatch_seed(seed, j, i++)};
      Tensor y = model.forward(model.all(), w, mb.inputs, saved, ctx);
      LossResult l = SoftmaxCrossEntropy{}(y, mb.labels, 1.f / static_cast<float>(b.size()));
      model.backward(model.all(), w, saved, l.grad, g, false);
    }
    ModelParams next = clone_params(history.back());
    std::vector<Tensor> flat = flatten_params(next);
    std::vector<Tensor> grads = flatten_grads(g);
    opt->step(flat, grads, lr);
    history.push_back(std::move(next));
  }
  return std::move(history.back());
}

}  // namespace pipeline::testing
