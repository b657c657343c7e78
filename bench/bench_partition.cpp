// Partitioner speed: the shipped PipeDream profiles over 16 workers (one level), 4x4 and 8x2,
// and synthetic 1,000-layer chains over 1,024 workers (8x8x16 three levels, and --straight).
// Usage: bench_partition [pipedream-profiles dir]. Prints a table of wall-clock seconds.
#include <pipeline/plan/antichain.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/pipedream_graph.hpp>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <random>

using namespace pipeline;

namespace {

double seconds(const Profile& p, const Topology& t, const PartitionOptions& o, double* result) {
  auto t0 = std::chrono::steady_clock::now();
  Plan plan = partition(p, t, o);
  *result = plan.predicted.time_per_minibatch_s;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "../shared/reference/pipedream-profiles";
  fmt::print("{:<42} {:>10} {:>10} {:>10}\n", "profile", "16 (s)", "4x4 (s)", "8x2 (s)");
  const char* models[] = {"alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50", "resnext101",
                          "squeezenet1_0", "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt",
                          "gnmt_large", "_derived/compressed_graphs/inception_v3"};
  PartitionOptions o;
  o.cost_model = CostModel::PipeDream;
  double r = 0;
  if (std::filesystem::exists(dir + "/vgg16/graph.txt")) {
    for (const char* m : models) {
      Profile p = read_pipedream_graph(dir + "/" + m + "/graph.txt");
      double a = seconds(p, Topology{{{16, 1e10}}, {}}, o, &r);
      double b = seconds(p, Topology{{{4, 1e10}, {4, 1.25e9}}, {}}, o, &r);
      double c = seconds(p, Topology{{{8, 1e10}, {2, 1.25e9}}, {}}, o, &r);
      fmt::print("{:<42} {:>10.3f} {:>10.3f} {:>10.3f}\n", m, a, b, c);
    }
  } else {
    fmt::print("(no PipeDream profiles at {})\n", dir);
  }
  Profile c = chain(1000);
  PartitionOptions def;
  double t3 = seconds(c, Topology{{{8, 3e11}, {8, 1e11}, {16, 3.125e9}}, {}}, def, &r);
  fmt::print("chain 1000 layers, 8x8x16 = 1024 workers: {:.3f} s\n", t3);
  PartitionOptions st;
  st.straight = true;
  double ts = seconds(c, Topology{{{1024, 1e10}}, {}}, st, &r);
  fmt::print("chain 1000 layers, 1024 workers, straight: {:.3f} s\n", ts);
  return 0;
}
