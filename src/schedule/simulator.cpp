// Timing a schedule on a profile, a plan and a topology.
#include <pipeline/schedule/simulator.hpp>

#include <pipeline/plan/allreduce_buckets.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/partition.hpp>

#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace pipeline {

namespace {

// The layers of a plan stage: its layer_ids, or the range [begin, end).
std::vector<int> stage_layers(const PlanStage& ps) {
  if (!ps.layer_ids.empty()) return ps.layer_ids;
  std::vector<int> out;
  for (int l = ps.begin; l < ps.end; ++l) out.push_back(l);
  return out;
}

// layer -> the stage holding it. Throws ConfigError unless every layer of the profile is in
// exactly one stage and no layer reads a layer of a later stage (data only flows forwards).
std::vector<int> layer_stages(const Profile& profile, const Plan& plan) {
  std::vector<int> owner(static_cast<std::size_t>(profile.size()), -1);
  for (int s = 0; s < plan.num_stages(); ++s) {
    const PlanStage& ps = plan.stages[s];
    PIPELINE_CHECK_AS(
        ConfigError, 0 <= ps.begin && ps.begin < ps.end && ps.end <= profile.size(),
        "plan stage {} covers layers [{}, {}), which does not fit the profile's {} layers "
        "(was the plan made for another profile?)",
        s, ps.begin, ps.end, profile.size());
    for (int l : stage_layers(ps)) {
      PIPELINE_CHECK_AS(ConfigError, l >= ps.begin && l < ps.end,
                        "plan stage {} lists layer {} outside its range [{}, {})", s, l, ps.begin,
                        ps.end);
      PIPELINE_CHECK_AS(
          ConfigError, owner[static_cast<std::size_t>(l)] < 0,
          "layer {} belongs to plan stages {} and {}; each layer must be in one stage", l,
          owner[static_cast<std::size_t>(l)], s);
      owner[static_cast<std::size_t>(l)] = s;
    }
  }
  for (int l = 0; l < profile.size(); ++l) {
    const int s = owner[static_cast<std::size_t>(l)];
    PIPELINE_CHECK_AS(
        ConfigError, s >= 0,
        "layer {} ('{}') is in no stage of the plan; a plan must cover every layer of the "
        "profile (was it made for another profile?)",
        l, profile.layers[static_cast<std::size_t>(l)].name);
    for (int v : profile.predecessors(l))
      PIPELINE_CHECK_AS(
          ConfigError, owner[static_cast<std::size_t>(v)] <= s,
          "layer {} of stage {} reads layer {} of the later stage {}; stages must follow "
          "the layers' data flow",
          l, s, v, owner[static_cast<std::size_t>(v)]);
  }
  return owner;
}

// Bytes crossing the cut after stage `s`: outputs of layers in stages <= s that a layer of a
// later stage reads (the partitioner's boundary_bytes of that cut; for a chain the output of the
// stage's last layer). In a linear pipeline all of it travels from stage s to stage s + 1.
std::int64_t cut_bytes(const Profile& profile, const std::vector<int>& owner, int s) {
  std::int64_t bytes = 0;
  std::vector<char> counted(owner.size(), 0);
  for (int j = 0; j < profile.size(); ++j) {
    if (owner[static_cast<std::size_t>(j)] <= s) continue;
    for (int v : profile.predecessors(j))
      if (owner[static_cast<std::size_t>(v)] <= s && !counted[static_cast<std::size_t>(v)]) {
        counted[static_cast<std::size_t>(v)] = 1;
        bytes += profile.layers[static_cast<std::size_t>(v)].output_bytes;
      }
  }
  return bytes;
}

// Layer l as its stage runs it: a layer that runs after its successor inside a stage runs first,
// on the full tensor, where the stage ends at it (LayerProfile::at_stage_end); then `ended` holds
// those costs.
const LayerProfile& layer_as_run(const Profile& profile, const std::vector<int>& owner, int l,
                                 LayerProfile& ended) {
  const LayerProfile& declared = profile.layers[static_cast<std::size_t>(l)];
  if (!declared.at_stage_end || l + 1 >= profile.size() ||
      owner[static_cast<std::size_t>(l) + 1] == owner[static_cast<std::size_t>(l)])
    return declared;
  ended = as_last_of_stage(declared);
  return ended;
}

StageTiming stage_timing(const Profile& profile, const Plan& plan, const std::vector<int>& owner,
                         int stage, double scale) {
  const PlanStage& ps = plan.stages[static_cast<std::size_t>(stage)];
  StageTiming t;
  double input = 0, weight = 0;
  bool split = true;
  std::int64_t kept_input = 0;  // what the first layer keeps of the input the stage receives
  std::int64_t backward_peak = 0;  // the most one layer's backward holds (backward_peak_bytes)
  // The same when the backward is split, less the output gradient the I keeps for the W, which
  // split_gradient_bytes holds.
  std::int64_t split_backward_peak = 0;
  std::int64_t top_kept = 0;  // what the I keeps of the stage's last layer's output gradient
  const std::vector<int> layers = stage_layers(ps);
  LayerProfile ended;
  for (int l : layers) {
    const LayerProfile& lp = layer_as_run(profile, owner, l, ended);
    if (l == layers.front()) kept_input = lp.saved_input_bytes;
    t.forward_s += lp.forward_s;
    t.backward_s += lp.backward_s;
    input += lp.backward_input_s;
    weight += lp.backward_weight_s;
    split = split && (lp.backward_input_s > 0 || lp.backward_weight_s > 0 || lp.backward_s == 0);
    t.parameter_bytes += lp.parameter_bytes;
    t.version_bytes += version_bytes(lp);
    if (!plan.optimizer.empty()) t.step_s += lp.step_s.of(plan.optimizer);
    t.activation_bytes += stash_bytes(lp);
    // The weight half reads the output gradients of the layers it trains, and only those.
    top_kept = lp.parameter_bytes > 0 ? split_kept_bytes(lp) : 0;
    t.split_gradient_bytes += top_kept;
    t.workspace_bytes = std::max(t.workspace_bytes, lp.workspace_bytes);
    backward_peak = std::max(backward_peak, backward_peak_bytes(lp));
    split_backward_peak = std::max(split_backward_peak, backward_peak_bytes(lp) - top_kept);
  }
  if (split && input + weight > 0) {
    t.backward_input_s = input;
    t.backward_weight_s = weight;
  } else {
    t.backward_input_s = t.backward_weight_s = t.backward_s / 2;
  }
  const bool last = stage + 1 == plan.num_stages();
  t.output_bytes = last ? 0 : cut_bytes(profile, owner, stage);
  const std::int64_t received = stage > 0 ? cut_bytes(profile, owner, stage - 1) : 0;
  // The last stage keeps the loss's gradient from a minibatch's forward to its backward (to its W,
  // where its last layer has weights: that layer's kept output gradient, counted once).
  const std::int64_t loss_gradient = last ? profile.loss_gradient_bytes : 0;
  if (last && top_kept > 0)
    t.split_gradient_bytes -= std::min(t.split_gradient_bytes, loss_gradient);
  // What the first layer keeps of its input is that received storage, counted once.
  t.activation_bytes += received - (stage > 0 ? kept_input : 0);
  // As the partitioner charges them beside the stashed activations: the gradient of the backward
  // in progress (backward_gradient_bytes of plan/cost_model.hpp; the loss's is stashed below),
  // and as working memory, beyond it, the larger of one layer pass's temporaries and what one
  // layer's backward holds (StageWorkspace, plan/antichain.hpp).
  const std::int64_t gradient = std::max(received, loss_gradient);
  t.backward_gradient_bytes = gradient - loss_gradient;
  t.split_workspace_bytes = std::max(t.workspace_bytes, split_backward_peak - gradient);
  t.workspace_bytes = std::max(t.workspace_bytes, backward_peak - gradient);
  t.forward_s *= scale;
  t.backward_s *= scale;
  t.backward_input_s *= scale;
  t.backward_weight_s *= scale;
  if (ps.recompute) {
    // The forward runs again at the start of the backward (of its input-gradient half when
    // split), and only the stage's input stays stashed between the two: the first stage's is the
    // model's, from the data loader (recompute_stage_memory_bytes of plan/cost_model.hpp).
    t.recompute = true;
    t.backward_s += t.forward_s;
    t.backward_input_s += t.forward_s;
    t.recompute_bytes = t.activation_bytes - received;
    t.activation_bytes = stage > 0 ? received : profile.input_bytes;
  } else if (ps.layer_ids.empty() && stage > 0 &&
             profile.stage_frees_input(profile.input_read_alone(), ps.begin, ps.end - 1)) {
    t.activation_bytes -= received;  // no layer keeps it past the forward
  }
  t.activation_bytes += loss_gradient;
  t.output_bytes = static_cast<std::int64_t>(static_cast<double>(t.output_bytes) * scale);
  t.activation_bytes = static_cast<std::int64_t>(static_cast<double>(t.activation_bytes) * scale);
  t.recompute_bytes = static_cast<std::int64_t>(static_cast<double>(t.recompute_bytes) * scale);
  t.split_gradient_bytes =
      static_cast<std::int64_t>(static_cast<double>(t.split_gradient_bytes) * scale);
  t.backward_gradient_bytes =
      static_cast<std::int64_t>(static_cast<double>(t.backward_gradient_bytes) * scale);
  t.workspace_bytes = static_cast<std::int64_t>(static_cast<double>(t.workspace_bytes) * scale) +
                      profile.runtime_bytes;
  t.split_workspace_bytes =
      static_cast<std::int64_t>(static_cast<double>(t.split_workspace_bytes) * scale) +
      profile.runtime_bytes;
  return t;
}

// The executor's gradient buckets of a replicated stage (allreduce_buckets over the layers as run)
// and their share of its allreduce: that of their bytes, plus the latency term, which every
// bucket pays.
void overlap_buckets(const Profile& profile, const std::vector<int>& owner, const PlanStage& ps,
                     detail::StageCosts& c, int r, const SimulateOptions& options) {
  LayerProfile ended;
  std::vector<double> backward_s, parameter_bytes;
  for (int l : stage_layers(ps)) {
    backward_s.push_back(layer_as_run(profile, owner, l, ended).backward_s);
    parameter_bytes.push_back(
        static_cast<double>(profile.layers[static_cast<std::size_t>(l)].parameter_bytes));
  }
  const double latency = 2.0 * (r - 1) * options.latency_s;
  const double bandwidth_part = c.allreduce_s - latency;
  for (const AllreduceBucket& b :
       allreduce_buckets(backward_s, parameter_bytes, options.allreduce_bucket_bytes)) {
    c.bucket_ready.push_back(b.ready);
    c.bucket_s.push_back(bandwidth_part * b.share + latency);
  }
}

}  // namespace

StageTiming stage_timing(const Profile& profile, const Plan& plan, int stage, double scale) {
  PIPELINE_CHECK_AS(ConfigError, stage >= 0 && stage < plan.num_stages(),
                    "stage {} is not in the plan (it has {} stages)", stage, plan.num_stages());
  return stage_timing(profile, plan, layer_stages(profile, plan), stage, scale);
}

double link_bandwidth(const Topology& topology, int a, int b) {
  constexpr double kFree = std::numeric_limits<double>::infinity();
  if (a == b || topology.levels.empty()) return kFree;
  long long group = 1;
  for (const auto& level : topology.levels) {
    group *= std::max(level.count, 1);
    if (a / group == b / group)
      return level.bandwidth_bytes_per_s > 0 ? level.bandwidth_bytes_per_s : kFree;
  }
  double outer = topology.levels.back().bandwidth_bytes_per_s;
  return outer > 0 ? outer : kFree;
}

namespace {

// The profile that times a stage: its device type's, when the options carry per-type profiles.
const Profile& stage_profile(const Profile& profile, const Plan& plan, int stage,
                             const SimulateOptions& options) {
  const std::string& device = plan.stages[static_cast<std::size_t>(stage)].device;
  if (device.empty() || options.device_profiles == nullptr) return profile;
  const auto it = options.device_profiles->find(device);
  PIPELINE_CHECK_AS(ConfigError, it != options.device_profiles->end(),
                    "plan stage {} runs on worker type '{}', which has no profile; give one "
                    "(pipeline-simulate --profile {}=profile.json)",
                    stage, device, device);
  return it->second;
}

}  // namespace

Simulation simulate(const Schedule& schedule, const Profile& profile, const Plan& plan,
                    const Topology& topology, const SimulateOptions& options) {
  PIPELINE_CHECK_AS(ConfigError, options.cores >= 0,
                    "cores must be >= 0 (0: a core of its own for every rank), got {}",
                    options.cores);
  if (options.clip_by_global_norm) check_global_norm_exists(schedule);
  PIPELINE_CHECK_AS(
      ConfigError, plan.num_stages() == schedule.num_stages(),
      "the plan has {} stages but schedule '{}' has {}; generate the schedule from the "
      "plan",
      plan.num_stages(), schedule.name, schedule.num_stages());
  for (int s = 0; s < plan.num_stages(); ++s)
    PIPELINE_CHECK_AS(
        ConfigError,
        plan.stages[s].ranks.empty() || plan.stages[s].ranks == schedule.stage_ranks[s],
        "stage {} runs on different ranks in the plan and in schedule '{}'", s, schedule.name);
  PIPELINE_CHECK_AS(
      ConfigError, profile.batch_size > 0 || options.microbatch_size == 0,
      "profile '{}' does not say its batch size, so a microbatch size of {} cannot scale its "
      "times; leave the microbatch size at 0 (the profile's batch)",
      profile.model.empty() ? "profile" : profile.model, options.microbatch_size);
  PIPELINE_CHECK_AS(ConfigError, options.microbatch_size >= 0,
                    "microbatch size must be >= 0, got {}", options.microbatch_size);
  // Another model's profile, or one of other options, times stages that are not the plan's.
  PIPELINE_CHECK_AS(ConfigError,
                    plan.model.empty() || profile.model.empty() || plan.model == profile.model,
                    "the plan is for model '{}' but the profile is of '{}': give the profile the "
                    "plan was made from",
                    plan.model, profile.model);
  if (const auto d = first_difference(plan.architecture, profile.architecture))
    PIPELINE_FAIL(ConfigError,
                  "the plan was made for {} with {} {} but the profile is of it with {} {}: give "
                  "the profile the plan was made from",
                  plan.model, d->flag, d->recorded, d->flag, d->ours);
  PIPELINE_CHECK_AS(
      ConfigError, topology.levels.empty() || topology.workers() >= schedule.num_ranks(),
      "the topology has {} worker(s) but the schedule runs {} ranks: describe a cluster of at "
      "least {} (e.g. --level {}:<bandwidth>)",
      topology.workers(), schedule.num_ranks(), schedule.num_ranks(), schedule.num_ranks());
  detail::check_local(schedule);
  for (std::size_t r = 0; r < options.rank_slowdown.size(); ++r)
    PIPELINE_CHECK_AS(ConfigError,
                      std::isfinite(options.rank_slowdown[r]) && options.rank_slowdown[r] > 0,
                      "slowdown of rank {} must be a positive factor (1: nominal), got {}", r,
                      options.rank_slowdown[r]);
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(options.jitter_cv) && options.jitter_cv >= 0,
                    "jitter coefficient of variation must be >= 0 (0: none), got {}",
                    options.jitter_cv);

  const int microbatch_size =
      options.microbatch_size > 0 ? options.microbatch_size : profile.batch_size;
  // A profile without a batch size (some imported PipeDream graphs) is timed as it is, and its
  // samples per second are unknown (0), as the partitioner reports them.
  const double scale =
      profile.batch_size > 0 ? static_cast<double>(microbatch_size) / profile.batch_size : 1.0;
  const std::vector<int> owner = layer_stages(profile, plan);
  // The optimizer's copies of the weights: the plan's, or the partitioner's default.
  const double optimizer_copies = plan.optimizer.empty() ? PartitionOptions{}.optimizer_state_factor
                                                         : optimizer_state_copies(plan.optimizer);
  // A schedule of split backwards (ZB-H1) runs every backward as an I and a W.
  const bool split_backward = std::any_of(
      schedule.ranks.begin(), schedule.ranks.end(), [](const std::vector<Action>& actions) {
        return std::any_of(actions.begin(), actions.end(),
                           [](const Action& a) { return a.kind == ActionKind::BackwardInput; });
      });
  std::vector<StageTiming> timing;
  detail::EngineCosts costs;
  for (int s = 0; s < plan.num_stages(); ++s) {
    const Profile& stage_prof = stage_profile(profile, plan, s, options);
    StageTiming t = stage_timing(stage_prof, plan, owner, s, scale);
    detail::StageCosts c;
    c.forward_s = t.forward_s;
    c.backward_s = t.backward_s;
    c.backward_input_s = t.backward_input_s;
    c.backward_weight_s = t.backward_weight_s;
    c.step_s = options.optimizer_step_s + t.step_s;
    c.activation_bytes = t.activation_bytes;
    c.recompute_bytes = t.recompute_bytes;
    c.split_gradient_bytes = t.split_gradient_bytes;
    // Beside its layers' working memory, the stage's message buffers (posted receives, a send).
    const double received =
        s > 0 ? static_cast<double>(cut_bytes(profile, owner, s - 1)) * scale : 0.0;
    c.workspace_bytes =
        (split_backward ? t.split_workspace_bytes : t.workspace_bytes) +
        static_cast<std::int64_t>(message_buffer_bytes(
            received, static_cast<double>(t.output_bytes), 1.0 / options.transfer_bytes_scale));
    c.backward_gradient_bytes = t.backward_gradient_bytes;
    c.parameter_bytes = t.parameter_bytes;
    c.version_bytes = t.version_bytes;
    // Gradients accumulate in float32 like the weights; the optimizer keeps its copies of them.
    c.gradient_bytes = t.parameter_bytes;
    c.optimizer_bytes =
        static_cast<std::int64_t>(optimizer_copies * static_cast<double>(t.parameter_bytes));
    const auto& group = schedule.stage_ranks[s];
    int r = static_cast<int>(group.size());
    if (r > 1) {
      double bw = std::numeric_limits<double>::infinity();
      for (int a : group)
        for (int b : group) bw = std::min(bw, link_bandwidth(topology, a, b));
      // The partitioner's synchronisation time of one minibatch's gradients (sharers = 1: one
      // flat ring over the group's slowest link), scaled when another ring constant is asked for.
      c.allreduce_s = options.allreduce_factor / 4.0 *
                          sync_time(static_cast<double>(t.parameter_bytes), r, bw, 1.0) +
                      2.0 * (r - 1) * options.latency_s;
      c.allreduce_cpu_s =
          options.allreduce_cpu_s_per_byte * static_cast<double>(r - 1) * t.parameter_bytes;
      if (options.overlap_allreduce)
        overlap_buckets(stage_prof, owner, plan.stages[static_cast<std::size_t>(s)], c, r, options);
    }
    costs.stages.push_back(c);
    timing.push_back(t);
  }
  costs.rank_slowdown = options.rank_slowdown;
  PIPELINE_CHECK_AS(ConfigError, options.threads_per_rank >= 1,
                    "threads per rank must be at least 1, got {}", options.threads_per_rank);
  const bool shared =
      options.cores > 0 && schedule.num_ranks() * options.threads_per_rank > options.cores;
  costs.shared_cores = shared ? options.cores : 0;
  costs.threads_per_rank = options.threads_per_rank;
  costs.jitter_cv = options.jitter_cv;
  costs.jitter_seed = options.jitter_seed;
  costs.global_norm_steps = options.clip_by_global_norm;
  costs.global_norm_s = 2.0 * (schedule.num_ranks() - 1) * options.latency_s;
  // Free links and zero latency leave transfer_s empty, so the engine skips the call.
  bool any_cost = options.latency_s > 0;
  for (auto& l : topology.levels) any_cost = any_cost || l.bandwidth_bytes_per_s > 0;
  if (any_cost) {
    // transfer_time() is the link time of one activation and its gradient on a half-duplex
    // link, 2a/B, which is also each one's time when the two directions share the bandwidth.
    // A rank's link towards a neighbour stage is shared by the peers it talks to there, each pair
    // getting the share of the rank's messages across the boundary that it carries — the
    // smaller of the sender's and the receiver's share. Under round-robin dealing, with r and r'
    // replicas on the two sides of a boundary, each rank talks to r'/g resp. r/g peers (g = gcd)
    // evenly, so a pair gets 1/(max(r, r')/g) of the bandwidth and the boundary carries
    // 2a/(B min(r, r')) per minibatch — the partitioner's transfer term of the side with fewer
    // replicas (a single rank feeding r replicas carries all of it). A dealing by speed
    // (Schedule::dealing) gives uneven pairs, whose shares are counted from it.
    const int boundaries = std::max(plan.num_stages() - 1, 0);
    std::vector<double> boundary_share(static_cast<std::size_t>(boundaries), 1.0);
    // Dealt boundaries: (lower rank, upper rank) -> the pair's share.
    std::vector<std::map<std::pair<int, int>, double>> pair_share(
        static_cast<std::size_t>(boundaries));
    for (int s = 0; s < boundaries; ++s) {
      const int a = schedule.replicas(s), b = schedule.replicas(s + 1);
      boundary_share[static_cast<std::size_t>(s)] = round_robin_pair_share(a, b);
      if (schedule.round_robin(s) && schedule.round_robin(s + 1)) continue;
      std::map<std::pair<int, int>, int> pair;
      std::map<int, int> lower, upper;
      for (int u = 0; u < schedule.num_microbatches(); ++u) {
        const int lo = schedule.rank_of(s, u), hi = schedule.rank_of(s + 1, u);
        ++pair[{lo, hi}];
        ++lower[lo];
        ++upper[hi];
      }
      for (auto& [key, n] : pair)
        pair_share[static_cast<std::size_t>(s)][key] =
            std::min(static_cast<double>(n) / lower[key.first],
                     static_cast<double>(n) / upper[key.second]);
    }
    const double duplex = options.full_duplex ? 0.5 : 1.0;
    costs.transfer_s = [&timing, &topology, &options, duplex, boundary_share, pair_share](
                           int src, int dst, int stage, ActionKind kind) {
      if (src == dst) return 0.0;
      const bool forward = kind == ActionKind::SendActivation;
      const auto boundary = static_cast<std::size_t>(forward ? stage : stage - 1);
      const double bytes =
          static_cast<double>(timing[boundary].output_bytes) * options.transfer_bytes_scale;
      double share = boundary_share[boundary];
      if (!pair_share[boundary].empty())
        share = pair_share[boundary].at(forward ? std::pair{src, dst} : std::pair{dst, src});
      const double bandwidth = link_bandwidth(topology, src, dst) * share;
      return duplex * transfer_time(bytes, 1, bandwidth, 1.0) + options.latency_s;
    };
  }

  detail::EngineResult run = detail::execute_schedule(schedule, &costs, options.record_trace);

  Simulation out;
  out.schedule = schedule.name;
  out.samples_per_minibatch = schedule.microbatches * microbatch_size;
  for (auto& r : run.ranks) out.makespan_s = std::max(out.makespan_s, r.finish_s);
  std::vector<int> rank_stage(run.ranks.size(), 0);
  for (int s = schedule.num_stages() - 1; s >= 0; --s)
    for (int r : schedule.stage_ranks[s]) rank_stage[r] = s;

  double busy = 0, steady_bubble_sum = 0, steady_period = 0;
  int steady_ranks = 0;
  for (std::size_t i = 0; i < run.ranks.size(); ++i) {
    const auto& rec = run.ranks[i];
    RankSimulation rs;
    rs.rank = static_cast<int>(i);
    rs.stage = rank_stage[i];
    rs.busy_s = rec.busy_s;
    // (Clamped at 0: a rank busy the whole run sums its passes to the makespan's rounding.)
    rs.bubble_fraction =
        out.makespan_s > 0 ? std::max(0.0, 1.0 - rec.busy_s / out.makespan_s) : 0.0;
    rs.steady_state_bubble_fraction = rs.bubble_fraction;
    if (schedule.policy != UpdatePolicy::Flush && rec.window_forwards > 0) {
      double span = rec.window_end_s - rec.window_begin_s;
      if (span > 0) {
        rs.steady_state_bubble_fraction =
            std::max(0.0, 1.0 - (rec.window_end_busy_s - rec.window_begin_busy_s) / span);
        steady_period =
            std::max(steady_period, span * schedule.microbatches /
                                        (rec.window_forwards * schedule.replicas(rs.stage)));
      } else {
        rs.steady_state_bubble_fraction = 0;
      }
    }
    rs.peak_activations = rec.peak_activations;
    rs.peak_weight_versions = rec.peak_weight_versions;
    rs.peak_activation_bytes = rec.peak_activation_bytes;
    rs.peak_weight_bytes = rec.peak_weight_bytes;
    rs.peak_state_bytes = rec.peak_state_bytes;
    rs.workspace_bytes = rec.workspace_bytes;
    rs.peak_memory_bytes = rec.peak_memory_bytes;
    busy += rec.busy_s;
    steady_bubble_sum += rs.steady_state_bubble_fraction;
    ++steady_ranks;
    out.ranks.push_back(rs);
  }
  const double n = static_cast<double>(run.ranks.size());
  out.bubble_fraction = out.makespan_s > 0 ? std::max(0.0, 1.0 - busy / (n * out.makespan_s)) : 0.0;
  out.steady_state_bubble_fraction = steady_ranks ? steady_bubble_sum / steady_ranks : 0.0;
  out.time_per_minibatch_s = out.makespan_s / schedule.minibatches;
  if (schedule.policy != UpdatePolicy::Flush && steady_period > 0)
    out.time_per_minibatch_s = steady_period;
  out.samples_per_s =
      out.time_per_minibatch_s > 0 ? out.samples_per_minibatch / out.time_per_minibatch_s : 0.0;
  if (shared)
    for (const auto& rec : run.ranks)
      out.core_stretch.push_back(rec.work_s > 0 ? rec.busy_s / rec.work_s : 1.0);
  out.events = std::move(run.events);
  return out;
}

}  // namespace pipeline
