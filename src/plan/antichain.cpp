#include <pipeline/plan/antichain.hpp>

#include <pipeline/core/error.hpp>

#include <algorithm>
#include <bit>
#include <numeric>
#include <queue>
#include <tuple>

namespace pipeline {
namespace {

using Bits = std::vector<std::uint64_t>;


bool test(const Bits& b, int i) { return (b[static_cast<std::size_t>(i) / 64] >> (i % 64)) & 1u; }
void set(Bits& b, int i) { b[static_cast<std::size_t>(i) / 64] |= std::uint64_t{1} << (i % 64); }

}  // namespace

template <class Member>
void StateGraph::charge_stage_ends(const Profile& p, Member&& member) {
  const int states = size();
  end_compute_s.assign(static_cast<std::size_t>(states), 0.0);
  end_forward_s.assign(static_cast<std::size_t>(states), 0.0);
  end_activation_bytes.assign(static_cast<std::size_t>(states), 0.0);
  m_cuts_pair.assign(static_cast<std::size_t>(states), 0);
  for (int v = 0; v + 1 < p.size(); ++v) {
    const LayerProfile& l = p.layers[static_cast<std::size_t>(v)];
    if (!l.at_stage_end) continue;
    const LayerProfile last = as_last_of_stage(l);
    for (int e = 0; e < states; ++e) {
      if (!member(e, v) || member(e, v + 1)) continue;
      const auto u = static_cast<std::size_t>(e);
      m_cuts_pair[u] = 1;
      end_compute_s[u] += (last.forward_s + last.backward_s) - (l.forward_s + l.backward_s);
      end_forward_s[u] += last.forward_s - l.forward_s;
      end_activation_bytes[u] += static_cast<double>(stash_bytes(last) - stash_bytes(l));
    }
  }
}

StateGraph StateGraph::linear(const Profile& p) {
  StateGraph g;
  g.m_chain = true;
  g.m_layers = g.m_groups = p.size();
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
  const std::vector<char> read_alone = p.input_read_alone();
  double c = 0, a = 0, w = 0, v = 0, f = 0;
  for (int i = 0; i < n; ++i) {
    const auto& l = p.layers[static_cast<std::size_t>(i)];
    c += l.forward_s + l.backward_s;
    f += l.forward_s;
    a += static_cast<double>(stash_bytes(l));
    w += static_cast<double>(l.parameter_bytes);
    v += static_cast<double>(pipeline::version_bytes(l));
    g.compute_s.push_back(c);
    g.forward_s.push_back(f);
    g.activation_bytes.push_back(a);
    g.parameter_bytes.push_back(w);
    g.version_bytes.push_back(v);
    double cut = 0;
    for (int v = 0; v <= i; ++v)
      if (last_use[static_cast<std::size_t>(v)] > i) cut += static_cast<double>(p.layers[static_cast<std::size_t>(v)].output_bytes);
    g.boundary_bytes.push_back(cut);
    g.pipedream_boundary_bytes.push_back(static_cast<double>(l.output_bytes));
    const LayerProfile* next = i + 1 < n ? &p.layers[static_cast<std::size_t>(i) + 1] : nullptr;
    if (next) {
      g.received.push_back({static_cast<double>(next->saved_input_bytes),
                            p.stage_frees_input(read_alone, i + 1, n - 1)});
      g.received_ending.push_back(
          {static_cast<double>(next->at_stage_end ? next->at_stage_end->saved_input_bytes
                                                  : next->saved_input_bytes),
           p.stage_frees_input(read_alone, i + 1, i + 1)});
    } else {
      g.received.emplace_back();
      g.received_ending.emplace_back();
    }
  }
  g.charge_stage_ends(p, [](int state, int layer) { return layer <= state; });
  g.workspace = StageWorkspace(p, /*prefix_states=*/true);
  g.loss_gradient_bytes = static_cast<double>(p.loss_gradient_bytes);
  g.input_bytes = static_cast<double>(p.input_bytes);
  return g;
}

LayerRangeMax::LayerRangeMax(std::vector<double> values, bool prefix_states)
    : m_prefix_states(prefix_states) {
  if (std::all_of(values.begin(), values.end(), [](double v) { return v == 0; })) return;
  if (!prefix_states) {
    m_rows.push_back({*std::max_element(values.begin(), values.end())});
    return;
  }
  m_rows.push_back(std::move(values));
  for (std::size_t w = 1; 2 * w <= m_rows.front().size(); w *= 2) {
    const std::vector<double>& prev = m_rows.back();
    std::vector<double> row(prev.size() - w);
    for (std::size_t i = 0; i < row.size(); ++i) row[i] = std::max(prev[i], prev[i + w]);
    m_rows.push_back(std::move(row));
  }
}

StageWorkspace::StageWorkspace(const Profile& p, bool prefix_states)
    : m_runtime_bytes(static_cast<double>(p.runtime_bytes)) {
  std::vector<double> temporaries, backward, last;
  for (const LayerProfile& l : p.layers) {
    const auto ending = static_cast<double>(backward_peak_bytes(as_last_of_stage(l)));
    temporaries.push_back(static_cast<double>(l.workspace_bytes));
    // Between antichain states a layer may end a stage or not: the larger of the two.
    backward.push_back(
        std::max(static_cast<double>(backward_peak_bytes(l)), prefix_states ? 0.0 : ending));
    last.push_back(ending);
  }
  m_temporaries = LayerRangeMax(std::move(temporaries), prefix_states);
  m_backward = LayerRangeMax(std::move(backward), prefix_states);
  if (prefix_states) m_backward_last = std::move(last);
}

namespace {

// The layer DAG with each layer's ancestors (down) and descendants (up) as bit sets.
struct LayerDag {
  int n = 0;
  std::size_t words = 0;
  std::vector<std::vector<int>> pred, succ;
  std::vector<int> order;  // a topological order
  std::vector<Bits> down, up;

  explicit LayerDag(const Profile& p) : n(p.size()), words((static_cast<std::size_t>(p.size()) + 63) / 64) {
    const auto N = static_cast<std::size_t>(n);
    pred.resize(N);
    succ.resize(N);
    for (int i = 0; i < n; ++i)
      for (int in : p.predecessors(i)) {
        pred[static_cast<std::size_t>(i)].push_back(in);
        succ[static_cast<std::size_t>(in)].push_back(i);
      }
    std::vector<int> indeg(N);
    for (std::size_t i = 0; i < N; ++i) indeg[i] = static_cast<int>(pred[i].size());
    for (int i = 0; i < n; ++i)
      if (indeg[static_cast<std::size_t>(i)] == 0) order.push_back(i);
    for (std::size_t q = 0; q < order.size(); ++q)
      for (int s : succ[static_cast<std::size_t>(order[q])])
        if (--indeg[static_cast<std::size_t>(s)] == 0) order.push_back(s);
    PIPELINE_CHECK_AS(ConfigError, static_cast<int>(order.size()) == n, "the profile's layers form a cycle");
    down.assign(N, Bits(words, 0));
    up.assign(N, Bits(words, 0));
    for (int v : order) {
      Bits& d = down[static_cast<std::size_t>(v)];
      set(d, v);
      for (int u : pred[static_cast<std::size_t>(v)])
        for (std::size_t w = 0; w < words; ++w) d[w] |= down[static_cast<std::size_t>(u)][w];
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Bits& u = up[static_cast<std::size_t>(*it)];
      set(u, *it);
      for (int x : succ[static_cast<std::size_t>(*it)])
        for (std::size_t w = 0; w < words; ++w) u[w] |= up[static_cast<std::size_t>(x)][w];
    }
  }

  // Comparable with every other layer: every path of the model passes through it.
  bool series(int v) const {
    int c = 0;
    for (std::size_t w = 0; w < words; ++w)
      c += std::popcount(down[static_cast<std::size_t>(v)][w]) + std::popcount(up[static_cast<std::size_t>(v)][w]);
    return c - 1 == n;
  }
};

// The states of a layer grouping (group[v]: the group of layer v; a state never splits a group),
// as layer bit sets in discovery order, and for each the states it was reached from. Returns
// false as soon as there would be more than `cap`. The search runs on group bit sets: a state's
// addable groups (outside it, with a predecessor inside) are carried from parent to child, so a
// step costs the words of a few bit rows, and states live in one flat pool with an open-addressing
// index (bisection in build_coarsened calls this a dozen times per profile).
bool enumerate_states(const LayerDag& d, const std::vector<int>& group, std::size_t cap, std::vector<Bits>& states,
                      std::vector<std::vector<int>>& parents) {
  const int G = 1 + *std::max_element(group.begin(), group.end());
  const std::size_t gw = (static_cast<std::size_t>(G) + 63) / 64;
  auto gi = [](int g) { return static_cast<std::size_t>(g); };
  std::vector<Bits> succ(gi(G), Bits(gw, 0)), closure(gi(G), Bits(gw, 0));
  std::vector<std::vector<int>> pred(gi(G));
  for (int v = 0; v < d.n; ++v)
    for (int u : d.pred[static_cast<std::size_t>(v)]) {
      const int a = group[static_cast<std::size_t>(u)], b = group[static_cast<std::size_t>(v)];
      if (a == b) continue;
      set(succ[gi(a)], b);
      pred[gi(b)].push_back(a);
    }
  // closure[g]: g and every group below it, in a topological order of the groups.
  std::vector<int> indeg(gi(G), 0), order;
  for (int g = 0; g < G; ++g)
    for (std::size_t w = 0; w < gw; ++w)
      for (std::uint64_t bits = succ[gi(g)][w]; bits; bits &= bits - 1) ++indeg[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))];
  for (int g = 0; g < G; ++g)
    if (indeg[gi(g)] == 0) order.push_back(g);
  for (std::size_t q = 0; q < order.size(); ++q)
    for (std::size_t w = 0; w < gw; ++w)
      for (std::uint64_t bits = succ[gi(order[q])][w]; bits; bits &= bits - 1) {
        const int x = static_cast<int>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
        if (--indeg[gi(x)] == 0) order.push_back(x);
      }
  PIPELINE_CHECK(static_cast<int>(order.size()) == G, "internal: merged layer groups form a cycle");
  for (int g : order) {
    set(closure[gi(g)], g);
    for (int u : pred[gi(g)])
      for (std::size_t w = 0; w < gw; ++w) closure[gi(g)][w] |= closure[gi(u)][w];
  }

  std::vector<std::uint64_t> pool, addable;  // state i: words [i·gw, (i+1)·gw)
  std::vector<std::vector<int>> par;
  // Open addressing over the states found so far, grown as they are (not sized for the cap: a
  // cap of millions would cost its table on every call of the coarsening's bisection).
  std::size_t slots = 64;
  std::vector<int> table(slots, -1);
  auto row = [&](std::vector<std::uint64_t>& v, std::size_t i) { return v.data() + i * gw; };
  auto hash = [&](const std::uint64_t* x) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t w = 0; w < gw; ++w) h = (h ^ x[w]) * 1099511628211ull ^ (h >> 29);
    return static_cast<std::size_t>(h);
  };
  auto empty_slot = [&](const std::uint64_t* x) {  // for a state not in the table
    std::size_t h = hash(x) & (slots - 1);
    while (table[h] >= 0) h = (h + 1) & (slots - 1);
    return h;
  };
  auto grow = [&] {
    slots *= 2;
    table.assign(slots, -1);
    for (std::size_t i = 0; i < par.size(); ++i)
      table[empty_slot(row(pool, i))] = static_cast<int>(i);
  };
  // Index of the state `x`, inserted (with its addable groups) when new; -1 beyond the cap.
  Bits next(gw), next_addable(gw);
  auto find_or_insert = [&]() -> int {
    std::size_t h = hash(next.data()) & (slots - 1);
    for (; table[h] >= 0; h = (h + 1) & (slots - 1))
      if (std::equal(next.begin(), next.end(), row(pool, static_cast<std::size_t>(table[h])))) return table[h];
    if (par.size() >= cap) return -1;
    if (2 * (par.size() + 1) > slots) {  // keeps the load at most a half
      grow();
      h = empty_slot(next.data());
    }
    table[h] = static_cast<int>(par.size());
    pool.insert(pool.end(), next.begin(), next.end());
    addable.insert(addable.end(), next_addable.begin(), next_addable.end());
    par.emplace_back();
    return table[h];
  };
  next = closure[gi(group[0])];
  std::fill(next_addable.begin(), next_addable.end(), 0);
  for (std::size_t w = 0; w < gw; ++w)
    for (std::uint64_t bits = next[w]; bits; bits &= bits - 1)
      for (std::size_t x = 0; x < gw; ++x) next_addable[x] |= succ[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))][x];
  for (std::size_t w = 0; w < gw; ++w) next_addable[w] &= ~next[w];
  find_or_insert();
  for (std::size_t q = 0; q < par.size(); ++q) {
    for (std::size_t w = 0; w < gw; ++w)
      for (std::uint64_t bits = row(addable, q)[w]; bits; bits &= bits - 1) {
        const Bits& c = closure[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))];
        const std::uint64_t* cur = row(pool, q);
        const std::uint64_t* cur_add = row(addable, q);
        for (std::size_t x = 0; x < gw; ++x) {
          next[x] = cur[x] | c[x];
          next_addable[x] = cur_add[x];
        }
        // PipeDream's move: a group outside the state with a predecessor inside it, together
        // with everything below it; the groups it brings in may make their successors addable.
        for (std::size_t x = 0; x < gw; ++x)
          for (std::uint64_t added = c[x] & ~cur[x]; added; added &= added - 1)
            for (std::size_t y = 0; y < gw; ++y) next_addable[y] |= succ[x * 64 + static_cast<std::size_t>(std::countr_zero(added))][y];
        for (std::size_t x = 0; x < gw; ++x) next_addable[x] &= ~next[x];
        const int k = find_or_insert();
        if (k < 0) return false;
        auto& p = par[static_cast<std::size_t>(k)];
        if (p.empty() || p.back() != static_cast<int>(q)) p.push_back(static_cast<int>(q));
      }
  }
  // Back to layer bit sets.
  std::vector<Bits> members(gi(G), Bits(d.words, 0));
  for (int v = 0; v < d.n; ++v) set(members[gi(group[static_cast<std::size_t>(v)])], v);
  states.assign(par.size(), Bits(d.words, 0));
  for (std::size_t i = 0; i < par.size(); ++i)
    for (std::size_t w = 0; w < gw; ++w)
      for (std::uint64_t bits = row(pool, i)[w]; bits; bits &= bits - 1)
        for (std::size_t x = 0; x < d.words; ++x) states[i][x] |= members[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))][x];
  parents = std::move(par);
  return true;
}

// Layer groups as a union-find forest; join(a, b) puts b's group under a's root.
struct DisjointSets {
  std::vector<int> parent;
  explicit DisjointSets(int n) : parent(static_cast<std::size_t>(n)) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int v) {
    while (parent[static_cast<std::size_t>(v)] != v)
      v = parent[static_cast<std::size_t>(v)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(v)])];
    return v;
  }
  void join(int a, int b) { parent[static_cast<std::size_t>(find(b))] = find(a); }
};

// The order in which coarsening merges layer groups: repeatedly the lightest (compute) pair of
// adjacent groups a -> b that can be merged without making the groups' graph cyclic (b is a's
// only successor, or a is b's only predecessor). Layers that every path passes through are never
// merged, so the cuts between blocks (the natural split points) stay states. Each entry is a
// pair of layers whose groups are joined.
std::vector<std::pair<int, int>> merge_sequence(const LayerDag& d, const Profile& p) {
  const int n = d.n;
  DisjointSets sets(n);
  auto find = [&](int v) { return sets.find(v); };
  std::vector<double> weight(static_cast<std::size_t>(n));
  std::vector<char> series(static_cast<std::size_t>(n));
  std::vector<std::vector<int>> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n));
  for (int v = 0; v < n; ++v) {
    const auto& l = p.layers[static_cast<std::size_t>(v)];
    weight[static_cast<std::size_t>(v)] = l.forward_s + l.backward_s;
    series[static_cast<std::size_t>(v)] = d.series(v);
    out[static_cast<std::size_t>(v)] = d.succ[static_cast<std::size_t>(v)];
    in[static_cast<std::size_t>(v)] = d.pred[static_cast<std::size_t>(v)];
    std::sort(out[static_cast<std::size_t>(v)].begin(), out[static_cast<std::size_t>(v)].end());
    std::sort(in[static_cast<std::size_t>(v)].begin(), in[static_cast<std::size_t>(v)].end());
  }
  using Candidate = std::tuple<double, int, int>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto offer = [&](int a) {
    for (int b : out[static_cast<std::size_t>(a)])
      if (!series[static_cast<std::size_t>(a)] && !series[static_cast<std::size_t>(b)])
        queue.emplace(weight[static_cast<std::size_t>(a)] + weight[static_cast<std::size_t>(b)], a, b);
  };
  for (int v = 0; v < n; ++v) offer(v);
  // Neighbour lists hold roots; relabelling after a merge keeps them sorted and unique.
  auto relabel = [&](std::vector<int>& list) {
    for (int& x : list) x = find(x);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  };
  std::vector<std::pair<int, int>> merges;
  while (!queue.empty()) {
    auto [w, a, b] = queue.top();
    queue.pop();
    if (find(a) != a || find(b) != b) continue;
    const auto& oa = out[static_cast<std::size_t>(a)];
    const auto& ib = in[static_cast<std::size_t>(b)];
    if (!((oa.size() == 1 && oa[0] == b) || (ib.size() == 1 && ib[0] == a))) continue;
    if (w != weight[static_cast<std::size_t>(a)] + weight[static_cast<std::size_t>(b)]) continue;  // stale
    merges.emplace_back(a, b);
    sets.join(a, b);
    weight[static_cast<std::size_t>(a)] += weight[static_cast<std::size_t>(b)];
    std::vector<int> o = out[static_cast<std::size_t>(a)], i = in[static_cast<std::size_t>(a)];
    o.insert(o.end(), out[static_cast<std::size_t>(b)].begin(), out[static_cast<std::size_t>(b)].end());
    i.insert(i.end(), in[static_cast<std::size_t>(b)].begin(), in[static_cast<std::size_t>(b)].end());
    relabel(o);
    relabel(i);
    o.erase(std::remove(o.begin(), o.end(), a), o.end());
    i.erase(std::remove(i.begin(), i.end(), a), i.end());
    out[static_cast<std::size_t>(a)] = std::move(o);
    in[static_cast<std::size_t>(a)] = std::move(i);
    out[static_cast<std::size_t>(b)].clear();
    in[static_cast<std::size_t>(b)].clear();
    // The merged group's neighbours now see one group where they saw two: their degrees may
    // have dropped, which can make their own edges mergeable.
    for (int x : in[static_cast<std::size_t>(a)]) {
      relabel(out[static_cast<std::size_t>(x)]);
      offer(x);
    }
    for (int x : out[static_cast<std::size_t>(a)]) {
      relabel(in[static_cast<std::size_t>(x)]);
      for (int y : in[static_cast<std::size_t>(x)])
        if (y != a) offer(y);
    }
    offer(a);
  }
  return merges;
}

// Group ids (dense, by lowest layer) after the first k merges.
std::vector<int> groups_after(const std::vector<std::pair<int, int>>& merges, std::size_t k, int n) {
  DisjointSets sets(n);
  auto find = [&](int v) { return sets.find(v); };
  for (std::size_t i = 0; i < k; ++i) sets.join(merges[i].first, merges[i].second);
  std::vector<int> id(static_cast<std::size_t>(n), -1), group(static_cast<std::size_t>(n));
  int next = 0;
  for (int v = 0; v < n; ++v) {
    int r = find(v);
    if (id[static_cast<std::size_t>(r)] < 0) id[static_cast<std::size_t>(r)] = next++;
    group[static_cast<std::size_t>(v)] = id[static_cast<std::size_t>(r)];
  }
  return group;
}

}  // namespace

// Builds a StateGraph from enumerated states; a friend, so that LayerDag stays out of the header.
struct StateGraphAssembler {
  static StateGraph assemble(const Profile& p, const LayerDag& d, const std::vector<Bits>& states,
                             const std::vector<std::vector<int>>& parents, int groups);
};

StateGraph StateGraph::build(const Profile& p, std::size_t max_states) {
  if (p.is_chain()) return linear(p);
  LayerDag d(p);
  std::vector<int> group(static_cast<std::size_t>(d.n));
  std::iota(group.begin(), group.end(), 0);
  std::vector<Bits> states;
  std::vector<std::vector<int>> parents;
  PIPELINE_CHECK_AS(ConfigError, enumerate_states(d, group, max_states, states, parents),
                    "the layer DAG has more than {} antichain states", max_states);
  return StateGraphAssembler::assemble(p, d, states, parents, d.n);
}

StateGraph StateGraph::build_coarsened(const Profile& p, std::size_t max_states) {
  if (p.is_chain()) return linear(p);
  LayerDag d(p);
  const int n = d.n;
  // The prefixes of one topological order (the profile's own when its inputs point backwards)
  // join the coarse states when the budget leaves room for them: then every plan over that
  // order, at layer granularity, is among the candidates too.
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  for (int v = 0; v < n; ++v)
    for (int u : d.pred[static_cast<std::size_t>(v)])
      if (u > v) order = d.order;
  const bool with_prefixes = max_states >= static_cast<std::size_t>(n + std::min(n, 200));
  const std::size_t cap = with_prefixes ? max_states - static_cast<std::size_t>(n) : max_states;

  const auto merges = merge_sequence(d, p);
  std::vector<Bits> states;
  std::vector<std::vector<int>> parents;
  // Merging only removes states, so the fewest merges that fit are found by bisection.
  std::size_t lo = 0, hi = merges.size();
  PIPELINE_CHECK_AS(ConfigError, enumerate_states(d, groups_after(merges, hi, n), cap, states, parents),
                    "the layer DAG has more than {} antichain states even with every mergeable layer merged", cap);
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    std::vector<Bits> s;
    std::vector<std::vector<int>> par;
    if (enumerate_states(d, groups_after(merges, mid, n), cap, s, par)) {
      hi = mid;
      states = std::move(s);
      parents = std::move(par);
    } else {
      lo = mid + 1;
    }
  }
  const auto group = groups_after(merges, hi, n);
  if (with_prefixes) {
    // Prefix t holds order[0..t). A coarse state C contains exactly the prefixes up to the first
    // position it misses, and is contained in those from one past its last position: linking
    // each C to the largest prefix below it, and each prefix to the coarse states that first
    // fit in it, gives every subset relation by closure.
    std::vector<int> pos(static_cast<std::size_t>(n));
    for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(order[static_cast<std::size_t>(t)])] = t;
    const std::size_t coarse = states.size();
    std::vector<std::vector<int>> fits_at(static_cast<std::size_t>(n) + 1);
    std::vector<int> first_miss(coarse);
    std::vector<char> is_prefix(static_cast<std::size_t>(n) + 1, 0);
    for (std::size_t c = 0; c < coarse; ++c) {
      int last = -1, size = 0;
      std::vector<char> in(static_cast<std::size_t>(n), 0);
      for (int v = 0; v < n; ++v)
        if (test(states[c], v)) {
          last = std::max(last, pos[static_cast<std::size_t>(v)]);
          in[static_cast<std::size_t>(pos[static_cast<std::size_t>(v)])] = 1;
          ++size;
        }
      int miss = 0;
      while (miss < n && in[static_cast<std::size_t>(miss)]) ++miss;
      first_miss[c] = miss;
      fits_at[static_cast<std::size_t>(last) + 1].push_back(static_cast<int>(c));
      if (miss == size) is_prefix[static_cast<std::size_t>(size)] = 1;  // C is itself a prefix
    }
    std::vector<int> prefix_state(static_cast<std::size_t>(n) + 1, -1);
    Bits prefix(d.words, 0);
    std::vector<int> pending;  // coarse states below a prefix that is itself a coarse state
    for (int t = 1; t <= n; ++t) {
      set(prefix, order[static_cast<std::size_t>(t) - 1]);
      const auto& fit = fits_at[static_cast<std::size_t>(t)];
      pending.insert(pending.end(), fit.begin(), fit.end());
      if (is_prefix[static_cast<std::size_t>(t)]) continue;
      prefix_state[static_cast<std::size_t>(t)] = static_cast<int>(states.size());
      states.push_back(prefix);
      std::vector<int> par = std::move(pending);
      pending.clear();
      for (int u = t - 1; u >= 1; --u)
        if (prefix_state[static_cast<std::size_t>(u)] >= 0) {
          par.push_back(prefix_state[static_cast<std::size_t>(u)]);
          break;
        }
      parents.push_back(std::move(par));
    }
    for (std::size_t c = 0; c < coarse; ++c)
      for (int u = first_miss[c]; u >= 1; --u)
        if (prefix_state[static_cast<std::size_t>(u)] >= 0) {
          parents[c].push_back(prefix_state[static_cast<std::size_t>(u)]);
          break;
        }
  }
  return StateGraphAssembler::assemble(p, d, states, parents, 1 + *std::max_element(group.begin(), group.end()));
}

StateGraph StateGraphAssembler::assemble(const Profile& p, const LayerDag& d, const std::vector<Bits>& states,
                                         const std::vector<std::vector<int>>& parents, int groups) {
  const int n = d.n;
  const std::size_t lw = d.words;
  const auto& succ = d.succ;
  const auto& down = d.down;
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
  g.m_groups = groups;
  g.m_layer_words = lw;
  g.m_state_words = (static_cast<std::size_t>(s) + 63) / 64;
  g.m_ancestors.assign(static_cast<std::size_t>(s) * g.m_state_words, 0);
  g.m_members.resize(static_cast<std::size_t>(s) * lw);
  // leaving(f): the layers below f with an edge to a layer outside down(f), once per layer.
  std::vector<Bits> leaving_of(static_cast<std::size_t>(n));
  auto leaving = [&](int f) -> const Bits& {
    Bits& out = leaving_of[static_cast<std::size_t>(f)];
    if (!out.empty()) return out;
    out.assign(lw, 0);
    const Bits& df = down[static_cast<std::size_t>(f)];
    for (int v = 0; v < n; ++v) {
      if (v == f || !test(df, v)) continue;
      for (int x : succ[static_cast<std::size_t>(v)])
        if (!test(df, x)) {
          set(out, v);
          break;
        }
    }
    return out;
  };
  Bits aug_bits(lw, 0);
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
    // PipeDream's augmented antichain: the frontier (layers with no successor inside) and, for
    // each frontier layer f, the layers below f with an edge leaving down(f).
    std::fill(aug_bits.begin(), aug_bits.end(), 0);
    double c = 0, f = 0, a = 0, w = 0, vb = 0, cut = 0, aug = 0;
    for (std::size_t word = 0; word < lw; ++word)
      for (std::uint64_t bits = b[word]; bits; bits &= bits - 1) {
        const int v = static_cast<int>(word * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
        const auto& l = p.layers[static_cast<std::size_t>(v)];
        c += l.forward_s + l.backward_s;
        f += l.forward_s;
        a += static_cast<double>(stash_bytes(l));
        w += static_cast<double>(l.parameter_bytes);
        vb += static_cast<double>(pipeline::version_bytes(l));
        bool inside = false, leaves = false;
        for (int x : succ[static_cast<std::size_t>(v)]) (test(b, x) ? inside : leaves) = true;
        if (leaves) cut += static_cast<double>(l.output_bytes);
        if (!inside) {
          set(aug_bits, v);
          for (std::size_t x = 0; x < lw; ++x) aug_bits[x] |= leaving(v)[x];
        }
      }
    for (std::size_t word = 0; word < lw; ++word)
      for (std::uint64_t bits = aug_bits[word]; bits; bits &= bits - 1)
        aug += static_cast<double>(p.layers[word * 64 + static_cast<std::size_t>(std::countr_zero(bits))].output_bytes);
    g.compute_s.push_back(c);
    g.forward_s.push_back(f);
    g.activation_bytes.push_back(a);
    g.parameter_bytes.push_back(w);
    g.version_bytes.push_back(vb);
    g.boundary_bytes.push_back(cut);
    g.pipedream_boundary_bytes.push_back(aug);
    g.received.emplace_back();
    g.received_ending.emplace_back();
  }
  g.charge_stage_ends(p, [&](int state, int layer) {
    return test(states[static_cast<std::size_t>(perm[static_cast<std::size_t>(state)])], layer);
  });
  g.workspace = StageWorkspace(p, /*prefix_states=*/false);
  g.loss_gradient_bytes = static_cast<double>(p.loss_gradient_bytes);
  g.input_bytes = static_cast<double>(p.input_bytes);
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
