// Timing a schedule on a profile, a plan and a topology.
#include <pipeline/schedule/simulator.hpp>

#include "engine.hpp"

#include <algorithm>
#include <limits>

namespace pipeline {

StageTiming stage_timing(const Profile& profile, const Plan& plan, int stage, double scale) {
  PIPELINE_CHECK_AS(ConfigError, stage >= 0 && stage < plan.num_stages(),
                    "stage {} is not in the plan (it has {} stages)", stage, plan.num_stages());
  const PlanStage& ps = plan.stages[stage];
  PIPELINE_CHECK_AS(ConfigError, 0 <= ps.begin && ps.begin < ps.end && ps.end <= profile.size(),
                    "plan stage {} covers layers [{}, {}), which does not fit the profile's {} layers "
                    "(was the plan made for another profile?)",
                    stage, ps.begin, ps.end, profile.size());
  StageTiming t;
  double input = 0, weight = 0;
  bool split = true;
  for (int l = ps.begin; l < ps.end; ++l) {
    const LayerProfile& lp = profile.layers[l];
    t.forward_s += lp.forward_s;
    t.backward_s += lp.backward_s;
    input += lp.backward_input_s;
    weight += lp.backward_weight_s;
    split = split && (lp.backward_input_s > 0 || lp.backward_weight_s > 0 || lp.backward_s == 0);
    t.parameter_bytes += lp.parameter_bytes;
    t.activation_bytes += lp.output_bytes;
  }
  if (split && input + weight > 0) {
    t.backward_input_s = input;
    t.backward_weight_s = weight;
  } else {
    t.backward_input_s = t.backward_weight_s = t.backward_s / 2;
  }
  // Bytes crossing the boundary after this stage: outputs of layers before `end` that a layer
  // at or after `end` consumes (for a chain: the last layer's output).
  auto crossing = [&](int end) {
    std::vector<char> counted(static_cast<std::size_t>(std::max(end, 0)), 0);
    std::int64_t bytes = 0;
    for (int j = end; j < profile.size(); ++j) {
      const auto& inputs = profile.layers[j].inputs;
      auto take = [&](int v) {
        if (v >= 0 && v < end && !counted[v]) {
          counted[v] = 1;
          bytes += profile.layers[v].output_bytes;
        }
      };
      if (inputs.empty())
        take(j - 1);
      else
        for (int v : inputs) take(v);
    }
    return bytes;
  };
  t.output_bytes = ps.end < profile.size() ? crossing(ps.end) : 0;
  std::int64_t received = stage > 0 ? crossing(ps.begin) : 0;
  t.activation_bytes += received;
  t.forward_s *= scale;
  t.backward_s *= scale;
  t.backward_input_s *= scale;
  t.backward_weight_s *= scale;
  t.output_bytes = static_cast<std::int64_t>(static_cast<double>(t.output_bytes) * scale);
  t.activation_bytes = static_cast<std::int64_t>(static_cast<double>(t.activation_bytes) * scale);
  return t;
}

double link_bandwidth(const Topology& topology, int a, int b) {
  constexpr double kFree = std::numeric_limits<double>::infinity();
  if (a == b || topology.levels.empty()) return kFree;
  long long group = 1;
  for (const auto& level : topology.levels) {
    group *= std::max(level.count, 1);
    if (a / group == b / group) return level.bandwidth_bytes_per_s > 0 ? level.bandwidth_bytes_per_s : kFree;
  }
  double outer = topology.levels.back().bandwidth_bytes_per_s;
  return outer > 0 ? outer : kFree;
}

Simulation simulate(const Schedule& schedule, const Profile& profile, const Plan& plan,
                    const Topology& topology, const SimulateOptions& options) {
  PIPELINE_CHECK_AS(ConfigError, plan.num_stages() == schedule.num_stages(),
                    "the plan has {} stages but schedule '{}' has {}; generate the schedule from the "
                    "plan",
                    plan.num_stages(), schedule.name, schedule.num_stages());
  for (int s = 0; s < plan.num_stages(); ++s)
    PIPELINE_CHECK_AS(ConfigError,
                      plan.stages[s].ranks.empty() || plan.stages[s].ranks == schedule.stage_ranks[s],
                      "stage {} runs on different ranks in the plan and in schedule '{}'", s,
                      schedule.name);
  PIPELINE_CHECK_AS(ConfigError, profile.batch_size > 0, "profile '{}' has batch size {}",
                    profile.model, profile.batch_size);
  PIPELINE_CHECK_AS(ConfigError, options.microbatch_size >= 0, "microbatch size must be >= 0, got {}",
                    options.microbatch_size);
  detail::check_local(schedule);

  const int microbatch_size = options.microbatch_size > 0 ? options.microbatch_size : profile.batch_size;
  const double scale = static_cast<double>(microbatch_size) / profile.batch_size;
  std::vector<StageTiming> timing;
  detail::EngineCosts costs;
  for (int s = 0; s < plan.num_stages(); ++s) {
    StageTiming t = stage_timing(profile, plan, s, scale);
    detail::StageCosts c;
    c.forward_s = t.forward_s;
    c.backward_s = t.backward_s;
    c.backward_input_s = t.backward_input_s;
    c.backward_weight_s = t.backward_weight_s;
    c.step_s = options.optimizer_step_s;
    c.activation_bytes = t.activation_bytes;
    c.parameter_bytes = t.parameter_bytes;
    const auto& group = schedule.stage_ranks[s];
    int r = static_cast<int>(group.size());
    if (r > 1) {
      double bw = std::numeric_limits<double>::infinity();
      for (int a : group)
        for (int b : group) bw = std::min(bw, link_bandwidth(topology, a, b));
      c.allreduce_s = options.allreduce_factor * (r - 1) / r * static_cast<double>(t.parameter_bytes) / bw +
                      2.0 * (r - 1) * options.latency_s;
    }
    costs.stages.push_back(c);
    timing.push_back(t);
  }
  // Free links and zero latency leave transfer_s empty, so the engine skips the call.
  bool any_cost = options.latency_s > 0;
  for (auto& l : topology.levels) any_cost = any_cost || l.bandwidth_bytes_per_s > 0;
  if (any_cost) {
    const double duplex = options.full_duplex ? 1.0 : 2.0;
    costs.transfer_s = [&timing, &topology, &options, duplex](int src, int dst, int stage, ActionKind kind) {
      if (src == dst) return 0.0;
      std::int64_t bytes = kind == ActionKind::SendActivation ? timing[stage].output_bytes
                                                              : timing[stage - 1].output_bytes;
      return duplex * static_cast<double>(bytes) / link_bandwidth(topology, src, dst) + options.latency_s;
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
    rs.bubble_fraction = out.makespan_s > 0 ? 1.0 - rec.busy_s / out.makespan_s : 0.0;
    rs.steady_state_bubble_fraction = rs.bubble_fraction;
    if (schedule.policy == UpdatePolicy::Stash && rec.window_forwards > 0) {
      double span = rec.window_end_s - rec.window_begin_s;
      if (span > 0) {
        rs.steady_state_bubble_fraction = 1.0 - (rec.window_end_busy_s - rec.window_begin_busy_s) / span;
        steady_period = std::max(steady_period, span / (rec.window_forwards * schedule.replicas(rs.stage)));
      } else {
        rs.steady_state_bubble_fraction = 0;
      }
    }
    rs.peak_activations = rec.peak_activations;
    rs.peak_weight_versions = rec.peak_weight_versions;
    rs.peak_activation_bytes = rec.peak_activation_bytes;
    rs.peak_weight_bytes = rec.peak_weight_bytes;
    rs.peak_memory_bytes = rec.peak_memory_bytes;
    busy += rec.busy_s;
    steady_bubble_sum += rs.steady_state_bubble_fraction;
    ++steady_ranks;
    out.ranks.push_back(rs);
  }
  const double n = static_cast<double>(run.ranks.size());
  out.bubble_fraction = out.makespan_s > 0 ? 1.0 - busy / (n * out.makespan_s) : 0.0;
  out.steady_state_bubble_fraction = steady_ranks ? steady_bubble_sum / steady_ranks : 0.0;
  out.time_per_minibatch_s = out.makespan_s / schedule.minibatches;
  if (schedule.policy == UpdatePolicy::Stash && steady_period > 0) out.time_per_minibatch_s = steady_period;
  out.samples_per_s = out.time_per_minibatch_s > 0 ? out.samples_per_minibatch / out.time_per_minibatch_s : 0.0;
  out.events = std::move(run.events);
  return out;
}

}  // namespace pipeline
