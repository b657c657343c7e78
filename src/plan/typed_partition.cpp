#include <pipeline/plan/typed_partition.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/plan/antichain.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/topology_io.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pipeline {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kMaxCells = std::size_t{1} << 25;

// One worker type's view of the states: prefix sums over P(i) from its own profile.
struct TypeData {
  std::string name;
  int count = 0;
  std::optional<double> memory;
  std::vector<double> compute, forward, activation, parameter, version, boundary;
  StageWorkspace workspace;
};

// The best plan for the layers after one state on exactly one usage vector: its time, and its
// first stage (end state, type, replicas); j = -1 marks "no plan" (or the empty plan).
struct Cell {
  double t = kInf;
  int j = -1;
  std::int16_t type = -1;
  std::int16_t stages = 0;
  int replicas = 0;
};

}  // namespace

struct TypedPartitioner::Impl {
  PartitionOptions options;
  Topology topology;
  std::string model;  // the profiles' model name and batch size (the profiles are not kept)
  Architecture architecture;
  std::string dtype;  // the profiles' dtype when it is not float32 (Plan::dtype)
  int profile_threads = 0;  // the threads every CPU profile was timed on; 0 where they differ
  int batch_size = 0;
  StateGraph g;
  std::vector<TypeData> types;
  std::vector<std::size_t> stride;  // mixed radix of usage vectors
  std::vector<int> total;           // workers of each usage vector
  std::size_t U = 1;
  int S = 0;
  double bandwidth = 0, ratio = 1;
  bool transfer = true;
  std::vector<Cell> table;  // (S + 1) rows (s + 1 = 0..S) of U cells

  Cell& cell(int s, std::size_t v) { return table[static_cast<std::size_t>(s + 1) * U + v]; }
  const Cell& cell(int s, std::size_t v) const {
    return table[static_cast<std::size_t>(s + 1) * U + v];
  }
  int digit(std::size_t v, std::size_t t) const {
    return static_cast<int>(v / stride[t] % static_cast<std::size_t>(types[t].count + 1));
  }
  static double diff(const std::vector<double>& x, int s, int j) {
    return StateGraph::stage_sum(x, s, j);
  }

  struct Mode {
    bool fits = true;
    bool recompute = false;
    double extra_s = 0;
    double memory_bytes = 0;
  };
  // The stage's working memory: its layers' temporaries and the runtime's, and its message
  // buffers.
  double working(const TypeData& d, int s, int j) const {
    const double input = s < 0 ? 0.0 : d.boundary[static_cast<std::size_t>(s)];
    return d.workspace(s, j, backward_gradient_bytes(input, g.stage_loss_gradient_bytes(j))) +
           message_buffer_bytes(input, d.boundary[static_cast<std::size_t>(j)], ratio);
  }

  // How stage (s..j] runs on r workers of type t with w workers at and after it (partition()'s
  // rule at level 0: stash if that fits, else recompute where allowed), holding PipeDream's
  // count of minibatches, or `flight` (> 0) and, when `delays` and r > 1, the second gradient
  // set of replicas that delay their allreduce.
  Mode mode(const TypeData& d, int s, int j, int r, int w, int flight = 0,
            bool delays = false) const {
    // The stage keeps part of its received input as its first layer's saved input (the types'
    // profiles share their layers, so the states' kept input bytes are every type's).
    const double par = diff(d.parameter, s, j), version = diff(d.version, s, j),
                 act = diff(d.activation, s, j) - g.stage_kept_input_bytes(s, j);
    const double input = s < 0 ? 0.0 : d.boundary[static_cast<std::size_t>(s)];
    if (flight <= 0) flight = in_flight(w, 0, r);
    const double delay_bytes =
        delays ? delayed_allreduce_bytes(par, r, /*input_stage=*/s < 0) : 0.0;
    const double loss = g.stage_loss_gradient_bytes(j);
    const double work = working(d, s, j);
    const double stash =
        stage_memory_bytes(par, version, act, flight, options.optimizer_state_factor, input, loss,
                           work, g.stage_frees_input(s, j)) +
        delay_bytes;
    const double again =
        recompute_stage_memory_bytes(par, version, act, input, s < 0 ? g.input_bytes : input, loss,
                                     flight, options.optimizer_state_factor, work) +
        delay_bytes;
    const bool can = options.recompute != Recompute::None;
    const Mode recomputed{true, true, diff(d.forward, s, j), again};
    if (can && options.recompute == Recompute::All && !d.memory) return recomputed;
    if (!d.memory) return {true, false, 0, stash};
    if (options.recompute != Recompute::All && stash <= *d.memory) return {true, false, 0, stash};
    if (can && again <= *d.memory) return recomputed;
    return {false};
  }

  // The stage's time per minibatch, split as describe() reports it; mode must fit.
  struct StageCost {
    double compute_path = 0, transfer = 0;
    double time() const { return std::max(compute_path, transfer); }
  };
  StageCost stage_cost(const TypeData& d, int s, int j, int r, const Mode& md) const {
    StageCost c;
    c.compute_path = replicated_stage_time(diff(d.compute, s, j) + md.extra_s,
                                           diff(d.parameter, s, j), r, bandwidth, 1.0);
    // Its replicas receive its input and send its output over their own links (the first stage
    // too, whatever the next stage's replicas).
    if (transfer && s >= 0)
      c.transfer = transfer_time(d.boundary[static_cast<std::size_t>(s)], r, bandwidth, ratio);
    if (transfer && j != S - 1)
      c.transfer = std::max(
          c.transfer, transfer_time(d.boundary[static_cast<std::size_t>(j)], r, bandwidth, ratio));
    return c;
  }

  void solve_cell(int s, std::size_t v) {
    Cell best;
    const int w = total[v];
    for (std::size_t t = 0; t < types.size(); ++t) {
      const int have = digit(v, t);
      const int max_r = options.straight ? std::min(have, 1) : have;
      const TypeData& d = types[t];
      for (int r = 1; r <= max_r; ++r) {
        const std::size_t rest_v = v - static_cast<std::size_t>(r) * stride[t];
        for (int j = s + 1; j < S; ++j) {
          if (!g.chain() && !g.is_ancestor(s, j)) continue;
          if (!g.can_end(j)) continue;  // it would cut a reordered pair (StateGraph::can_end)
          const double lower = diff(d.compute, s, j) / r;
          if (g.chain() && lower > best.t) break;  // compute only grows with j
          const Cell& rest = cell(j, rest_v);
          if (!(rest.t <= best.t)) continue;  // infinite, or already slower
          if (j == S - 1 ? rest_v != 0 : rest.j < 0) continue;
          if (!(lower <= best.t)) continue;
          const Mode md = mode(d, s, j, r, w);
          if (!md.fits) continue;
          const double v_t = std::max(stage_cost(d, s, j, r, md).time(), rest.t);
          const int stages = rest.stages + 1;
          if (v_t < best.t || (v_t == best.t && stages < best.stages))
            best = Cell{v_t, j, static_cast<std::int16_t>(t), static_cast<std::int16_t>(stages), r};
        }
      }
    }
    cell(s, v) = best;
  }

  // Rows depend on the rows after them, cells of a row do not depend on one another: one thread
  // team for the whole solve, a barrier per row. Worth it only when a row has enough work (a
  // barrier costs milliseconds when another job holds the cores).
  void solve() {
    table.assign(static_cast<std::size_t>(S + 1) * U, Cell{});
    cell(S - 1, 0) = Cell{0.0, -1, -1, 0, 0};
    int workers = 0;
    for (const TypeData& d : types) workers += d.count;
    const long long n = static_cast<long long>(U);
    const bool parallel = static_cast<double>(U) * S * workers > 2e7;
#pragma omp parallel if (parallel)
    for (int s = S - 2; s >= -1; --s) {
#pragma omp for schedule(dynamic, 16)
      for (long long v = 1; v < n; ++v)
        if (s < 0 || g.can_end(s)) solve_cell(s, static_cast<std::size_t>(v));
    }
  }
};

TypedPartitioner::TypedPartitioner(const DeviceProfiles& profiles, const Topology& topology,
                                   const PartitionOptions& options)
    : m(std::make_unique<Impl>()) {
  validate_topology(topology);
  PIPELINE_CHECK_AS(ConfigError, topology.typed(),
                    "the topology has no worker types; plan it with partition() and one profile");
  check_device_profiles(profiles);
  PIPELINE_CHECK_AS(
      ConfigError, options.cost_model == CostModel::Pipeline,
      "planning over worker types uses the pipeline cost model (drop --cost-model pipedream)");
  PIPELINE_CHECK_AS(
      ConfigError, options.virtual_stages == 1,
      "planning over worker types makes plans of one stage per worker; --virtual-stages {} "
      "is not supported there",
      options.virtual_stages);
  if (options.activation_compression)
    PIPELINE_CHECK_AS(
        ConfigError,
        std::isfinite(*options.activation_compression) && *options.activation_compression > 0,
        "activation compression ratio must be positive, got {}", *options.activation_compression);
  Impl& x = *m;
  x.options = options;
  x.topology = topology;
  x.bandwidth = topology.levels.front().bandwidth_bytes_per_s;
  x.ratio = options.activation_compression.value_or(1.0);
  x.transfer = !options.ignore_transfer;
  for (std::size_t t = 0; t < topology.types.size(); ++t) {
    const WorkerType& wt = topology.types[t];
    PIPELINE_CHECK_AS(ConfigError, profiles.count(wt.name) == 1,
                      "worker type '{}' has no profile; give --profile {}=profile.json", wt.name,
                      wt.name);
  }
  PIPELINE_CHECK_AS(
      ConfigError, profiles.size() == topology.types.size(),
      "{} profiles given for the topology's {} worker types; give exactly one per type",
      profiles.size(), topology.types.size());
  const Profile& reference = profiles.find(topology.types.front().name)->second;
  x.model = reference.model;
  x.architecture = reference.architecture;
  if (reference.bf16()) x.dtype = reference.dtype;
  x.batch_size = reference.batch_size;
  x.profile_threads = reference.threads;
  for (const auto& [name, p] : profiles)
    if (p.threads != reference.threads) x.profile_threads = 0;
  // One set of states for every type, from the first type's profile (the types' profiles share
  // their layers, so the states are the same; only the sums over them differ).
  x.g = planning_states(reference, antichain_state_budget(topology, options));
  x.S = x.g.size();
  std::vector<std::vector<int>> members(static_cast<std::size_t>(x.S));
  for (int i = 0; i < x.S; ++i) members[static_cast<std::size_t>(i)] = x.g.layers_between(-1, i);
  std::vector<std::vector<int>> successors(static_cast<std::size_t>(reference.size()));
  for (int l = 0; l < reference.size(); ++l)
    for (int p : reference.predecessors(l)) successors[static_cast<std::size_t>(p)].push_back(l);
  for (std::size_t t = 0; t < topology.types.size(); ++t) {
    const WorkerType& wt = topology.types[t];
    const Profile p = with_optimizer_steps(profiles.find(wt.name)->second, options);
    TypeData d;
    d.name = wt.name;
    d.count = wt.count;
    d.memory = type_memory(topology, t);
    d.workspace = StageWorkspace(p, x.g.chain());
    std::vector<char> in(static_cast<std::size_t>(p.size()), 0);
    for (int i = 0; i < x.S; ++i) {
      double c = 0, f = 0, a = 0, par = 0, ver = 0, cut = 0;
      std::fill(in.begin(), in.end(), 0);
      for (int l : members[static_cast<std::size_t>(i)]) in[static_cast<std::size_t>(l)] = 1;
      for (int l : members[static_cast<std::size_t>(i)]) {
        const LayerProfile& lp = p.layers[static_cast<std::size_t>(l)];
        c += lp.forward_s + lp.backward_s;
        f += lp.forward_s;
        a += static_cast<double>(stash_bytes(lp));
        par += static_cast<double>(lp.parameter_bytes);
        ver += static_cast<double>(version_bytes(lp));
        for (int q : successors[static_cast<std::size_t>(l)])
          if (!in[static_cast<std::size_t>(q)]) {
            cut += static_cast<double>(lp.output_bytes);
            break;
          }
      }
      d.compute.push_back(c);
      d.forward.push_back(f);
      d.activation.push_back(a);
      d.parameter.push_back(par);
      d.version.push_back(ver);
      d.boundary.push_back(cut);
    }
    x.types.push_back(std::move(d));
  }
  x.U = 1;
  for (const TypeData& d : x.types) {
    x.stride.push_back(x.U);
    x.U *= static_cast<std::size_t>(d.count) + 1;
    PIPELINE_CHECK_AS(
        ConfigError, x.U * static_cast<std::size_t>(x.S + 1) <= kMaxCells,
        "planning {} states over these worker types needs more than {} (state, workers) "
        "cells; use fewer types or workers",
        x.S, kMaxCells);
  }
  x.total.assign(x.U, 0);
  for (std::size_t v = 0; v < x.U; ++v)
    for (std::size_t t = 0; t < x.types.size(); ++t) x.total[v] += x.digit(v, t);
  x.solve();
}

TypedPartitioner::~TypedPartitioner() = default;
TypedPartitioner::TypedPartitioner(TypedPartitioner&&) noexcept = default;
TypedPartitioner& TypedPartitioner::operator=(TypedPartitioner&&) noexcept = default;

int TypedPartitioner::num_types() const {
  return static_cast<int>(m->types.size());
}
std::size_t TypedPartitioner::num_usages() const {
  return m->U;
}

std::vector<int> TypedPartitioner::usage(std::size_t index) const {
  PIPELINE_CHECK(index < m->U, "usage index {} out of range ({} usages)", index, m->U);
  std::vector<int> out;
  for (std::size_t t = 0; t < m->types.size(); ++t) out.push_back(m->digit(index, t));
  return out;
}

std::size_t TypedPartitioner::usage_index(const std::vector<int>& u) const {
  PIPELINE_CHECK_AS(ConfigError, u.size() == m->types.size(),
                    "a usage has {} counts for {} worker types", u.size(), m->types.size());
  std::size_t v = 0;
  for (std::size_t t = 0; t < u.size(); ++t) {
    PIPELINE_CHECK_AS(ConfigError, u[t] >= 0 && u[t] <= m->types[t].count,
                      "{} workers of type '{}', which has {}", u[t], m->types[t].name,
                      m->types[t].count);
    v += static_cast<std::size_t>(u[t]) * m->stride[t];
  }
  return v;
}

double TypedPartitioner::best_time(std::size_t index) const {
  PIPELINE_CHECK(index < m->U, "usage index {} out of range ({} usages)", index, m->U);
  return index == 0 ? kInf : m->cell(-1, index).t;
}

std::size_t TypedPartitioner::fastest() const {
  std::size_t best = 0;
  for (std::size_t v = 1; v < m->U; ++v) {
    const double t = best_time(v);
    if (!std::isfinite(t)) continue;
    if (best == 0 || t < best_time(best) || (t == best_time(best) && m->total[v] < m->total[best]))
      best = v;
  }
  if (best == 0) {
    std::string what;
    for (const TypeData& d : m->types)
      what += fmt::format(
          "{}{} x {} ({})", what.empty() ? "" : ", ", d.count, d.name,
          d.memory ? fmt::format("{:.4g} bytes each", *d.memory) : std::string("no memory limit"));
    PIPELINE_FAIL(ConfigError,
                  "no plan fits on any subset of the workers ({}){}; give the types more memory or "
                  "add workers",
                  what,
                  m->options.recompute == Recompute::None
                      ? "; activation recomputation may help: --recompute auto"
                      : "");
  }
  return best;
}

Plan TypedPartitioner::plan(std::size_t index) const {
  const Impl& x = *m;
  const double best = best_time(index);
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(best),
                    "no plan uses exactly the workers ({}) asked for",
                    fmt::format("{}", fmt::join(usage(index), ", ")));
  Plan plan;
  plan.model = x.model;
  plan.architecture = x.architecture;
  plan.batch_size = x.batch_size;
  plan.workers = x.total[index];
  plan.schedule = "1f1b-stash";
  plan.cost_model = std::string(to_string(CostModel::Pipeline));
  plan.optimizer = x.options.optimizer;
  plan.dtype = x.dtype;
  plan.profile_threads = x.profile_threads;
  record_transfer_dtype(plan, x.options);
  // The stages' replica counts first: the in-flight counts the schedule needs depend on the
  // stages after each (stash_in_flights).
  std::vector<int> replicas;
  for (auto [s, v] = std::pair<int, std::size_t>{-1, index}; s != x.S - 1;) {
    const Cell& c = x.cell(s, v);
    PIPELINE_CHECK(c.j >= 0, "internal: no stage to expand after state {}", s);
    replicas.push_back(c.replicas);
    v -= static_cast<std::size_t>(c.replicas) * x.stride[static_cast<std::size_t>(c.type)];
    s = c.j;
  }
  // The stages at the given in-flight counts (stash_in_flights or more), each taken where it fits
  // (as partition()'s describe()); returns the slowest stage's time.
  const std::vector<int> deeper = stash_in_flights(x.total[index], replicas);
  auto expand = [&](const std::vector<int>& flights) {
    plan.stages.clear();
    plan.config.clear();
    int s = -1, rank = 0;
    std::size_t v = index;
    double worst = 0;
    while (s != x.S - 1) {
      const Cell& c = x.cell(s, v);
      const TypeData& d = x.types[static_cast<std::size_t>(c.type)];
      const std::size_t k = plan.stages.size();
      // As partition(): the schedule's deeper count and delayed allreduces where they fit without
      // changing whether the stage recomputes; PipeDream's count otherwise.
      Impl::Mode md = x.mode(d, s, c.j, c.replicas, x.total[v]);
      const int base_flight = in_flight(x.total[v], 0, c.replicas);
      int flight = std::max(flights[k], deeper[k]);
      auto deep_at = [&](int f) { return x.mode(d, s, c.j, c.replicas, x.total[v], f, true); };
      auto fits = [&](const Impl::Mode& m) { return m.fits && m.recompute == md.recompute; };
      while (flight > deeper[k] && !fits(deep_at(flight))) --flight;
      const Impl::Mode deep = deep_at(flight);
      const bool take_deeper = fits(deep);
      if (take_deeper) md = deep;
      const Impl::StageCost cost = x.stage_cost(d, s, c.j, c.replicas, md);
      PlanStage ps;
      const std::vector<int> layers = x.g.layers_between(s, c.j);
      ps.begin = layers.front();
      ps.end = layers.back() + 1;
      if (static_cast<int>(layers.size()) != ps.end - ps.begin) ps.layer_ids = layers;
      ps.replicas = c.replicas;
      for (int r = 0; r < c.replicas; ++r) ps.ranks.push_back(rank++);
      ps.recompute = md.recompute;
      ps.in_flight = take_deeper ? flight : base_flight;
      ps.delay_allreduce = take_deeper || c.replicas == 1;
      ps.device = d.name;
      ps.compute_s = (Impl::diff(d.compute, s, c.j) + md.extra_s) / c.replicas;
      ps.sync_s = std::max(0.0, cost.compute_path - ps.compute_s);
      ps.transfer_s = cost.transfer;
      if (s >= 0 && x.transfer)
        ps.input_message_s =
            transfer_time(d.boundary[static_cast<std::size_t>(s)], 1, x.bandwidth, x.ratio);
      ps.memory_bytes = md.memory_bytes;
      ps.workspace_bytes = x.working(d, s, c.j);
      worst = std::max(worst, cost.time());
      if (!plan.stages.empty()) plan.config.push_back('-');
      plan.config += std::to_string(c.replicas);
      plan.stages.push_back(std::move(ps));
      v -= static_cast<std::size_t>(c.replicas) * x.stride[static_cast<std::size_t>(c.type)];
      s = c.j;
    }
    return worst;
  };
  double worst = expand(deeper);
  const std::vector<int> flights = stash_in_flights_hiding_transfers(plan, x.total[index], worst);
  if (flights != deeper && !x.options.pipedream_in_flight) worst = expand(flights);
  PIPELINE_CHECK(
      worst == best,
      "internal: the slowest stage of the expanded typed plan ({}) is not the optimum ({})", worst,
      best);
  plan.in_flight = plan.stages.front().in_flight;
  plan.predicted.peak_memory_bytes.assign(static_cast<std::size_t>(plan.workers), 0);
  for (const PlanStage& ps : plan.stages)
    for (int r : ps.ranks)
      plan.predicted.peak_memory_bytes[static_cast<std::size_t>(r)] =
          static_cast<std::int64_t>(ps.memory_bytes);
  plan.predicted.time_per_minibatch_s = best;
  plan.predicted.samples_per_s = best > 0 ? x.batch_size / best : 0.0;
  // Data parallelism on the fastest single type whose workers each hold the whole model (0 where
  // none does).
  double dp = kInf;
  for (const TypeData& d : x.types) {
    const Impl::Mode whole = x.mode(d, -1, x.S - 1, d.count, d.count);
    if (whole.fits) dp = std::min(dp, x.stage_cost(d, -1, x.S - 1, d.count, whole).time());
  }
  plan.predicted.data_parallel_time_per_minibatch_s = std::isfinite(dp) ? dp : 0.0;
  return plan;
}

Plan partition_typed(const DeviceProfiles& profiles, const Topology& topology,
                     const PartitionOptions& options) {
  PIPELINE_CHECK_AS(ConfigError, options.schedule == "1f1b-stash",
                    "mixed clusters are planned for 1f1b-stash, not {}; time the plan under {} "
                    "with pipeline-simulate --schedule {}",
                    options.schedule, options.schedule, options.schedule);
  TypedPartitioner p(profiles, topology, options);
  return p.plan(p.fastest());
}

}  // namespace pipeline
