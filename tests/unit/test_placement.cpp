// Placing a plan's ranks on hosts: OpenMPI hostfiles, rank r on host r / (workers per host) for
// the topology's host level (a typed topology's on workers of its stage's device type), the
// rankfile text, and the errors when hosts or slots are too few.
#include <pipeline/core/error.hpp>
#include <pipeline/plan/placement.hpp>

#include <doctest/doctest.h>

#include <string>

namespace test_placement {

using namespace pipeline;

namespace {

// `workers` ranks as stages of `per_stage` replicas each.
Plan plan_of(int workers, int per_stage) {
  Plan p;
  p.workers = workers;
  for (int r = 0; r < workers; r += per_stage) {
    PlanStage s;
    s.begin = r;
    s.end = r + 1;
    s.replicas = per_stage;
    for (int i = 0; i < per_stage; ++i) s.ranks.push_back(r + i);
    p.stages.push_back(s);
  }
  return p;
}

Topology levels(std::vector<int> counts) {
  Topology t;
  for (int c : counts) t.levels.push_back({c, 1e9});
  return t;
}

std::string error_of(const Plan& plan, const Topology& t, const std::vector<HostEntry>& hosts,
                     PlacementOptions o = {}) {
  try {
    place_ranks(plan, t, hosts, o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("OpenMPI hostfiles") {
  const auto hosts = parse_hostfile(
      "# the lab\nnode-a slots=4\n\n  node-b max_slots=2 slots=8  # two cores\nnode-c\n"
      "node-d count=3 cpu=2\n");
  REQUIRE(hosts.size() == 4);
  CHECK(hosts[0].name == "node-a");
  CHECK(hosts[0].slots == 4);
  CHECK(hosts[1].slots == 2);  // max_slots bounds slots
  CHECK(!hosts[2].slots);
  CHECK(hosts[3].slots == 3);
  CHECK_THROWS_WITH_AS(parse_hostfile("a\nb\na slots=2\n", "h.txt"),
                       doctest::Contains("h.txt line 3: host 'a' is listed twice"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_hostfile("a slots=0\n"), doctest::Contains("positive whole number"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_hostfile("a slots=two\n"), doctest::Contains("'slots=two'"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_hostfile("slots=2\n"), doctest::Contains("expected a host name"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_hostfile("# nothing\n\n", "empty.txt"),
                       doctest::Contains("empty.txt lists no hosts"), ConfigError);
  CHECK_THROWS_WITH_AS(read_hostfile("/nonexistent/hosts.txt"),
                       doctest::Contains("cannot open hostfile"), ConfigError);
}

TEST_CASE(
    "the innermost level is one host; a one-level topology puts every worker on its own host") {
  const std::vector<HostEntry> hosts{{"a", std::nullopt}, {"b", std::nullopt}, {"c", std::nullopt}};
  // 2 servers of 2 workers: stage replicas (0,1) and (2,3) each on one server.
  auto p = place_ranks(plan_of(4, 2), levels({2, 2}), hosts);
  REQUIRE(p.size() == 4);
  CHECK(p[0].host == "a");
  CHECK(p[1].host == "a");
  CHECK(p[1].local_index == 1);
  CHECK(p[2].host == "b");
  CHECK(p[3].host == "b");
  CHECK(describe_placement(p) == "ranks 0-1 on a, ranks 2-3 on b");
  CHECK(rankfile_text(p) == "rank 0=a slot=0\nrank 1=a slot=1\nrank 2=b slot=0\nrank 3=b slot=1\n");

  // One level: its bandwidth is the hosts' network.
  p = place_ranks(plan_of(2, 1), levels({2}), hosts);
  CHECK(describe_placement(p) == "rank 0 on a, rank 1 on b");
  CHECK(rankfile_text(p) == "rank 0=a slot=0\nrank 1=b slot=0\n");

  // Three levels with the two innermost inside a host (2 sockets of 2 workers per server).
  PlacementOptions two;
  two.host_level = 2;
  two.cores_per_rank = 3;
  p = place_ranks(plan_of(8, 1), levels({2, 2, 2}), hosts, two);
  CHECK(describe_placement(p) == "ranks 0-3 on a, ranks 4-7 on b");
  CHECK(p[7].first_core == 9);
  CHECK(rankfile_text(p).find("rank 7=b slot=9-11\n") != std::string::npos);

  // Everything on one host.
  PlacementOptions all;
  all.host_level = 1;
  CHECK(describe_placement(place_ranks(plan_of(3, 1), levels({3}), hosts, all)) ==
        "ranks 0-2 on a");
  CHECK(describe_placement(place_ranks(plan_of(1, 1), levels({1}), hosts)) == "rank 0 on a");

  // A plan that leaves workers idle (--allow-idle, manual stages) runs as a job of the ranks it
  // uses, each on its worker's host: workers 0, 2 and 3 of 2 servers as ranks 0, 1 and 2.
  Plan idle = plan_of(4, 1);
  idle.stages.erase(idle.stages.begin() + 1);
  idle.stages[0].end = 2;
  p = place_ranks(idle, levels({2, 2}), hosts);
  CHECK(describe_placement(p) == "rank 0 on a, ranks 1-2 on b");
  CHECK(rankfile_text(p) == "rank 0=a slot=0\nrank 1=b slot=0\nrank 2=b slot=1\n");
  CHECK(compact_ranks(idle).workers == 3);
  CHECK(compact_ranks(idle).stages[1].ranks == std::vector<int>{1});
}

TEST_CASE("a typed topology's ranks go to workers of their stage's device type") {
  // The hostfile lists the hosts type by type, in the topology's order: a100, a100, h100, h100.
  Topology typed = levels({4});
  typed.types = {{"a100", 2, {}, {}}, {"h100", 2, {}, {}}};
  const std::vector<HostEntry> hosts{
      {"a1", std::nullopt}, {"a2", std::nullopt}, {"h1", std::nullopt}, {"h2", std::nullopt}};
  // The typed planner numbers ranks in stage order: h100 first, then the a100 replicas.
  Plan plan = plan_of(3, 1);
  plan.stages[0].device = "h100";
  plan.stages[1].device = "a100";
  plan.stages[2].device = "a100";
  std::vector<RankPlacement> placed = place_ranks(plan, typed, hosts);
  REQUIRE(placed.size() == 3);
  CHECK(placed[0].host == "h1");
  CHECK(placed[1].host == "a1");
  CHECK(placed[2].host == "a2");
  // Every type on one host: the local index is the worker's place in the topology's order.
  PlacementOptions one_host;
  one_host.host_level = 1;
  placed = place_ranks(plan, typed, {{"node", 4}}, one_host);
  CHECK(placed[0].local_index == 2);
  CHECK(placed[1].local_index == 0);
  CHECK(placed[2].first_core == 1);
}

TEST_CASE("too few hosts or slots, and plans that do not fit the topology, are refused") {
  const std::vector<HostEntry> one{{"a", std::nullopt}};
  CHECK(error_of(plan_of(4, 2), levels({2, 2}), one)
            .find("the plan needs 2 hosts (4 ranks, 2 per host at host level 1) but the hostfile "
                  "lists 1") != std::string::npos);
  CHECK(error_of(plan_of(2, 1), levels({2}), one).find("needs 2 hosts") != std::string::npos);
  const std::vector<HostEntry> small{{"a", 1}, {"b", 2}};
  CHECK(error_of(plan_of(4, 2), levels({2, 2}), small)
            .find("host 'a' has 1 slots but the plan puts 2 ranks on it") != std::string::npos);
  const std::vector<HostEntry> enough{{"a", 2}, {"b", 2}};
  CHECK(error_of(plan_of(4, 2), levels({2, 2}), enough).empty());
  // A plan for fewer workers (cost planning's sub-clusters) runs on the topology's first ones.
  const std::vector<RankPlacement> first = place_ranks(plan_of(2, 1), levels({2, 2}), enough);
  REQUIRE(first.size() == 2);
  CHECK(first[1].host == "a");
  CHECK(first[1].local_index == 1);
  CHECK(place_ranks(plan_of(3, 1), levels({2, 2}), enough)[2].host == "b");
  CHECK(error_of(plan_of(6, 2), levels({2, 2}), enough)
            .find("the plan is for 6 workers but the topology has 4") != std::string::npos);
  Topology typed = levels({4});
  typed.types = {{"a100", 2, {}, {}}, {"h100", 2, {}, {}}};
  Plan untyped_stages = plan_of(2, 1);
  CHECK(error_of(untyped_stages, typed, enough).find("the plan's stages name none") !=
        std::string::npos);
  Plan three_h100 = plan_of(3, 1);
  for (auto& st : three_h100.stages) st.device = "h100";
  CHECK(
      error_of(three_h100, typed,
               {{"a", std::nullopt}, {"b", std::nullopt}, {"c", std::nullopt}, {"d", std::nullopt}})
          .find("more ranks on device type 'h100' than the topology's 2") != std::string::npos);
  PlacementOptions deep;
  deep.host_level = 3;
  CHECK(error_of(plan_of(4, 2), levels({2, 2}), enough, deep).find("host level 3 is outside") !=
        std::string::npos);
  PlacementOptions no_cores;
  no_cores.cores_per_rank = 0;
  CHECK(error_of(plan_of(4, 2), levels({2, 2}), enough, no_cores).find("cores per rank") !=
        std::string::npos);
  Plan bad = plan_of(2, 1);
  bad.stages[1].ranks = {5};
  CHECK(error_of(bad, levels({2}), enough).find("rank 5") != std::string::npos);
}

}  // namespace test_placement
