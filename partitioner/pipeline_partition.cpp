// pipeline-partition: profile.json (or a PipeDream graph.txt) + topology → plan.json, and a
// readable table of the plan on stdout. Errors go to stderr with a non-zero exit.
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace {

std::string layers_text(const pipeline::PlanStage& s) {
  if (s.layer_ids.empty()) return fmt::format("{}..{}", s.begin, s.end - 1);
  return fmt::format("{} layers in {}..{}", s.layer_ids.size(), s.begin, s.end - 1);
}

void print_table(const pipeline::Plan& plan, const pipeline::Profile& profile, const pipeline::Topology& topo, double seconds) {
  fmt::print("model {} ({} layers), {} workers: {}, cost model {}\n", plan.model.empty() ? "?" : plan.model,
             profile.size(), plan.workers, pipeline::describe_topology(topo), plan.cost_model);
  fmt::print("{:>5}  {:<24} {:>8} {:>12} {:>12} {:>10} {:>12} {:>10}\n", "stage", "layers", "replicas", "compute ms",
             "transfer ms", "sync ms", "memory GB", "recompute");
  for (std::size_t i = 0; i < plan.stages.size(); ++i) {
    const auto& s = plan.stages[i];
    fmt::print("{:>5}  {:<24} {:>8} {:>12.3f} {:>12.3f} {:>10.3f} {:>12.3f} {:>10}\n", i, layers_text(s), s.replicas,
               s.compute_s * 1e3, s.transfer_s * 1e3, s.sync_s * 1e3, s.memory_bytes / 1e9, s.recompute ? "yes" : "no");
  }
  const auto& p = plan.predicted;
  fmt::print("config {}   in flight {}\n", plan.config, plan.in_flight);
  if (plan.interleaved())
    fmt::print("interleaved: {} virtual stages per worker, stage k on rank k mod {}\n", plan.virtual_stages,
               plan.workers);
  fmt::print("time per minibatch {:.6f} s ({:.1f} samples/s)\n", p.time_per_minibatch_s, p.samples_per_s);
  fmt::print("data parallel      {:.6f} s   speedup over data parallelism {:.3f}x\n", p.data_parallel_time_per_minibatch_s,
             p.time_per_minibatch_s > 0 ? p.data_parallel_time_per_minibatch_s / p.time_per_minibatch_s : 0.0);
  fmt::print("bubble fraction    {:.4f} ({} schedule, simulated)\n", p.bubble_fraction, plan.schedule);
  fmt::print("planned in {:.3f} s\n", seconds);
}

// The plan's bubble fraction from the schedule simulator, with pipeline-simulate's defaults: one
// microbatch per minibatch and enough minibatches for a steady state (8 per worker, a multiple
// of every stage's replica count) under a stash schedule, which reports its steady-state value;
// 4 microbatches per stage and one minibatch under a flush schedule, which reports the whole
// makespan's (an interleaved plan: 4 microbatches per worker, as for a plain plan on as many
// workers). The partitioner itself stays independent of the schedule library.
double simulated_bubble_fraction(const pipeline::Plan& plan, const pipeline::Profile& profile,
                                 const pipeline::Topology& topo) {
  const bool stash = plan.schedule.rfind("1f1b-stash", 0) == 0;
  int microbatches = stash ? 1 : 4 * (plan.interleaved() ? plan.workers : plan.num_stages()), minibatches = 1;
  if (stash) {
    int lcm = 1, workers = 0;
    for (const auto& s : plan.stages) {
      lcm = std::lcm(lcm, std::max(s.replicas, 1));
      workers += s.replicas;
    }
    minibatches = lcm * ((8 * workers + lcm - 1) / lcm);
  }
  pipeline::Schedule schedule =
      pipeline::generate_schedule(plan.schedule, pipeline::ScheduleSpec::from_plan(plan, microbatches, minibatches));
  pipeline::Simulation sim = pipeline::simulate(schedule, profile, plan, topo);
  return stash ? sim.steady_state_bubble_fraction : sim.bubble_fraction;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Split a profiled model into pipeline stages (PipeDream's dynamic program)"};
  std::string profile_path, pipedream_path, output, stages_text, cost_model = "pipeline", bandwidth_text, memory_text,
                                                                    topology_path;
  std::vector<std::string> levels;
  int workers = 0, batch = 0, virtual_stages = 1;
  bool straight = false, allow_idle = false, ignore_transfer = false, quiet = false, no_simulate = false;
  std::optional<double> compression;
  std::size_t max_states = pipeline::PartitionOptions{}.max_states;
  std::string recompute = "auto";
  auto* src = app.add_option("--profile", profile_path, "profile.json (pipeline.profile/1)");
  app.add_option("--pipedream", pipedream_path, "PipeDream graph.txt instead of a profile.json")->excludes(src);
  app.add_option("--workers", workers, "workers of a one-level topology");
  app.add_option("--bandwidth", bandwidth_text, "bandwidth of a one-level topology (bytes/s, or 300GB/s, 25Gbit/s)");
  app.add_option("--level", levels, "COUNT:BANDWIDTH, repeated, innermost first (e.g. --level 4:1e10 --level 4:1.25e9)");
  app.add_option("--topology", topology_path, "topology JSON file instead of --workers/--level");
  app.add_option("--memory", memory_text, "memory per worker (bytes, or 16GB, 80GiB)");
  app.add_option("--recompute", recompute,
                 "activation recomputation: auto (default: the stages that would not fit in --memory otherwise), "
                 "all stages, or none")
      ->check(CLI::IsMember({"none", "auto", "all"}));
  app.add_option("--cost-model", cost_model, "pipeline (default) or pipedream")->check(CLI::IsMember({"pipeline", "pipedream"}));
  app.add_flag("--straight", straight, "no replicated stages");
  app.add_flag("--allow-idle", allow_idle, "leave workers unused when that is no slower");
  app.add_flag("--ignore-transfer", ignore_transfer, "no activation transfer cost");
  app.add_option("--activation-compression", compression, "activation compression ratio R (transfers cost 2a/(B r R))");
  app.add_option("--stages", stages_text, "evaluate this plan instead: BEGIN:END[xREPLICAS],... e.g. 0:5x2,5:12,12:20");
  app.add_option("--batch", batch, "batch size of the profile (overrides the file)");
  app.add_option("--virtual-stages", virtual_stages,
                 "V > 1: an interleaved plan of V·p stages over the p workers, stage k on rank k mod p, "
                 "to run under interleaved-1f1b (default 1)");
  app.add_option("--max-states", max_states,
                 "antichain states the search may use; a DAG with more is planned over a coarsened DAG "
                 "(default 0: 4000 on one level, 1500 on several)");
  app.add_option("-o,--output", output, "write plan.json here");
  app.add_flag("-q,--quiet", quiet, "no table on stdout");
  app.add_flag("--no-simulate", no_simulate, "leave predicted.bubble_fraction at 0 instead of simulating the plan");
  CLI11_PARSE(app, argc, argv);

  try {
    auto t0 = std::chrono::steady_clock::now();
    PIPELINE_CHECK_AS(ConfigError, !profile_path.empty() || !pipedream_path.empty(),
                      "give the model: --profile profile.json or --pipedream graph.txt");
    pipeline::Profile profile =
        profile_path.empty() ? pipeline::read_pipedream_graph(pipedream_path) : pipeline::read_profile(profile_path);
    if (batch > 0) profile.batch_size = batch;

    pipeline::Topology topo;
    if (!topology_path.empty()) {
      PIPELINE_CHECK_AS(ConfigError, levels.empty() && workers == 0, "--topology excludes --workers and --level");
      topo = pipeline::read_topology(topology_path);
    } else if (!levels.empty()) {
      PIPELINE_CHECK_AS(ConfigError, workers == 0 && bandwidth_text.empty(), "--level excludes --workers/--bandwidth");
      for (const auto& l : levels) topo.levels.push_back(pipeline::parse_level(l));
    } else {
      PIPELINE_CHECK_AS(ConfigError, workers >= 1, "--workers must be at least 1 (got {}); or give --level COUNT:BANDWIDTH",
                        workers);
      PIPELINE_CHECK_AS(ConfigError, !bandwidth_text.empty(), "--workers needs --bandwidth");
      topo.levels.push_back({workers, pipeline::parse_bandwidth(bandwidth_text)});
    }
    if (!memory_text.empty()) topo.memory_bytes_per_worker = pipeline::parse_bytes(memory_text);
    pipeline::validate_topology(topo);

    pipeline::PartitionOptions opt;
    opt.cost_model = cost_model == "pipedream" ? pipeline::CostModel::PipeDream : pipeline::CostModel::Pipeline;
    opt.straight = straight;
    opt.allow_idle = allow_idle;
    opt.ignore_transfer = ignore_transfer;
    opt.activation_compression = compression;
    opt.max_states = max_states;
    // PipeDream's model has no recomputation: auto leaves it off there.
    opt.recompute = opt.cost_model == pipeline::CostModel::PipeDream && recompute == "auto"
                        ? pipeline::Recompute::None
                        : pipeline::parse_recompute(recompute);
    opt.virtual_stages = virtual_stages;

    pipeline::Plan plan = stages_text.empty()
                              ? pipeline::partition(profile, topo, opt)
                              : pipeline::evaluate_stages(profile, topo, pipeline::parse_manual_stages(stages_text), opt);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!no_simulate) plan.predicted.bubble_fraction = simulated_bubble_fraction(plan, profile, topo);
    if (!output.empty()) pipeline::write_plan(plan, output);
    if (!quiet) print_table(plan, profile, topo, seconds);
  } catch (const pipeline::Error& e) {
    fmt::print(stderr, "pipeline-partition: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline-partition: unexpected error: {}\n", e.what());
    return 2;
  }
  return 0;
}
