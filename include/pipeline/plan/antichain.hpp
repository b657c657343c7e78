// The split points of a layer DAG: its antichain states, as PipeDream's partitioner defines them.
//
// A state is a downward-closed set of layers P(i) (a layer and all its ancestors), reached from
// the state {layer 0} by repeatedly adding a layer outside the set that has a predecessor inside
// it, together with all of that layer's ancestors. A stage is the difference P(j) \ P(i) of a
// state and one of its ancestors in this state DAG. For a chain, state i is simply layers 0..i.
// States are numbered in a topological order (by size, then discovery), so the last state holds
// every layer. Sums over P(i) are kept as prefix values, so a stage's totals are differences.
//
// Two boundary sizes are kept per state: `boundary_bytes`, the outputs of layers in P(i) read by
// a layer outside it (what really crosses the cut), and `pipedream_boundary_bytes`, the sum over
// PipeDream's "augmented antichain" (the frontier plus every ancestor with an edge leaving the
// ancestor set of a frontier layer), which its released optimizer charges as the transfer.
#pragma once

#include <pipeline/profile/profile.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipeline {

// The largest of per-layer values over a stage's layers: for the stage P(e) \ P(s) between
// prefix states of the layer order (a chain, StateGraph::linear), layers s+1..e from a sparse
// table; between antichain states of DAGs the largest of all (on the safe side, as
// StateGraph::received is).
class LayerRangeMax {
 public:
  LayerRangeMax() = default;
  LayerRangeMax(std::vector<double> values, bool prefix_states);

  // 0 where the stage has no layers or no layer a value.
  double operator()(int s, int e) const {
    if (m_rows.empty() || e <= s) return 0;
    if (!m_prefix_states) return m_rows.front().front();
    // Layers s+1..e: the larger of two power-of-two windows that cover them.
    const int k = std::bit_width(static_cast<unsigned>(e - s)) - 1;
    const std::vector<double>& row = m_rows[static_cast<std::size_t>(k)];
    return std::max(row[static_cast<std::size_t>(s + 1)],
                    row[static_cast<std::size_t>(e + 1 - (1 << k))]);
  }

 private:
  bool m_prefix_states = true;
  // Row k: the largest value of the 2^k layers from each layer on; for antichain states one row
  // of one value. Empty when no layer has a value.
  std::vector<std::vector<double>> m_rows;
};

// The working memory a stage needs beside its tensors: the runtime's (Profile::runtime_bytes), and
// the larger of its layers' temporaries (LayerProfile::workspace_bytes; a stage runs one pass at a
// time) and what one of its layers' backward holds (backward_peak_bytes: the layer's output and
// input gradients and temporaries) beyond the gradient of the backward in progress, which the
// memory model charges apart (`gradient_bytes`: backward_gradient_bytes of plan/cost_model.hpp).
// Between prefix states the stage's last layer counts as it runs there (as_last_of_stage: a ReLU
// that ends a stage before its pool).
class StageWorkspace {
 public:
  StageWorkspace() = default;
  StageWorkspace(const Profile& profile, bool prefix_states);

  double operator()(int s, int e, double gradient_bytes) const {
    const double backward =
        m_backward_last.empty()
            ? m_backward(s, e)
            : std::max(m_backward(s, e - 1), m_backward_last[static_cast<std::size_t>(e)]);
    return m_runtime_bytes + std::max(m_temporaries(s, e), backward - gradient_bytes);
  }

 private:
  double m_runtime_bytes = 0;
  LayerRangeMax m_temporaries, m_backward;
  std::vector<double> m_backward_last;  // prefix states: each layer as a stage's last
};

class StateGraph {
 public:
  // Throws ConfigError when the profile is not a DAG or the state count exceeds max_states
  // (the caller can then fall back to `linear`).
  static StateGraph build(const Profile& profile, std::size_t max_states);
  // For DAGs with more states than that: the antichain states of a coarser DAG, in which groups
  // of layers are merged (the lightest mergeable neighbours first; never a layer that every path
  // passes through) just enough that at most max_states remain. Every state is still a set of
  // whole layers closed under ancestors; stages just cannot split a merged group. Throws
  // ConfigError when even merging every mergeable pair leaves more than max_states.
  static StateGraph build_coarsened(const Profile& profile, std::size_t max_states);
  // States = prefixes of the layer order (valid for any profile whose inputs point backwards).
  static StateGraph linear(const Profile& profile);

  int size() const { return static_cast<int>(compute_s.size()); }
  bool chain() const { return m_chain; }
  // a is an ancestor of b in the state DAG (a < 0 stands for the empty start: always true).
  bool is_ancestor(int a, int b) const {
    if (a < 0) return b >= 0;
    if (m_chain) return a < b;
    return (m_ancestors[static_cast<std::size_t>(b) * m_state_words + static_cast<std::size_t>(a) / 64] >>
            (a % 64)) & 1u;
  }
  // Calls f(k) for every ancestor state k of j (DAGs), ascending.
  template <class F>
  void for_each_ancestor(int j, F&& f) const {
    const std::uint64_t* row = &m_ancestors[static_cast<std::size_t>(j) * m_state_words];
    for (std::size_t w = 0; w < m_state_words; ++w)
      for (std::uint64_t bits = row[w]; bits; bits &= bits - 1) f(static_cast<int>(w * 64) + std::countr_zero(bits));
  }
  // Layers of P(b) \ P(a), ascending (a < 0: all of P(b)).
  std::vector<int> layers_between(int a, int b) const;
  int num_layers() const { return m_layers; }
  // Groups of layers the states respect: num_layers() unless built by build_coarsened.
  int num_groups() const { return m_groups; }

  // Prefix sums over P(i).
  std::vector<double> compute_s;         // Σ forward_s + backward_s
  std::vector<double> forward_s;         // Σ forward_s (what recomputation adds)
  std::vector<double> activation_bytes;  // Σ output_bytes
  std::vector<double> parameter_bytes;   // Σ parameter_bytes
  std::vector<double> version_bytes;     // Σ version_bytes (a stashed weight version's bytes)
  std::vector<double> boundary_bytes;
  std::vector<double> pipedream_boundary_bytes;
  // What a stage that starts right after a state does with the input it receives: what its first
  // layer keeps of it (LayerProfile::saved_input_bytes), which activation_bytes counts and the
  // memory model charges as the received input already; and whether it frees it after its
  // forward, its first layer reading it alone and keeping none of it (Profile::stage_frees_input:
  // a max pool).
  struct ReceivedInput {
    double kept_bytes = 0;
    bool freed = false;
  };
  // Per state; `received_ending`: where that first layer also ends the stage inside a reordered
  // pair (as_last_of_stage). Prefix-of-a-layer-order states only; nothing kept or freed for
  // antichain states of DAGs (the estimate then stays on the safe side).
  std::vector<ReceivedInput> received, received_ending;

  // Per state: what a stage that ends at it pays beyond the prefix sums' difference, because it
  // holds a layer that runs after its successor inside a stage (LayerProfile::at_stage_end)
  // without that successor: the extra compute and forward seconds and stashed bytes. 0 almost
  // everywhere; the planner ends no stage at a state that has them (can_end).
  std::vector<double> end_compute_s;
  std::vector<double> end_forward_s;
  std::vector<double> end_activation_bytes;

  // Whether a stage may end at state e: it cuts no pair of layers that runs reordered inside a
  // stage. The search skips such states: a cut after the pair sends a quarter of the bytes (after
  // a 2x2 pool) and costs the two stages less in all, though it moves the pool's time into the
  // earlier stage, so where that stage is the bottleneck a cut inside could be a little faster.
  bool can_end(int e) const { return !m_cuts_pair[static_cast<std::size_t>(e)]; }
  // A prefix sum's difference over the stage P(e) \ P(s) (s < 0: from the first layer).
  static double stage_sum(const std::vector<double>& prefix, int s, int e) {
    return prefix[static_cast<std::size_t>(e)] -
           (s < 0 ? 0.0 : prefix[static_cast<std::size_t>(s)]);
  }
  // Compute and forward seconds of the stage, with what ending inside a pair adds.
  double stage_compute_s(int s, int e) const {
    return stage_sum(compute_s, s, e) + end_compute_s[static_cast<std::size_t>(e)];
  }
  double stage_forward_s(int s, int e) const {
    return stage_sum(forward_s, s, e) + end_forward_s[static_cast<std::size_t>(e)];
  }

  // The working memory a stage P(e) \ P(s) needs beside its tensors (StageWorkspace).
  StageWorkspace workspace;
  // Profile::loss_gradient_bytes: what the last stage holds of the loss's gradient per minibatch.
  double loss_gradient_bytes = 0;
  // The loss's gradient a stage that ends at state e holds per minibatch: loss_gradient_bytes
  // where it ends the model (the last state holds every layer), nothing elsewhere.
  double stage_loss_gradient_bytes(int e) const {
    return e == size() - 1 ? loss_gradient_bytes : 0;
  }
  // Profile::input_bytes: the model's input per minibatch.
  double input_bytes = 0;
  // What a stage starting after state s keeps per minibatch in flight when it recomputes: the
  // input it receives, or on the first stage (s < 0) the model's input, which it receives from
  // the data loader instead (and which the first stage's boundary of 0 bytes leaves out).
  double stage_recompute_input_bytes(int s) const {
    return s < 0 ? input_bytes : boundary_bytes[static_cast<std::size_t>(s)];
  }

  // The activation bytes a stage P(e) \ P(s) stashes per minibatch beside the input it receives.
  double stage_activation_bytes(int s, int e) const {
    return stage_sum(activation_bytes, s, e) + end_activation_bytes[static_cast<std::size_t>(e)] -
           stage_kept_input_bytes(s, e);
  }
  // What of its received input the stage P(e) \ P(s) keeps as its first layer's saved input.
  double stage_kept_input_bytes(int s, int e) const {
    return s < 0 ? 0.0 : received_input(s, e).kept_bytes;
  }
  // Whether the stage P(e) \ P(s) frees its received input after the forward: a stashing stage
  // then holds none of it per minibatch in flight; a recomputing one holds it all the same (its
  // forward runs again from it).
  bool stage_frees_input(int s, int e) const { return s >= 0 && received_input(s, e).freed; }

 private:
  // s >= 0; a stage of one layer that ends inside a reordered pair takes `received_ending`
  // (prefix states: state e is layer e).
  const ReceivedInput& received_input(int s, int e) const {
    const bool pair_end_alone = m_chain && e == s + 1 && !can_end(e);
    return (pair_end_alone ? received_ending : received)[static_cast<std::size_t>(s)];
  }
  // Fills the end_* arrays from each state's members (member(state, layer)).
  template <class Member>
  void charge_stage_ends(const Profile& p, Member&& member);

  friend struct StateGraphAssembler;
  bool m_chain = true;
  int m_layers = 0, m_groups = 0;
  std::size_t m_state_words = 0, m_layer_words = 0;
  std::vector<std::uint64_t> m_ancestors;  // size × m_state_words bits
  std::vector<std::uint64_t> m_members;    // size × m_layer_words bits (empty for chains)
  std::vector<char> m_cuts_pair;           // per state: !can_end
};

// The states partition() plans a profile over: the antichain states, those of a coarsened DAG
// when there are more than max_states, one topological order's prefixes when even that has too
// many (logged), and a chain's prefixes for a chain.
StateGraph planning_states(const Profile& profile, std::size_t max_states);

}  // namespace pipeline
