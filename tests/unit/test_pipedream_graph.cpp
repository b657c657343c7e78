// Import of PipeDream's graph.txt: the format, Input/__getitem__ removal, list-valued sizes, and
// every shipped profile (antichain state counts as PipeDream's optimizer reports them).
#include <pipeline/core/error.hpp>
#include <pipeline/plan/antichain.hpp>
#include <pipeline/profile/pipedream_graph.hpp>

#include <doctest/doctest.h>

#include "support/pipedream_profiles.hpp"

#include <filesystem>

namespace test_pipedream_graph {

using namespace pipeline;

TEST_CASE("graph.txt parsing: units, lists, Input and __getitem__ removal") {
  const char* text =
      "node1 -- Input0 -- forward_compute_time=100.000, backward_compute_time=0.000, activation_size=602112.0, parameter_size=0.000\n"
      "node2 -- Conv2d(3, 8) -- forward_compute_time=1.500, backward_compute_time=3.000, activation_size=1000.0, parameter_size=896.000\n"
      "node3 -- hidden -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=[10.0; 20.0; 30.0], parameter_size=0.000\n"
      "node4 -- LSTM(8, 8) -- forward_compute_time=2.000, backward_compute_time=4.000, activation_size=[100.0; 28.0], parameter_size=64.000\n"
      "node5 -- __getitem__(0) -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000\n"
      "\tnode1 -- node2\n\tnode2 -- node4\n\tnode3 -- node4\n\tnode4 -- node5\n";
  Profile p = parse_pipedream_graph(text, "inline", "toy");
  REQUIRE(p.size() == 3);
  CHECK(p.batch_size == 1);  // 602112 = 4 * 3 * 224 * 224
  CHECK(p.layers[0].name == "node2");
  CHECK(p.layers[0].forward_s == doctest::Approx(0.0015));
  CHECK(p.layers[0].backward_s == doctest::Approx(0.003));
  CHECK(p.layers[1].name == "node3");
  CHECK(p.layers[1].source);
  CHECK(p.layers[1].output_bytes == 60);
  CHECK(p.layers[2].output_bytes == 128);
  CHECK(p.layers[2].inputs == std::vector<int>{0, 1});
}

TEST_CASE("graph.txt errors") {
  CHECK_THROWS_AS(parse_pipedream_graph("", "e", ""), ConfigError);
  CHECK_THROWS_AS(parse_pipedream_graph("node1 -- X -- forward_compute_time=abc, backward_compute_time=0, activation_size=1, parameter_size=0\n", "e", ""), ConfigError);
  CHECK_THROWS_AS(parse_pipedream_graph("node1 -- X -- forward_compute_time=-1, backward_compute_time=0, activation_size=1, parameter_size=0\n", "e", ""), ConfigError);
  const char* dangling = "node1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n\tnode1 -- node9\n";
  CHECK_THROWS_AS(parse_pipedream_graph(dangling, "e", ""), ConfigError);
  const char* cycle =
      "node1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
      "node2 -- Y -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
      "node3 -- Z -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n"
      "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node2\n";
  CHECK_THROWS_AS(parse_pipedream_graph(cycle, "e", ""), ConfigError);
  CHECK_THROWS_AS(read_pipedream_graph("/nonexistent/graph.txt"), IoError);
  // Names become profile.json strings, which must be UTF-8, and sizes must fit profile.json
  // (found by fuzz/pipedream_graph.cpp: such graphs imported, then could not be written).
  auto node = [](const std::string& id, const std::string& desc, const std::string& act) {
    return id + " -- " + desc + " -- forward_compute_time=1, backward_compute_time=0, " +
           "activation_size=" + act + ", parameter_size=0\n";
  };
  CHECK_THROWS_WITH_AS(parse_pipedream_graph(node("n", "Conv2d(\xff)", "1"), "e", ""),
                       doctest::Contains("not UTF-8"), ConfigError);
  CHECK_THROWS_AS(parse_pipedream_graph(node("n\xc3", "X", "1"), "e", ""), ConfigError);
  CHECK_THROWS_AS(parse_pipedream_graph(node("n\xed\xa0\x80", "X", "1"), "e", ""), ConfigError);
  const std::string accented = "n\xc3\xa9\xf0\x9f\x98\x80";  // U+00E9 and U+1F600
  CHECK(parse_pipedream_graph(node(accented, "X", "1"), "e", "").layers[0].name == accented);
  CHECK_THROWS_WITH_AS(parse_pipedream_graph(node("n", "X", "9.1e18"), "e", ""),
                       doctest::Contains("not plausible"), ConfigError);
  CHECK_THROWS_AS(parse_pipedream_graph(node("n", "X", "[1e308; 1e308]"), "e", ""), ConfigError);
}

TEST_CASE("every shipped PipeDream profile imports; state counts match PipeDream") {
  std::string dir = testing::pipedream_profiles_dir();
  if (dir.empty()) {
    MESSAGE("shared/reference/pipedream-profiles not found; skipping");
    return;
  }
  struct Case {
    const char* path;
    int layers;
    int states;  // -1: too many to enumerate here
  };
  const Case cases[] = {{"alexnet", 22, 22},          {"vgg16", 40, 40},          {"resnet18", 70, 100},
                        {"resnet50", 176, 240},       {"resnet101", 346, 410},    {"resnext50", 176, 240},
                        {"resnext101", 346, 410},     {"squeezenet1_0", 67, 99},  {"densenet121", 428, 430},
                        {"gnmt", 37, 99},             {"gnmt_large", 77, 1495},   {"inception_v3", 325, -1},
                        {"nasnetamobile", -1, -1},    {"nasnetalarge", -1, -1},
                        {"_derived/compressed_graphs/inception_v3", 91, 1646}};
  for (const Case& c : cases) {
    CAPTURE(c.path);
    Profile p = read_pipedream_graph(dir + "/" + c.path + "/graph.txt");
    if (c.layers > 0) CHECK(p.size() == c.layers);
    if (c.states > 0) {
      StateGraph g = StateGraph::build(p, 5000);
      CHECK(g.size() == c.states);
      double total = 0;
      for (auto& l : p.layers) total += l.forward_s + l.backward_s;
      CHECK(g.compute_s.back() == doctest::Approx(total));
    } else {
      CHECK_THROWS_AS(StateGraph::build(p, 5000), ConfigError);
    }
  }
  CHECK(read_pipedream_graph(dir + "/vgg16/graph.txt").batch_size == 128);
  CHECK(read_pipedream_graph(dir + "/alexnet/graph.txt").batch_size == 256);
}

}  // namespace test_pipedream_graph
