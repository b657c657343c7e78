// Bandwidth and memory units, the COUNT:BANDWIDTH level syntax and topology JSON.
#include <pipeline/core/error.hpp>
#include <pipeline/plan/topology_io.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace test_topology {

using namespace pipeline;

TEST_CASE("bandwidths and sizes with units") {
  CHECK(parse_bandwidth("1e10") == doctest::Approx(1e10));
  CHECK(parse_bandwidth("300GB/s") == doctest::Approx(300e9));
  CHECK(parse_bandwidth("25Gbit/s") == doctest::Approx(25e9 / 8));
  CHECK(parse_bandwidth("25 Gbps") == doctest::Approx(25e9 / 8));
  // In a rate a lower-case b is a bit, an upper-case B a byte, as network speeds are written.
  CHECK(parse_bandwidth("10Gb/s") == doctest::Approx(10e9 / 8));
  CHECK(parse_bandwidth("100mb/s") == doctest::Approx(100e6 / 8));
  CHECK(parse_bandwidth("100Mbps") == doctest::Approx(100e6 / 8));
  CHECK(parse_bandwidth("10gbps") == doctest::Approx(10e9 / 8));
  CHECK(parse_bandwidth("10GBps") == doctest::Approx(10e9));
  CHECK(parse_bandwidth("10gB/s") == doctest::Approx(10e9));
  CHECK(parse_bandwidth("8b/s") == doctest::Approx(1));
  CHECK(parse_bandwidth("10GiB/s") == doctest::Approx(10.0 * 1073741824));
  CHECK(parse_bandwidth("10 gbit/s") == doctest::Approx(10e9 / 8));
  CHECK(parse_bytes("16gb") == doctest::Approx(16e9));  // a size is bytes whatever the case
  CHECK(parse_bandwidth("1.25e9") == doctest::Approx(1.25e9));
  CHECK(parse_bandwidth("10 GiB/s") == doctest::Approx(10.0 * 1073741824));
  CHECK(parse_bytes("80GiB") == doctest::Approx(80.0 * 1073741824));
  CHECK(parse_bytes("16GB") == doctest::Approx(16e9));
  CHECK(parse_bytes("4e9") == doctest::Approx(4e9));
  for (const char* bad : {"", "fast", "-5GB/s", "0", "10 parsecs", "1e10x", "nan", "inf"})
    CHECK_THROWS_AS(parse_bandwidth(bad), ConfigError);
  CHECK_THROWS_AS(parse_bytes("25Gbit"), ConfigError);  // bits are not a memory size
  CHECK_THROWS_AS(parse_bytes("lots"), ConfigError);
}

TEST_CASE("levels and topologies") {
  TopologyLevel l = parse_level("8:300GB/s");
  CHECK(l.count == 8);
  CHECK(l.bandwidth_bytes_per_s == doctest::Approx(3e11));
  CHECK_THROWS_AS(parse_level("0:1e10"), ConfigError);
  CHECK_THROWS_AS(parse_level("4"), ConfigError);
  CHECK_THROWS_AS(parse_level("x:1e10"), ConfigError);
  auto j = nlohmann::json::parse(R"({"levels": [{"count": 8, "bandwidth": "300GB/s"},
                                                {"count": 4, "bandwidth": "25Gbit/s"}],
                                     "memory_per_worker": "80GiB"})");
  Topology t = topology_from_json(j, "t.json");
  CHECK(t.workers() == 32);
  // A misspelt key is refused, not left at its default.
  CHECK_THROWS_WITH_AS(
      topology_from_json(
          nlohmann::json::parse(
              R"({"levels": [{"count": 2, "bandwidth": 1e9}], "memroy_per_worker": "1MB"})"),
          "t.json"),
      doctest::Contains("t.json: unknown key \"memroy_per_worker\" in the topology; the keys are "
                        "levels, memory_per_worker, price_per_worker_hour, types"),
      ConfigError);
  CHECK_THROWS_WITH_AS(
      topology_from_json(nlohmann::json::parse(R"({"levels": [{"count": 2, "bandwith": 1e9}]})"),
                         "t.json"),
      doctest::Contains("needs \"count\" and \"bandwidth\""), ConfigError);
  CHECK(t.levels[1].bandwidth_bytes_per_s == doctest::Approx(25e9 / 8));
  CHECK(*t.memory_bytes_per_worker == doctest::Approx(80.0 * 1073741824));
  Topology back = topology_from_json(topology_to_json(t), "back");
  CHECK(back.workers() == 32);
  Topology empty;
  CHECK_THROWS_AS(validate_topology(empty), ConfigError);
  Topology zero{{{0, 1e10}}, {}};
  CHECK_THROWS_AS(validate_topology(zero), ConfigError);
}

}  // namespace test_topology
