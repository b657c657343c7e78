// WeightStore: the weight versions of one stage on one rank — PipeDream's weight stashing.
//
// Under 1F1B-stash a forward uses the latest weights and its backward must use the *same*
// weights, although the optimizer has stepped in between. The store keeps every version still
// referenced by an in-flight microbatch: acquire() on forward, release() after backward. A step
// updates the latest version in place when nothing references it, and otherwise first copies it
// into a new version (copy-on-write), so a version lives exactly as long as some microbatch needs
// it. Flush schedules use the same calls and never hold more than one version (no forward of the
// next minibatch runs before the step).
//
// Versions are identified by a tag: the number of minibatches whose gradients the version has
// absorbed. A stage with r replicas absorbs r minibatches per step (its gradients are
// allreduced), so its tags advance by r; a single-replica stage's tag is its step count. Tags
// give vertical sync (PipeDream §3.3) a meaning that holds across stages: microbatch u carries
// the tag the input stage used, and every stage runs u with its newest version whose tag does not
// exceed it (acquire(tag)). Requests arrive in non-decreasing tag order, so with vertical sync
// the store keeps, besides referenced versions, every version that a future request could still
// select — the newest one at or below the highest tag requested so far (the floor) and all newer.
//
// Released versions give their tensors back to a spare list that the next copy reuses, so
// steady-state stashing allocates nothing.
//
// Under bf16 mixed precision (ops/precision.hpp) every product rounds the weight matrices it
// reads to bf16, so a version that stops being the latest may keep those matrices as bfloat16
// (set_bf16_stash: half their bytes) without changing any result; the latest version, which the
// optimizer updates, stays float32 (the master weights).
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/ops/convert.hpp>

#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

namespace pipeline {

class WeightStore {
 public:
  using Tag = std::int64_t;

  // `initial` becomes version `first_tag`; every step advances the tag by `tag_step`.
  explicit WeightStore(ModelParams initial, Tag tag_step = 1, bool vertical_sync = false,
                       Tag first_tag = 0)
      : m_tag_step(tag_step), m_vertical_sync(vertical_sync) {
    PIPELINE_CHECK(tag_step >= 1, "weight store: tag step must be >= 1, got {}", tag_step);
    m_versions.push_back({first_tag, std::move(initial), 0});
    m_floor = first_tag;
  }

  // Changes the tag step and vertical sync between runs, when no microbatch is in flight; only
  // the latest version is kept.
  void set_policy(Tag tag_step, bool vertical_sync) {
    PIPELINE_CHECK(tag_step >= 1, "weight store: tag step must be >= 1, got {}", tag_step);
    for (auto& v : m_versions)
      PIPELINE_CHECK(v.refs == 0,
                     "weight store: the policy can only change with no microbatch in flight "
                     "(version {} has {} references)",
                     v.tag, v.refs);
    while (m_versions.size() > 1) {
      m_spare.push_back(std::move(m_versions.front().params));
      m_versions.pop_front();
    }
    m_tag_step = tag_step;
    m_vertical_sync = vertical_sync;
    m_floor = m_versions.back().tag;
  }

  // Which parameters (per layer, in LayerParams::params order) a stashed version keeps as
  // bfloat16: those marked ParamSpec::product_operand, when the products compute in bf16. Empty:
  // none (the default). Takes effect at the next step.
  void set_bf16_stash(std::vector<std::vector<bool>> narrow) { m_bf16_stash = std::move(narrow); }

  Tag latest_tag() const { return m_versions.back().tag; }
  ModelParams& latest() { return m_versions.back().params; }
  const ModelParams& latest() const { return m_versions.back().params; }
  bool vertical_sync() const { return m_vertical_sync; }

  // References the latest version (forward without vertical sync, or on the input stage).
  Tag acquire_latest() {
    Version& v = m_versions.back();
    ++v.refs;
    raise_floor(v.tag);
    return v.tag;
  }

  // References the newest version whose tag is <= `wanted` (vertical sync: the tag the input
  // stage used for this microbatch). Throws when that version was already freed, which means
  // requests arrived out of order.
  Tag acquire(Tag wanted) {
    PIPELINE_CHECK(!m_vertical_sync || wanted >= m_floor,
                   "weight version for tag {} requested after tag {}: vertical-sync requests must "
                   "arrive in non-decreasing tag order (the version may already be freed)",
                   wanted, m_floor);
    Version* best = nullptr;
    for (auto& v : m_versions)
      if (v.tag <= wanted) best = &v;
    PIPELINE_CHECK(best != nullptr, "no weight version with tag <= {} is held (oldest held: {})",
                   wanted, m_versions.front().tag);
    ++best->refs;
    raise_floor(wanted);
    return best->tag;
  }

  // Promises that no later acquire() asks for a tag below `tag`, so versions only such a request
  // could select are freed once unreferenced (2BW: after step k no minibatch needs tag k - 1).
  void forget_below(Tag tag) { raise_floor(tag); }

  ModelParams& params(Tag tag) { return find(tag).params; }
  const ModelParams& params(Tag tag) const { return const_cast<WeightStore*>(this)->find(tag).params; }

  void release(Tag tag) {
    Version& v = find(tag);
    PIPELINE_CHECK(v.refs > 0, "weight version {} released more often than acquired", tag);
    --v.refs;
    collect();
  }

  // The parameters an optimizer step must update: the latest version itself when no in-flight
  // microbatch (and, with vertical sync, no future request) can need it, else a fresh copy that
  // becomes the latest. The tag advances by tag_step either way.
  ModelParams& begin_step() {
    Version& cur = m_versions.back();
    const bool keep = cur.refs > 0 || m_vertical_sync;
    if (!keep) {
      cur.tag += m_tag_step;
      return cur.params;
    }
    Version next{cur.tag + m_tag_step, copy_of(cur.params), 0};
    narrow(cur.params);  // no longer the latest: read only, by the products
    m_versions.push_back(std::move(next));
    collect();
    return m_versions.back().params;
  }

  // Versions held now, and the most held at once.
  int size() const { return static_cast<int>(m_versions.size()); }
  int peak() const { return m_peak; }
  int references(Tag tag) const {
    for (auto& v : m_versions)
      if (v.tag == tag) return v.refs;
    return 0;
  }
  // Calls f(tensor, latest) for every tensor the store holds: each version's parameters and
  // buffers (latest: of the newest version) and the spare copies kept for reuse (not latest).
  template <class F>
  void for_each_tensor(F&& f) const {
    for (std::size_t i = 0; i < m_versions.size(); ++i)
      for (auto& layer : m_versions[i].params) {
        for (auto& t : layer.params) f(t, i + 1 == m_versions.size());
        for (auto& t : layer.buffers) f(t, i + 1 == m_versions.size());
      }
    for (auto& spare : m_spare)
      for (auto& layer : spare) {
        for (auto& t : layer.params) f(t, false);
        for (auto& t : layer.buffers) f(t, false);
      }
  }
  std::vector<Tag> tags() const {
    std::vector<Tag> out;
    for (auto& v : m_versions) out.push_back(v.tag);
    return out;
  }

 private:
  struct Version {
    Tag tag = 0;
    ModelParams params;
    int refs = 0;
  };

  Version& find(Tag tag) {
    for (auto& v : m_versions)
      if (v.tag == tag) return v;
    PIPELINE_FAIL(Error, "weight version {} is not held by this stage (held: {} versions, latest {})",
                  tag, m_versions.size(), latest_tag());
  }

  void raise_floor(Tag t) {
    if (t > m_floor) m_floor = t;
    collect();
  }

  // Frees every version that is not the latest, not referenced, and (vertical sync) cannot be
  // selected by a future request: its successor's tag is <= the floor.
  void collect() {
    for (std::size_t i = 0; i + 1 < m_versions.size();) {
      Version& v = m_versions[i];
      const bool selectable = m_vertical_sync && m_versions[i + 1].tag > m_floor;
      if (v.refs == 0 && !selectable) {
        m_spare.push_back(std::move(v.params));
        m_versions.erase(m_versions.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (static_cast<int>(m_versions.size()) > m_peak) m_peak = static_cast<int>(m_versions.size());
  }

  // A deep copy of `src`, into a spare version's tensors when one is available (a spare tensor
  // stashed in bf16 is replaced: the copy is a latest version, float32).
  ModelParams copy_of(const ModelParams& src) {
    if (m_spare.empty()) return clone_params(src);
    ModelParams out = std::move(m_spare.back());
    m_spare.pop_back();
    const auto copy = [](Tensor& dst, const Tensor& from) {
      if (dst.dtype() == from.dtype())
        dst.copy_from(from);
      else
        dst = from.clone();
    };
    for (std::size_t l = 0; l < src.size(); ++l) {
      for (std::size_t k = 0; k < src[l].params.size(); ++k)
        copy(out[l].params[k], src[l].params[k]);
      for (std::size_t k = 0; k < src[l].buffers.size(); ++k)
        copy(out[l].buffers[k], src[l].buffers[k]);
    }
    return out;
  }

  // Keeps the parameters set_bf16_stash names as bfloat16.
  void narrow(ModelParams& params) const {
    for (std::size_t l = 0; l < params.size() && l < m_bf16_stash.size(); ++l)
      for (std::size_t k = 0; k < params[l].params.size() && k < m_bf16_stash[l].size(); ++k)
        if (m_bf16_stash[l][k])
          params[l].params[k] = ops::to_dtype(params[l].params[k], DType::BFloat16);
  }

  Tag m_tag_step;
  bool m_vertical_sync;
  Tag m_floor = 0;
  std::deque<Version> m_versions;
  std::vector<ModelParams> m_spare;
  std::vector<std::vector<bool>> m_bf16_stash;
  int m_peak = 1;
};

// What a WeightStore of the layers `range` of `model` narrows under a bf16 compute dtype: per
// layer, its parameters marked ParamSpec::product_operand.
inline std::vector<std::vector<bool>> bf16_stash_mask(const Sequential& model, LayerRange range) {
  std::vector<std::vector<bool>> mask;
  for (int i = range.begin; i < range.end; ++i) {
    auto& m = mask.emplace_back();
    for (const ParamSpec& s : model.layer(i).parameters()) m.push_back(s.product_operand);
  }
  return mask;
}

}  // namespace pipeline
