#include <pipeline/plan/partition.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/allreduce_buckets.hpp>
#include <pipeline/plan/antichain.hpp>
#include <pipeline/plan/straight_order.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/plan/zb_v_order.hpp>
#include <pipeline/profile/profile_json.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace pipeline {
namespace {

// Data-parallel time of a profile whose optimizer steps are already charged.
double data_parallel_seconds(const Profile& p, const Topology& t, const PartitionOptions& o);

constexpr double kInf = std::numeric_limits<double>::infinity();

// A stage's working memory beside its tensors: its layers' temporaries and the runtime's
// (StageWorkspace) and its message buffers (message_buffer_bytes), at `ratio` compression.
double working_bytes(const StateGraph& g, int s, int e, double ratio) {
  const double input = s < 0 ? 0.0 : g.boundary_bytes[static_cast<std::size_t>(s)];
  return g.workspace(s, e, backward_gradient_bytes(input, g.stage_loss_gradient_bytes(e))) +
         message_buffer_bytes(input, g.boundary_bytes[static_cast<std::size_t>(e)], ratio);
}

struct Entry {
  double t = kInf;
  int k = -3;       // split state; -2: single stage; -4: idle (same j, one machine fewer)
  int mprime = 0;   // machines of the split-off last stage
  int stages = 0;
};

struct Segment {
  int s, e, machines;
};

// The largest level count whose per-(machines, last-stage machines) search positions a chain's
// row remembers: (512 + 1)^2 ints, 1 MiB. Past that their cache misses cost more than the
// galloping they save (bench_partition: 250 layers on 1,024 workers 7.9 s with them, 6.0 s
// without).
constexpr int kMaxRememberedCount = 512;

// The search over one level scans every (machines, last-stage machines) pair: its time grows
// with the square of the level's count (fashion-cnn over 30,000 workers in one level: 14 s on
// one core). Past this count it would run for many minutes, hours at a million.
constexpr int kMaxLevelCount = 65536;

// The first index in [lo, hi) where below() is false (hi if none), for a below() that holds on a
// prefix of the range. It gallops from `hint`, so it costs little when the answer moved little
// since the previous call — the search's window starts move by a few states per end state.
template <class Below>
std::size_t first_not_below(std::size_t lo, std::size_t hi, std::size_t hint, Below&& below) {
  hint = std::clamp(hint, lo, hi);
  std::size_t a = lo, b = hi;  // the answer lies in [a, b]
  if (hint < hi && below(hint)) {
    a = hint + 1;
    for (std::size_t step = 1;; step *= 2) {
      const std::size_t q = a + step - 1;
      if (q >= hi) break;
      if (!below(q)) {
        b = q;
        break;
      }
      a = q + 1;
    }
  } else {
    b = hint;
    for (std::size_t step = 1; b > lo; step *= 2) {
      const std::size_t q = b - std::min(step, b - lo);
      if (below(q)) {
        a = q + 1;
        break;
      }
      b = q;
    }
  }
  while (a < b) {
    const std::size_t mid = a + (b - a) / 2;
    if (below(mid)) a = mid + 1;
    else b = mid;
  }
  return a;
}

// One partitioning problem: the states, the options and every level's parameters.
class Solver {
 public:
  Solver(const StateGraph& g, const Topology& t, const PartitionOptions& o, std::optional<double> memory)
      : m_g(g), m_t(t), m_o(o), m_memory(memory) {
    m_pd = o.cost_model == CostModel::PipeDream;
    m_transfer = !o.ignore_transfer && (!m_pd || o.activation_compression.has_value());
    m_ratio = o.activation_compression.value_or(1.0);
    m_workers = t.workers();
    const int levels = static_cast<int>(t.levels.size());
    m_group.assign(static_cast<std::size_t>(levels) + 1, 1);
    for (int l = 0; l < levels; ++l) m_group[static_cast<std::size_t>(l) + 1] = m_group[static_cast<std::size_t>(l)] * t.levels[static_cast<std::size_t>(l)].count;
    m_S = g.size();
    if (!g.chain()) index_by_compute();
  }

  // DAGs: the states in ascending compute (ties by index),
  // and for each state j the set of its ancestors as bits by that rank. The splits of a segment
  // (s, j] are then one AND of two bit rows, already in compute order.
  void index_by_compute() {
    m_by_compute.resize(static_cast<std::size_t>(m_S));
    for (int k = 0; k < m_S; ++k) m_by_compute[static_cast<std::size_t>(k)] = k;
    std::stable_sort(m_by_compute.begin(), m_by_compute.end(), [&](int x, int y) {
      return m_g.compute_s[static_cast<std::size_t>(x)] < m_g.compute_s[static_cast<std::size_t>(y)];
    });
    m_rank.resize(static_cast<std::size_t>(m_S));
    for (int r = 0; r < m_S; ++r) m_rank[static_cast<std::size_t>(m_by_compute[static_cast<std::size_t>(r)])] = r;
    m_words = (static_cast<std::size_t>(m_S) + 63) / 64;
    m_ancestor_bits.assign(static_cast<std::size_t>(m_S) * m_words, 0);
    for (int j = 0; j < m_S; ++j)
      m_g.for_each_ancestor(j, [&](int k) {
        const std::size_t r = static_cast<std::size_t>(m_rank[static_cast<std::size_t>(k)]);
        m_ancestor_bits[static_cast<std::size_t>(j) * m_words + r / 64] |= std::uint64_t{1} << (r % 64);
      });
  }

  // Fills the per-level tables T_{l+1}(s, e) for every level below the outermost. Rows are
  // independent, so they are solved in parallel.
  void solve_levels() {
    const int levels = static_cast<int>(m_t.levels.size());
    m_tables.resize(static_cast<std::size_t>(levels));
    for (int l = 0; l + 1 < levels; ++l) {
      const int M = count(l);
      auto& table = m_tables[static_cast<std::size_t>(l)];
      table.assign(static_cast<std::size_t>(m_S + 1) * static_cast<std::size_t>(m_S), kInf);
      // Threads only pay off on large tables; small problems stay on the calling thread.
#pragma omp parallel if (m_S >= 256)
      {
        std::vector<Entry> row;
#pragma omp for schedule(dynamic, 4)
        for (int s = -1; s < m_S - 1; ++s) {
          if (s >= 0 && !m_g.can_end(s)) continue;  // no segment starts after such a state
          solve_row(l, s, row);
          for (int j = s + 1; j < m_S; ++j)
            table[static_cast<std::size_t>(j) * static_cast<std::size_t>(m_S + 1) + static_cast<std::size_t>(s + 1)] =
                row[index(j, M, M)].t;
        }
      }
    }
  }

  // Solves the outermost row and keeps it for expand(), which would otherwise solve it again.
  double best_time() {
    const int top = static_cast<int>(m_t.levels.size()) - 1;
    solve_row(top, -1, m_top_row);
    return m_top_row[index(m_S - 1, count(top), count(top))].t;
  }

  // How one level of the search turns a segment's time T into its stage's time:
  // max((T + sync) / r, transfer / r), exactly as solve_row computes it.
  struct LevelStep {
    double par = 0, bandwidth = 1, share = 1, transfer = -1;  // transfer < 0: none
    int replicas = 1;
  };
  struct Expanded {
    Segment seg;
    std::vector<int> ranks;
    double compute_path = 0;   // compute and synchronisation through every level
    double transfer_path = 0;  // the largest transfer term, carried through the outer levels
    bool recompute = false;    // the stage recomputes its activations
  };

  // How the search runs a stage (s..j] on r machines when its subproblem uses m of the level's M
  // machines: whether it fits in memory, and whether it recomputes its activations to fit (or
  // because every stage must), which adds its forward time to its compute.
  struct StageMode {
    bool fits = true;
    bool recompute = false;
    double extra_s = 0;  // the second forward's time, per minibatch
  };
  StageMode mode(int level, int s, int j, int r, int m, int M) const {
    // Recomputation is a property of the final stages, which level 0 forms; the outer levels see
    // its cost in the inner tables' times.
    const bool can = !m_pd && level == 0 && m_o.recompute != Recompute::None;
    const StageMode recomputed{true, true, can ? m_g.stage_forward_s(s, j) : 0.0};
    if (can && m_o.recompute == Recompute::All && !m_memory) return recomputed;
    if (!m_memory) return {};
    double par = diff(m_g.parameter_bytes, s, j), act = m_g.stage_activation_bytes(s, j);
    if (m_pd) return {pipedream_stage_memory_bytes(par, act, M, m, r) <= *m_memory};
    const double version = diff(m_g.version_bytes, s, j);
    if (level != 0) return {};  // inner stages were checked one level down
    int flight = in_flight(m_workers, m - r, r);
    const double input = s < 0 ? 0.0 : m_g.boundary_bytes[static_cast<std::size_t>(s)];
    const double loss = m_g.stage_loss_gradient_bytes(j);
    const double work = working_bytes(m_g, s, j, m_ratio);
    if (m_o.recompute != Recompute::All &&
        stage_memory_bytes(par, version, act, flight, m_o.optimizer_state_factor, input, loss, work,
                           m_g.stage_frees_input(s, j)) <= *m_memory)
      return {};
    if (!can) return {false};
    if (recompute_stage_memory_bytes(par, version, act, input, m_g.stage_recompute_input_bytes(s),
                                     loss, flight, m_o.optimizer_state_factor, work) <= *m_memory)
      return recomputed;
    return {false};
  }

  // Expands the optimum into final stages with their ranks, and replays the search's arithmetic
  // on each of them (innermost level first), so that the per-stage breakdown is the search's own:
  // the slowest stage's max(compute_path, transfer_path) is the optimum.
  void expand(int level, int s, int e, const std::vector<int>& bases, std::vector<LevelStep> outer,
              std::vector<Expanded>& out) const {
    std::vector<Entry> own;
    const bool top = level + 1 == static_cast<int>(m_t.levels.size()) && s < 0 && !m_top_row.empty();
    if (!top) solve_row(level, s, own);
    const std::vector<Entry>& row = top ? m_top_row : own;
    std::vector<Segment> segs;
    int j = e, m = count(level);
    while (true) {
      const Entry& en = row[index(j, m, count(level))];
      PIPELINE_CHECK(std::isfinite(en.t), "internal: no solution to expand at level {} ({}..{}, {})", level, s, j, m);
      if (en.k == -4) {
        --m;
        continue;
      }
      if (en.k == -2) {
        segs.push_back({s, j, m});
        break;
      }
      segs.push_back({en.k, j, en.mprime});
      j = en.k;
      m -= en.mprime;
    }
    std::reverse(segs.begin(), segs.end());
    int offset = 0;
    const int G = m_group[static_cast<std::size_t>(level)];
    const int level_machines = count(level);
    const double B = m_t.levels[static_cast<std::size_t>(level)].bandwidth_bytes_per_s;
    const double W = level == 0 ? 1.0 : count(level - 1);
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const Segment& sg = segs[i];
      std::vector<int> sub;
      for (int b : bases)
        for (int r = 0; r < sg.machines; ++r) sub.push_back(b + (offset + r) * G);
      offset += sg.machines;
      LevelStep step;
      step.par = diff(m_g.parameter_bytes, sg.s, sg.e);
      step.bandwidth = B;
      step.replicas = sg.machines;
      if (i == 0)
        step.share = m_pd ? W : G;
      else
        step.share = m_pd ? 1.0 : G;
      step.transfer = stage_messages_s(sg.s, sg.e, sg.machines, B, /*starts_row=*/i == 0);
      std::vector<LevelStep> path = outer;
      path.push_back(step);
      if (level > 0) {
        expand(level - 1, sg.s, sg.e, sub, std::move(path), out);
        continue;
      }
      // The mode the search gave this stage: the subproblem used `offset` machines through it.
      const StageMode md = mode(level, sg.s, sg.e, sg.machines, offset, level_machines);
      Expanded x{sg, sub, m_g.stage_compute_s(sg.s, sg.e) + md.extra_s, 0.0, md.recompute};
      bool any_transfer = false;
      for (auto it = path.rbegin(); it != path.rend(); ++it) {
        x.compute_path = replicated_stage_time(x.compute_path, it->par, it->replicas, it->bandwidth, it->share);
        if (any_transfer) x.transfer_path = replicated_stage_time(x.transfer_path, it->par, it->replicas, it->bandwidth, it->share);
        if (it->transfer >= 0 && m_transfer) {
          x.transfer_path = any_transfer ? std::max(x.transfer_path, it->transfer) : it->transfer;
          any_transfer = true;
        }
      }
      out.push_back(std::move(x));
    }
  }

  int count(int level) const { return m_t.levels[static_cast<std::size_t>(level)].count; }
  static std::size_t index(int j, int m, int M) {
    return static_cast<std::size_t>(j) * static_cast<std::size_t>(M) + static_cast<std::size_t>(m - 1);
  }

  bool pipedream() const { return m_pd; }
  bool transfer() const { return m_transfer; }
  double ratio() const { return m_ratio; }
  const std::vector<int>& groups() const { return m_group; }

 private:
  double seg_compute(int level, int s, int j) const {
    if (level == 0) return StateGraph::stage_sum(m_g.compute_s, s, j);
    // Stored by end state, so that scanning splits k for one end state reads consecutive values.
    return m_tables[static_cast<std::size_t>(level - 1)][static_cast<std::size_t>(j) * static_cast<std::size_t>(m_S + 1) + static_cast<std::size_t>(s + 1)];
  }
  static double diff(const std::vector<double>& v, int s, int j) {
    return StateGraph::stage_sum(v, s, j);
  }
  double boundary(int k) const {
    return m_pd ? m_g.pipedream_boundary_bytes[static_cast<std::size_t>(k)] : m_g.boundary_bytes[static_cast<std::size_t>(k)];
  }
  // A stage (s, e]'s messages per minibatch on r machines of bandwidth B, shared by its replicas:
  // its input's, unless it starts its row (the level above charges that one), and its output's,
  // unless it ends the model; its replicas send over their own links whatever the next stage's
  // replicas, where PipeDream's model charges only the receiving stage. -1 where none is charged.
  double stage_messages_s(int s, int e, int r, double B, bool starts_row) const {
    if (!m_transfer || (starts_row && m_pd)) return -1;
    double t = starts_row ? -1 : transfer_time(boundary(s), r, B, m_ratio);
    if (e != m_S - 1) t = std::max(t, transfer_time(boundary(e), r, B, m_ratio));
    return t;
  }
  // Candidate order on equal time (PipeDream model) or equal time and stages (Pipeline model):
  // the single stage and the idle option first, as established before splits are scanned, then
  // splits by (last-stage machines, split state) ascending.
  static bool split_before(int mp, int k, const Entry& best) {
    if (best.k < 0) return false;
    return mp < best.mprime || (mp == best.mprime && k < best.k);
  }
  bool tie_wins(int stages, int mp, int k, const Entry& best) const {
    if (!m_pd && stages != best.stages) return stages < best.stages;
    return split_before(mp, k, best);
  }
  bool better_split(double v, int stages, int mp, int k, const Entry& best) const {
    if (v != best.t) return v < best.t;
    return tie_wins(stages, mp, k, best);
  }

  // A[j][m] for the segments starting after state s (s = -1: from the first layer), at `level`.
  //
  // Pruning: a stage on r machines of a level whose groups hold G workers takes at least its
  // compute over r·G (compute and synchronisation are added, and an inner level's best time of
  // a segment is at least its compute over the group), so a prefix on m - mp machines ending at
  // k and a last stage on mp machines can only beat the best time t found so far when
  //   compute(s..k) <= t·G·(m - mp)  and  compute(k..j) + G·sync(k..j, mp) <= t·G·mp
  // (the last stage, split off, always pays its synchronisation; a prefix may be one unreplicated
  // stage that pays none). Both bounds are applied to k: a window in compute order, shrinking as
  // t improves. The search starts from the split that was best for the previous end state,
  // which usually makes t tight before the scan begins.
  void solve_row(int level, int s, std::vector<Entry>& A) const {
    const int M = count(level);
    const double B = m_t.levels[static_cast<std::size_t>(level)].bandwidth_bytes_per_s;
    const double G = m_group[static_cast<std::size_t>(level)];
    const double W = level == 0 ? 1.0 : count(level - 1);
    const double share_single = m_pd ? W : G;
    const double share_split = m_pd ? 1.0 : G;
    const bool final_level = level + 1 == static_cast<int>(m_t.levels.size());
    const std::size_t SM = static_cast<std::size_t>(M);
    A.assign(static_cast<std::size_t>(m_S) * SM, Entry{});
    // first_finite[m']: the smallest state with a finite A[.][m'] so far (prefixes ending
    // earlier cannot serve as a split on m' machines).
    std::vector<int> first_finite(SM + 1, std::numeric_limits<int>::max());
    // pos[m][mp]: where the window's lower end was for the previous end state (chains only). It
    // grows with the square of the level's count, so a level past kMaxRememberedCount workers
    // gallops from the previous mp's window instead, as DAGs do (the same result; faster there).
    const bool remember = m_g.chain() && (m_o.straight || M <= kMaxRememberedCount);
    std::vector<int> pos(!remember ? 0 : m_o.straight ? SM + 1 : (SM + 1) * (SM + 1), s + 1);
    const double cs = s < 0 ? 0.0 : m_g.compute_s[static_cast<std::size_t>(s)];
    const double slack = 1.0 + 1e-12;
    const bool chain = m_g.chain();
    // DAGs: the states after s (descendants of s), as a dense flag per state, and for each end
    // state j its splits (ancestors of j after s) in ascending compute with their compute. In a
    // wide DAG most ancestors of j are not descendants of s; filtering them once per (s, j),
    // instead of in every (machines, last-stage machines) window, is most of the DAG speed.
    std::vector<std::uint64_t> after_s(chain ? 0 : m_words, 0);
    if (!chain)
      for (int k = s + 1; k < m_S; ++k)
        if (m_g.is_ancestor(s, k)) {
          const std::size_t r = static_cast<std::size_t>(m_rank[static_cast<std::size_t>(k)]);
          after_s[r / 64] |= std::uint64_t{1} << (r % 64);
        }
    // G times the synchronisation per parameter byte of a split-off stage on r machines: the
    // weight of parameters against compute in the window bounds below.
    std::vector<double> sync_per_byte(SM + 1, 0.0);
    for (int r = 1; r <= M; ++r) sync_per_byte[static_cast<std::size_t>(r)] = G * sync_time(1.0, r, B, share_split);
    std::size_t n_splits = 0;
    std::vector<int> splits(chain ? 0 : static_cast<std::size_t>(m_S));
    std::vector<double> split_compute(splits.size());
    // The largest parameter prefix among the splits so far in compute order: with it,
    // compute + synchronisation of the last stage bounds the window's lower end (see below).
    std::vector<double> split_param_max(splits.size());
    int prev_j = -1;
    for (int j = s + 1; j < m_S; ++j) {
      if (!m_g.is_ancestor(s, j)) continue;
      if (!m_g.can_end(j)) continue;  // its row stays infinite: no stage, nor prefix, ends there
      const double T = seg_compute(level, s, j);
      const double par = diff(m_g.parameter_bytes, s, j);
      const double cj = m_g.compute_s[static_cast<std::size_t>(j)];
      const double pj = m_g.parameter_bytes[static_cast<std::size_t>(j)];
      if (!chain) {
        n_splits = 0;
        double pmax = 0;
        const std::uint64_t* anc = &m_ancestor_bits[static_cast<std::size_t>(j) * m_words];
        for (std::size_t w = 0; w < m_words; ++w)
          for (std::uint64_t bits = anc[w] & after_s[w]; bits != 0; bits &= bits - 1) {
            const int k = m_by_compute[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))];
            splits[n_splits] = k;
            split_compute[n_splits] = m_g.compute_s[static_cast<std::size_t>(k)];
            pmax = std::max(pmax, m_g.parameter_bytes[static_cast<std::size_t>(k)]);
            split_param_max[n_splits] = pmax;
            ++n_splits;
          }
      }
      Entry* row = &A[static_cast<std::size_t>(j) * SM];
      for (int m = 1; m <= M; ++m) {
        Entry best;
        const StageMode single = (m == 1 || !m_o.straight) && std::isfinite(T) ? mode(level, s, j, m, m, M) : StageMode{false};
        if (single.fits) {
          best.t = std::max(replicated_stage_time(T + single.extra_s, par, m, B, share_single),
                            stage_messages_s(s, j, m, B, /*starts_row=*/true));
          best.k = -2;
          best.stages = 1;
        }
        if (m == 1) {
          row[0] = best;
          if (std::isfinite(best.t)) first_finite[1] = std::min(first_finite[1], j);
          continue;
        }
        if (m_o.allow_idle) {
          const Entry& prev = row[m - 2];
          bool take = m_pd ? (!std::isfinite(best.t) || prev.t < best.t)
                           : (prev.t < best.t || (prev.t == best.t && prev.stages <= best.stages));
          if (take && std::isfinite(prev.t)) best = Entry{prev.t, -4, 0, prev.stages};
        }
        const int max_mp = m_o.straight ? 1 : m - 1;
        // The last-stage machine counts whose prefix can be finite at all.
        int mp_min = 1;
        while (mp_min <= max_mp && first_finite[static_cast<std::size_t>(m - mp_min)] >= j) ++mp_min;
        int mp_max = max_mp;
        while (mp_max >= mp_min && first_finite[static_cast<std::size_t>(m - mp_max)] >= j) --mp_max;
        if (mp_min > mp_max) {
          row[m - 1] = best;
          if (std::isfinite(best.t)) first_finite[static_cast<std::size_t>(m)] = std::min(first_finite[static_cast<std::size_t>(m)], j);
          continue;
        }
        auto consider = [&](int k, int mp) {
          const Entry& a = A[static_cast<std::size_t>(k) * SM + static_cast<std::size_t>(m - mp - 1)];
          if (!std::isfinite(a.t) || a.t > best.t) return;
          // A prefix as slow as the best can at most tie with it (the split's time is at least
          // the prefix's); settle the tie order before any arithmetic. Wide DAGs have many such
          // splits: every prefix holding the bottleneck layer.
          if (a.t == best.t && !tie_wins(a.stages + 1, mp, k, best)) return;
          double Tl = seg_compute(level, k, j);
          if (!(Tl <= best.t * slack * mp)) return;  // infinite, or the last stage alone is slower
          const StageMode md = mode(level, k, j, mp, m, M);
          if (!md.fits) return;
          Tl += md.extra_s;
          double v = replicated_stage_time(Tl, diff(m_g.parameter_bytes, k, j), mp, B, share_split);
          v = std::max(v, a.t);
          v = std::max(v, stage_messages_s(k, j, mp, B, /*starts_row=*/false));
          const int stages = a.stages + 1;
          if (!better_split(v, stages, mp, k, best)) return;
          best = Entry{v, k, mp, stages};
        };
        auto valid_split = [&](int k) { return k > s && k < j && (chain || (m_g.is_ancestor(s, k) && m_g.is_ancestor(k, j))); };
        // Warm start: the split that was best for the previous end state.
        if (prev_j >= 0) {
          const Entry& pe = A[static_cast<std::size_t>(prev_j) * SM + static_cast<std::size_t>(m - 1)];
          if (pe.k >= 0 && pe.mprime >= mp_min && pe.mprime <= mp_max && valid_split(pe.k)) consider(pe.k, pe.mprime);
        }
        // For each mp, scan k by ascending compute over the window
        // [cj - t·G·mp, cs + t·G·(m - mp)], its upper end re-checked as t improves. For a chain
        // the window's lower end moves little from one end state to the next, so it is found by
        // walking from where it was (pos) instead of by binary search.
        // Where the previous machine count's window began (DAGs, and chains without pos).
        std::size_t hint = chain ? static_cast<std::size_t>(j) : n_splits;
        for (int mp = mp_min; mp <= mp_max; ++mp) {
          const std::size_t pm = m_o.straight ? static_cast<std::size_t>(m) : static_cast<std::size_t>(m) * (SM + 1) + static_cast<std::size_t>(mp);
          if (first_finite[static_cast<std::size_t>(m - mp)] >= j) continue;
          const double bound0 = best.t * slack * G;
          if (chain) {
            int kb = s + 1;
            if (std::isfinite(bound0)) {
              // As for DAGs below: the last stage's compute plus synchronisation bounds the
              // window's start; for a chain the parameter prefix is monotone itself.
              const double gs = sync_per_byte[static_cast<std::size_t>(mp)];
              const double x = cj + gs * pj - bound0 * mp - 1e-9 * (cj + gs * pj + bound0 * mp);
              auto key = [&](int q) {
                return m_g.compute_s[static_cast<std::size_t>(q)] + gs * m_g.parameter_bytes[static_cast<std::size_t>(q)];
              };
              const auto first = first_not_below(
                  static_cast<std::size_t>(s + 1), static_cast<std::size_t>(j),
                  remember ? static_cast<std::size_t>(std::max(pos[pm], s + 1)) : hint,
                  [&](std::size_t q) { return key(static_cast<int>(q)) < x; });
              kb = static_cast<int>(first);
              if (remember)
                pos[pm] = kb;
              else
                hint = first;
            }
            kb = std::max(kb, first_finite[static_cast<std::size_t>(m - mp)]);
            for (int k = kb; k < j; ++k) {
              if (m_g.compute_s[static_cast<std::size_t>(k)] - cs > best.t * slack * G * (m - mp)) break;
              consider(k, mp);
            }
          } else {
            // The last stage (k, j] on mp machines takes at least (C(k, j)/G + σ P(k, j))/mp with
            // σ its synchronisation per parameter byte, so it can only be fast enough where
            //   C_k + Gσ P_k >= C_j + Gσ P_j - t·G·mp.
            // P_k is not monotone in compute order, but its running maximum is, so the first
            // split where C_k + Gσ·max(P) reaches that value starts the window (a margin keeps
            // rounding from dropping a tie). The search gallops from the previous machine
            // count's start, which is usually near.
            std::size_t i = 0;
            if (std::isfinite(bound0)) {
              const double gs = sync_per_byte[static_cast<std::size_t>(mp)];
              const double x = cj + gs * pj - bound0 * mp;
              const double xm = x - 1e-9 * (cj + gs * pj + bound0 * mp);
              auto below = [&](std::size_t q) { return split_compute[q] + gs * split_param_max[q] < xm; };
              i = hint = first_not_below(0, n_splits, hint, below);
            }
            for (; i < n_splits; ++i) {
              if (split_compute[i] - cs > best.t * slack * G * (m - mp)) break;
              consider(splits[i], mp);
            }
          }
        }
        row[m - 1] = best;
        if (std::isfinite(best.t)) first_finite[static_cast<std::size_t>(m)] = std::min(first_finite[static_cast<std::size_t>(m)], j);
      }
      prev_j = j;
      if (final_level && s < 0 && j == m_S - 1) break;
    }
  }

  const StateGraph& m_g;
  const Topology& m_t;
  const PartitionOptions& m_o;
  std::optional<double> m_memory;
  bool m_pd = false, m_transfer = true;
  double m_ratio = 1;
  int m_workers = 1, m_S = 0;
  std::vector<int> m_group;
  std::vector<std::vector<double>> m_tables;
  std::vector<Entry> m_top_row;
  std::vector<int> m_by_compute, m_rank;          // DAGs: states by ascending compute, and back
  std::size_t m_words = 0;
  std::vector<std::uint64_t> m_ancestor_bits;     // DAGs: m_S rows of m_words, bits by rank
};

StateGraph make_states(const Profile& p, std::size_t max_states) {
  if (p.is_chain()) return StateGraph::linear(p);
  const std::string_view name = p.model.empty() ? std::string_view("profile") : std::string_view(p.model);
  auto too_many = [](const ConfigError& e) { return std::string_view(e.what()).find("antichain states") != std::string_view::npos; };
  try {
    return StateGraph::build(p, max_states);
  } catch (const ConfigError& e) {
    if (!too_many(e)) throw;
  }
  try {
    StateGraph g = StateGraph::build_coarsened(p, max_states);
    log_info("{}: more than {} antichain states; planning over the {} states of the DAG with its {} layers merged "
             "into {} groups (raise --max-states for finer splits)",
             name, max_states, g.size(), g.num_layers(), g.num_groups());
    return g;
  } catch (const ConfigError& e) {
    if (!too_many(e)) throw;
  }
  log_warn("{}: more than {} antichain states even with its layers merged; planning over one topological order of "
           "the layers instead",
           name, max_states);
  return StateGraph::linear(p);
}

struct FinalStage {
  std::vector<int> layers;  // ascending
  int s, e;                 // states
  std::vector<int> ranks;
  // From the search (negative: evaluate the stage flat): its time through every level as the
  // search computed it, split into the compute-and-synchronisation path and the transfer path.
  double compute_path = -1, transfer_path = 0;
  bool recompute = false;  // from the search; a flat evaluation decides in describe()
};

// Which level the workers a and b are joined at (0: same innermost group).
int span_level(const std::vector<int>& groups, int a, int b) {
  int l = 0;
  while (l + 1 < static_cast<int>(groups.size()) && a / groups[static_cast<std::size_t>(l) + 1] != b / groups[static_cast<std::size_t>(l) + 1]) ++l;
  return l;
}

// The ranks a plan's stages take: all of the topology's workers, or fewer where the plan leaves
// some idle (--allow-idle, manual stages). The in-flight counts are those of the ranks that run;
// the ranks keep their places in the topology (the links between them), and a job runs the plan
// on just the ranks it uses (compact_ranks).
int workers_used(const std::vector<FinalStage>& stages) {
  int used = 0;
  for (const FinalStage& fs : stages) used += static_cast<int>(fs.ranks.size());
  return used;
}

// describe() with the in-flight counts the schedule's stash shape may take (`flights`, per
// stage; stash_in_flights() or more), each taken where it fits.
double describe_at(Plan& plan, const StateGraph& g, const Topology& t, const PartitionOptions& o,
                   const std::vector<FinalStage>& stages, std::optional<double> memory,
                   bool check_memory, const std::vector<int>& flights) {
  const bool pd = o.cost_model == CostModel::PipeDream;
  const bool transfer = !o.ignore_transfer && (!pd || o.activation_compression.has_value());
  const double R = o.activation_compression.value_or(1.0);
  std::vector<int> groups(t.levels.size() + 1, 1);
  for (std::size_t l = 0; l < t.levels.size(); ++l) groups[l + 1] = groups[l] * t.levels[l].count;
  // PipeDream's model counts every worker, as its optimizer does; ours the ranks that run.
  const int N = pd ? t.workers() : workers_used(stages);
  int ranks_before = 0;  // of the stages before this one
  const auto diff = &StateGraph::stage_sum;
  plan.stages.clear();
  plan.config.clear();
  std::vector<int> replicas;
  for (const FinalStage& fs : stages) replicas.push_back(static_cast<int>(fs.ranks.size()));
  const std::vector<int> deeper_flights = stash_in_flights(N, replicas);
  double worst = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const FinalStage& fs = stages[i];
    PlanStage ps;
    ps.begin = fs.layers.front();
    ps.end = fs.layers.back() + 1;
    if (static_cast<int>(fs.layers.size()) != ps.end - ps.begin) ps.layer_ids = fs.layers;
    ps.ranks = fs.ranks;
    ps.replicas = static_cast<int>(fs.ranks.size());
    const int r = ps.replicas;
    int lo = *std::min_element(fs.ranks.begin(), fs.ranks.end()), hi = *std::max_element(fs.ranks.begin(), fs.ranks.end());
    const int lvl = span_level(groups, lo, hi);
    const double B = t.levels[static_cast<std::size_t>(lvl)].bandwidth_bytes_per_s;
    const double par = diff(g.parameter_bytes, fs.s, fs.e), act = g.stage_activation_bytes(fs.s, fs.e);
    const double version = diff(g.version_bytes, fs.s, fs.e);
    const double input = fs.s < 0 ? 0.0 : g.boundary_bytes[static_cast<std::size_t>(fs.s)];
    const double loss = g.stage_loss_gradient_bytes(fs.e);
    const double work = working_bytes(g, fs.s, fs.e, R);
    auto stash_at = [&](int f) {
      return stage_memory_bytes(par, version, act, f, o.optimizer_state_factor, input, loss, work,
                                g.stage_frees_input(fs.s, fs.e));
    };
    auto recompute_at = [&](int f) {
      return recompute_stage_memory_bytes(par, version, act, input,
                                          g.stage_recompute_input_bytes(fs.s), loss, f,
                                          o.optimizer_state_factor, work);
    };
    int flight = in_flight(N, pd ? lo : ranks_before, r);
    ranks_before += r;
    double delay_bytes = 0;
    if (!pd) {
      // As the runtime schedules replicated stages: more minibatches held (stash_in_flights), and
      // on a replicated stage a second gradient set for replicas that wait for their allreduce
      // after their next backward (StashShape). Taken where they fit without changing whether
      // the stage recomputes; PipeDream's count otherwise. The most of `flights` that fits, down
      // to stash_in_flights()'.
      const double extra = delayed_allreduce_bytes(par, r, /*input_stage=*/fs.s < 0);
      auto over = [&](double bytes) { return memory && bytes > *memory; };
      auto fits = [&](int f) {
        return !over(std::min(stash_at(f), recompute_at(f)) + extra) &&
               over(stash_at(f) + extra) == over(stash_at(flight));
      };
      int deeper = std::max(flights[i], deeper_flights[i]);
      while (deeper > deeper_flights[i] && !fits(deeper)) --deeper;
      if (fits(deeper)) {
        flight = deeper;
        delay_bytes = extra;
      } else {
        ps.delay_allreduce = r == 1;
      }
      ps.in_flight = flight;
    }
    const double stash_bytes = stash_at(flight) + delay_bytes;
    const double recompute_bytes = recompute_at(flight) + delay_bytes;
    ps.recompute = fs.recompute;
    if (fs.compute_path < 0 && !pd)
      ps.recompute = o.recompute == Recompute::All ||
                     (o.recompute == Recompute::Auto && memory && stash_bytes > *memory && recompute_bytes <= *memory);
    const double T =
        g.stage_compute_s(fs.s, fs.e) + (ps.recompute ? g.stage_forward_s(fs.s, fs.e) : 0.0);
    if (fs.compute_path >= 0) {
      // The search's own numbers (every level's replication and synchronisation included).
      ps.compute_s = T / r;
      ps.sync_s = std::max(0.0, fs.compute_path - ps.compute_s);
      ps.transfer_s = fs.transfer_path;
      worst = std::max(worst, std::max(fs.compute_path, fs.transfer_path));
    } else {
      ps.compute_s = T / r;
      ps.sync_s = r > 1 ? sync_time(par, r, B, 1.0) / r : 0.0;
    }
    if (transfer && fs.s >= 0 && stages[i - 1].ranks.front() != fs.ranks.front()) {
      const auto& bytes = pd ? g.pipedream_boundary_bytes : g.boundary_bytes;
      const int l2 = span_level(groups, stages[i - 1].ranks.front(), fs.ranks.front());
      ps.input_message_s =
          transfer_time(bytes[static_cast<std::size_t>(fs.s)], 1,
                        t.levels[static_cast<std::size_t>(l2)].bandwidth_bytes_per_s, R);
    }
    if (transfer && fs.compute_path < 0) {
      const auto& bytes = pd ? g.pipedream_boundary_bytes : g.boundary_bytes;
      // (Neighbouring stages on the same rank, as at the bottom of a V, hand over in memory.)
      if (fs.s >= 0 && stages[i - 1].ranks.front() != fs.ranks.front()) {
        const int l2 = span_level(groups, stages[i - 1].ranks.front(), fs.ranks.front());
        ps.transfer_s = std::max(ps.transfer_s, transfer_time(bytes[static_cast<std::size_t>(fs.s)], r, t.levels[static_cast<std::size_t>(l2)].bandwidth_bytes_per_s, R));
      }
      if (i + 1 < stages.size() && stages[i + 1].ranks.front() != fs.ranks.front()) {
        const int l2 = span_level(groups, fs.ranks.front(), stages[i + 1].ranks.front());
        ps.transfer_s = std::max(ps.transfer_s, transfer_time(bytes[static_cast<std::size_t>(fs.e)], r, t.levels[static_cast<std::size_t>(l2)].bandwidth_bytes_per_s, R));
      }
    }
    if (pd) ps.memory_bytes = pipedream_stage_memory_bytes(par, act, N, lo + r, r);
    else ps.memory_bytes = ps.recompute ? recompute_bytes : stash_bytes;
    if (!pd) ps.workspace_bytes = work;
    if (check_memory && memory && ps.memory_bytes > *memory) {
      const bool recompute_fits = !pd && !ps.recompute && recompute_bytes <= *memory;
      PIPELINE_FAIL(ConfigError, "stage {} (layers {}..{}, {} replicas) needs {:.4g} bytes per worker, more than the {:.4g} available{}",
                    i, ps.begin, ps.end, r, ps.memory_bytes, *memory,
                    recompute_fits ? fmt::format("; with activation recomputation it needs {:.4g}: pass --recompute auto",
                                                 recompute_bytes)
                                   : std::string());
    }
    if (fs.compute_path < 0) worst = std::max(worst, std::max(ps.compute_s + ps.sync_s, ps.transfer_s));
    if (i) plan.config.push_back('-');
    plan.config.append(std::to_string(r));
    plan.stages.push_back(std::move(ps));
  }
  plan.in_flight = plan.stages.empty() ? 1
                   : plan.stages.front().in_flight > 0
                       ? plan.stages.front().in_flight
                       : in_flight(N, 0, plan.stages.front().replicas);
  plan.predicted.peak_memory_bytes.assign(static_cast<std::size_t>(t.workers()), 0);
  for (const PlanStage& ps : plan.stages)
    for (int rk : ps.ranks) plan.predicted.peak_memory_bytes[static_cast<std::size_t>(rk)] = static_cast<std::int64_t>(ps.memory_bytes);
  return worst;
}

// Fills stages, ranks, config, in_flight and the per-stage breakdown with the flat evaluation
// of each stage at the bandwidth of the level its ranks span; returns the bottleneck. The
// in-flight counts are those that hide the plan's transfers (stash_in_flights with transfers, at
// the bottleneck's period) where they fit.
double describe(Plan& plan, const StateGraph& g, const Topology& t, const PartitionOptions& o,
                const std::vector<FinalStage>& stages, std::optional<double> memory,
                bool check_memory) {
  std::vector<int> replicas;
  for (const FinalStage& fs : stages) replicas.push_back(static_cast<int>(fs.ranks.size()));
  const std::vector<int> counts = stash_in_flights(workers_used(stages), replicas);
  const double period = describe_at(plan, g, t, o, stages, memory, check_memory, counts);
  if (o.cost_model == CostModel::PipeDream || o.pipedream_in_flight) return period;
  const std::vector<int> flights =
      stash_in_flights_hiding_transfers(plan, workers_used(stages), period);
  // (The first pass decided recomputation; deeper counts are taken only where they keep it.)
  return flights == counts ? period
                           : describe_at(plan, g, t, o, stages, memory, check_memory, flights);
}

// A hand-made stage that ends at state e (layer e of a chain) where the planner would not end one
// (StateGraph::can_end): it is planned as it will run, and the user is told what a cut one layer
// later saves.
void warn_if_cutting_pair(const Profile& p, const StateGraph& g, int e) {
  if (g.can_end(e)) return;
  const LayerProfile& l = p.layers[static_cast<std::size_t>(e)];
  const LayerProfile& next = p.layers[static_cast<std::size_t>(e) + 1];
  log_warn(
      "a stage ends at layer {} ('{}'), which runs after '{}' when both are in one stage: "
      "alone it costs {:.3f} ms more a minibatch and sends {:.3g} MiB where a cut after "
      "'{}' sends {:.3g} MiB; end the stage one layer later",
      e, l.name, next.name, 1e3 * g.end_compute_s[static_cast<std::size_t>(e)],
      static_cast<double>(l.output_bytes) / (1 << 20), next.name,
      static_cast<double>(next.output_bytes) / (1 << 20));
}

void check_recompute(const PartitionOptions& o) {
  PIPELINE_CHECK_AS(ConfigError, !(o.cost_model == CostModel::PipeDream && o.recompute == Recompute::All),
                    "--recompute all needs the pipeline cost model: PipeDream's model has no recomputation "
                    "(drop --cost-model pipedream, or use --recompute none)");
}

void finish(Plan& plan, const Profile& p, const Topology& t, const PartitionOptions& o, double time) {
  plan.model = p.model;
  plan.architecture = p.architecture;
  plan.batch_size = p.batch_size;
  plan.workers = t.workers();
  plan.schedule = "1f1b-stash";
  plan.cost_model = std::string(to_string(o.cost_model));
  plan.profile_threads = p.threads;
  plan.predicted.time_per_minibatch_s = time;
  plan.predicted.samples_per_s = time > 0 ? p.batch_size / time : 0.0;
  plan.predicted.data_parallel_time_per_minibatch_s = data_parallel_seconds(p, t, o);
  if (o.cost_model == CostModel::Pipeline) plan.optimizer = o.optimizer;
  if (p.bf16()) plan.dtype = p.dtype;
  record_transfer_dtype(plan, o);
}

// What partition() and evaluate_stages() both demand of the microbatches and, for interleaved
// plans (options.virtual_stages != 1), of the virtual stages.
void check_schedule_request(const Profile& p, const Topology& t, const PartitionOptions& o) {
  const int v = o.virtual_stages, w = t.workers();
  PIPELINE_CHECK_AS(ConfigError, o.microbatches >= 0,
                    "microbatches per minibatch: {} is not a count (0 takes the default)",
                    o.microbatches);
  PIPELINE_CHECK_AS(ConfigError, v >= 1, "virtual stages per worker must be at least 1, got {}", v);
  PIPELINE_CHECK_AS(ConfigError, o.placement == StagePlacement::Looped || v == 2,
                    "a V placement has 2 stages per worker (stage k and 2p - 1 - k on rank k); "
                    "got --virtual-stages {}: use --virtual-stages 2",
                    v);
  if (v == 1) return;
  PIPELINE_CHECK_AS(ConfigError, o.placement == StagePlacement::V || o.microbatches % w == 0,
                    "interleaved-1f1b deals microbatches round-robin to its pipelines and takes "
                    "each pipeline's in groups of its ranks, so a minibatch's microbatches must "
                    "be a multiple of the {} workers; got {} (try {})",
                    w, o.microbatches,
                    o.microbatches < w ? fmt::format("{}", w)
                                       : fmt::format("{} or {}", o.microbatches / w * w,
                                                     (o.microbatches / w + 1) * w));
  PIPELINE_CHECK_AS(ConfigError, o.cost_model == CostModel::Pipeline,
                    "interleaved plans ({} virtual stages per worker) use the pipeline cost model; "
                    "PipeDream's optimizer has none (drop --cost-model pipedream)",
                    v);
  PIPELINE_CHECK_AS(ConfigError, !o.allow_idle,
                    "interleaved plans ({} virtual stages per worker) put stages on every worker; "
                    "--allow-idle does not apply (give fewer workers instead)",
                    v);
  PIPELINE_CHECK_AS(ConfigError, w >= 2,
                    "interleaved plans need at least 2 workers ({} virtual stages on {} worker "
                    "would only add transfers); use --virtual-stages 1",
                    v, w);
  // The shortest pipeline (2 ranks; all of them with --straight) must have enough layers.
  const int shortest = o.straight ? w : 2;
  PIPELINE_CHECK_AS(ConfigError, std::int64_t{v} * shortest <= p.size(),
                    "{} virtual stages per worker on {} workers make {} stages but the model has "
                    "only {} layers; use at most {} virtual stages",
                    v, shortest, std::int64_t{v} * shortest, p.size(),
                    std::max(1, p.size() / shortest));
}

// Microbatches per minibatch a flush or interleaved plan is made for: the options', else 4 per
// worker.
int planned_microbatches(const PartitionOptions& o, int workers) {
  return o.microbatches > 0 ? o.microbatches : 4 * workers;
}

// An interleaved plan's pipelines on the topology: `pipelines` (d) copies of a pipeline of
// `positions` (p) ranks, pipeline j on ranks j·p .. j·p + p − 1, so stage k's replicas sit on
// ranks j·p + (k's place: k mod p looped, or in a V) and allreduce across the level that joins
// rank 0 and rank (d − 1)·p.
struct InterleavedPipes {
  int pipelines = 1;
  int positions = 1;
  int microbatches = 1;  // per minibatch, over all pipelines (PartitionOptions::microbatches)
  InterleavedShape shape;
  std::vector<int> groups;  // workers per group at each level (span_level)
  double sync_bandwidth = 0;

  InterleavedPipes(const Topology& t, int d, const PartitionOptions& o)
      : pipelines(d),
        positions(t.workers() / d),
        microbatches(planned_microbatches(o, t.workers())),
        shape{positions, o.virtual_stages, d, o.placement} {
    groups.assign(t.levels.size() + 1, 1);
    for (std::size_t l = 0; l < t.levels.size(); ++l) groups[l + 1] = groups[l] * t.levels[l].count;
    sync_bandwidth = t.levels[static_cast<std::size_t>(span_level(groups, 0, (d - 1) * positions))]
                         .bandwidth_bytes_per_s;
  }
  int place_of(int stage) const { return shape.place_of(stage); }
  std::vector<int> ranks_of(int stage) const {
    std::vector<int> r;
    for (int j = 0; j < pipelines; ++j) r.push_back(j * positions + place_of(stage));
    return r;
  }
  // Seconds of the allreduce of `parameter_bytes` among a stage's replicas, once per minibatch.
  double sync_s(double parameter_bytes) const {
    return pipelines > 1 ? sync_time(parameter_bytes, pipelines, sync_bandwidth, 1.0) : 0.0;
  }
  // The microbatches each pipeline takes of a minibatch (dealt round-robin).
  int per_pipeline() const { return (microbatches + pipelines - 1) / pipelines; }
};

// A stage's backward over layers [i, j) split into its input- and weight-gradient halves, as the
// simulator runs them: the profile's split times where every layer with a backward has them,
// halves of the whole backward otherwise; a recomputing stage runs its forward (`rebuilt_s`) again
// before the input-gradient half.
struct SplitBackward {
  double input_s = 0, weight_s = 0;
};
SplitBackward split_backward_s(const Profile& p, int i, int j, double rebuilt_s) {
  SplitBackward split;
  double whole = 0;
  bool measured = true;
  for (int l = i; l < j; ++l) {
    const LayerProfile& layer = p.layers[static_cast<std::size_t>(l)];
    split.input_s += layer.backward_input_s;
    split.weight_s += layer.backward_weight_s;
    whole += layer.backward_s;
    measured = measured &&
               (layer.backward_input_s > 0 || layer.backward_weight_s > 0 || layer.backward_s == 0);
  }
  if (!measured || split.input_s + split.weight_s <= 0) split.input_s = split.weight_s = whole / 2;
  split.input_s += rebuilt_s;
  return split;
}

// How long the bucketed allreduce of layers [i, j) taking `sync_s` runs on after the closing
// backward of `backward_s` it starts with (allreduce_buckets, the executor's buckets).
double allreduce_after_closing_backward(const Profile& p, int i, int j, double sync_s,
                                        double backward_s) {
  std::vector<double> backwards, bytes;
  for (int l = i; l < j; ++l) {
    backwards.push_back(p.layers[static_cast<std::size_t>(l)].backward_s);
    bytes.push_back(static_cast<double>(p.layers[static_cast<std::size_t>(l)].parameter_bytes));
  }
  return allreduce_after_backward_s(allreduce_buckets(backwards, bytes, kAllreduceBucketBytes),
                                    sync_s, 0.0, backward_s);
}

// When a minibatch `walk`ed ends: on each rank its last pass, or the allreduce of one of its
// stages (from the stage's closing pass of `closing_s`, in the runtime's buckets; `sync_s` its
// whole length, 0 without replicas) where that ends later, and then its stages' optimizer steps
// (`step_s`). Stage k covers layers [cuts[k], cuts[k + 1]) on rank rank_of_stage[k].
double minibatch_end_s(const Profile& p, const PassWalk& walk,
                       const std::vector<int>& rank_of_stage, const std::vector<int>& cuts,
                       const std::vector<double>& sync_s, const std::vector<double>& closing_s,
                       const std::vector<double>& step_s) {
  std::vector<double> end = walk.rank_end_s, steps(end.size(), 0.0);
  for (std::size_t k = 0; k < rank_of_stage.size(); ++k) {
    const auto r = static_cast<std::size_t>(rank_of_stage[k]);
    if (sync_s[k] > 0)
      end[r] = std::max(
          end[r], walk.closing_end_s[k] + allreduce_after_closing_backward(
                                              p, cuts[k], cuts[k + 1], sync_s[k], closing_s[k]));
    steps[r] += step_s[k];
  }
  double latest = 0;
  for (std::size_t r = 0; r < end.size(); ++r) latest = std::max(latest, end[r] + steps[r]);
  return latest;
}

// The optimizer step time of layers [i, j) under `optimizer` (none when empty).
double step_s(const Profile& p, int i, int j, const std::string& optimizer) {
  double step = 0;
  if (!optimizer.empty())
    for (int l = i; l < j; ++l) step += p.layers[static_cast<std::size_t>(l)].step_s.of(optimizer);
  return step;
}

// A stage's costs under a split backward (zb-v, zb-h1), from prefix sums over the layers so that
// the searches take them in O(1).
class SplitCosts {
 public:
  explicit SplitCosts(const Profile& p)
      : m_loss(static_cast<double>(p.loss_gradient_bytes)),
        m_last_has_weights(p.size() > 0 && p.layers.back().parameter_bytes > 0) {
    for (const LayerProfile& l : p.layers) {
      m_kept.push_back(m_kept.back() +
                       (l.parameter_bytes > 0 ? static_cast<double>(split_kept_bytes(l)) : 0.0));
      m_extra.push_back(m_extra.back() + l.backward_input_s + l.backward_weight_s - l.backward_s);
      const bool whole = l.backward_input_s <= 0 && l.backward_weight_s <= 0 && l.backward_s > 0;
      m_unsplit.push_back(m_unsplit.back() + (whole ? 1 : 0));
    }
  }
  // What the layers [begin, end) keep per microbatch from the input-gradient half to the
  // weight-gradient half: the output gradients of those with weights, the loss's gradient apart
  // (counted as the last stage's anyway), as the simulator charges them (split_kept_bytes).
  double kept_bytes(int begin, int end) const {
    const double sum = at(m_kept, end) - at(m_kept, begin);
    const bool last = end == static_cast<int>(m_kept.size()) - 1;
    return last && m_last_has_weights ? sum - std::min(sum, m_loss) : sum;
  }
  // What running their backward as its two halves costs beyond running it whole (the profile's
  // split times, where every layer has them, as the simulator takes them).
  double extra_s(int begin, int end) const {
    if (m_unsplit[static_cast<std::size_t>(end)] != m_unsplit[static_cast<std::size_t>(begin)])
      return 0.0;
    return at(m_extra, end) - at(m_extra, begin);
  }

 private:
  static double at(const std::vector<double>& v, int i) { return v[static_cast<std::size_t>(i)]; }
  double m_loss;
  bool m_last_has_weights;
  std::vector<double> m_kept{0.0}, m_extra{0.0};
  std::vector<int> m_unsplit{0};
};

// The stages of a chain cut at `cuts` (stage k over layers [cuts[k], cuts[k + 1])), stage k on
// the ranks ranks_of(k).
template <class RanksOf>
std::vector<FinalStage> stages_at_cuts(const std::vector<int>& cuts, RanksOf&& ranks_of) {
  std::vector<FinalStage> fs(cuts.size() - 1);
  for (std::size_t k = 0; k < fs.size(); ++k) {
    for (int l = cuts[k]; l < cuts[k + 1]; ++l) fs[k].layers.push_back(l);
    fs[k].s = cuts[k] - 1;
    fs[k].e = cuts[k + 1] - 1;
    fs[k].ranks = ranks_of(static_cast<int>(k));
  }
  return fs;
}

// What a microbatch between its I and its W holds under a split backward beyond what a stage
// holds for it under a whole one: the output gradients its weights need (`kept`), and on a
// recomputing stage the activations it rebuilt for the I.
double split_held_bytes(double kept, double activation_bytes, bool recompute) {
  return kept + (recompute ? activation_bytes : 0.0);
}

// The order an interleaved plan's schedule runs, as describe_interleaved() chose it for the plan:
// looped, interleaved 1F1B's group of microbatches; a V, zb-v's order.
struct InterleavedChoice {
  int group = 0;
  PassOrder v_order;
  bool empty() const { return group == 0 && v_order.empty(); }
};

// The interleaved plan whose stage k is the layer range [cuts[k], cuts[k + 1]) on the ranks of
// its place in each pipeline: describe()'s per-stage breakdown, with the memory and time of its
// schedule (a flush: one weight version; each pipeline takes 1/d of a minibatch's microbatches,
// each rank runs all of its stages for each of them, and every stage allreduces its gradients and
// steps once per minibatch; a rank holds what its order (interleaved 1F1B's in the plan's group,
// or zb-v's) holds at its peak, and the working memory of one pass), the stages marked in
// `recompute` recomputing. `p` is the measured profile (no optimizer step in its backward times:
// the step comes once per minibatch here) and `g` its chain. Returns the slowest stage's
// max(compute + allreduce, transfer) per microbatch, and the plan in `plan`; fit_interleaved()
// checks its memory. Where `order` is given, the order it holds is walked as it is; an empty one
// gets the order chosen for the plan.
double describe_interleaved(Plan& plan, const Profile& p, const StateGraph& g, const Topology& t,
                            const PartitionOptions& o, const std::vector<int>& cuts,
                            const InterleavedPipes& pipes, const std::vector<bool>& recompute,
                            InterleavedChoice* order = nullptr) {
  const int w = t.workers(), places = pipes.positions, d = pipes.pipelines;
  const int stages = static_cast<int>(cuts.size()) - 1, m = pipes.microbatches;
  const std::vector<FinalStage> fs = stages_at_cuts(cuts, [&](int k) { return pipes.ranks_of(k); });
  const SplitCosts split_costs(p);
  PartitionOptions stashing = o;  // recomputation is per stage here, as `recompute` says
  stashing.recompute = Recompute::None;
  describe(plan, g, t, stashing, fs, std::nullopt, false);
  std::vector<double> memory(static_cast<std::size_t>(places), 0.0);  // per rank
  std::vector<double> stage_forward, stage_backward;  // per stage, a microbatch's passes
  std::vector<double> stage_sync, stage_step;         // per stage, once per minibatch
  const auto at = [](const std::vector<double>& v, int i) {
    return i < 0 ? 0.0 : v[static_cast<std::size_t>(i)];
  };
  // Each stage's memory apart from the microbatches it holds, its working memory and its backward
  // in progress (`fixed`); what one microbatch holds from its forward to its backward
  // (`whole_bytes`; in a V, from its F to its W, and `between_bytes` from its I to its W): every
  // microbatch is a whole one of the profile's batch, whichever pipeline takes it; and what the
  // backward in progress holds besides: the input gradient it makes (`gradient_bytes`), and a
  // looped recomputing stage's rebuilt activations (`rebuilt_bytes`).
  std::vector<double> fixed(static_cast<std::size_t>(stages)),
      whole_bytes = fixed, between_bytes = fixed, gradient_bytes = fixed, rebuilt_bytes = fixed;
  double slowest = 0;
  for (int k = 0; k < stages; ++k) {
    PlanStage& ps = plan.stages[static_cast<std::size_t>(k)];
    const FinalStage& f = fs[static_cast<std::size_t>(k)];
    const double par = StateGraph::stage_sum(g.parameter_bytes, f.s, f.e);
    const double act = g.stage_activation_bytes(f.s, f.e), input = at(g.boundary_bytes, f.s);
    const double kept_input = g.stage_recompute_input_bytes(f.s);
    // describe() gave each replica's share of compute and transfers; a recomputing stage runs its
    // forward twice; its allreduce is whole, once per minibatch.
    if (recompute[static_cast<std::size_t>(k)]) {
      ps.recompute = true;
      ps.compute_s += g.stage_forward_s(f.s, f.e) / d;
    }
    const double sync = pipes.sync_s(par);
    ps.sync_s = sync / m;  // per microbatch, as time_per_minibatch_s
    const double step = step_s(p, ps.begin, ps.end, o.optimizer);
    ps.workspace_bytes = working_bytes(g, f.s, f.e, o.activation_compression.value_or(1.0));
    const double loss = g.stage_loss_gradient_bytes(f.e);
    // A flush schedule: one weight version. The memory with one microbatch held, less that one.
    const double one =
        ps.recompute ? recompute_stage_memory_bytes(par, par, act, input, kept_input, loss, 1,
                                                    o.optimizer_state_factor, ps.workspace_bytes)
                     : stage_memory_bytes(par, par, act, 1, o.optimizer_state_factor, input, loss,
                                          ps.workspace_bytes, g.stage_frees_input(f.s, f.e));
    const double whole =
        loss + (ps.recompute ? kept_input : act + (g.stage_frees_input(f.s, f.e) ? 0.0 : input));
    // zb-v's W comes after the I: a microbatch between the two keeps the output gradients its
    // weights need, and a recomputing stage the activations it rebuilt for the I too (which
    // `one` holds for the backward in progress: counted with the microbatches between).
    const bool split = pipes.shape.placement == StagePlacement::V;
    gradient_bytes[static_cast<std::size_t>(k)] = backward_gradient_bytes(input, loss) - loss;
    rebuilt_bytes[static_cast<std::size_t>(k)] = ps.recompute && !split ? act : 0.0;
    fixed[static_cast<std::size_t>(k)] = one - whole - ps.workspace_bytes -
                                         gradient_bytes[static_cast<std::size_t>(k)] -
                                         (ps.recompute ? act : 0.0);
    whole_bytes[static_cast<std::size_t>(k)] = whole;
    between_bytes[static_cast<std::size_t>(k)] =
        split ? split_held_bytes(split_costs.kept_bytes(ps.begin, ps.end), act, ps.recompute) : 0.0;
    stage_sync.push_back(sync);
    stage_step.push_back(step);
    stage_forward.push_back(g.stage_forward_s(f.s, f.e));
    // (describe() gave each pipeline's share of a microbatch's compute.)
    stage_backward.push_back(ps.compute_s * d - stage_forward.back());
    slowest = std::max(slowest, std::max(ps.compute_s + ps.sync_s, ps.transfer_s));
  }
  // A minibatch: each pipeline's ⌈m/d⌉ microbatches, as the walk of its schedule's order times
  // them, plus the slowest rank's allreduces and steps.
  const int mp = pipes.per_pipeline();
  const int most = places * ((mp + places - 1) / places);  // (the order's groups are whole)
  const bool looped = pipes.shape.placement == StagePlacement::Looped;
  // Each place's stages in forward order.
  std::vector<std::vector<int>> stages_at(static_cast<std::size_t>(places));
  for (int k = 0; k < stages; ++k)
    stages_at[static_cast<std::size_t>(pipes.place_of(k))].push_back(k);
  // Each rank's memory from its order, pass by pass: a microbatch's F takes its `whole` bytes,
  // its I (a V's) the `between` ones, its B or W frees both. The rank's peak is its memory, each
  // stage's share at that moment the stage's. A rank runs one pass at a time: the largest working
  // memory of its stages is charged once, to the first stage that has it, and so are the largest
  // input gradient and rebuilt activations of a backward in progress (a V's rebuilt ones are
  // held from each I to its W: `between`).
  const auto hold_in_order = [&](const PassOrder& passes) {
    for (int r = 0; r < places; ++r) {
      std::vector<double> live(static_cast<std::size_t>(stages), 0.0), at_peak = live;
      double total = 0, peak = 0;
      for (const StagePass& pass : passes[static_cast<std::size_t>(r)]) {
        const auto k = static_cast<std::size_t>(pass.stage);
        const double change = pass.kind == PassKind::Forward ? whole_bytes[k]
                              : pass.kind == PassKind::Input ? between_bytes[k]
                                                             : -(whole_bytes[k] + between_bytes[k]);
        live[k] += change;
        total += change;
        if (total > peak) {
          peak = total;
          at_peak = live;
        }
      }
      const std::vector<int>& mine = stages_at[static_cast<std::size_t>(r)];
      const auto largest = [&](auto&& bytes) {
        return *std::max_element(mine.begin(), mine.end(),
                                 [&](int a, int b) { return bytes(a) < bytes(b); });
      };
      const int working =
          largest([&](int k) { return plan.stages[static_cast<std::size_t>(k)].workspace_bytes; });
      const int gradient =
          largest([&](int k) { return gradient_bytes[static_cast<std::size_t>(k)]; });
      const int rebuilt =
          largest([&](int k) { return rebuilt_bytes[static_cast<std::size_t>(k)]; });
      memory[static_cast<std::size_t>(r)] = 0;
      for (int k : mine) {
        PlanStage& ps = plan.stages[static_cast<std::size_t>(k)];
        ps.in_flight = 0;  // 1F1B-stash's count, which describe() set: no stash schedule runs it
        ps.memory_bytes = fixed[static_cast<std::size_t>(k)] +
                          at_peak[static_cast<std::size_t>(k)] +
                          (k == working ? ps.workspace_bytes : 0.0) +
                          (k == gradient ? gradient_bytes[static_cast<std::size_t>(k)] : 0.0) +
                          (k == rebuilt ? rebuilt_bytes[static_cast<std::size_t>(k)] : 0.0);
        memory[static_cast<std::size_t>(r)] += ps.memory_bytes;
      }
    }
  };
  // Looped, interleaved 1F1B's order in groups of `group_size`.
  const auto hold = [&](int group_size) {
    hold_in_order(interleaved_passes(InterleavedOrder{places, o.virtual_stages, most, group_size}));
  };
  const auto fits = [&] {
    return !t.memory_bytes_per_worker ||
           *std::max_element(memory.begin(), memory.end()) <= *t.memory_bytes_per_worker;
  };
  // The walk of the schedule's order, and per stage how long its closing pass takes (its
  // backward; a V's: its W), which the runtime's buckets start with.
  PassWalk walked;
  std::vector<double> closing_s;
  // Interleaved 1F1B in groups of p keeps a group on a microbatch's way round the ranks, which
  // with free messages and equal stages takes p paces. Slow links and unequal stages make the ranks
  // wait, and larger groups (a multiple of p) give each more work to hide that, as far as the
  // memory allows: looped, the group whose order walks fastest (a larger one where it is at least
  // 1% faster); the walk's time is the minibatch's.
  const bool given = order && !order->empty();
  int group = given && looped ? order->group : places;
  if (looped) {
    StagePassTimes times;
    times.forward_s = stage_forward;
    times.backward_s = stage_backward;
    for (const PlanStage& ps : plan.stages) times.message_s.push_back(ps.input_message_s);
    const std::vector<int> stage_places = looped_stage_places(places, o.virtual_stages);
    const auto fits_group = [&](int g) {
      if (g == places || !t.memory_bytes_per_worker) return true;
      hold(g);
      return fits();
    };
    std::optional<PassWalk> walk;
    for (int g = group; g <= most && (given || fits_group(g)); g += places) {
      PassWalk next =
          walk_passes(interleaved_passes(InterleavedOrder{places, o.virtual_stages, most, g}),
                      stage_places, most, times);
      if (!walk || next.makespan_s < walk->makespan_s * 0.99) {
        walk = std::move(next);
        group = g;
      }
      if (given) break;
    }
    if (order) order->group = group;
    walked = std::move(*walk);
    closing_s = stage_backward;
  } else {
    // zb-v's order, built as the generator builds it from the plan (thirds of each stage's time
    // per microbatch, its messages), walked on the stages' F, I and W as the simulator runs them.
    std::vector<double> seconds;
    StagePassTimes times;
    for (int k = 0; k < stages; ++k) {
      const PlanStage& ps = plan.stages[static_cast<std::size_t>(k)];
      seconds.push_back(ps.compute_s * d);
      times.message_s.push_back(ps.input_message_s);
      const double forward = stage_forward[static_cast<std::size_t>(k)];
      const SplitBackward split =
          split_backward_s(p, ps.begin, ps.end, ps.recompute ? forward : 0.0);
      times.forward_s.push_back(forward);
      times.input_s.push_back(split.input_s);
      times.weight_s.push_back(split.weight_s);
    }
    PassOrder built;
    if (!given)
      built = zero_bubble_v_order(places, mp, v_times_in_thirds(places, seconds, times.message_s));
    if (order && !given) order->v_order = std::move(built);
    const PassOrder& v_order = order ? order->v_order : built;
    walked = walk_passes(v_order, v_stage_ranks(places), mp, times);
    closing_s = times.weight_s;
    hold_in_order(v_order);
  }
  if (looped) hold(group);
  std::vector<int> stage_places;
  for (int k = 0; k < stages; ++k) stage_places.push_back(pipes.place_of(k));
  const double makespan =
      minibatch_end_s(p, walked, stage_places, cuts, stage_sync, closing_s, stage_step);
  for (int rank = 0; rank < w; ++rank)
    plan.predicted.peak_memory_bytes[static_cast<std::size_t>(rank)] =
        static_cast<std::int64_t>(memory[static_cast<std::size_t>(rank % places)]);
  plan.in_flight = 1;
  finish(plan, p, t, o,
         makespan / m);  // (fit_interleaved() adds the steps to its data-parallel time)
  plan.microbatches = m;
  plan.microbatch_group = group > places ? group : 0;
  plan.schedule = o.placement == StagePlacement::V ? "zb-v" : "interleaved-1f1b";
  plan.virtual_stages = o.virtual_stages;
  return slowest;
}

// The first place (rank of the first pipeline) whose memory exceeds the topology's, or -1.
int place_over_memory(const Plan& plan, const Topology& t, const InterleavedPipes& pipes) {
  if (!t.memory_bytes_per_worker) return -1;
  for (int r = 0; r < pipes.positions; ++r)
    if (static_cast<double>(plan.predicted.peak_memory_bytes[static_cast<std::size_t>(r)]) >
        *t.memory_bytes_per_worker)
      return r;
  return -1;
}

// The interleaved plan of describe_interleaved() with every stage recomputing under
// --recompute all and none otherwise; under auto, while a rank holds more than the memory, the one
// of its stashing stages whose recomputation lowers its memory most recomputes. ConfigError
// naming the rank where it still does not fit.
Plan fit_interleaved(const Profile& p, const StateGraph& g, const Topology& t,
                     const PartitionOptions& o, const std::vector<int>& cuts,
                     const InterleavedPipes& pipes) {
  const int stages = static_cast<int>(cuts.size()) - 1;
  std::vector<bool> recompute(static_cast<std::size_t>(stages), o.recompute == Recompute::All);
  Plan plan;
  describe_interleaved(plan, p, g, t, o, cuts, pipes, recompute);
  const auto memory_at = [](const Plan& q, int r) {
    return q.predicted.peak_memory_bytes[static_cast<std::size_t>(r)];
  };
  for (int r; o.recompute == Recompute::Auto && (r = place_over_memory(plan, t, pipes)) >= 0;) {
    std::optional<Plan> best;
    for (int k = 0; k < stages; ++k) {
      if (pipes.place_of(k) != r || recompute[static_cast<std::size_t>(k)]) continue;
      recompute[static_cast<std::size_t>(k)] = true;
      Plan trial;
      describe_interleaved(trial, p, g, t, o, cuts, pipes, recompute);
      recompute[static_cast<std::size_t>(k)] = false;
      if (!best || memory_at(trial, r) < memory_at(*best, r)) best = std::move(trial);
    }
    if (!best) break;  // every stage of the rank recomputes already
    for (int k = 0; k < stages; ++k)
      recompute[static_cast<std::size_t>(k)] = best->stages[static_cast<std::size_t>(k)].recompute;
    plan = std::move(*best);
  }
  if (const int r = place_over_memory(plan, t, pipes); r >= 0) {
    std::vector<int> held;
    for (int k = 0; k < stages; ++k)
      if (pipes.place_of(k) == r) held.push_back(k);
    PIPELINE_FAIL(
        ConfigError,
        "the interleaved plan ({} stages per worker{}) needs {:.4g} bytes on rank {} (stages {}), "
        "more than the {:.4g} available; use fewer virtual stages, more workers or more memory{}",
        o.virtual_stages,
        pipes.pipelines > 1 ? fmt::format(", {} pipelines of {}", pipes.pipelines, pipes.positions)
                            : "",
        static_cast<double>(memory_at(plan, r)), r, fmt::join(held, ", "),
        *t.memory_bytes_per_worker,
        o.recompute == Recompute::None ? ", or recompute activations (--recompute auto)" : "");
  }
  // Data parallelism steps once per minibatch too (`p` has no steps in its backward times).
  plan.predicted.data_parallel_time_per_minibatch_s = data_parallel_time(p, t, o);
  return plan;
}

// Exact DP over the cut points of the layer order for `pipes`: v·p contiguous stages, stage k at
// place k mod p of every pipeline, minimising the slowest stage's max(compute + allreduce,
// transfer in, transfer out). The model must have the v·p − 1 places to cut.
Plan partition_interleaved_pipes(const Profile& p, const StateGraph& g, const Topology& t,
                                 const PartitionOptions& o, const InterleavedPipes& pipes) {
  const int places = pipes.positions, d = pipes.pipelines, n = g.size();
  const int stages = o.virtual_stages * places;
  const bool charge = !o.ignore_transfer;
  const double R = o.activation_compression.value_or(1.0);
  // The bandwidth of the cut after stage k: between the places of stages k and k + 1 (none within
  // one place, as at the bottom of a V).
  std::vector<double> bandwidth(static_cast<std::size_t>(stages), 0.0);
  for (int k = 0; k + 1 < stages; ++k) {
    const int a = pipes.place_of(k), b = pipes.place_of(k + 1);
    bandwidth[static_cast<std::size_t>(k)] =
        a == b ? 0.0
               : t.levels[static_cast<std::size_t>(span_level(pipes.groups, a, b))]
                     .bandwidth_bytes_per_s;
  }
  // Seconds of the transfer across the cut after stage k, which ends before layer j (each
  // pipeline sends its share).
  const auto cut_time = [&](int k, int j) {
    if (!charge || bandwidth[static_cast<std::size_t>(k)] == 0.0) return 0.0;
    return transfer_time(g.boundary_bytes[static_cast<std::size_t>(j) - 1], d,
                         bandwidth[static_cast<std::size_t>(k)], R);
  };
  // Compute and allreduce of the stage [i, j), in describe()'s arithmetic; under --recompute all
  // every stage runs its forward twice.
  const bool twice = o.recompute == Recompute::All;
  const auto stage_compute = [&](int i, int j) {
    const double T =
        g.stage_compute_s(i - 1, j - 1) + (twice ? g.stage_forward_s(i - 1, j - 1) : 0.0);
    return T / d + pipes.sync_s(StateGraph::stage_sum(g.parameter_bytes, i - 1, j - 1)) /
                       pipes.microbatches;
  };
  // A stage may end before layer j (StateGraph::can_end).
  const auto cut_allowed = [&](int j) { return j == n || g.can_end(j - 1); };
  // Stage `stage` over layers [i, j): its compute, its transfer out (`out`, hoisted by the callers
  // out of their loop over i) and its transfer in, whichever is slowest.
  const auto stage_cost = [&](int stage, int i, int j, double out) {
    const double cost = std::max(stage_compute(i, j), out);
    return stage > 0 ? std::max(cost, cut_time(stage - 1, i)) : cost;
  };
  // best[k][j]: the slowest of the first k stages when they cover layers [0, j); from[k][j]: where
  // the k-th of them starts.
  const auto width = static_cast<std::size_t>(n) + 1;
  const auto cell = [&](int k, int j) { return static_cast<std::size_t>(k) * width + static_cast<std::size_t>(j); };
  std::vector<double> best((static_cast<std::size_t>(stages) + 1) * width, kInf);
  std::vector<int> from(best.size(), -1);
  best[0] = 0;
  for (int k = 1; k <= stages; ++k) {
    const int stage = k - 1;
    for (int j = k; j <= n - (stages - k); ++j) {
      if (!cut_allowed(j)) continue;
      const double out = k < stages ? cut_time(stage, j) : 0.0;
      double b = kInf;
      int f = -1;
      for (int i = k - 1; i < j; ++i) {
        const double before = best[cell(k - 1, i)];
        if (!(before < b)) continue;
        const double cost = stage_cost(stage, i, j, out);
        const double cand = std::max(before, cost);
        if (cand < b) {
          b = cand;
          f = i;
        }
      }
      best[cell(k, j)] = b;
      from[cell(k, j)] = f;
    }
  }
  const double optimum = best[cell(stages, n)];
  PIPELINE_CHECK(std::isfinite(optimum), "internal: no interleaved plan of {} stages over {} layers", stages, n);
  // Among the cuts whose every stage is within the optimum, the one with the least sum of squared
  // stage times: the most even one, so that each rank's sum over its stages (its time per
  // minibatch under interleaved 1F1B) is balanced too. Without it, a layer slower than all the
  // others fixes the optimum and the earliest cuts within it could leave a rank almost idle.
  std::vector<double>& squares = best;
  std::fill(squares.begin(), squares.end(), kInf);
  std::fill(from.begin(), from.end(), -1);
  squares[0] = 0;
  for (int k = 1; k <= stages; ++k) {
    const int stage = k - 1;
    for (int j = k; j <= n - (stages - k); ++j) {
      if (!cut_allowed(j)) continue;
      const double out = k < stages ? cut_time(stage, j) : 0.0;
      double b = kInf;
      int f = -1;
      for (int i = k - 1; i < j; ++i) {
        const double before = squares[cell(k - 1, i)];
        if (!std::isfinite(before)) continue;
        const double cost = stage_cost(stage, i, j, out);
        if (cost > optimum) continue;
        const double cand = before + cost * cost;
        if (cand < b) {
          b = cand;
          f = i;
        }
      }
      squares[cell(k, j)] = b;
      from[cell(k, j)] = f;
    }
  }
  std::vector<int> cuts(static_cast<std::size_t>(stages) + 1, 0);
  cuts.back() = n;
  for (int k = stages; k > 0; --k)
    cuts[static_cast<std::size_t>(k) - 1] = from[cell(k, cuts[static_cast<std::size_t>(k)])];
  // A rank's time is the sum over its stages, and which stages share a rank (the placement: k mod
  // p, or a V) is more than a DP over prefixes sees. So, keeping every stage within the optimum,
  // move single cut points while that lowers the slowest rank's sum of compute (then the sum of
  // their squares): each move strictly lowers the pair, so this ends.
  const auto cost_of = [&](int k) {
    const int i = cuts[static_cast<std::size_t>(k)], j = cuts[static_cast<std::size_t>(k) + 1];
    return stage_cost(k, i, j, k + 1 < stages ? cut_time(k, j) : 0.0);
  };
  const auto rank_balance = [&] {
    std::vector<double> sum(static_cast<std::size_t>(places), 0.0);
    for (int k = 0; k < stages; ++k)
      sum[static_cast<std::size_t>(pipes.place_of(k))] +=
          stage_compute(cuts[static_cast<std::size_t>(k)], cuts[static_cast<std::size_t>(k) + 1]);
    double worst = 0, squares = 0;
    for (double x : sum) {
      worst = std::max(worst, x);
      squares += x * x;
    }
    return std::pair{worst, squares};
  };
  // Moves single cut points by a layer while `keeps` (which sees the moved cut k) takes a move.
  const auto move_cuts = [&](const auto& keeps) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int k = 1; k < stages; ++k)
        for (int step : {-1, 1}) {
          auto& c = cuts[static_cast<std::size_t>(k)];
          const int was = c;
          c = was + step;
          if (c > cuts[static_cast<std::size_t>(k) - 1] &&
              c < cuts[static_cast<std::size_t>(k) + 1] && cut_allowed(c) && keeps(k)) {
            moved = true;
            continue;
          }
          c = was;
        }
    }
  };
  const double slack = optimum * (1 + 1e-12);
  auto current = rank_balance();
  move_cuts([&](int k) {
    // Every stage within the optimum: the neighbours' transfers change with the cut too.
    for (int s = std::max(k - 2, 0); s <= std::min(k + 1, stages - 1); ++s)
      if (cost_of(s) > slack) return false;
    const auto next = rank_balance();
    if (!(next.first < current.first * (1 - 1e-12) ||
          (next.first <= current.first && next.second < current.second * (1 - 1e-12))))
      return false;
    current = next;
    return true;
  });
  const std::vector<bool> recompute(static_cast<std::size_t>(stages), twice);
  Plan plan;
  const double slowest = describe_interleaved(plan, p, g, t, o, cuts, pipes, recompute);
  PIPELINE_CHECK(std::abs(slowest - optimum) <= 1e-9 * optimum,
                 "internal: the slowest stage of the interleaved plan ({}) is not the optimum ({})",
                 slowest, optimum);
  // What counts is the minibatch's time under the schedule, which describe_interleaved walks: a
  // rank whose stages differ widely in time waits on the others' long ones, which neither the
  // slowest stage nor the ranks' sums show. So move single cut points, now past the optimum too,
  // while that shortens the walked minibatch by more than rounding and the memory still fits (a
  // plan that needs recomputation to fit is left as it is). The order follows the stage times
  // (a V's is built on them; a looped plan walks every group of microbatches) and takes longer to
  // choose than to walk, so a round of moves walks the order chosen for the cuts it starts from;
  // the next round chooses anew, and moves whose own order walks slower than the best cuts so far
  // are undone. Once a round moves nothing, a looped plan takes one more round that judges each
  // move on its own order (a V's would build one per move), so that no single move shortens it.
  if (place_over_memory(plan, t, pipes) < 0) {
    const bool looped = pipes.shape.placement == StagePlacement::Looped;
    double best = plan.predicted.time_per_minibatch_s;
    std::vector<int> best_cuts = cuts;
    for (bool exact = false;;) {
      InterleavedChoice order;  // (chosen by the first describe for the cuts as they stand)
      Plan now;
      describe_interleaved(now, p, g, t, o, cuts, pipes, recompute, &order);
      double time = now.predicted.time_per_minibatch_s;
      if (time < best * (1 - 1e-9)) {
        best = time;
        best_cuts = cuts;
      } else if (cuts != best_cuts) {
        cuts = best_cuts;  // (the round's moves did not pay under their own order)
        if (exact || !looped) break;
        exact = true;
        continue;
      }
      bool moved = false;
      move_cuts([&](int) {
        Plan trial;
        InterleavedChoice own;
        describe_interleaved(trial, p, g, t, o, cuts, pipes, recompute, exact ? &own : &order);
        if (trial.predicted.time_per_minibatch_s >= time * (1 - 1e-9) ||
            place_over_memory(trial, t, pipes) >= 0)
          return false;
        time = trial.predicted.time_per_minibatch_s;
        moved = true;
        return true;
      });
      if (moved) {
        exact = false;
        continue;
      }
      if (exact || !looped) break;
      exact = true;
    }
  }
  return fit_interleaved(p, g, t, o, cuts, pipes);
}

// The fastest interleaved plan over the data-parallel degrees d that divide the workers into
// pipelines of at least 2 (d = 1 only with --straight): each degree's exact cut, then the least
// predicted time per minibatch (ties: fewer pipelines). Memory limits rule degrees out; when
// none fits, the error of the single pipeline (or of the last degree tried) stands.
Plan partition_interleaved(const Profile& p, const Topology& t, const PartitionOptions& o) {
  const StateGraph g = StateGraph::linear(p);
  const int w = t.workers();
  const int m = planned_microbatches(o, w);
  int cut_points = 0;  // where a stage may end, the model's end aside
  for (int j = 1; j < g.size(); ++j) cut_points += g.can_end(j - 1);
  std::optional<Plan> best;
  std::optional<ConfigError> refused;
  for (int d = 1; d <= (o.straight ? 1 : std::min(w / 2, m)); ++d) {
    if (w % d != 0 || o.virtual_stages * (w / d) > cut_points + 1) continue;
    // Under --recompute auto, the cut of stashing stages with those of its ranks that would not
    // fit recomputing, and the cut of all stages recomputing, whichever is faster (the error kept
    // is then the second's).
    std::vector<Recompute> tries{o.recompute};
    if (o.recompute == Recompute::Auto) tries.push_back(Recompute::All);
    for (Recompute recompute : tries) {
      PartitionOptions with = o;
      with.recompute = recompute;
      try {
        Plan plan = partition_interleaved_pipes(p, g, t, with, InterleavedPipes(t, d, with));
        if (!best || plan.predicted.time_per_minibatch_s < best->predicted.time_per_minibatch_s)
          best = std::move(plan);
      } catch (const ConfigError& e) {
        if (recompute == tries.back() && (!refused || d == 1)) refused = e;
      }
    }
  }
  if (best) return *best;
  if (refused) throw *refused;
  // The shortest pipeline the workers make: one of all of them under --straight, else the least
  // divisor of at least 2 (all of them when their count is prime).
  int places = w;
  for (int q = 2; !o.straight && q < w; ++q)
    if (w % q == 0) {
      places = q;
      break;
    }
  PIPELINE_FAIL(ConfigError,
                "an interleaved plan on {} workers needs pipelines of at least {} of them{}, and "
                "{} stages ({} virtual stages per worker) need {} cuts between layers, but {} has "
                "only {} where a stage may end (a ReLU and the max pool after it stay together); "
                "use fewer virtual stages{}",
                w, places,
                o.straight             ? " (--straight: one pipeline)"
                : places == w && w > 2 ? fmt::format(" ({} is prime)", w)
                                       : "",
                o.virtual_stages * places, o.virtual_stages, o.virtual_stages * places - 1,
                p.model.empty() ? "the model" : p.model, cut_points,
                o.straight   ? " or workers"
                : places > 2 ? " or a worker count that makes shorter pipelines"
                             : "");
}

// Microbatches stage k of a straight pipeline of p holds at once under a flush schedule, with m of
// them per pipeline and minibatch.
int flush_held(std::string_view schedule, int k, int p, int m) {
  if (schedule == "gpipe") return m;
  if (schedule == "zb-h1") return std::min(m, p);
  return std::min(m, p - k);
}

// One degree d of partition_flush(): d copies of a straight pipeline of p stages over `measured`
// (its times without optimizer steps; `g` its linear states), every stage fitting. nullopt where
// no cut fits; the plan otherwise, its predicted time per minibatch of m microbatches in `time`.
std::optional<Plan> partition_flush_degree(const Profile& measured, const Profile& charged,
                                           const StateGraph& g, const SplitCosts& split_costs,
                                           const Topology& t, const PartitionOptions& o, int d,
                                           int m, double& time) {
  const int w = t.workers(), p = w / d, n = g.size();
  const int mp = (m + d - 1) / d;  // microbatches per pipeline
  const double R = o.activation_compression.value_or(1.0);
  const std::optional<double> memory = t.memory_bytes_per_worker;
  std::vector<int> groups(t.levels.size() + 1, 1);
  for (std::size_t l = 0; l < t.levels.size(); ++l) groups[l + 1] = groups[l] * t.levels[l].count;
  const auto bandwidth = [&](int a, int b) {
    return t.levels[static_cast<std::size_t>(span_level(groups, a, b))].bandwidth_bytes_per_s;
  };
  // Per microbatch: the transfer across the cut before layer j, after stage k (to stage k + 1).
  const auto cut_time = [&](int k, int j) {
    if (o.ignore_transfer) return 0.0;
    return transfer_time(g.boundary_bytes[static_cast<std::size_t>(j) - 1], 1,
                         bandwidth(k * d, (k + 1) * d), R);
  };
  // Stage k over layers [i, j): whether it recomputes and its compute per microbatch; nullopt
  // where it fits in memory neither way the options allow.
  struct Choice {
    bool recompute = false;
    double compute_s = 0;
    double memory_bytes = 0;
  };
  const bool split = o.schedule == "zb-h1";
  // (`held`: the microbatches the stage holds, flush_held()'s unless given; `pending`, under
  // ZB-H1: of those, the most whose I has run and whose W has not, which keep their output
  // gradients (and, recomputing, their rebuilt activations): the stage's W lag + 1,
  // zero_bubble_lag(), k + 1 at PipeDream's warm-ups.)
  const auto choose = [&](int k, int i, int j, int held = 0,
                          int pending = 0) -> std::optional<Choice> {
    const int s = i - 1, e = j - 1;
    if (held <= 0) held = flush_held(o.schedule, k, p, mp);
    pending = std::min(held, pending > 0 ? pending : k + 1);
    const double par = StateGraph::stage_sum(g.parameter_bytes, s, e);
    const double act = g.stage_activation_bytes(s, e);
    const double input = s < 0 ? 0.0 : g.boundary_bytes[static_cast<std::size_t>(s)];
    const double loss = g.stage_loss_gradient_bytes(e);
    const double work = working_bytes(g, s, e, R);
    const double kept = split ? split_costs.kept_bytes(i, j) : 0.0;
    const double stash = stage_memory_bytes(par, 0.0, act, held, o.optimizer_state_factor, input,
                                            loss, work, g.stage_frees_input(s, e)) +
                         (split ? pending * split_held_bytes(kept, act, false) : 0.0);
    // (Split, the rebuilt activations are held from each I to its W: in split_held_bytes(), not
    // once for the backward in progress.)
    const double rebuilt =
        recompute_stage_memory_bytes(par, 0.0, act, input, g.stage_recompute_input_bytes(s), loss,
                                     held, o.optimizer_state_factor, work) +
        (split ? pending * split_held_bytes(kept, act, true) - act : 0.0);
    const auto fits = [&](double bytes) { return !memory || bytes <= *memory; };
    const bool recompute = o.recompute == Recompute::All ||
                           (o.recompute == Recompute::Auto && !fits(stash) && fits(rebuilt));
    if (!fits(recompute ? rebuilt : stash)) return std::nullopt;
    return Choice{recompute,
                  g.stage_compute_s(s, e) + (recompute ? g.stage_forward_s(s, e) : 0.0) +
                      (split ? split_costs.extra_s(i, j) : 0.0),
                  recompute ? rebuilt : stash};
  };
  const auto cut_allowed = [&](int j) { return j == n || g.can_end(j - 1); };
  // Stage k over [i, j) per microbatch, its compute as chosen: max(compute, transfer in, out).
  const auto cost = [&](int k, int i, int j, const Choice& c) {
    double x = c.compute_s;
    if (k > 0) x = std::max(x, cut_time(k - 1, i));
    if (k + 1 < p) x = std::max(x, cut_time(k, j));
    return x;
  };
  // The time per minibatch is a microbatch's way through the pipeline (the stages' compute, and
  // at each cut its activation and its gradient, one after the other) + (mp − 1) × the slowest
  // stage: a sum and a maximum over the stages. So each cell (k stages over layers [0, j)) keeps
  // the labels (slowest, way) that no other label of the cell beats in both, at most kLabels of
  // them (those of the least mp-weighted time; exact unless a cell has more).
  constexpr std::size_t kLabels = 32;
  struct Label {
    double slowest = 0, way = 0;
    int from = -1;       // where the k-th stage starts
    std::size_t up = 0;  // the label of cell (k − 1, from) it extends
  };
  const auto weighted = [&](const Label& l) { return l.way + (mp - 1) * l.slowest; };
  const auto width = static_cast<std::size_t>(n) + 1;
  const auto cell = [&](int k, int j) {
    return static_cast<std::size_t>(k) * width + static_cast<std::size_t>(j);
  };
  std::vector<std::vector<Label>> labels((static_cast<std::size_t>(p) + 1) * width);
  labels[0] = {Label{}};
  std::vector<Label> next;
  for (int k = 1; k <= p; ++k)
    for (int j = k; j <= n - (p - k); ++j) {
      if (!cut_allowed(j)) continue;
      next.clear();
      for (int i = k - 1; i < j; ++i) {
        const std::vector<Label>& before = labels[cell(k - 1, i)];
        if (before.empty()) continue;
        const std::optional<Choice> choice = choose(k - 1, i, j);
        if (!choice) continue;
        const double c = cost(k - 1, i, j, *choice);
        const double way = choice->compute_s + (k < p ? 2 * cut_time(k - 1, j) : 0.0);
        for (std::size_t b = 0; b < before.size(); ++b)
          next.push_back({std::max(before[b].slowest, c), before[b].way + way, i, b});
      }
      // The Pareto front: by slowest, then way; keep those whose way beats every faster one's.
      std::sort(next.begin(), next.end(), [](const Label& a, const Label& b) {
        return a.slowest != b.slowest ? a.slowest < b.slowest : a.way < b.way;
      });
      std::vector<Label>& front = labels[cell(k, j)];
      for (const Label& l : next)
        if (front.empty() || l.way < front.back().way) front.push_back(l);
      if (front.size() > kLabels) {
        std::sort(front.begin(), front.end(),
                  [&](const Label& a, const Label& b) { return weighted(a) < weighted(b); });
        front.resize(kLabels);
        std::sort(front.begin(), front.end(),
                  [](const Label& a, const Label& b) { return a.slowest < b.slowest; });
      }
    }
  const std::vector<Label>& done = labels[cell(p, n)];
  if (done.empty()) return std::nullopt;
  // The least time; of equal ones (to rounding) the least slowest stage.
  std::size_t pick = 0;
  for (std::size_t b = 1; b < done.size(); ++b)
    if (weighted(done[b]) < weighted(done[pick]) * (1 - 1e-12)) pick = b;
  std::vector<int> cuts(static_cast<std::size_t>(p) + 1, n);
  for (int k = p, j = n; k > 0; --k) {
    const Label& l = labels[cell(k, j)][pick];
    cuts[static_cast<std::size_t>(k) - 1] = l.from;
    pick = l.up;
    j = l.from;
  }
  // The plan at the cuts `at`: describe()'s per-stage breakdown, then the flush schedule's memory
  // and time; nullopt where a stage does not fit.
  const auto plan_at = [&](const std::vector<int>& at) -> std::optional<std::pair<Plan, double>> {
    const std::vector<FinalStage> fs = stages_at_cuts(at, [d](int k) {
      std::vector<int> ranks;
      for (int r = 0; r < d; ++r) ranks.push_back(k * d + r);
      return ranks;
    });
    PartitionOptions stashing = o;  // describe() decides no recomputation: the choices above do
    stashing.recompute = Recompute::None;
    Plan plan;
    describe(plan, g, t, stashing, fs, std::nullopt, false);
    std::vector<double> compute, message;  // per stage: its compute, and its input's message
    StagePassTimes passes;                 // per stage, a microbatch's passes
    std::vector<double> steps, syncs;      // per stage, its optimizer step and allreduce
    double slowest = 0;                    // the slowest stage's max(compute, transfers)
    for (int k = 0; k < p; ++k) {
      PlanStage& ps = plan.stages[static_cast<std::size_t>(k)];
      const int i = at[static_cast<std::size_t>(k)], j = at[static_cast<std::size_t>(k) + 1];
      const std::optional<Choice> choice = choose(k, i, j);
      if (!choice) return std::nullopt;
      const Choice& c = *choice;
      slowest = std::max(slowest, cost(k, i, j, c));
      ps.recompute = c.recompute;
      ps.compute_s = c.compute_s / d;
      ps.memory_bytes = c.memory_bytes;
      ps.in_flight = 0;  // 1F1B-stash's count, which describe() set
      ps.delay_allreduce = true;
      compute.push_back(c.compute_s);
      message.push_back(k > 0 ? cut_time(k - 1, i) : 0.0);
      const double forward = g.stage_forward_s(i - 1, j - 1);
      steps.push_back(step_s(measured, i, j, o.optimizer));
      const SplitBackward halves = split_backward_s(measured, i, j, c.recompute ? forward : 0.0);
      passes.forward_s.push_back(forward);
      passes.backward_s.push_back(c.compute_s - forward);
      passes.input_s.push_back(halves.input_s);
      passes.weight_s.push_back(halves.weight_s);
      passes.message_s.push_back(message.back());
      const double sync = d > 1 ? sync_time(StateGraph::stage_sum(g.parameter_bytes, i - 1, j - 1),
                                            d, bandwidth(k * d, k * d + d - 1), 1.0)
                                : 0.0;
      ps.sync_s = sync / m;  // per microbatch, as time_per_minibatch_s
      syncs.push_back(sync);
    }
    // Over slow links: each stage starts enough microbatches before its first backward that every
    // loop to a later stage and back fits in them (stash_in_flights with transfers, at the slowest
    // stage's pace), where that fits in memory without recomputing more; the schedule runs those
    // depths (PlanStage::in_flight: warm-up + 1). Under 1F1B-flush a stage holds its own depth's
    // microbatches, under ZB-H1 every stage the first stage's (flush_held); GPipe holds them all.
    if (o.schedule != "gpipe") {
      std::vector<int> depths = stash_in_flights(
          p, std::vector<int>(static_cast<std::size_t>(p), 1), compute, message, slowest);
      for (int& depth : depths) depth = std::min(depth, mp);
      // The microbatches stage k holds at the depths, and whether every stage fits them.
      const auto held_at = [&](int k) {
        return std::max(flush_held(o.schedule, k, p, mp),
                        split ? depths.front() : depths[static_cast<std::size_t>(k)]);
      };
      // Under ZB-H1, stage k's W lag + 1 at the depths, from the warm-ups the schedule runs there.
      const auto pending_at = [&](int k) {
        std::vector<int> pipedream, in_flight;
        for (int stage = 0; stage < p; ++stage) {
          pipedream.push_back(p - 1 - stage);
          in_flight.push_back(
              std::max(depths[static_cast<std::size_t>(stage)], std::min(p - stage, mp)));
        }
        return zero_bubble_lag(capped_warmups(pipedream, in_flight, /*deepen=*/true), k) + 1;
      };
      const auto choose_at = [&](int k, int i, int j) {
        return choose(k, i, j, held_at(k), pending_at(k));
      };
      const auto fits = [&](int k) {
        const int i = at[static_cast<std::size_t>(k)], j = at[static_cast<std::size_t>(k) + 1];
        const std::optional<Choice> c = choose_at(k, i, j);
        return c && c->recompute == plan.stages[static_cast<std::size_t>(k)].recompute;
      };
      // Stage by stage, lowered until it fits (under ZB-H1 the first stage's depth, which every
      // stage holds), never deeper than the stage before it (the schedule's depths do not rise).
      for (int k = 0; k < p; ++k) {
        int& depth = depths[static_cast<std::size_t>(split ? 0 : k)];
        if (k > 0)
          depths[static_cast<std::size_t>(k)] = std::min(depths[static_cast<std::size_t>(k)],
                                                         depths[static_cast<std::size_t>(k) - 1]);
        // (At flush_held()'s count every stage fits: the search above chose it so.)
        while (depth > 1 && !fits(k)) --depth;
        for (int& later : depths) later = std::min(later, depths.front());
      }
      for (int k = 0; k < p; ++k) {
        PlanStage& ps = plan.stages[static_cast<std::size_t>(k)];
        const int i = at[static_cast<std::size_t>(k)], j = at[static_cast<std::size_t>(k) + 1];
        ps.in_flight = std::max(depths[static_cast<std::size_t>(k)], std::min(p - k, mp));
        ps.memory_bytes = choose_at(k, i, j)->memory_bytes;
      }
    }
    // Each pipeline runs the order above as its schedule will (flush_warmups: the stages' planned
    // depths), the first one (of the most microbatches) the latest: its walk, with each stage's
    // allreduce from its closing backward in the runtime's buckets and then its step, is the
    // minibatch's time. (Over replicas the generator searches the depths from these on by probing
    // the schedule, which the partitioner cannot; where it finds faster ones the plan runs faster
    // than its figure.) The search above took a microbatch's way plus the slowest stage's pace for
    // each later microbatch, which ranks the cuts well but can miss what 1F1B's warm-up hides.
    std::vector<int> pipedream, in_flight;  // (PipeDream's depth: a forward per later stage)
    for (int k = 0; k < p; ++k) {
      pipedream.push_back(p - 1 - k);
      in_flight.push_back(plan.stages[static_cast<std::size_t>(k)].in_flight);
    }
    const std::vector<int> warmups = capped_warmups(pipedream, in_flight, /*deepen=*/true);
    std::vector<int> mbs(static_cast<std::size_t>(mp)), ranks(static_cast<std::size_t>(p));
    std::iota(mbs.begin(), mbs.end(), 0);
    std::iota(ranks.begin(), ranks.end(), 0);
    PassOrder order(static_cast<std::size_t>(p));
    for (int k = 0; k < p; ++k) {
      std::vector<StagePass>& mine = order[static_cast<std::size_t>(k)];
      const auto emit = [&](PassKind kind, int u) { mine.push_back({kind, k, u}); };
      const std::vector<int> before = forwards_before(
          mbs.size(), o.schedule == "gpipe" ? mp : warmups[static_cast<std::size_t>(k)]);
      if (split)
        zero_bubble_passes(mbs, before, zero_bubble_lag(warmups, k), emit);
      else
        one_f_one_b_passes(mbs, before, emit);
    }
    const double walked =
        minibatch_end_s(measured, walk_passes(order, ranks, mp, passes), ranks, at, syncs,
                        split ? passes.weight_s : passes.backward_s, steps);
    finish(plan, charged, t, o, walked / m);
    plan.schedule = o.schedule;
    plan.microbatches = m;
    plan.in_flight = 1;
    plan.predicted.peak_memory_bytes.assign(static_cast<std::size_t>(w), 0);
    for (const PlanStage& ps : plan.stages)
      for (int r : ps.ranks)
        plan.predicted.peak_memory_bytes[static_cast<std::size_t>(r)] =
            static_cast<std::int64_t>(ps.memory_bytes);
    return std::pair{std::move(plan), walked};
    return std::pair{std::move(plan), walked};
  };
  std::optional<std::pair<Plan, double>> best = plan_at(cuts);
  PIPELINE_CHECK(best.has_value(), "internal: the flush plan's own cut does not fit");
  // The dynamic program ranks cuts by a microbatch's way and the slowest stage's pace, which
  // misses what the schedule's warm-up hides: move single cut points while that shortens the
  // walked minibatch by more than rounding, every stage still fitting.
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 1; k < p; ++k)
      for (int step : {-1, 1}) {
        std::vector<int> trial = cuts;
        int& c = trial[static_cast<std::size_t>(k)];
        c += step;
        if (c <= trial[static_cast<std::size_t>(k) - 1] ||
            c >= trial[static_cast<std::size_t>(k) + 1] || !cut_allowed(c))
          continue;
        std::optional<std::pair<Plan, double>> next = plan_at(trial);
        if (!next || next->second >= best->second * (1 - 1e-9)) continue;
        best = std::move(next);
        cuts = std::move(trial);
        moved = true;
      }
  }
  time = best->second;
  return std::move(best->first);
}

// partition() for a flush schedule (partition.hpp): the fastest degree that fits.
Plan partition_flush(const Profile& measured, const Profile& charged, const Topology& t,
                     const PartitionOptions& o) {
  PIPELINE_CHECK_AS(ConfigError, o.cost_model == CostModel::Pipeline,
                    "planning for {} needs the pipeline cost model (PipeDream's plans 1f1b-stash): "
                    "drop --cost-model pipedream",
                    o.schedule);
  PIPELINE_CHECK_AS(ConfigError, o.virtual_stages == 1,
                    "--virtual-stages plans interleaved schedules of its own; drop --schedule {}",
                    o.schedule);
  PIPELINE_CHECK_AS(ConfigError, !o.allow_idle,
                    "a plan for {} puts a stage replica on every worker; --allow-idle does not "
                    "apply (give fewer workers instead)",
                    o.schedule);
  const int w = t.workers();
  const int m = planned_microbatches(o, w);
  const StateGraph g = StateGraph::linear(measured);
  const SplitCosts split_costs(measured);
  int cut_points = 0;  // where a stage may end, the model's end aside
  for (int j = 1; j < g.size(); ++j) cut_points += g.can_end(j - 1);
  PIPELINE_CHECK_AS(ConfigError, !o.straight || w <= cut_points + 1,
                    "a plan for {} in one pipeline of {} stages (--straight) needs {} cuts, but "
                    "the model has only {} places to cut; leave out --straight or give at most {} "
                    "workers",
                    o.schedule, w, w - 1, cut_points, cut_points + 1);
  std::optional<Plan> best;
  double best_time = kInf, data_parallel = 0;
  for (int d = o.straight ? 1 : w; d >= 1; --d) {
    if (w % d != 0 || w / d > cut_points + 1) continue;
    double time = 0;
    std::optional<Plan> plan =
        partition_flush_degree(measured, charged, g, split_costs, t, o, d, m, time);
    if (d == w && plan) data_parallel = time / m;
    if (plan && time < best_time * (1 - 1e-12)) {
      best = std::move(plan);
      best_time = time;
    }
  }
  PIPELINE_CHECK_AS(
      ConfigError, best.has_value(),
      "no plan for {} of {} workers{} fits{}: every cut of every pipeline depth needs more; "
      "use more workers or more memory{}",
      o.schedule, w, o.straight ? " in one pipeline" : "",
      t.memory_bytes_per_worker
          ? fmt::format(" in {:.4g} bytes per worker", *t.memory_bytes_per_worker)
          : "",
      o.recompute == Recompute::None ? ", or recompute activations (--recompute auto)" : "");
  if (data_parallel > 0) best->predicted.data_parallel_time_per_minibatch_s = data_parallel;
  return *best;
}

}  // namespace

namespace {

double data_parallel_seconds(const Profile& p, const Topology& t, const PartitionOptions& o) {
  double total = 0, par = 0;
  for (const auto& l : p.layers) {
    total += l.forward_s + l.backward_s;
    par += static_cast<double>(l.parameter_bytes);
  }
  double time = total;
  int inner = 1, group = 1;
  for (const auto& l : t.levels) {
    double share = o.cost_model == CostModel::PipeDream ? inner : group;
    time = (time + sync_time(par, l.count, l.bandwidth_bytes_per_s, share)) / l.count;
    inner = l.count;
    group *= l.count;
  }
  return time;
}

}  // namespace

std::vector<int> stash_in_flights_hiding_transfers(const Plan& plan, int workers, double period_s) {
  std::vector<double> replica_seconds, message_seconds;
  for (const PlanStage& ps : plan.stages) {
    replica_seconds.push_back(ps.compute_s * ps.replicas);
    message_seconds.push_back(ps.input_message_s);
  }
  return stash_in_flights(workers, plan.replica_counts(), replica_seconds, message_seconds,
                          period_s);
}

Profile with_optimizer_steps(const Profile& profile, const PartitionOptions& options) {
  if (options.optimizer.empty() || options.cost_model == CostModel::PipeDream) return profile;
  Profile charged = profile;
  for (LayerProfile& l : charged.layers) {
    l.backward_s += l.step_s.of(options.optimizer);
    if (l.at_stage_end) l.at_stage_end->backward_s += l.step_s.of(options.optimizer);
  }
  return charged;
}

double data_parallel_time(const Profile& p, const Topology& t, const PartitionOptions& o) {
  return data_parallel_seconds(with_optimizer_steps(p, o), t, o);
}

std::size_t antichain_state_budget(const Topology& topology, const PartitionOptions& options) {
  if (options.max_states > 0) return options.max_states;
  return topology.levels.size() == 1 ? 4000 : 1500;
}

StateGraph planning_states(const Profile& profile, std::size_t max_states) { return make_states(profile, max_states); }

namespace {

// partition(), and with explain = false try_partition(): nullopt where partition() would search
// for the memory that admits a plan and throw.
std::optional<Plan> partition_impl(const Profile& measured, const Topology& topology,
                                   const PartitionOptions& options, bool explain);

// The most workers of one level for which allow_idle plans every smaller count exactly (below).
constexpr int kMaxIdleSearchWorkers = 64;

// With idle workers allowed, the search charges each stage the minibatches in flight of a
// pipeline over every worker: it cannot know how many of the later workers a plan leaves idle.
// Under a memory limit a plan on fewer workers that fits only with fewer in flight was then
// missed (fashion-cnn on 6 workers at 100 Mbit/s with 60 MB each: 5-1 at 0.128 s a minibatch,
// where one worker alone takes 0.023 s). On one level of at most kMaxIdleSearchWorkers, the plan
// is instead the fastest of the plans without idle workers on every count up to the level's,
// each charged exactly, run on the first workers (the others idle); nullopt elsewhere, or where
// none fits (the search then says why).
std::optional<Plan> plan_on_fewest_fitting(const Profile& measured, const Topology& topology,
                                           const PartitionOptions& options) {
  const int workers = topology.workers();
  if (!options.allow_idle || !topology.memory_bytes_per_worker || topology.levels.size() != 1 ||
      options.cost_model != CostModel::Pipeline || workers > kMaxIdleSearchWorkers)
    return std::nullopt;
  PartitionOptions all_busy = options;
  all_busy.allow_idle = false;
  std::optional<Plan> best;
  for (int w = 1; w <= workers; ++w) {
    Topology sub = topology;
    sub.levels.front().count = w;
    std::optional<Plan> p;
    try {
      p = partition_impl(measured, sub, all_busy, false);
    } catch (const ConfigError&) {
      continue;  // (--straight on more workers than the model has stages, ...)
    }
    if (p && (!best || p->predicted.time_per_minibatch_s < best->predicted.time_per_minibatch_s))
      best = std::move(p);
  }
  if (!best) return std::nullopt;
  best->workers = workers;
  best->predicted.peak_memory_bytes.resize(static_cast<std::size_t>(workers), 0);
  best->predicted.data_parallel_time_per_minibatch_s =
      data_parallel_time(measured, topology, options);
  return best;
}

std::optional<Plan> partition_impl(const Profile& measured, const Topology& topology,
                                   const PartitionOptions& options, bool explain) {
  validate_profile(measured, measured.model.empty() ? "profile" : measured.model);
  const Profile profile = with_optimizer_steps(measured, options);
  validate_topology(topology);
  PIPELINE_CHECK_AS(ConfigError, !topology.typed(),
                    "the topology has worker types ({} of them); plan it with a profile per type "
                    "(partition_typed, or pipeline-partition --profile TYPE=profile.json for each)",
                    topology.types.size());
  if (options.activation_compression)
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(*options.activation_compression) && *options.activation_compression > 0,
                      "activation compression ratio must be positive, got {}", *options.activation_compression);
  check_recompute(options);
  check_schedule_request(profile, topology, options);
  if (!options.straight)
    for (std::size_t l = 0; l < topology.levels.size(); ++l)
      PIPELINE_CHECK_AS(
          ConfigError, topology.levels[l].count <= kMaxLevelCount,
          "topology level {} has {} workers, more than the {} the partitioner "
          "searches in one level (its time grows with the square of a level's count): "
          "describe the cluster as the levels it is wired in, e.g. --level 8:<bandwidth "
          "inside a server> --level {}:<bandwidth between servers>",
          l, topology.levels[l].count, kMaxLevelCount, (topology.levels[l].count + 7) / 8);
  if (plans_flush(options.schedule)) return partition_flush(measured, profile, topology, options);
  PIPELINE_CHECK_AS(ConfigError, options.schedule == "1f1b-stash",
                    "the partitioner plans for 1f1b-stash, 1f1b-flush, zb-h1 or gpipe, not '{}'{}",
                    options.schedule,
                    options.schedule.starts_with("interleaved") || options.schedule == "zb-v"
                        ? " (interleaved plans: --virtual-stages 2, and --stage-placement v for "
                          "zb-v)"
                        : "");
  if (options.virtual_stages > 1) return partition_interleaved(measured, topology, options);
  if (const std::optional<Plan> fewer = plan_on_fewest_fitting(measured, topology, options))
    return fewer;
  const StateGraph g = make_states(profile, antichain_state_budget(topology, options));
  std::optional<double> memory = topology.memory_bytes_per_worker;
  auto solve = [&](std::optional<double> mem, const PartitionOptions& opts) {
    auto s = std::make_unique<Solver>(g, topology, opts, mem);
    s->solve_levels();
    double t = s->best_time();
    return std::make_pair(t, std::move(s));
  };
  auto [best, solver] = solve(memory, options);
  if (!std::isfinite(best) && !explain) return std::nullopt;
  if (!std::isfinite(best)) {
    std::string hint;
    if (memory) {
      // The smallest memory that admits a plan: the feasible set only grows with memory.
      double lo = *memory, hi = *memory * 2;
      for (int it = 0; it < 80; ++it) {
        if (std::isfinite(solve(hi, options).first)) break;
        lo = hi;
        hi *= 2;
      }
      for (int it = 0; it < 40 && hi - lo > 1e-4 * hi; ++it) {
        double mid = 0.5 * (lo + hi);
        (std::isfinite(solve(mid, options).first) ? hi : lo) = mid;
      }
      // Both figures rounded up, so that either given as --memory admits the plan.
      const double digits = std::pow(10.0, std::floor(std::log10(hi)) - 3);
      hint = fmt::format(
          "; the smallest memory per worker that admits a plan is about {:.4g} bytes ({:.3f} GiB)",
          std::ceil(hi / digits) * digits, std::ceil(hi / 1073741824.0 * 1000) / 1000);
      if (options.recompute == Recompute::None && options.cost_model == CostModel::Pipeline) {
        PartitionOptions with = options;
        with.recompute = Recompute::Auto;
        if (std::isfinite(solve(memory, with).first))
          hint += "; with activation recomputation a plan fits: pass --recompute auto";
      }
      PIPELINE_FAIL(ConfigError, "no plan fits in {:.4g} bytes of memory per worker{}", *memory, hint);
    }
    int cuts = 0, kept = 0;
    for (int e = 0; e + 1 < g.size(); ++e) (g.can_end(e) ? cuts : kept) += 1;
    const std::string places =
        kept == 0 || !g.chain()
            ? std::string()
            : fmt::format(
                  " (it has {} places where a stage may end: {} layers stay with the layer "
                  "after them, a ReLU with its max pool)",
                  cuts, kept);
    PIPELINE_CHECK_AS(
        ConfigError,
        !g.chain() || !options.straight || options.allow_idle || topology.workers() <= cuts + 1,
        "no plan gives each of the {} workers a stage of its own (--straight): the model can be "
        "cut in at most {} stages{}; give at most {} workers, pass --allow-idle, or drop "
        "--straight",
        topology.workers(), cuts + 1, places, cuts + 1);
    PIPELINE_FAIL(ConfigError, "no feasible plan for this profile and topology{}", places);
  }
  std::vector<Solver::Expanded> parts;
  solver->expand(static_cast<int>(topology.levels.size()) - 1, -1, g.size() - 1, {0}, {}, parts);
  std::vector<FinalStage> stages;
  for (auto& x : parts)
    stages.push_back({g.layers_between(x.seg.s, x.seg.e), x.seg.s, x.seg.e, x.ranks, x.compute_path, x.transfer_path,
                      x.recompute});
  Plan plan;
  const double slowest = describe(plan, g, topology, options, stages, memory, false);
  PIPELINE_CHECK(slowest == best, "internal: the slowest stage of the expanded plan ({}) is not the optimum ({})", slowest, best);
  finish(plan, profile, topology, options, best);
  return plan;
}

}  // namespace

namespace {

// Whether the whole model, replicated on every worker under 1F1B-stash (one minibatch in flight,
// no recomputation), fits the topology's memory: the data-parallel baseline a plan is compared
// with exists only then.
bool data_parallel_fits(const Profile& measured, const Topology& topology,
                        const PartitionOptions& options) {
  const std::optional<double> memory = topology.memory_bytes_per_worker;
  if (!memory) return true;
  PartitionOptions whole = options;
  whole.schedule = "1f1b-stash";
  whole.virtual_stages = 1;
  whole.recompute = Recompute::None;
  const Profile profile = with_optimizer_steps(measured, whole);
  const StateGraph g = StateGraph::linear(profile);
  FinalStage all;  // every layer on every worker
  for (int v = 0; v < profile.size(); ++v) all.layers.push_back(v);
  all.s = -1;
  all.e = profile.size() - 1;
  for (int r = 0; r < topology.workers(); ++r) all.ranks.push_back(r);
  Plan plan;
  describe(plan, g, topology, whole, {all}, memory, /*check_memory=*/false);
  return plan.stages.front().memory_bytes <= *memory;
}

// partition_impl with the data-parallel baseline left out (0) where it does not fit.
std::optional<Plan> partition_with_baseline(const Profile& profile, const Topology& topology,
                                            const PartitionOptions& options, bool explain) {
  std::optional<Plan> plan = partition_impl(profile, topology, options, explain);
  if (plan && plan->predicted.data_parallel_time_per_minibatch_s > 0 &&
      !data_parallel_fits(profile, topology, options))
    plan->predicted.data_parallel_time_per_minibatch_s = 0;
  return plan;
}

}  // namespace

Plan partition(const Profile& profile, const Topology& topology, const PartitionOptions& options) {
  return *partition_with_baseline(profile, topology, options, true);
}

std::optional<Plan> try_partition(const Profile& profile, const Topology& topology, const PartitionOptions& options) {
  return partition_with_baseline(profile, topology, options, false);
}

Recompute parse_recompute(std::string_view text) {
  if (text == "none") return Recompute::None;
  if (text == "auto") return Recompute::Auto;
  if (text == "all") return Recompute::All;
  PIPELINE_FAIL(ConfigError, "--recompute '{}': expected none, auto or all", text);
}

std::vector<ManualStage> parse_manual_stages(std::string_view text) {
  std::vector<ManualStage> out;
  std::size_t pos = 0;
  auto number = [&](std::string_view s, const char* what) {
    int v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty())
      PIPELINE_FAIL(ConfigError, "cannot parse --stages '{}': {} '{}' is not a non-negative integer (expected e.g. 0:5x2,5:12,12:20)",
                    text, what, s);
    return v;
  };
  PIPELINE_CHECK_AS(ConfigError, !text.empty(), "--stages is empty; expected e.g. 0:5x2,5:12,12:20");
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    auto colon = item.find(':');
    PIPELINE_CHECK_AS(ConfigError, colon != std::string_view::npos,
                      "cannot parse --stages item '{}': expected BEGIN:END or BEGIN:ENDxREPLICAS", item);
    ManualStage st;
    st.begin = number(item.substr(0, colon), "begin");
    std::string_view rest = item.substr(colon + 1);
    auto x = rest.find('x');
    st.end = number(rest.substr(0, x), "end");
    st.replicas = x == std::string_view::npos ? 1 : number(rest.substr(x + 1), "replicas");
    PIPELINE_CHECK_AS(ConfigError, st.replicas >= 1, "--stages item '{}' has {} replicas; need at least 1", item, st.replicas);
    PIPELINE_CHECK_AS(ConfigError, st.end > st.begin, "--stages item '{}' is empty (end must exceed begin)", item);
    out.push_back(st);
    if (comma == text.size()) break;
  }
  return out;
}

Plan evaluate_stages(const Profile& measured, const Topology& topology,
                     const std::vector<ManualStage>& manual, const PartitionOptions& options) {
  validate_profile(measured, measured.model.empty() ? "profile" : measured.model);
  const Profile profile = with_optimizer_steps(measured, options);
  validate_topology(topology);
  PIPELINE_CHECK_AS(ConfigError, !topology.typed(),
                    "manual stages are evaluated on a topology of one kind of worker; this one has {} "
                    "worker types",
                    topology.types.size());
  PIPELINE_CHECK_AS(
      ConfigError, options.schedule == "1f1b-stash",
      "manual stages are evaluated for 1f1b-stash (or, with --virtual-stages, their "
      "interleaved schedule); time them under {} with pipeline-simulate --schedule {}",
      options.schedule, options.schedule);
  PIPELINE_CHECK_AS(ConfigError, !manual.empty(), "a manual plan needs at least one stage");
  check_recompute(options);
  int next = 0, workers = 0;
  for (const ManualStage& m : manual) {
    PIPELINE_CHECK_AS(ConfigError, m.begin == next,
                      "manual stages must cover the layers in order without gaps: a stage starts at {} where {} was expected",
                      m.begin, next);
    next = m.end;
    workers += m.replicas;
  }
  PIPELINE_CHECK_AS(ConfigError, next == profile.size(), "manual stages end at layer {} but the model has {} layers", next,
                    profile.size());
  check_schedule_request(profile, topology, options);
  if (options.virtual_stages > 1) {
    // Every stage with the same replicas r: r pipelines of p = workers / r ranks.
    const int w = topology.workers(), r = manual.front().replicas;
    for (const ManualStage& m : manual)
      PIPELINE_CHECK_AS(ConfigError, m.replicas == r,
                        "stage {}:{} asks for {} replicas but the first stage for {}: the stages "
                        "of an interleaved plan (--virtual-stages {}) have the same replicas, one "
                        "per pipeline",
                        m.begin, m.end, m.replicas, r, options.virtual_stages);
    PIPELINE_CHECK_AS(ConfigError, w % r == 0 && w / r >= 2 && !(options.straight && r > 1),
                      "{} pipelines (replicas of every stage) on {} workers: the workers must "
                      "make {} pipelines of at least 2{}",
                      r, w, r, options.straight ? ", and --straight forbids replicas" : "");
    const int places = w / r;
    PIPELINE_CHECK_AS(
        ConfigError,
        static_cast<std::int64_t>(manual.size()) == std::int64_t{options.virtual_stages} * places,
        "an interleaved plan of {} virtual stages per worker on {} workers{} has {} stages, got {}",
        options.virtual_stages, w, r > 1 ? fmt::format(" ({} pipelines of {})", r, places) : "",
        std::int64_t{options.virtual_stages} * places, manual.size());
    std::vector<int> cuts;
    for (const ManualStage& m : manual) cuts.push_back(m.begin);
    cuts.push_back(next);
    const InterleavedPipes pipes(topology, r, options);
    PIPELINE_CHECK_AS(ConfigError, pipes.microbatches >= r,
                      "{} pipelines deal a minibatch's microbatches round-robin, so it needs at "
                      "least {}; got --microbatches {}",
                      r, r, pipes.microbatches);
    const StateGraph g = StateGraph::linear(measured);
    for (std::size_t k = 1; k < cuts.size(); ++k) warn_if_cutting_pair(measured, g, cuts[k] - 1);
    return fit_interleaved(measured, g, topology, options, cuts, pipes);
  }
  PIPELINE_CHECK_AS(ConfigError, workers <= topology.workers(), "manual stages use {} workers but the topology has only {}",
                    workers, topology.workers());
  PIPELINE_CHECK_AS(ConfigError, !(options.straight && workers != static_cast<int>(manual.size())),
                    "--straight forbids replicated stages");
  const StateGraph g = StateGraph::linear(profile);
  std::vector<FinalStage> stages;
  int rank = 0;
  for (const ManualStage& m : manual) {
    FinalStage fs;
    for (int v = m.begin; v < m.end; ++v) fs.layers.push_back(v);
    fs.s = m.begin - 1;
    fs.e = m.end - 1;
    for (int r = 0; r < m.replicas; ++r) fs.ranks.push_back(rank++);
    warn_if_cutting_pair(profile, g, fs.e);
    stages.push_back(std::move(fs));
  }
  Plan plan;
  double t = describe(plan, g, topology, options, stages, topology.memory_bytes_per_worker, true);
  finish(plan, profile, topology, options, t);
  return plan;
}

}  // namespace pipeline
