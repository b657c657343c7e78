#include <pipeline/plan/antichain.hpp>

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace pipeline {
namespace {

using Bits = std::vector<std::uint64_t>;

struct BitsHash {
  std::size_t operator()(const Bits& b) const {
    std::uint64_t h = 1469598103934665603ull;
    for (auto w : b) h = (h ^ w) * 1099511628211ull ^ (h >> 29);
    return static_cast<std::size_t>(h);
  }
};

bool test(const Bits& b, int i) { return (b[static_cast<std::size_t>(i) / 64] >> (i % 64)) & 1u; }
void set(Bits& b, int i) { b[static_cast<std::size_t>(i) / 64] |= std::uint64_t{1} << (i % 64); }

}  // namespace

StateGraph StateGraph::linear(const Profile& p) {
  StateGraph g;
  g.m_chain = true;
  g.m_layers = p.size();
  const int n = p.size();
  std::vector<int> last_use(static_cast<std::size_t>(n), -1);
  for (int i = 0; i < n; ++i)
    for (int in : p.predecessors(i)) {
      PIPELINE_CHECK_AS(ConfigError, in < i,
                        "layer {} reads layer {}, which comes later; a profile's layers must be in "
                        "topological order for a linear partition",
                        i, in);
      last_use[static_cast<std::size_t>(in)] = std::max(last_use[static_cast<std::size_t>(in)], i);
    }
  double c = 0, a = 0, w = 0;
  for (int i = 0; i < n; ++i) {
    const auto& l = p.layers[static_cast<std::size_t>(i)];
    c += l.forward_s + l.backward_s;
    a += static_cast<double>(l.output_bytes);
    w += static_cast<double>(l.parameter_bytes);
    g.compute_s.push_back(c);
    g.activation_bytes.push_back(a);
    g.parameter_bytes.push_back(w);
    double cut = 0;
    for (int v = 0; v <= i; ++v)
      if (last_use[static_cast<std::size_t>(v)] > i) cut += static_cast<double>(p.layers[static_cast<std::size_t>(v)].output_bytes);
    g.boundary_bytes.push_back(cut);
    g.pipedream_boundary_bytes.push_back(static_cast<double>(l.output_bytes));
  }
  return g;
}

StateGraph StateGraph::build(const Profile& p, std::size_t max_states) {
  if (p.is_chain()) return linear(p);
  const int n = p.size();
  const std::size_t lw = (static_cast<std::size_t>(n) + 63) / 64;
  std::vector<std::vector<int>> pred(static_cast<std::size_t>(n)), succ(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int in : p.predecessors(i)) {
      pred[static_cast<std::size_t>(i)].push_back(in);
      succ[static_cast<std::size_t>(in)].push_back(i);
    }
  // down(v): v and all its ancestors, in a topological order of the layers.
  std::vector<int> order, indeg(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) indeg[static_cast<std::size_t>(i)] = static_cast<int>(pred[static_cast<std::size_t>(i)].size());
  for (int i = 0; i < n; ++i)
    if (indeg[static_cast<std::size_t>(i)] == 0) order.push_back(i);
  for (std::size_t q = 0; q < order.size(); ++q)
    for (int s : succ[static_cast<std::size_t>(order[q])])
      if (--indeg[static_cast<std::size_t>(s)] == 0) order.push_back(s);
  PIPELINE_CHECK_AS(ConfigError, static_cast<int>(order.size()) == n, "the profile's layers form a cycle");
  std::vector<Bits> down(static_cast<std::size_t>(n), Bits(lw, 0));
  for (int v : order) {
    Bits& d = down[static_cast<std::size_t>(v)];
    set(d, v);
    for (int u : pred[static_cast<std::size_t>(v)])
      for (std::size_t w = 0; w < lw; ++w) d[w] |= down[static_cast<std::size_t>(u)][w];
  }

  // Breadth-first enumeration of the reachable ideals.
  std::vector<Bits> states{down[0]};
  std::unordered_map<Bits, int, BitsHash> index{{down[0], 0}};
  std::vector<std::vector<int>> parents(1);
  for (std::size_t q = 0; q < states.size(); ++q) {
    const Bits cur = states[q];
    for (int v = 0; v < n; ++v) {
      if (test(cur, v)) continue;
      bool reachable = false;
      for (int u : pred[static_cast<std::size_t>(v)])
        if (test(cur, u)) {
          reachable = true;
          break;
        }
      if (!reachable) continue;
      Bits next = cur;
      for (std::size_t w = 0; w < lw; ++w) next[w] |= down[static_cast<std::size_t>(v)][w];
      auto [it, inserted] = index.emplace(next, static_cast<int>(states.size()));
      if (inserted) {
        PIPELINE_CHECK_AS(ConfigError, states.size() < max_states,
                          "the layer DAG has more than {} antichain states", max_states);
        states.push_back(std::move(next));
        parents.emplace_back();
      }
      auto& par = parents[static_cast<std::size_t>(it->second)];
      if (par.empty() || par.back() != static_cast<int>(q)) par.push_back(static_cast<int>(q));
    }
  }
  const int s = static_cast<int>(states.size());
  auto popcount = [&](const Bits& b) {
    int c = 0;
    for (auto w : b) c += __builtin_popcountll(w);
    return c;
  };
  std::vector<int> perm(static_cast<std::size_t>(s)), rank(static_cast<std::size_t>(s));
  std::vector<int> sizes(static_cast<std::size_t>(s));
  for (int i = 0; i < s; ++i) sizes[static_cast<std::size_t>(i)] = popcount(states[static_cast<std::size_t>(i)]);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int a, int b) { return sizes[static_cast<std::size_t>(a)] < sizes[static_cast<std::size_t>(b)]; });
  for (int i = 0; i < s; ++i) rank[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
  PIPELINE_CHECK_AS(ConfigError, sizes[static_cast<std::size_t>(perm.back())] == n,
                    "not every layer is reachable from layer 0 through the layer DAG ({} of {}); "
                    "connect the profile's inputs",
                    sizes[static_cast<std::size_t>(perm.back())], n);

  StateGraph g;
  g.m_chain = false;
  g.m_layers = n;
  g.m_layer_words = lw;
  g.m_state_words = (static_cast<std::size_t>(s) + 63) / 64;
  g.m_ancestors.assign(static_cast<std::size_t>(s) * g.m_state_words, 0);
  g.m_members.resize(static_cast<std::size_t>(s) * lw);
  for (int i = 0; i < s; ++i) {
    int old = perm[static_cast<std::size_t>(i)];
    const Bits& b = states[static_cast<std::size_t>(old)];
    std::copy(b.begin(), b.end(), g.m_members.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * lw));
    std::uint64_t* anc = &g.m_ancestors[static_cast<std::size_t>(i) * g.m_state_words];
    for (int po : parents[static_cast<std::size_t>(old)]) {
      int pi = rank[static_cast<std::size_t>(po)];
      const std::uint64_t* pa = &g.m_ancestors[static_cast<std::size_t>(pi) * g.m_state_words];
      for (std::size_t w = 0; w < g.m_state_words; ++w) anc[w] |= pa[w];
      anc[static_cast<std::size_t>(pi) / 64] |= std::uint64_t{1} << (pi % 64);
    }
    std::vector<int> frontier;
    for (int v = 0; v < n; ++v) {
      if (!test(b, v)) continue;
      bool inside = false;
      for (int x : succ[static_cast<std::size_t>(v)])
        if (test(b, x)) inside = true;
      if (!inside) frontier.push_back(v);
    }
    double c = 0, a = 0, w = 0, cut = 0, aug = 0;
    for (int v = 0; v < n; ++v) {
      if (!test(b, v)) continue;
      const auto& l = p.layers[static_cast<std::size_t>(v)];
      c += l.forward_s + l.backward_s;
      a += static_cast<double>(l.output_bytes);
      w += static_cast<double>(l.parameter_bytes);
      bool leaves = false;
      for (int x : succ[static_cast<std::size_t>(v)])
        if (!test(b, x)) leaves = true;
      if (leaves) cut += static_cast<double>(l.output_bytes);
      // PipeDream's augmented antichain: the frontier (no successor inside), plus any layer v
      // below a frontier layer f with an edge to a layer outside down(f).
      bool augmented = std::find(frontier.begin(), frontier.end(), v) != frontier.end();
      for (std::size_t fi = 0; fi < frontier.size() && !augmented; ++fi) {
        int f = frontier[fi];
        if (f == v || !test(down[static_cast<std::size_t>(f)], v)) continue;
        for (int x : succ[static_cast<std::size_t>(v)])
          if (!test(down[static_cast<std::size_t>(f)], x)) {
            augmented = true;
            break;
          }
      }
      if (augmented) aug += static_cast<double>(l.output_bytes);
    }
    g.compute_s.push_back(c);
    g.activation_bytes.push_back(a);
    g.parameter_bytes.push_back(w);
    g.boundary_bytes.push_back(cut);
    g.pipedream_boundary_bytes.push_back(aug);
  }
  g.ancestors_by_compute.resize(static_cast<std::size_t>(s));
  for (int j = 0; j < s; ++j) {
    auto& list = g.ancestors_by_compute[static_cast<std::size_t>(j)];
    for (int k = 0; k < j; ++k)
      if (g.is_ancestor(k, j)) list.push_back(k);
    std::stable_sort(list.begin(), list.end(), [&](int x, int y) {
      return g.compute_s[static_cast<std::size_t>(x)] < g.compute_s[static_cast<std::size_t>(y)];
    });
  }
  return g;
}

std::vector<int> StateGraph::layers_between(int a, int b) const {
  std::vector<int> out;
  if (m_chain) {
    for (int v = a + 1; v <= b; ++v) out.push_back(v);
    return out;
  }
  const std::uint64_t* mb = &m_members[static_cast<std::size_t>(b) * m_layer_words];
  const std::uint64_t* ma = a >= 0 ? &m_members[static_cast<std::size_t>(a) * m_layer_words] : nullptr;
  for (int v = 0; v < m_layers; ++v) {
    bool in_b = (mb[static_cast<std::size_t>(v) / 64] >> (v % 64)) & 1u;
    bool in_a = ma && ((ma[static_cast<std::size_t>(v) / 64] >> (v % 64)) & 1u);
    if (in_b && !in_a) out.push_back(v);
  }
  return out;
}

}  // namespace pipeline
