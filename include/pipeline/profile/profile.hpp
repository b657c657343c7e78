// Profile: what the partitioner and simulator know about a model — per-layer compute time and
// sizes at one batch size on one device. Plain data, no layers: it comes from the profiler, from
// a profile.json file, or from a PipeDream graph.txt.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/nn/architecture.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace pipeline {

// Seconds one optimizer step over a layer's parameters takes, per update rule (the optimizers of
// optim/: plain SGD, SGD with momentum, AdamW); 0 when not measured (PipeDream profiles, layers
// without parameters). A step does not depend on the batch size. Serialised as
// "step_s": {"sgd": ..., "momentum": ..., "adamw": ...}.
struct StepTimes {
  double sgd = 0;
  double momentum = 0;
  double adamw = 0;

  bool measured() const { return sgd != 0 || momentum != 0 || adamw != 0; }
  // The time of the rule named "sgd", "momentum" or "adamw" ("adam" too); ConfigError otherwise.
  double of(std::string_view optimizer) const { return pick(*this, optimizer); }
  double& of(std::string_view optimizer) { return pick(*this, optimizer); }

  StepTimes& operator+=(const StepTimes& o) {
    sgd += o.sgd;
    momentum += o.momentum;
    adamw += o.adamw;
    return *this;
  }

 private:
  template <typename Self>  // StepTimes or const StepTimes
  static std::conditional_t<std::is_const_v<Self>, const double&, double&> pick(
      Self& t, std::string_view optimizer) {
    if (optimizer == "sgd") return t.sgd;
    if (optimizer == "momentum") return t.momentum;
    if (optimizer == "adamw" || optimizer == "adam") return t.adamw;
    PIPELINE_FAIL(ConfigError, "unknown optimizer '{}': use sgd, momentum or adamw", optimizer);
  }
};

// What a layer that runs after its successor inside a stage (Sequential::runs_at: a ReLU before
// a max pool, which then works on the pooled tensor) costs in a stage that ends at it: there it
// runs in its declared order, on the full-size tensor it declares and sends. Measured by the
// profiler as such a stage runs it.
struct StageEndCosts {
  double forward_s = 0;
  double backward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
  std::int64_t saved_bytes = 0;
  // LayerProfile's saved_input_bytes and frees_input, as such a stage runs the layer: a stage of
  // that layer alone keeps the input it receives where the layer keeps it (a ReLU in place).
  std::int64_t saved_input_bytes = 0;
  bool frees_input = false;
  std::int64_t gradient_bytes = 0;  // LayerProfile::gradient_bytes, as such a stage runs it
};

struct LayerProfile {
  std::string name;
  std::string kind;
  double forward_s = 0;   // median forward time for one minibatch of Profile::batch_size
  double backward_s = 0;  // median backward time (input gradient + weight gradient)
  // The backward split, where measured (0 when unknown): input-gradient and weight-gradient time.
  double backward_input_s = 0;
  double backward_weight_s = 0;
  // Spread of the repeats (interquartile range), 0 when unknown.
  double forward_spread_s = 0;
  double backward_spread_s = 0;
  std::int64_t output_bytes = 0;     // bytes of this layer's output for the whole minibatch
  std::int64_t parameter_bytes = 0;  // bytes of trainable parameters
  double flops = 0;                  // forward FLOPs for the whole minibatch, 0 when unknown
  std::vector<int> inputs;           // predecessor layer indices; empty: the previous layer
  // A layer with no predecessor at all although it is not layer 0 (a second model input, such as
  // GNMT's `hidden`). Its `inputs` must then be empty. Serialised as "source": true.
  bool source = false;
  // Bytes the layer keeps from its forward for its backward, for the whole minibatch, counting
  // storage that an earlier layer already keeps (a ReLU's output that the next Linear saves as
  // its input) only at the first: what stashing one microbatch costs. 0 when unknown (PipeDream
  // profiles), and then output_bytes stands for it (stash_bytes()).
  std::int64_t saved_bytes = 0;
  // Of saved_bytes, the storage of the layer's own input (a predecessor's output) that no earlier
  // layer keeps: a conv after a pooling layer, a Linear after a flatten. A stage that starts at
  // this layer holds that storage once, as the input it received, so the memory models do not
  // charge it again there. 0 when unknown.
  std::int64_t saved_input_bytes = 0;
  // Measured: the layer keeps no part of its input's storage for its backward and does not
  // return a view of it (a max pool keeps its argmax indices; a ReLU that runs after its pool
  // keeps the pooled tensor). A stage that starts at it, as the only reader of what it receives,
  // frees that input after the forward instead of holding it per minibatch in flight
  // (Profile::stage_frees_input). false when it keeps it, and when unknown. Serialised only when
  // set.
  bool frees_input = false;
  // Bytes a split backward keeps from the input-gradient half to the weight half: the layer's
  // output gradient, and a composite's children's output gradients. 0 when not measured, and
  // then output_bytes stands for it (split_kept_bytes()).
  std::int64_t split_kept_bytes = 0;
  // One optimizer step over the layer's parameters, per rule: the runtime pays it once per
  // minibatch on every replica of the layer's stage.
  StepTimes step_s;
  // Bytes of one stashed weight version of the layer where they differ from parameter_bytes: a
  // bf16 profile's layers keep their weight matrices in bf16 there (ParamSpec::product_operand).
  // 0: parameter_bytes (version_bytes()). Serialised only when set.
  std::int64_t stashed_parameter_bytes = 0;
  // Bytes of the layer's output gradient and of the input gradient its backward makes, which
  // that backward holds at once (each storage once; no input gradient where training makes none,
  // under the bottom layers with weights). With workspace_bytes, what a stage's backward holds at
  // this layer beside its stashed tensors (backward_peak_bytes). Measured; 0 when unknown.
  // Serialised only when set.
  std::int64_t gradient_bytes = 0;
  // The most memory any one pass of the layer (forward, backward, either half of a split
  // backward, an optimizer step) had allocated at once beyond what it held at its start and at
  // its end, the larger (what it left is its output; what it let go of was charged elsewhere):
  // its temporaries (packed or converted operands, a composite's intermediate gradients, scratch
  // of its kernels), as the device's allocator counts them. A stage runs one layer's pass at a
  // time, so it needs the largest of its layers' once. 0 when unknown. Serialised only when set.
  std::int64_t workspace_bytes = 0;
  // Set for a layer that runs after the next one when both are in one stage: its costs where a
  // stage ends at it instead (StageEndCosts). The partitioner never cuts such a pair
  // (StateGraph::can_end); a hand-made plan may, and is charged these. Serialised as
  // "at_stage_end": {...} only when set.
  std::optional<StageEndCosts> at_stage_end;
};

// The end-of-stage costs of a layer measured as a stage's last layer (`a`), and the layer as a
// stage whose last layer it is runs it: at_stage_end's costs where it has them. The two carry the
// same fields.
inline StageEndCosts stage_end_costs(const LayerProfile& a) {
  return {a.forward_s,   a.backward_s,        a.backward_input_s, a.backward_weight_s,
          a.saved_bytes, a.saved_input_bytes, a.frees_input,      a.gradient_bytes};
}
inline LayerProfile as_last_of_stage(LayerProfile l) {
  if (!l.at_stage_end) return l;
  const StageEndCosts& e = *l.at_stage_end;
  l.forward_s = e.forward_s;
  l.backward_s = e.backward_s;
  l.backward_input_s = e.backward_input_s;
  l.backward_weight_s = e.backward_weight_s;
  l.saved_bytes = e.saved_bytes;
  l.saved_input_bytes = e.saved_input_bytes;
  l.frees_input = e.frees_input;
  l.gradient_bytes = e.gradient_bytes;
  return l;
}

// What the layer's backward holds at its peak beside the stage's stashed tensors: its gradient
// pair and its temporaries (the larger of any pass's, on the safe side).
inline std::int64_t backward_peak_bytes(const LayerProfile& l) {
  return l.gradient_bytes + l.workspace_bytes;
}

// What the memory models charge per stashed minibatch for a layer: its measured saved bytes, or
// its output when they were not measured.
inline std::int64_t stash_bytes(const LayerProfile& l) {
  return l.saved_bytes > 0 ? l.saved_bytes : l.output_bytes;
}

// What the memory models charge for each weight version of a layer beyond its latest.
inline std::int64_t version_bytes(const LayerProfile& l) {
  return l.stashed_parameter_bytes > 0 ? l.stashed_parameter_bytes : l.parameter_bytes;
}

inline std::int64_t split_kept_bytes(const LayerProfile& l) {
  return l.split_kept_bytes > 0 ? l.split_kept_bytes : l.output_bytes;
}

struct Profile {
  std::string model;
  // The options the zoo built the model with (ZooModel::architecture); empty where not recorded
  // (a profile of a model outside the zoo, PipeDream's profiles, older files).
  Architecture architecture;
  int batch_size = 0;
  std::string device;
  // CPU profiles: the threads each layer was timed on (pipeline::num_threads() when profiled), a
  // rank's compute being as fast only on as many cores. 0 when unknown (GPU profiles, imported
  // and older ones). Serialised only when set.
  int threads = 0;
  // The dtype the products were timed in: "float32", or "bfloat16" (mixed precision, whose
  // pipelines move activations and gradients as bf16 by default).
  std::string dtype = "float32";
  std::vector<LayerProfile> layers;
  // Device memory a rank's runtime keeps besides tensors once it has run a pass: the product
  // library's workspace and the like (on a GPU, cuBLASLt's per-thread workspace), which every rank
  // holds once whatever its layers. Measured by the profiler; 0 when unknown or none (the CPU).
  std::int64_t runtime_bytes = 0;
  // Bytes of the loss's gradient with respect to the model's output for one minibatch (float32,
  // the logits' shape), which the last stage holds from each minibatch's forward to its backward
  // and which the last layer's backward reads. Known to the profiler; 0 when unknown (an imported
  // profile), and then not charged. Serialised only when set.
  std::int64_t loss_gradient_bytes = 0;
  // Bytes of the model's input for one minibatch, as the data loader hands it to the first stage
  // (images in float32, token ids in int32), which a recomputing first stage keeps per minibatch
  // in flight to run its forward again from. Known to the profiler; 0 when unknown (an imported
  // profile), and then not charged. Serialised only when set.
  std::int64_t input_bytes = 0;

  bool bf16() const { return dtype == "bfloat16"; }

  int size() const { return static_cast<int>(layers.size()); }

  // Predecessors of layer i with the "empty means the previous layer" convention resolved.
  std::vector<int> predecessors(int i) const {
    const LayerProfile& l = layers[static_cast<std::size_t>(i)];
    if (!l.inputs.empty()) return l.inputs;
    if (i == 0 || l.source) return {};
    return {i - 1};
  }

  // Per layer f: whether the one tensor that crosses a cut just before f is layer f - 1's output,
  // and f alone reads it. A stage starting at such a layer holds of its received input what that
  // layer keeps, nothing more; elsewhere later layers of the stage may read it too.
  std::vector<char> input_read_alone() const {
    const int n = size();
    std::vector<char> alone(static_cast<std::size_t>(n), 0);
    std::vector<int> last_reader(static_cast<std::size_t>(n), -1),
        readers(static_cast<std::size_t>(n), 0);
    for (int j = 0; j < n; ++j)
      for (int v : predecessors(j)) {
        last_reader[static_cast<std::size_t>(v)] =
            std::max(last_reader[static_cast<std::size_t>(v)], j);
        ++readers[static_cast<std::size_t>(v)];
      }
    int read_later = -1;  // the last reader of any layer before f - 1
    for (int f = 1; f < n; ++f) {
      const auto u = static_cast<std::size_t>(f) - 1;
      alone[static_cast<std::size_t>(f)] = read_later <= f - 1 && readers[u] == 1 &&
                                           last_reader[u] == f && predecessors(f).size() == 1;
      read_later = std::max(read_later, last_reader[u]);
    }
    return alone;
  }

  // Whether a stage of layers first..last frees the input it receives once its forward has run:
  // its first layer reads it alone (`read_alone`: input_read_alone()) and keeps none of it, nor
  // does the successor that runs before that layer where the two form a reordered pair inside
  // the stage (a stage starting at a ReLU before its max pool runs the pool on the input).
  bool stage_frees_input(const std::vector<char>& read_alone, int first, int last) const {
    if (first <= 0 || !read_alone[static_cast<std::size_t>(first)]) return false;
    const LayerProfile& l = layers[static_cast<std::size_t>(first)];
    if (!l.at_stage_end) return l.frees_input;
    if (last == first) return l.at_stage_end->frees_input;
    return l.frees_input && layers[static_cast<std::size_t>(first) + 1].frees_input;
  }

  // True when every layer takes exactly the previous layer's output (no DAG edges).
  bool is_chain() const {
    for (int i = 0; i < size(); ++i) {
      auto p = predecessors(i);
      if (i == 0 ? !p.empty() : (p.size() != 1 || p[0] != i - 1)) return false;
    }
    return true;
  }
};

}  // namespace pipeline
