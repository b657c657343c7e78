// Partitioner speed: the shipped PipeDream profiles over 16 workers (one level), 4x4 and 8x2,
// synthetic 1,000-layer chains over 1,024 workers (8x8x16 three levels, and --straight), and
// how time and peak memory grow with the number of states and workers.
// Usage: bench_partition [pipedream-profiles dir] [--only SUBSTRING]
// Every case runs in a child process, so its peak resident memory is its own (ru_maxrss), and
// its CPU seconds (user + system, all threads) are reported beside the wall seconds: on a loaded
// machine the wall time says little, the CPU time still compares.
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/antichain.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/pipedream_graph.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <random>

using namespace pipeline;

namespace {

struct Result {
  double seconds = -1;  // < 0: failed
  double cpu_seconds = 0;
  double time_per_minibatch = 0;
  double linear_time_per_minibatch = 0;  // DAGs planned over coarsened states: one topological order's plan
  int states = 0;
  int groups = 0, layers = 0;
  bool coarsened = false;
  double peak_mib = 0;
};

double cpu_seconds(const struct rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Runs `work` in a child: wall and CPU seconds of partition() and the child's peak RSS.
Result measure(const std::function<Profile()>& load, const Topology& t, const PartitionOptions& o) {
  int fd[2];
  if (pipe(fd) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    Result r;
    try {
      Profile p = load();
      struct rusage before {};
      getrusage(RUSAGE_SELF, &before);
      auto t0 = std::chrono::steady_clock::now();
      Plan plan = partition(p, t, o);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      struct rusage after {};
      getrusage(RUSAGE_SELF, &after);
      r.cpu_seconds = cpu_seconds(after) - cpu_seconds(before);
      r.time_per_minibatch = plan.predicted.time_per_minibatch_s;
      r.layers = p.size();
      if (p.is_chain()) r.states = p.size();
      else {
        // The states partition() used: all antichain states within its budget, else coarsened.
        const std::size_t budget = antichain_state_budget(t, o);
        try {
          r.states = StateGraph::build(p, budget).size();
        } catch (const ConfigError&) {
          StateGraph g = StateGraph::build_coarsened(p, budget);
          r.states = g.size();
          r.groups = g.num_groups();
          r.coarsened = true;
          PartitionOptions lin = o;
          lin.max_states = 1;  // too few for any state set: one topological order
          log_threshold() = LogLevel::Error;  // that fallback's warning is expected here
          r.linear_time_per_minibatch = partition(p, t, lin).predicted.time_per_minibatch_s;
        }
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
    }
    ssize_t n = write(fd[1], &r, sizeof r);
    _exit(n == static_cast<ssize_t>(sizeof r) ? 0 : 1);
  }
  close(fd[1]);
  Result r;
  if (read(fd[0], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) r = {};
  close(fd[0]);
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  r.peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  return r;
}

Profile chain(int n) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  Profile p;
  p.model = fmt::format("chain{}", n);
  p.batch_size = 64;
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.forward_s = 1e-3 * u(rng);
    l.backward_s = 2e-3 * u(rng);
    l.output_bytes = static_cast<std::int64_t>(1e6 * u(rng));
    l.parameter_bytes = static_cast<std::int64_t>(4e6 * u(rng));
    p.layers.push_back(l);
  }
  return p;
}

std::string cell(const Result& r) {
  return r.seconds < 0 ? std::string("fail") : fmt::format("{:.3f} ({:.3f})", r.seconds, r.cpu_seconds);
}

std::string states_cell(const Result& r) {
  if (!r.coarsened) return std::to_string(r.states);
  return fmt::format("{} ({} layers in {} groups)", r.states, r.layers, r.groups);
}

// A coarsened DAG's plan against one topological order's; "exact" where every state was used.
std::string versus(const Result& r) {
  if (!r.coarsened) return fmt::format("{:.6f} (all states)", r.time_per_minibatch);
  return fmt::format("{:.6f} / {:.6f}", r.time_per_minibatch, r.linear_time_per_minibatch);
}

std::string load_average() {
  double l[3] = {0, 0, 0};
  return getloadavg(l, 3) == 3 ? fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]) : std::string("unknown");
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "../shared/reference/pipedream-profiles", only;
  CLI::App app{"The partitioner over PipeDream's published profiles: time, states, memory"};
  app.add_option("dir", dir, "the folder of PipeDream's profiles (<model>/graph.txt)")
      ->capture_default_str();
  app.add_option("--only", only, "only the profiles whose name contains this");
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const std::string& name) { return only.empty() || name.find(only) != std::string::npos; };
  std::fflush(stdout);

  const char* models[] = {"alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50", "resnext101",
                          "squeezenet1_0", "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt",
                          "gnmt_large", "_derived/compressed_graphs/inception_v3",
                          "_derived/compressed_graphs/nasnetamobile", "_derived/compressed_graphs/nasnetalarge"};
  PartitionOptions pd;
  pd.cost_model = CostModel::PipeDream;
  if (std::filesystem::exists(dir + "/vgg16/graph.txt")) {
    fmt::print("Wall seconds of partition() (CPU seconds of all threads in parentheses); load average at start: {}\n\n",
               load_average());
    fmt::print("| profile | states 16 workers | states 4x4, 8x2 | 16 workers (s) | 4x4 (s) | 8x2 (s) | peak MiB |\n"
               "|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    std::vector<std::string> quality;
    for (const char* m : models) {
      if (!wanted(m)) continue;
      auto load = [&] { return read_pipedream_graph(dir + "/" + m + "/graph.txt"); };
      Result a = measure(load, Topology{{{16, 1e10}}, {}}, pd);
      Result b = measure(load, Topology{{{4, 1e10}, {4, 1.25e9}}, {}}, pd);
      Result c = measure(load, Topology{{{8, 1e10}, {2, 1.25e9}}, {}}, pd);
      fmt::print("| {} | {} | {} | {} | {} | {} | {:.0f} |\n", m, states_cell(a), states_cell(c), cell(a), cell(b), cell(c),
                 std::max({a.peak_mib, b.peak_mib, c.peak_mib}));
      std::fflush(stdout);
      if (a.coarsened || c.coarsened)
        quality.push_back(fmt::format("| {} | {} | {} | {} |", m, versus(a), versus(b), versus(c)));
    }
    if (!quality.empty()) {
      fmt::print("\nCoarsened DAGs: time per minibatch (s) of the plan over the coarsened antichain states / over "
                 "one topological order (PipeDream cost model)\n\n| profile | 16 workers | 4x4 | 8x2 |\n|---|---|---|---|\n");
      for (const auto& q : quality) fmt::print("{}\n", q);
    }
  } else {
    fmt::print("(no PipeDream profiles at {})\n", dir);
  }

  auto chain1000 = [] { return chain(1000); };
  fmt::print("\n| chain case | time (s) | peak MiB | time per minibatch (s) |\n|---|---|---|---|\n");
  std::fflush(stdout);
  PartitionOptions def;
  if (wanted("8x8x16")) {
    Result r = measure(chain1000, Topology{{{8, 3e11}, {8, 1e11}, {16, 3.125e9}}, {}}, def);
    fmt::print("| 1000 layers, 8x8x16 = 1024 workers | {} | {:.0f} | {:.6f} |\n", cell(r), r.peak_mib, r.time_per_minibatch);
    std::fflush(stdout);
  }
  PartitionOptions st;
  st.straight = true;
  st.allow_idle = true;
  if (wanted("straight")) {
    Result r = measure(chain1000, Topology{{{1024, 1e10}}, {}}, st);
    fmt::print("| 1000 layers, 1024 workers, straight (idle allowed: at most 1000 stages) | {} | {:.0f} | {:.6f} |\n",
               cell(r), r.peak_mib, r.time_per_minibatch);
    PartitionOptions exact;
    exact.straight = true;
    Result e = measure(chain1000, Topology{{{512, 1e10}}, {}}, exact);
    fmt::print("| 1000 layers, 512 workers, straight (exactly 512 stages) | {} | {:.0f} | {:.6f} |\n", cell(e), e.peak_mib,
               e.time_per_minibatch);
    std::fflush(stdout);
  }

  if (wanted("scaling")) {
    // Growth with states (chain length) and workers, one level and 8 x (workers/8) two levels.
    fmt::print("\n| layers | workers | 1 level (s) | MiB | 8 x w/8 (s) | MiB | straight (s) | MiB |\n|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    for (int n : {250, 500, 1000, 2000, 4000}) {
      for (int w : {16, 64, 256, 1024}) {
        auto load = [n] { return chain(n); };
        // One level over many workers visits every (machines, last-stage machines) pair:
        // O(S^2 M^2); 1,024 workers from 500 layers on (half a minute and more) are left out.
        const bool slow = w >= 1024 && n >= 500;
        Result one = slow ? Result{} : measure(load, Topology{{{w, 1e10}}, {}}, def);
        Result two = measure(load, Topology{{{8, 1e11}, {w / 8, 1.25e9}}, {}}, def);
        Result s = measure(load, Topology{{{w, 1e10}}, {}}, st);
        fmt::print("| {} | {} | {} | {:.0f} | {} | {:.0f} | {} | {:.0f} |\n", n, w, slow ? std::string("not run") : cell(one),
                   one.peak_mib, cell(two), two.peak_mib, cell(s), s.peak_mib);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
