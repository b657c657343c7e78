// bench_simulate: how fast schedules are generated, validated and simulated at scale.
//
// Usage: bench_simulate [--ranks N] [--microbatches M] [--results FILE]
// Times 1F1B-flush (one minibatch of M microbatches), GPipe and 1F1B-stash (M minibatches) on a
// straight pipeline of N ranks with equal stages and free communication, where the bubble must
// be (p-1)/(m+p-1) for the flush schedules and ~0 in the steady state of 1F1B-stash.
// With --results the table is appended to FILE (e.g. bench/RESULTS.md) with the machine and date.
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "bench_util.hpp"

using namespace pipeline;
using bench::cpu_name;
using bench::cpu_seconds;
using bench::load_average;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1024, microbatches = 10000;
  std::string results;
  CLI::App app{"Schedule generation, validation and simulation at scale"};
  app.add_option("--ranks", ranks, "pipeline stages")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--microbatches", microbatches, "microbatches per minibatch")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--results", results, "also write the table here");
  CLI11_PARSE(app, argc, argv);
  Profile profile;
  profile.batch_size = 32;
  Plan plan;
  for (int s = 0; s < ranks; ++s) {
    LayerProfile l;
    l.forward_s = 1e-3;
    l.backward_s = 2e-3;
    l.output_bytes = 1 << 20;
    l.parameter_bytes = 1 << 20;
    profile.layers.push_back(l);
    plan.stages.push_back({s, s + 1, 1, {s}});
  }

  std::string table = fmt::format(
      "{:<12} {:>6} {:>8} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}\n", "schedule", "ranks",
      "mbs", "actions", "gen s", "sim s", "total s", "total cpu s", "bubble", "(p-1)/(m+p-1)");
  table += std::string(110, '-') + "\n";
  for (const char* name : {"1f1b-flush", "gpipe", "1f1b-stash"}) {
    bool stash = std::string(name) == "1f1b-stash";
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds();
    Schedule s = generate_schedule(name, stash ? ScheduleSpec::straight(ranks, 1, microbatches)
                                               : ScheduleSpec::straight(ranks, microbatches, 1));
    double gen = seconds_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    Simulation sim = simulate(s, profile, plan, {});  // validates, then times
    double sim_s = seconds_since(t1);
    double cpu = cpu_seconds() - c0;
    double formula = static_cast<double>(ranks - 1) / (microbatches + ranks - 1);
    table += fmt::format(
        "{:<12} {:>6} {:>8} {:>12} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.2f} {:>10.4f} {:>12}\n",
        name, ranks, microbatches, s.num_actions(), gen, sim_s, gen + sim_s, cpu,
        stash ? sim.steady_state_bubble_fraction : sim.bubble_fraction,
        stash ? std::string("0 (steady)") : fmt::format("{:.4f}", formula));
    std::fflush(stdout);
  }
  const std::string header = fmt::format(
      "bench_simulate: {} ranks x {} microbatches, equal stages, free links, {}, load average {}, "
      "{:%Y-%m-%d}\n",
      ranks, microbatches, cpu_name(), load_average(), fmt::localtime(std::time(nullptr)));
  std::fputs((header + table).c_str(), stdout);
  if (!results.empty() && !bench::append_results(results, header, table)) return 1;
  return 0;
}
