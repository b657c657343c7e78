// pipeline-simulate: predict a plan's throughput, bubbles and memory under a schedule.
//
//   pipeline-simulate --profile profile.json --plan plan.json [--schedule NAME | --schedule-csv FILE]
//                     [--microbatches M] [--minibatches N] [--trace FILE] [--svg FILE] [--json]
//
// Prints a per-rank table (or, with --json, one JSON object) on stdout. The topology for transfer
// and allreduce costs is given innermost level first with repeated --level COUNT:BYTES_PER_S;
// without it communication is free.
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/trace.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <numeric>

namespace {

using nlohmann::json;
using namespace pipeline;

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open {} '{}'", what, path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    PIPELINE_FAIL(ConfigError, "{} '{}' is not valid JSON: {}", what, path, e.what());
  }
}

template <typename T>
T field(const json& j, const char* key, const std::string& where, T fallback) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    PIPELINE_FAIL(ConfigError, "{}: field '{}' has the wrong type ({})", where, key, j.at(key).dump());
  }
}

// The fields of profile.json and plan.json (DESIGN.md) the simulator uses.
Profile load_profile(const std::string& path) {
  json j = read_json(path, "profile");
  PIPELINE_CHECK_AS(ConfigError, j.is_object() && j.value("format", "") == "pipeline.profile/1",
                    "profile '{}' is not a pipeline.profile/1 document", path);
  Profile p;
  p.model = field<std::string>(j, "model", path, "");
  p.batch_size = field<int>(j, "batch_size", path, 0);
  PIPELINE_CHECK_AS(ConfigError, p.batch_size > 0, "profile '{}': batch_size must be positive, got {}",
                    path, p.batch_size);
  PIPELINE_CHECK_AS(ConfigError, j.contains("layers") && j["layers"].is_array(),
                    "profile '{}' has no layers array", path);
  int i = 0;
  for (const json& l : j["layers"]) {
    std::string where = fmt::format("profile '{}', layer {}", path, i++);
    PIPELINE_CHECK_AS(ConfigError, l.is_object(), "{} is not an object", where);
    LayerProfile lp;
    lp.name = field<std::string>(l, "name", where, "");
    lp.forward_s = field<double>(l, "forward_s", where, 0);
    lp.backward_s = field<double>(l, "backward_s", where, 0);
    lp.backward_input_s = field<double>(l, "backward_input_s", where, 0);
    lp.backward_weight_s = field<double>(l, "backward_weight_s", where, 0);
    lp.output_bytes = field<std::int64_t>(l, "output_bytes", where, 0);
    lp.parameter_bytes = field<std::int64_t>(l, "parameter_bytes", where, 0);
    lp.inputs = field<std::vector<int>>(l, "inputs", where, {});
    PIPELINE_CHECK_AS(ConfigError, lp.forward_s >= 0 && lp.backward_s >= 0 && lp.output_bytes >= 0 &&
                                       lp.parameter_bytes >= 0,
                      "{} has a negative time or size", where);
    p.layers.push_back(std::move(lp));
  }
  return p;
}

Plan load_plan(const std::string& path) {
  json j = read_json(path, "plan");
  PIPELINE_CHECK_AS(ConfigError, j.is_object() && j.value("format", "") == "pipeline.plan/1",
                    "plan '{}' is not a pipeline.plan/1 document", path);
  Plan plan;
  plan.model = field<std::string>(j, "model", path, "");
  plan.workers = field<int>(j, "workers", path, 0);
  plan.schedule = field<std::string>(j, "schedule", path, "1f1b-stash");
  plan.in_flight = field<int>(j, "in_flight", path, 1);
  PIPELINE_CHECK_AS(ConfigError, j.contains("stages") && j["stages"].is_array() && !j["stages"].empty(),
                    "plan '{}' has no stages", path);
  int next = 0, i = 0;
  for (const json& s : j["stages"]) {
    std::string where = fmt::format("plan '{}', stage {}", path, i++);
    PlanStage st;
    auto layers = field<std::vector<int>>(s, "layers", where, {});
    PIPELINE_CHECK_AS(ConfigError, layers.size() == 2, "{}: 'layers' must be [begin, end)", where);
    st.begin = layers[0];
    st.end = layers[1];
    st.replicas = field<int>(s, "replicas", where, 1);
    st.ranks = field<std::vector<int>>(s, "ranks", where, {});
    if (st.ranks.empty())
      for (int r = 0; r < st.replicas; ++r) st.ranks.push_back(next + r);
    PIPELINE_CHECK_AS(ConfigError, static_cast<int>(st.ranks.size()) == st.replicas,
                      "{}: {} replicas but {} ranks", where, st.replicas, st.ranks.size());
    next += st.replicas;
    plan.stages.push_back(std::move(st));
  }
  return plan;
}

Topology parse_levels(const std::vector<std::string>& levels) {
  Topology t;
  for (const auto& l : levels) {
    auto colon = l.find(':');
    PIPELINE_CHECK_AS(ConfigError, colon != std::string::npos,
                      "--level '{}' must be COUNT:BYTES_PER_S, e.g. 8:300e9", l);
    try {
      t.levels.push_back({std::stoi(l.substr(0, colon)), std::stod(l.substr(colon + 1))});
    } catch (const std::exception&) {
      PIPELINE_FAIL(ConfigError, "--level '{}' must be COUNT:BYTES_PER_S, e.g. 8:300e9", l);
    }
  }
  return t;
}

int run(int argc, char** argv) {
  CLI::App app{"Predict a pipeline plan's throughput, bubbles and memory under a schedule"};
  std::string profile_path, plan_path, schedule_name, schedule_csv, trace_path, svg_path;
  int microbatches = 0, minibatches = 0, microbatch_size = 0;
  std::vector<std::string> levels;
  double latency = 0;
  bool as_json = false, full_duplex = false;
  app.add_option("--profile", profile_path, "profile.json")->required();
  app.add_option("--plan", plan_path, "plan.json")->required();
  auto* by_name = app.add_option("--schedule", schedule_name,
                                 "schedule generator (default: the plan's): " +
                                     fmt::format("{}", fmt::join(GeneratorRegistry::builtin().names(), ", ")));
  app.add_option("--schedule-csv", schedule_csv, "a schedule written as CSV")->excludes(by_name);
  app.add_option("--microbatches", microbatches, "microbatches per minibatch (default: 4 x stages; 1 for stash)");
  app.add_option("--minibatches", minibatches, "minibatches to simulate (default: 1; stash: 8 x workers)");
  app.add_option("--microbatch-size", microbatch_size, "samples per microbatch (default: the profile's batch)");
  app.add_option("--level", levels, "topology level COUNT:BYTES_PER_S, innermost first (repeat)");
  app.add_option("--latency", latency, "seconds per message");
  app.add_flag("--full-duplex", full_duplex, "links carry both directions at full bandwidth");
  app.add_option("--trace", trace_path, "write a Chrome-trace / Perfetto JSON");
  app.add_option("--svg", svg_path, "write an SVG timeline");
  app.add_flag("--json", as_json, "print the result as JSON");
  CLI11_PARSE(app, argc, argv);

  Profile profile = load_profile(profile_path);
  Plan plan = load_plan(plan_path);
  Schedule schedule;
  if (!schedule_csv.empty()) {
    schedule = read_schedule_csv(schedule_csv);
  } else {
    std::string name = schedule_name.empty() ? plan.schedule : schedule_name;
    bool stash = name.rfind("1f1b-stash", 0) == 0;
    if (microbatches <= 0) microbatches = stash ? 1 : 4 * plan.num_stages();
    if (minibatches <= 0) {
      minibatches = 1;
      if (stash) {
        int lcm = 1;
        for (auto& s : plan.stages) lcm = std::lcm(lcm, std::max(s.replicas, 1));
        int workers = 0;
        for (auto& s : plan.stages) workers += s.replicas;
        minibatches = lcm * ((8 * workers + lcm - 1) / lcm);
      }
    }
    schedule = generate_schedule(name, ScheduleSpec::from_plan(plan, microbatches, minibatches));
  }
  SimulateOptions opt;
  opt.microbatch_size = microbatch_size;
  opt.latency_s = latency;
  opt.full_duplex = full_duplex;
  opt.record_trace = !trace_path.empty() || !svg_path.empty();
  Simulation sim = simulate(schedule, profile, plan, parse_levels(levels), opt);
  if (!trace_path.empty()) write_chrome_trace(trace_path, sim, schedule);
  if (!svg_path.empty()) write_timeline_svg(svg_path, sim, schedule);

  if (as_json) {
    json ranks = json::array();
    for (auto& r : sim.ranks)
      ranks.push_back({{"rank", r.rank},
                       {"stage", r.stage},
                       {"bubble_fraction", r.bubble_fraction},
                       {"steady_state_bubble_fraction", r.steady_state_bubble_fraction},
                       {"peak_activations", r.peak_activations},
                       {"peak_weight_versions", r.peak_weight_versions},
                       {"peak_memory_bytes", r.peak_memory_bytes}});
    json out = {{"schedule", sim.schedule},
                {"time_per_minibatch_s", sim.time_per_minibatch_s},
                {"samples_per_s", sim.samples_per_s},
                {"bubble_fraction", sim.bubble_fraction},
                {"steady_state_bubble_fraction", sim.steady_state_bubble_fraction},
                {"makespan_s", sim.makespan_s},
                {"per_rank", ranks}};
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("schedule {}: {} ranks, {} microbatch(es) x {} minibatch(es)\n", sim.schedule,
             schedule.num_ranks(), schedule.microbatches, schedule.minibatches);
  fmt::print("time per minibatch {:.6f} s, {:.1f} samples/s, bubble {:.1f}% (steady state {:.1f}%)\n",
             sim.time_per_minibatch_s, sim.samples_per_s, 100 * sim.bubble_fraction,
             100 * sim.steady_state_bubble_fraction);
  fmt::print("{:>5} {:>5} {:>8} {:>8} {:>11} {:>9} {:>14}\n", "rank", "stage", "bubble", "steady",
             "activations", "versions", "peak memory");
  for (auto& r : sim.ranks)
    fmt::print("{:>5} {:>5} {:>7.1f}% {:>7.1f}% {:>11} {:>9} {:>14}\n", r.rank, r.stage,
               100 * r.bubble_fraction, 100 * r.steady_state_bubble_fraction, r.peak_activations,
               r.peak_weight_versions, r.peak_memory_bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const pipeline::Error& e) {
    pipeline::log(pipeline::LogLevel::Error, "{}", e.what());
    return 1;
  }
}
