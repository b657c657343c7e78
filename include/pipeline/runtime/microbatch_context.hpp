// Per-microbatch state of a stage executor, and the table that bounds how many are in flight.
//
// Between a microbatch's forward and its backward a stage keeps: the records its layers saved
// for backward, the weight version the forward used (weight stashing), and on the last stage the
// labels and the loss gradient. InFlightTable holds these contexts in a fixed number of slots —
// the schedule's peak of stashed activations on this rank, as validate() counts it — so the
// memory bound of 1F1B (at most `in_flight` stashes) is a data structure one can see and test:
// opening one more than the schedule allows throws instead of growing silently. A context is
// closed, and its activations freed, as soon as its backward is done.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/nn/layer.hpp>
#include <pipeline/runtime/weight_store.hpp>

#include <cstdint>
#include <vector>

namespace pipeline {

struct MicrobatchContext {
  int microbatch = -1;              // the schedule's microbatch number
  WeightStore::Tag version = 0;     // the weight version its forward used
  WeightStore::Tag input_tag = 0;   // vertical sync: the tag the input stage used, passed on
  std::vector<Saved> saved;         // per layer of the stage, for backward
  Tensor labels;                    // last stage: the targets
  Tensor loss_grad;                 // last stage: dL/dlogits, computed right after the forward
  Tensor output;                    // the forward's output until it is sent (or scored)
  // Split backward: the output gradients of the layers with weights, from I to W.
  std::vector<Tensor> layer_grads;
  std::int64_t samples = 0;
  // Activation recomputation: the stage's input, kept instead of `saved` between the forward and
  // the backward, and the forward's dropout seed, so the recomputed forward draws the same masks.
  Tensor input;
  std::uint64_t seed = 0;

  // Nominal bytes (views of one storage counted per view); StageExecutor measures real bytes.
  std::size_t bytes() const {
    std::size_t n = input.defined() ? input.nbytes() : 0;
    for (auto& s : saved) n += s.bytes();
    for (auto& g : layer_grads) n += g.defined() ? g.nbytes() : 0;
    return n + (loss_grad.defined() ? loss_grad.nbytes() : 0);
  }
};

class InFlightTable {
 public:
  explicit InFlightTable(int capacity) : m_slots(static_cast<std::size_t>(capacity)) {
    PIPELINE_CHECK(capacity >= 1, "in-flight table needs at least one slot, got {}", capacity);
  }

  int capacity() const { return static_cast<int>(m_slots.size()); }
  int size() const { return m_size; }
  int peak() const { return m_peak; }

  // A fresh context for microbatch `mb`. Throws when `mb` is already open or every slot is taken
  // (the schedule stashes more than it was validated for).
  MicrobatchContext& open(int mb) {
    PIPELINE_CHECK(find(mb) == nullptr, "microbatch {} is already in flight on this stage", mb);
    for (auto& slot : m_slots)
      if (slot.microbatch < 0) {
        slot = MicrobatchContext{};
        slot.microbatch = mb;
        ++m_size;
        if (m_size > m_peak) m_peak = m_size;
        return slot;
      }
    PIPELINE_FAIL(Error,
                  "cannot start microbatch {}: all {} in-flight slots are taken (microbatches {}); "
                  "the schedule keeps more activations than its validated bound",
                  mb, capacity(), open_list());
  }

  // Calls f(context) for every open context.
  template <class F>
  void for_each_open(F&& f) const {
    for (auto& slot : m_slots)
      if (slot.microbatch >= 0) f(slot);
  }

  MicrobatchContext& at(int mb) {
    MicrobatchContext* c = find(mb);
    PIPELINE_CHECK(c != nullptr, "microbatch {} is not in flight on this stage (in flight: {})", mb,
                   open_list());
    return *c;
  }
  bool contains(int mb) const { return const_cast<InFlightTable*>(this)->find(mb) != nullptr; }

  // Frees the context's tensors and its slot.
  void close(int mb) {
    MicrobatchContext& c = at(mb);
    c = MicrobatchContext{};
    --m_size;
  }

  std::string open_list() const {
    std::string s;
    for (auto& slot : m_slots)
      if (slot.microbatch >= 0) s += (s.empty() ? "" : ", ") + std::to_string(slot.microbatch);
    return s.empty() ? "none" : s;
  }

 private:
  MicrobatchContext* find(int mb) {
    for (auto& slot : m_slots)
      if (slot.microbatch == mb) return &slot;
    return nullptr;
  }

  std::vector<MicrobatchContext> m_slots;
  int m_size = 0;
  int m_peak = 0;
};

}  // namespace pipeline
