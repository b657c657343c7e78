// pipeline-partition: profile.json (or a PipeDream graph.txt) + topology → plan.json, and a
// readable table of the plan on stdout. Errors go to stderr with a non-zero exit.
//
// Mixed clusters: worker types in the topology (file "types", or --type NAME:COUNT[:PRICE[:MEM]]
// with --bandwidth) and a profile per type (--profile TYPE=profile.json, repeated). Cost
// planning: --samples N with --deadline D (the cheapest plan that trains N samples by then),
// --budget B (the fastest within B) or --frontier (the time/cost Pareto frontier; also
// --frontier-json FILE, --frontier-svg FILE); prices per worker-hour from the topology or --price.
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/cost_plan.hpp>
#include <pipeline/plan/device_profiles.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/placement.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/typed_partition.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include "../examples/common/validators.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace {

std::string layers_text(const pipeline::PlanStage& s) {
  if (s.layer_ids.empty()) return fmt::format("{}..{}", s.begin, s.end - 1);
  return fmt::format("{} layers in {}..{}", s.layer_ids.size(), s.begin, s.end - 1);
}

// The ranks a job of `plan` runs: its workers, or fewer where it leaves some idle.

void print_table(const pipeline::Plan& plan, const pipeline::DeviceProfiles& profiles,
                 const pipeline::Topology& topo, double seconds, bool simulated) {
  const pipeline::Profile& profile = profiles.begin()->second;
  fmt::print("model {} ({} layers), {} workers: {}, cost model {}\n", plan.model.empty() ? "?" : plan.model,
             profile.size(), plan.workers, pipeline::describe_topology(topo), plan.cost_model);
  const bool typed = std::any_of(plan.stages.begin(), plan.stages.end(), [](const auto& s) { return !s.device.empty(); });
  fmt::print("{:>5}  {:<24} {:>8} {:>12} {:>12} {:>10} {:>12} {:>10}{}\n", "stage", "layers", "replicas", "compute ms",
             "transfer ms", "sync ms", "memory GB", "recompute", typed ? "  device" : "");
  for (std::size_t i = 0; i < plan.stages.size(); ++i) {
    const auto& s = plan.stages[i];
    fmt::print("{:>5}  {:<24} {:>8} {:>12.3f} {:>12.3f} {:>10.3f} {:>12.3f} {:>10}{}\n", i, layers_text(s), s.replicas,
               s.compute_s * 1e3, s.transfer_s * 1e3, s.sync_s * 1e3, s.memory_bytes / 1e9, s.recompute ? "yes" : "no",
               typed ? "  " + s.device : std::string());
  }
  const auto& p = plan.predicted;
  if (plan.microbatches > 0)
    fmt::print(
        "config {}   for {} with {} microbatches per minibatch ({} per pipeline)\n", plan.config,
        plan.schedule, plan.microbatches,
        (plan.microbatches + plan.stages.front().replicas - 1) / plan.stages.front().replicas);
  else {
    // Deeper than PipeDream's count where the planner found that transfers need it: say so, as
    // it costs weight staleness under 1f1b-stash.
    const int pipedream =
        pipeline::stash_in_flights(plan.ranks_run(), plan.replica_counts()).front();
    fmt::print("config {}   in flight {}{}\n", plan.config, plan.in_flight,
               plan.in_flight > pipedream
                   ? fmt::format(" (PipeDream's {}, more to hide the transfers; older weights in "
                                 "the first stages' forwards: --pipedream-in-flight keeps {})",
                                 pipedream, pipedream)
                   : std::string());
  }
  if (const int used = plan.ranks_run(); used < plan.workers)
    fmt::print("uses {} of the {} workers (the others stay idle): train it with mpirun -np {}\n",
               used, plan.workers, used);
  if (!plan.optimizer.empty()) {
    // Each worker type's own step (named where there are several).
    std::vector<std::string> steps;
    for (const auto& [type, p] : profiles) {
      double step = 0;
      for (const auto& l : p.layers) step += l.step_s.of(plan.optimizer);
      if (step > 0)
        steps.push_back(fmt::format("{:.3f} ms{}", step * 1e3,
                                    profiles.size() > 1 ? " on " + type : std::string()));
    }
    if (!steps.empty())
      fmt::print(
          "compute includes one {} step per minibatch on every replica ({} for the whole "
          "model)\n",
          plan.optimizer, fmt::join(steps, ", "));
  }
  if (plan.interleaved()) {
    const int pipelines = plan.stages.front().replicas, places = plan.workers / pipelines;
    const bool v = pipeline::placement_of(plan) == pipeline::StagePlacement::V;
    const std::string where = v ? fmt::format("stages k and {} - k at place k", 2 * places - 1)
                                : fmt::format("stage k at place k mod {}", places);
    if (pipelines == 1)
      fmt::print("interleaved: {} virtual stages per worker{}, {} (rank = place)\n",
                 plan.virtual_stages, v ? " in a V" : "", where);
    else
      fmt::print(
          "interleaved: {} virtual stages per worker{}, {} data-parallel pipelines of {} ranks "
          "(pipeline j on ranks {}j..{}j+{}), {} of each\n",
          plan.virtual_stages, v ? " in a V" : "", pipelines, places, places, places, places - 1,
          where);
  }
  // (A plan for microbatches records its time per microbatch of the profile's batch.)
  if (plan.microbatches > 0)
    fmt::print(
        "time per microbatch {:.6f} s ({:.1f} samples/s), its bubble included: {:.6f} s a "
        "minibatch of {}\n",
        p.time_per_minibatch_s, p.samples_per_s, p.time_per_minibatch_s * plan.microbatches,
        plan.microbatches);
  else
    fmt::print("time per minibatch {:.6f} s ({:.1f} samples/s)\n", p.time_per_minibatch_s,
               p.samples_per_s);
  if (p.data_parallel_time_per_minibatch_s > 0)
    fmt::print("data parallel      {:.6f} s   speedup over data parallelism {:.3f}x\n",
               p.data_parallel_time_per_minibatch_s,
               p.time_per_minibatch_s > 0
                   ? p.data_parallel_time_per_minibatch_s / p.time_per_minibatch_s
                   : 0.0);
  else if (topo.typed())
    fmt::print("data parallel      none: no worker type holds the whole model in its memory\n");
  else
    fmt::print("data parallel      none: a worker's memory does not hold the whole model\n");
  if (simulated)
    fmt::print("bubble fraction    {:.4f} ({} schedule, simulated)\n", p.bubble_fraction,
               plan.schedule);
  else
    fmt::print("bubble fraction    not simulated\n");
  fmt::print("planned in {:.3f} s\n", seconds);
}

bool stashes(const pipeline::Plan& plan) {
  return pipeline::stashes_weights(plan.schedule);
}

// The plan run by the schedule simulator as the runtime runs it (replicas' allreduces overlap
// their closing backwards), with pipeline-simulate's defaults: one
// microbatch per minibatch and enough minibatches for a steady state (8 per worker, or per
// minibatch its replicas hold, a multiple
// of every stage's replica count) under a stash schedule, which reports its steady-state value;
// the plan's microbatches (or the trainers' default, default_microbatches) and one minibatch
// under a flush schedule, which reports the whole makespan's. The partitioner itself stays
// independent of the schedule library.
// Nothing when the plan's replica counts make a steady state too long to simulate (the
// partitioner's plan is written all the same, with a note). `clip`: the run clips by the global
// gradient norm (--clip-grad), where the schedule has one (the trainers clip nowhere else).
std::optional<pipeline::Simulation> simulate_plan(const pipeline::Plan& plan,
                                                  const pipeline::Profile& profile,
                                                  const pipeline::Topology& topo,
                                                  const pipeline::DeviceProfiles* device_profiles,
                                                  double transfer_bytes_scale, bool clip) {
  const bool stash = stashes(plan);
  const int microbatches = pipeline::default_microbatches(plan, plan.schedule, plan.batch_size);
  int minibatches = 1;
  if (stash) {
    const std::int64_t steady =
        pipeline::steady_state_minibatches(plan, pipeline::kMaxSimulatedMinibatches);
    if (steady == 0) return std::nullopt;
    minibatches = static_cast<int>(steady);
  }
  pipeline::Schedule schedule =
      pipeline::generate_schedule(plan.schedule, pipeline::ScheduleSpec::from_plan(plan, microbatches, minibatches));
  pipeline::SimulateOptions options;
  options.device_profiles = device_profiles;
  options.transfer_bytes_scale = transfer_bytes_scale;
  options.overlap_allreduce = true;
  options.clip_by_global_norm = clip && pipeline::global_norm_exists(schedule);
  return pipeline::simulate(schedule, profile, plan, topo, options);
}

// What the partitioner's cost model leaves out of the transfers that the simulator charges in
// full ("" where nothing): --ignore-transfer, --activation-compression (bf16 transfers are
// charged as half the bytes by both), PipeDream's model.
std::string discounted_transfers(const pipeline::PartitionOptions& options,
                                 bool compression_given) {
  if (options.ignore_transfer) return "--ignore-transfer leaves the transfers out of the plan";
  if (compression_given)
    return fmt::format("--activation-compression {} divides the plan's messages by {}",
                       *options.activation_compression, *options.activation_compression);
  if (options.cost_model == pipeline::CostModel::PipeDream)
    return "PipeDream's cost model (--cost-model pipedream) times the stages as PipeDream's "
           "optimizer does, without the messages between them";
  return "";
}

// The steady state the schedule reaches beside the partitioner's figure, and why where it falls
// more than 10% short of it (`discounted`: what the plan's cost model left out, if anything;
// `clipped`: the simulation waited for the global gradient norm at each step).
void print_simulated(const pipeline::Plan& plan, const pipeline::Simulation& sim,
                     const std::string& discounted, bool clipped) {
  const double ratio =
      plan.predicted.samples_per_s > 0 ? sim.samples_per_s / plan.predicted.samples_per_s : 1.0;
  // A plan for microbatches states its time per microbatch of the profile's batch: so does this.
  const double seconds =
      plan.microbatches > 0 ? sim.time_per_minibatch_s * plan.batch_size / sim.samples_per_minibatch
                            : sim.time_per_minibatch_s;
  fmt::print(
      "simulated          {:.6f} s{} ({:.1f} samples/s, {} schedule), {:.3f}x the partitioner's\n",
      seconds, plan.microbatches > 0 ? " per microbatch" : "", sim.samples_per_s, plan.schedule,
      ratio);
  if (ratio < 0.9 && clipped && stashes(plan) && plan.num_stages() > 1)
    fmt::print(
        "note: the schedule falls short of the partitioner's figure because under --clip-grad "
        "each step first sums the gradient norm over every rank: every stage's step of a "
        "minibatch waits for the first stage's backward of it, which the figure leaves out\n");
  else if (ratio < 0.9 && !discounted.empty())
    fmt::print(
        "note: the schedule falls short of the partitioner's figure because {}, and the "
        "simulator charges every message in full at the topology's bandwidths\n",
        discounted);
  else if (ratio < 0.9 && stashes(plan))
    fmt::print(
        "note: the schedule cannot reach the partitioner's figure: transfers that the minibatches "
        "in flight cannot hide (where the memory, or --pipedream-in-flight, kept the in-flight "
        "counts that would hide them), or replicas of a stage waiting for each other at its "
        "allreduce (a replicated stage after the first gets its minibatches one at a time, and a "
        "plan without the memory for the deeper in-flight counts that hide it keeps PipeDream's); "
        "pipeline-simulate --trace shows where\n");
  else if (ratio < 0.9 && plan.interleaved())
    fmt::print(
        "note: the schedule falls short of the partitioner's figure: the partitioner times {}'s "
        "order from each stage's passes and messages and each allreduce from its stage's last "
        "backward, and the simulator charges more here (the allreduces' share of the cores, or "
        "the device profiles' times); pipeline-simulate --trace shows where\n",
        plan.schedule);
  // A replicated stash stage's estimate reserves the deepest in-flight count its schedule may
  // take; the schedule's search often takes fewer (mlp's 4-2 on 6 workers: 8.0 MB reserved, 4.0
  // MB held). Said where the fullest rank holds less than 95% of what the plan reserves for it.
  const std::vector<std::int64_t>& planned = plan.predicted.peak_memory_bytes;
  std::size_t fullest = 0;
  for (std::size_t r = 0; r < sim.ranks.size(); ++r)
    if (sim.ranks[r].peak_memory_bytes > sim.ranks[fullest].peak_memory_bytes) fullest = r;
  if (fullest < planned.size() && fullest < sim.ranks.size() &&
      static_cast<double>(sim.ranks[fullest].peak_memory_bytes) <
          0.95 * static_cast<double>(planned[fullest]))
    fmt::print(
        "simulated peak memory {:.3f} GB (rank {}), where the plan reserves {:.3f} GB: its "
        "in-flight counts are the most the schedule may hold, and its search for the fastest "
        "depths took fewer\n",
        static_cast<double>(sim.ranks[fullest].peak_memory_bytes) / 1e9, fullest,
        static_cast<double>(planned[fullest]) / 1e9);
}

// The partitioner's 1F1B-flush plan of the same workers under `options` (one stage per worker
// group, no virtual stages) for `microbatches` (0: the default count); nothing where none fits.
std::optional<pipeline::Plan> flush_plan_of(const pipeline::Profile& profile,
                                            const pipeline::Topology& topo,
                                            pipeline::PartitionOptions options, int microbatches) {
  options.virtual_stages = 1;
  options.placement = pipeline::StagePlacement::Looped;
  options.schedule = "1f1b-flush";
  options.microbatches = microbatches;
  try {
    const pipeline::LogThresholdScope quiet(pipeline::LogLevel::Warn);  // said once already
    return pipeline::partition(profile, topo, options);
  } catch (const pipeline::ConfigError&) {
    return std::nullopt;
  }
}

// Where the partitioner's interleaved plan is predicted slower than its 1F1B-flush plan for the
// same workers and microbatches (interleaving sends every microbatch through each worker v times,
// so over slow links its messages can cost more than its smaller bubble saves), or, with the
// interleaved plan's simulation (`simulated`), where its schedule simulates slower than the
// flush plan's, a note saying so and how to plan that one instead.
void note_faster_flush_plan(const pipeline::Plan& interleaved, const pipeline::Profile& profile,
                            const pipeline::Topology& topo,
                            const pipeline::PartitionOptions& options,
                            const pipeline::Simulation* simulated, double transfer_bytes_scale,
                            bool clip) {
  const std::optional<pipeline::Plan> flush =
      flush_plan_of(profile, topo, options, interleaved.microbatches);
  if (!flush) return;  // no 1F1B-flush plan fits: nothing faster to point to
  const double ratio = flush->predicted.samples_per_s / interleaved.predicted.samples_per_s;
  const std::string why =
      flush->num_stages() > 1
          ? fmt::format(": its microbatches pass each worker once, not {} times",
                        interleaved.virtual_stages)
          : std::string(" (plain data parallelism)");
  const std::string which = fmt::format(
      "note: the 1f1b-flush plan of these workers for the same {} microbatches (config {}, "
      "--schedule 1f1b-flush without --virtual-stages)",
      interleaved.microbatches, flush->config);
  if (ratio > 1.05) {
    fmt::print("{} is predicted {:.2f}x as fast{}\n", which, ratio, why);
    return;
  }
  // The plan's figure can miss what its schedule loses (a rank's stages of very different
  // times): the two schedules simulated.
  if (!simulated || simulated->samples_per_s <= 0) return;
  const std::optional<pipeline::Simulation> flush_simulated =
      simulate_plan(*flush, profile, topo, nullptr, transfer_bytes_scale, clip);
  if (!flush_simulated) return;
  const double simulated_ratio = flush_simulated->samples_per_s / simulated->samples_per_s;
  if (simulated_ratio > 1.05)
    fmt::print("{} simulates {:.2f}x as fast as this plan{}\n", which, simulated_ratio, why);
}

// Under --clip-grad a pipelined 1F1B-stash plan waits at every step for the norm of the whole
// model's gradients, so its stages step together as a flush schedule's do, without a flush
// schedule's gain in overlap: where the 1F1B-flush plan of the same workers simulates faster
// clipped, say so and how to plan it.
// `simulated`: the plan's own clipped simulation.
void note_flush_under_clipping(const pipeline::Profile& profile, const pipeline::Topology& topo,
                               const pipeline::PartitionOptions& options,
                               const pipeline::Simulation& simulated, double transfer_bytes_scale) {
  if (simulated.samples_per_s <= 0) return;
  const std::optional<pipeline::Plan> flush = flush_plan_of(profile, topo, options, 0);
  if (!flush) return;
  const std::optional<pipeline::Simulation> flush_simulated =
      simulate_plan(*flush, profile, topo, nullptr, transfer_bytes_scale, /*clip=*/true);
  if (!flush_simulated) return;
  const double ratio = flush_simulated->samples_per_s / simulated.samples_per_s;
  if (ratio > 1.05)
    fmt::print(
        "note: clipped, the 1f1b-flush plan of these workers (config {}, --schedule "
        "1f1b-flush) simulates {:.2f}x as fast as this plan ({:.1f} samples/s; its minibatch "
        "is {} microbatches of the profile's batch: train it with --batch {})\n",
        flush->config, ratio, flush_simulated->samples_per_s, flush->microbatches,
        std::int64_t{flush->microbatches} * flush->batch_size);
}

// A 1F1B-stash plan that must give every worker a replica can be slower than one that leaves some
// idle (where the replicas' allreduce or the transfers cost more than the workers add): say so.
void note_faster_on_fewer_workers(const pipeline::Plan& plan, const pipeline::Profile& profile,
                                  const pipeline::Topology& topo,
                                  pipeline::PartitionOptions options) {
  options.allow_idle = true;
  pipeline::Plan fewer;
  try {
    const pipeline::LogThresholdScope quiet(pipeline::LogLevel::Warn);  // said once already
    fewer = pipeline::partition(profile, topo, options);
  } catch (const pipeline::ConfigError&) {
    return;
  }
  const double ratio = fewer.predicted.samples_per_s / plan.predicted.samples_per_s;
  if (ratio > 1.05)
    fmt::print(
        "note: a plan on {} of the {} workers (config {}, --allow-idle) is predicted {:.2f}x as "
        "fast: more workers here cost more in transfers and allreduces than they add\n",
        fewer.ranks_run(), plan.workers, fewer.config, ratio);
}

// The stages' device types joined like the config ("h100-a100-a100"); "" for an untyped plan.
std::string devices_text(const pipeline::Plan& plan) {
  std::string s;
  for (const auto& st : plan.stages) {
    if (st.device.empty()) return "";
    s += (s.empty() ? "" : "-") + st.device;
  }
  return s;
}

void print_frontier(const std::vector<pipeline::CostedPlan>& frontier, const pipeline::Topology& topo, double samples) {
  fmt::print("time/cost frontier for {:.6g} samples ({} plans; none is both faster and cheaper than another):\n", samples,
             frontier.size());
  fmt::print("{:>3}  {:>9} {:>12} {:>10}  {:<24} {:<16} {:>12}  {}\n", "#", "time", "cost", "per hour", "workers", "config",
             "s/minibatch", topo.typed() ? "devices" : "");
  for (std::size_t i = 0; i < frontier.size(); ++i) {
    const auto& c = frontier[i];
    fmt::print("{:>3}  {:>9} {:>12.2f} {:>10.2f}  {:<24} {:<16} {:>12.6f}  {}\n", i, pipeline::format_duration(c.time_s),
               c.cost, c.price_per_hour, pipeline::describe_workers(c, topo), c.plan.config,
               c.plan.predicted.time_per_minibatch_s, devices_text(c.plan));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Split a profiled model into pipeline stages (PipeDream's dynamic program)"};
  std::string pipedream_path, output, stages_text, cost_model = "pipeline", bandwidth_text, memory_text, topology_path;
  std::vector<std::string> levels, profile_args, type_args;
  std::string price_text, deadline_text, frontier_json, frontier_svg;
  std::optional<double> samples, budget;
  bool frontier = false;
  int workers = 0, batch = 0, virtual_stages = 1, microbatches = 0;
  std::string schedule = "1f1b-stash";
  std::string stage_placement = "looped";
  bool straight = false, allow_idle = false, ignore_transfer = false, quiet = false, no_simulate = false;
  bool pipedream_in_flight = false;
  std::optional<double> compression;
  std::size_t max_states = pipeline::PartitionOptions{}.max_states;
  std::string recompute = "auto", optimizer = "momentum", transfer_dtype;
  auto* src = app.add_option("--profile", profile_args,
                             "profile.json (pipeline.profile/1); on a mixed cluster TYPE=profile.json, once per worker type");
  app.add_option("--pipedream", pipedream_path, "PipeDream graph.txt instead of a profile.json")->excludes(src);
  app.add_option("--workers", workers, "workers of a one-level topology");
  app.add_option("--bandwidth", bandwidth_text, "bandwidth of a one-level topology (bytes/s, or 300GB/s, 25Gbit/s)");
  app.add_option("--level", levels, "COUNT:BANDWIDTH, repeated, innermost first (e.g. --level 4:1e10 --level 4:1.25e9)");
  app.add_option("--topology", topology_path, "topology JSON file instead of --workers/--level");
  app.add_option("--memory", memory_text, "memory per worker (bytes, or 16GB, 80GiB)");
  app.add_option("--type", type_args,
                 "worker type NAME:COUNT[:PRICE[:MEMORY]], repeated, on one --bandwidth level (e.g. --type h100:8:4.5:80GiB "
                 "--type a100:16:1.9:40GiB)");
  app.add_option("--price", price_text, "price per worker-hour (currency units) of a topology of one kind of worker");
  app.add_option("--samples", samples, "samples to train, for --deadline, --budget and --frontier");
  app.add_option("--deadline", deadline_text, "the cheapest plan that trains --samples by then (90s, 45m, 6h, 2d)");
  app.add_option("--budget", budget, "the fastest plan that trains --samples within this cost (currency units)");
  app.add_flag("--frontier", frontier, "print the time/cost Pareto frontier of the plans for --samples");
  app.add_option("--frontier-json", frontier_json, "write the frontier as JSON")
      ->check(pipeline::examples::file_to_write());
  app.add_option("--frontier-svg", frontier_svg,
                 "write the frontier (and every candidate) as an SVG plot")
      ->check(pipeline::examples::file_to_write());
  app.add_option("--recompute", recompute,
                 "activation recomputation: auto (default: the stages that would not fit in --memory otherwise), "
                 "all stages, or none")
      ->check(CLI::IsMember({"none", "auto", "all"}));
  app.add_option(
         "--optimizer", optimizer,
         "the training's optimizer, whose state the memory model charges: sgd (none), momentum "
         "(default, one copy of the weights) or adamw (two); each stage's compute also "
         "includes its step time when the profile measured it (step_s)")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}));
  app.add_option(
         "--transfer-dtype", transfer_dtype,
         "element type of the activations and gradients sent between stages: float32 or bf16 "
         "(half the bytes: transfers cost as with --activation-compression 2; default: "
         "the profile's dtype)")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--cost-model", cost_model, "pipeline (default) or pipedream")->check(CLI::IsMember({"pipeline", "pipedream"}));
  app.add_flag("--straight", straight, "no replicated stages");
  app.add_flag("--allow-idle", allow_idle, "leave workers unused when that is no slower");
  app.add_flag("--ignore-transfer", ignore_transfer, "no activation transfer cost");
  app.add_flag(
      "--pipedream-in-flight", pipedream_in_flight,
      "1f1b-stash: keep PipeDream's minibatches in flight (the least weight staleness; with "
      "replicated stages, the r - 1 more a stage of r replicas needs), even where slow "
      "links then leave round trips unhidden (default: more where that hides them)");
  app.add_option("--activation-compression", compression, "activation compression ratio R (transfers cost 2a/(B r R))");
  app.add_option("--stages", stages_text, "evaluate this plan instead: BEGIN:END[xREPLICAS],... e.g. 0:5x2,5:12,12:20");
  app.add_option("--batch", batch,
                 "the batch a profile was timed at, where it records none (a PipeDream graph)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option(
      "--virtual-stages", virtual_stages,
      "V > 1: an interleaved plan of V·p stages over pipelines of p workers, stage k on rank "
      "k mod p of each, to run under interleaved-1f1b; the workers form one pipeline or several "
      "data-parallel ones, whichever is predicted faster (one with --straight) (default 1)");
  app.add_option("--schedule", schedule,
                 "the schedule to plan for: 1f1b-stash (default; PipeDream's objective), or a "
                 "flush schedule (1f1b-flush, zb-h1, gpipe): data-parallel copies of a straight "
                 "pipeline, the depth and cuts that run --microbatches fastest")
      ->check(CLI::IsMember({"1f1b-stash", "1f1b-flush", "zb-h1", "gpipe"}));
  app.add_option("--microbatches", microbatches,
                 "microbatches per minibatch a flush --schedule or an interleaved plan "
                 "(--virtual-stages) runs, recorded in the plan for the trainers (default: 4 per "
                 "worker)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--stage-placement", stage_placement,
                 "where an interleaved plan's stages go: looped (stage k at place k mod p) or v "
                 "(2 stages per worker, stages k and 2p-1-k at place k, to run under zb-v; "
                 "implies --virtual-stages 2) (default looped)")
      ->check(CLI::IsMember({"looped", "v"}));
  app.add_option("--max-states", max_states,
                 "antichain states the search may use; a DAG with more is planned over a coarsened DAG "
                 "(default 0: 4000 on one level, 1500 on several)");
  app.add_option("-o,--output", output, "write plan.json here")
      ->check(pipeline::examples::file_to_write());
  app.add_flag("-q,--quiet", quiet, "no table on stdout");
  double clip_grad = 0;
  app.add_option("--clip-grad", clip_grad,
                 "the run clips gradients to this global norm (the trainers' --clip-grad; "
                 "train_transformer_lm's default 1): the plan is simulated with every step "
                 "waiting for the norm summed over all ranks, and a 1F1B-stash pipeline that "
                 "this slows is compared with the 1f1b-flush plan (default 0: off)")
      ->check(pipeline::examples::non_negative_number());
  app.add_flag("--no-simulate", no_simulate, "leave predicted.bubble_fraction at 0 instead of simulating the plan");
  // Several hosts: an OpenMPI rankfile that puts each rank on the host the topology assigns it.
  std::string hosts_path, rankfile_path;
  pipeline::PlacementOptions placement_options;
  auto* hosts_opt = app.add_option("--hosts", hosts_path, "OpenMPI hostfile (NAME [slots=N] per line) to place the ranks on");
  app.add_option("--rankfile", rankfile_path,
                 "write an OpenMPI rankfile here (mpirun --rankfile FILE) placing rank r "
                 "on host r / (workers per host)")
      ->needs(hosts_opt)
      ->check(pipeline::examples::file_to_write());
  hosts_opt->needs("--rankfile");
  app.add_option("--host-level", placement_options.host_level,
                 "topology levels inside one host (default: 1 with several levels, 0 with one: a "
                 "host per worker)")
      ->needs(hosts_opt);
  app.add_option("--cores-per-rank", placement_options.cores_per_rank,
                 "cores each rank is bound to in the rankfile (1)")
      ->needs(hosts_opt);
  CLI11_PARSE(app, argc, argv);

  try {
    auto t0 = std::chrono::steady_clock::now();
    PIPELINE_CHECK_AS(ConfigError, !profile_args.empty() || !pipedream_path.empty(),
                      "give the model: --profile profile.json or --pipedream graph.txt");
    pipeline::DeviceProfiles profiles;
    bool named = false;
    if (profile_args.empty()) profiles[""] = pipeline::read_pipedream_graph(pipedream_path);
    for (std::size_t i = 0; i < profile_args.size(); ++i) {
      auto [type, path] = pipeline::split_profile_argument(profile_args[i]);
      PIPELINE_CHECK_AS(ConfigError, i == 0 || named == !type.empty(),
                        "--profile '{}': give either one plain profile or TYPE=profile.json for every worker type",
                        profile_args[i]);
      named = !type.empty();
      PIPELINE_CHECK_AS(ConfigError, profiles.count(type) == 0, "{}",
                        type.empty()
                            ? std::string("--profile is given twice: give one profile, "
                                          "or TYPE=profile.json for each worker type")
                            : fmt::format("--profile: worker type '{}' is given twice", type));
      profiles[type] = pipeline::read_profile(path);
    }
    for (auto& [type, p] : profiles) {
      // --batch names the batch of a profile that records none; it scales no time or size, so
      // it may not stand in for another batch than the one the layers were timed at.
      PIPELINE_CHECK_AS(ConfigError, batch == 0 || p.batch_size <= 0 || p.batch_size == batch,
                        "--batch {}: the profile{} was timed at batch {}, and --batch only names "
                        "the batch of a profile that records none; profile the model at batch {} "
                        "(pipeline-profile --batch {}), or leave --batch out",
                        batch, type.empty() ? std::string() : " of worker type '" + type + "'",
                        p.batch_size, batch, batch);
      if (batch > 0) p.batch_size = batch;
      PIPELINE_CHECK_AS(ConfigError, p.batch_size > 0,
                        "the profile{} does not record the batch size it was timed at (no "
                        "\"batch_size\", or 0): give it with --batch N",
                        type.empty() ? std::string() : " of worker type '" + type + "'");
    }
    pipeline::check_device_profiles(profiles);
    const pipeline::Profile& profile = profiles.begin()->second;
    if (transfer_dtype.empty()) transfer_dtype = profile.bf16() ? "bf16" : "float32";

    pipeline::Topology topo;
    for (const auto& t : type_args) topo.types.push_back(pipeline::parse_worker_type(t));
    if (!topology_path.empty()) {
      PIPELINE_CHECK_AS(ConfigError, levels.empty() && workers == 0 && type_args.empty(),
                        "--topology excludes --workers, --level and --type");
      topo = pipeline::read_topology(topology_path);
    } else if (!type_args.empty() && levels.empty()) {
      PIPELINE_CHECK_AS(ConfigError, !bandwidth_text.empty(), "--type needs --bandwidth (the network between the workers)");
      int total = 0;
      for (const auto& t : topo.types) total += t.count;
      PIPELINE_CHECK_AS(ConfigError, workers == 0 || workers == total,
                        "--workers {} disagrees with the --type counts, {} in all; leave --workers out", workers, total);
      topo.levels.push_back({total, pipeline::parse_bandwidth(bandwidth_text)});
    } else if (!levels.empty()) {
      PIPELINE_CHECK_AS(ConfigError, workers == 0 && bandwidth_text.empty(), "--level excludes --workers/--bandwidth");
      for (const auto& l : levels) topo.levels.push_back(pipeline::parse_level(l));
    } else {
      PIPELINE_CHECK_AS(ConfigError, workers >= 1, "--workers must be at least 1 (got {}); or give --level COUNT:BANDWIDTH",
                        workers);
      PIPELINE_CHECK_AS(
          ConfigError, !bandwidth_text.empty(),
          "--workers needs --bandwidth, the bytes per second between two workers (e.g. "
          "--bandwidth 10GB/s), or give --level COUNT:BANDWIDTH");
      topo.levels.push_back({workers, pipeline::parse_bandwidth(bandwidth_text)});
    }
    if (!memory_text.empty()) topo.memory_bytes_per_worker = pipeline::parse_bytes(memory_text);
    if (!price_text.empty()) topo.price_per_worker_hour = pipeline::parse_price(price_text);
    pipeline::validate_topology(topo);
    if (topo.typed())
      PIPELINE_CHECK_AS(ConfigError, named,
                        "the topology has worker types; give a profile for each: --profile TYPE=profile.json");
    else
      PIPELINE_CHECK_AS(ConfigError, !named && profiles.size() == 1,
                        "--profile TYPE=profile.json needs worker types in the topology (--type or \"types\"); "
                        "for one kind of worker give one plain --profile");
    const bool costing = !deadline_text.empty() || budget || frontier || !frontier_json.empty() || !frontier_svg.empty();
    PIPELINE_CHECK_AS(ConfigError, !costing || samples,
                      "--deadline, --budget and --frontier need --samples N (the samples to train)");
    PIPELINE_CHECK_AS(ConfigError, costing || !samples,
                      "--samples needs --deadline, --budget or --frontier (what to plan for)");
    PIPELINE_CHECK_AS(ConfigError, deadline_text.empty() || !budget, "give --deadline or --budget, not both");
    PIPELINE_CHECK_AS(ConfigError, !costing || stages_text.empty(), "--stages evaluates one plan; it excludes --samples");
    PIPELINE_CHECK_AS(ConfigError, app.count("--stages") == 0 || !stages_text.empty(),
                      "--stages is empty: give the stages, e.g. --stages 0:5x2,5:12,12:20, or "
                      "leave it out to let the partitioner cut the model");
    PIPELINE_CHECK_AS(ConfigError, !budget || (std::isfinite(*budget) && *budget > 0),
                      "--budget must be a positive amount, got {}", budget.value_or(0));

    pipeline::PartitionOptions opt;
    opt.cost_model = cost_model == "pipedream" ? pipeline::CostModel::PipeDream : pipeline::CostModel::Pipeline;
    opt.straight = straight;
    opt.allow_idle = allow_idle;
    opt.ignore_transfer = ignore_transfer;
    opt.pipedream_in_flight = pipedream_in_flight;
    opt.activation_compression = compression;
    if (transfer_dtype == "bf16") pipeline::set_transfer_dtype(opt, pipeline::DType::BFloat16);
    opt.max_states = max_states;
    // PipeDream's model has no recomputation: auto leaves it off there.
    opt.recompute = opt.cost_model == pipeline::CostModel::PipeDream && recompute == "auto"
                        ? pipeline::Recompute::None
                        : pipeline::parse_recompute(recompute);
    opt.virtual_stages = virtual_stages;
    if (stage_placement == "v") {
      opt.placement = pipeline::StagePlacement::V;
      if (opt.virtual_stages == 1) opt.virtual_stages = 2;
    }
    opt.optimizer_state_factor = pipeline::optimizer_state_copies(optimizer);
    opt.optimizer = optimizer;
    opt.schedule = schedule;
    opt.microbatches = microbatches;
    PIPELINE_CHECK_AS(ConfigError,
                      microbatches == 0 || schedule != "1f1b-stash" || opt.virtual_stages > 1,
                      "--microbatches is for a flush --schedule (1f1b-flush, zb-h1, gpipe) or "
                      "an interleaved plan (--virtual-stages); 1f1b-stash runs one per minibatch");
    PIPELINE_CHECK_AS(
        ConfigError, schedule == "1f1b-stash" || (stages_text.empty() && !costing && !topo.typed()),
        "--schedule {} plans one kind of worker by itself; --stages, worker types "
        "and --deadline/--budget/--frontier plan for 1f1b-stash (time any plan "
        "under {} with pipeline-simulate --schedule {})",
        schedule, schedule, schedule);

    pipeline::Plan plan;
    std::optional<pipeline::CostedPlan> chosen;
    if (costing) {
      const double deadline = deadline_text.empty() ? 0.0 : pipeline::parse_duration(deadline_text);
      const auto candidates = pipeline::cost_candidates(profiles, topo, opt, *samples);
      const auto front = pipeline::pareto_frontier(candidates);
      if (frontier && !quiet) print_frontier(front, topo, *samples);
      if (!frontier_json.empty()) pipeline::write_frontier_json(frontier_json, front, topo, *samples);
      if (!frontier_svg.empty()) pipeline::write_frontier_svg(frontier_svg, front, candidates, topo, *samples);
      chosen = !deadline_text.empty() ? pipeline::cheapest_within_deadline(candidates, deadline, *samples)
               : budget               ? pipeline::fastest_within_budget(candidates, *budget, *samples)
                                      : front.front();
      plan = chosen->plan;
    } else if (topo.typed()) {
      PIPELINE_CHECK_AS(ConfigError, stages_text.empty(), "--stages is not supported with worker types yet");
      plan = pipeline::partition_typed(profiles, topo, opt);
    } else {
      plan = stages_text.empty()
                 ? pipeline::partition(profile, topo, opt)
                 : pipeline::evaluate_stages(profile, topo, pipeline::parse_manual_stages(stages_text), opt);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::optional<pipeline::Simulation> sim;
    if (!no_simulate) {
      sim = simulate_plan(plan, profile, topo, topo.typed() ? &profiles : nullptr,
                          transfer_dtype == "bf16" ? 0.5 : 1.0, clip_grad > 0);
      if (sim)
        plan.predicted.bubble_fraction =
            stashes(plan) ? sim->steady_state_bubble_fraction : sim->bubble_fraction;
      else
        fmt::print(stderr,
                   "pipeline-partition: note: not simulated: under {} the replica counts {} deal "
                   "minibatches in rounds of their least common multiple, more than {} "
                   "minibatches to a steady state; a run of this plan takes minibatches in "
                   "multiples of it\n",
                   plan.schedule, fmt::join(plan.replica_counts(), "-"),
                   pipeline::kMaxSimulatedMinibatches);
    }
    std::vector<pipeline::RankPlacement> placement;  // placed before anything is written
    if (!rankfile_path.empty())
      placement = pipeline::place_ranks(plan, topo, pipeline::read_hostfile(hosts_path), placement_options);
    if (!output.empty()) pipeline::write_plan(plan, output);
    if (!rankfile_path.empty()) {
      pipeline::write_rankfile(rankfile_path, placement);
      if (!quiet) fmt::print("{}: {}\n", rankfile_path, pipeline::describe_placement(placement));
    }
    if (!quiet) {
      if (frontier && chosen) fmt::print("\n");
      print_table(plan, profiles, topo, seconds, sim.has_value());
      const bool clipped = clip_grad > 0 && pipeline::plan_has_global_norm(plan);
      if (clip_grad > 0 && !clipped)
        fmt::print(
            "note: under {} with replicated stages the stages step at different rates, so no "
            "global gradient norm exists: the trainers run this plan without clipping (a flush "
            "--schedule, or --straight, keeps --clip-grad)\n",
            plan.schedule);
      if (sim && (stashes(plan) || plan.microbatches > 0 || plan.interleaved()))
        print_simulated(plan, *sim, discounted_transfers(opt, compression.has_value()), clipped);
      if (sim && clipped && stashes(plan) && plan.num_stages() > 1 && stages_text.empty() &&
          !chosen && !topo.typed())
        note_flush_under_clipping(profile, topo, opt, *sim, transfer_dtype == "bf16" ? 0.5 : 1.0);
      // (A second search: only where the first was quick.)
      if (!allow_idle && opt.cost_model == pipeline::CostModel::Pipeline && stashes(plan) &&
          !plan.interleaved() && stages_text.empty() && !chosen && !topo.typed() && seconds < 1)
        note_faster_on_fewer_workers(plan, profile, topo, opt);
      if (plan.interleaved() && stages_text.empty() && !chosen && !topo.typed())
        note_faster_flush_plan(plan, profile, topo, opt, sim ? &*sim : nullptr,
                               transfer_dtype == "bf16" ? 0.5 : 1.0, clip_grad > 0);
      if (chosen)
        fmt::print("trains {:.6g} samples in {} for {:.2f} ({} at {:.2f} per hour){}\n", *samples,
                   pipeline::format_duration(chosen->time_s), chosen->cost, pipeline::describe_workers(*chosen, topo),
                   chosen->price_per_hour,
                   !deadline_text.empty() ? fmt::format("; the cheapest plan within the deadline of {}",
                                                        pipeline::format_duration(pipeline::parse_duration(deadline_text)))
                   : budget ? fmt::format("; the fastest plan within the budget of {:.2f}", *budget)
                            : std::string("; the fastest plan"));
    }
  } catch (const pipeline::Error& e) {
    fmt::print(stderr, "pipeline-partition: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline-partition: unexpected error: {}\n", e.what());
    return 2;
  }
  return 0;
}
