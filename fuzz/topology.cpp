// Topologies (src/plan/topology_io.cpp): the same bytes as topology JSON, as a command-line
// level ("8:300GB/s"), as a bandwidth and as a memory size. An accepted topology is described
// (the log line every tool prints) and written and read back.
#include "fuzz_support.hpp"

#include <pipeline/plan/topology_io.hpp>

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::accepts([&] { parse_level(text); });
  fuzz::accepts([&] { parse_bandwidth(text); });
  fuzz::accepts([&] { parse_bytes(text); });
  Topology topology;
  if (!fuzz::accepts([&] { topology = parse_topology(text, "fuzz"); })) return 0;
  fuzz::expect("topology description", [&] { return !describe_topology(topology).empty(); });
  fuzz::expect("topology round trip", [&] {
    Topology again = parse_topology(topology_to_json(topology).dump(), "round trip");
    return again.levels.size() == topology.levels.size() && again.workers() == topology.workers() &&
           again.memory_bytes_per_worker.has_value() ==
               topology.memory_bytes_per_worker.has_value();
  });
  return 0;
}
