#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>

namespace test_schedule_csv {

using namespace pipeline;

TEST_CASE("generated schedules survive a CSV round trip") {
  for (std::string name : {"gpipe", "1f1b-flush", "zb-h1", "2bw", "1f1b-stash", "1f1b-stash-vsync"}) {
    CAPTURE(name);
    ScheduleSpec spec;
    spec.stage_ranks = {{0, 1}, {2}, {3}};
    bool stash = name.find("stash") != std::string::npos;
    spec.microbatches = stash ? 1 : 4;
    spec.minibatches = stash ? 8 : 2;
    Schedule s = generate_schedule(name, spec);
    Schedule back = schedule_from_csv(schedule_to_csv(s));
    CHECK(back.name == s.name);
    CHECK(back.policy == s.policy);
    CHECK(back.vertical_sync == s.vertical_sync);
    CHECK(back.microbatches == s.microbatches);
    CHECK(back.minibatches == s.minibatches);
    CHECK(back.stage_ranks == s.stage_ranks);
    CHECK(back.ranks == s.ranks);
    validate(back);
  }
  // Several stages per rank: the stage -> rank map is read back from the actions.
  Schedule s = generate_schedule("interleaved-1f1b", ScheduleSpec::interleaved(3, 2, 6, 2));
  Schedule back = schedule_from_csv(schedule_to_csv(s));
  CHECK(back.stage_ranks == s.stage_ranks);
  CHECK(back.ranks == s.ranks);
  CHECK(back.minibatches == 2);
  validate(back);
}

TEST_CASE("a hand-written CSV without metadata infers its shape") {
  // Two stages, GPipe over two microbatches, cells holding several tokens each.
  Schedule s = schedule_from_csv(
      "rank,actions\n"
      "0,0F0 0SA0@1,0F1 0SA1@1,0RG0@1 0B0,0RG1@1 0B1,0ST0\n"
      "1,1RA0@0 1F0,1RA1@0 1F1,1B0 1SG0@0,1B1 1SG1@0,1ST0\n");
  CHECK(s.policy == UpdatePolicy::Flush);
  CHECK(s.minibatches == 1);
  CHECK(s.microbatches == 2);
  CHECK(s.stage_ranks == std::vector<std::vector<int>>{{0}, {1}});
  auto rep = validate(s);
  CHECK(rep.ranks[0].peak_activations == 2);
}

TEST_CASE("hand-written CSVs with mistakes are rejected naming the rank and the action") {
  const char* header =
      "# pipeline.schedule/1 name=hand policy=flush microbatches=2 minibatches=1\n";
  SUBCASE("deadlock") {
    // Each stage waits for the other: rank 1 wants microbatch 1 first, rank 0 sends it only
    // after the gradient of microbatch 0 came back.
    std::string csv = std::string(header) +
                      "0,0F0,0SA0@1,0RG0@1,0B0,0F1,0SA1@1,0RG1@1,0B1,0ST0\n"
                      "1,1RA1@0,1F1,1B1,1SG1@0,1RA0@0,1F0,1B0,1SG0@0,1ST0\n";
    CHECK_THROWS_WITH_AS(
        validate(schedule_from_csv(csv)),
        doctest::Contains("deadlock: rank 0 waits at action #2 `0RG0@1` for rank 1; "
                          "rank 1 waits at action #0 `1RA1@0` for rank 0"),
        ConfigError);
  }
  SUBCASE("missing receive") {
    std::string csv = std::string(header) +
                      "0,0F0,0SA0@1,0F1,0SA1@1,0RG0@1,0B0,0RG1@1,0B1,0ST0\n"
                      "1,1RA0@0,1F0,1F1,1B0,1SG0@0,1B1,1SG1@0,1ST0\n";
    CHECK_THROWS_WITH_AS(
        validate(schedule_from_csv(csv)),
        doctest::Contains("rank 1, action #2 `1F1`: forward of microbatch 1 on stage 1 "
                          "before receiving its input (expected `1RA1@0`"),
        ConfigError);
  }
  SUBCASE("a send nobody receives") {
    std::string csv = std::string(header) +
                      "0,0F0,0SA0@1,0F1,0SA1@1,0RG0@1,0B0,0RG1@1,0B1,0ST0\n"
                      "1,1RA0@0,1F0,1B0,1SG0@0,1SG1@0,1ST0\n";
    CHECK_THROWS_WITH_AS(validate(schedule_from_csv(csv)),
                         doctest::Contains("rank 1, action #4 `1SG1@0`: sends the input gradient "
                                           "of microbatch 1 before computing it"),
                         ConfigError);
  }
  SUBCASE("backward before its forward") {
    std::string csv = std::string(header) +
                      "0,0F0,0SA0@1,0F1,0SA1@1,0RG0@1,0B0,0RG1@1,0B1,0ST0\n"
                      "1,1RA0@0,1RA1@0,1B0,1F0,1F1,1SG0@0,1B1,1SG1@0,1ST0\n";
    CHECK_THROWS_WITH_AS(validate(schedule_from_csv(csv)),
                         doctest::Contains("rank 1, action #2 `1B0`: backward of microbatch 0 on "
                                           "stage 1 before its forward `1F0`"),
                         ConfigError);
  }
  SUBCASE("an unparsable cell") {
    std::string csv = std::string(header) + "0,0F0,0Q1\n";
    CHECK_THROWS_WITH_AS(
        schedule_from_csv(csv),
        doctest::Contains("line 2 (rank 0), cell 3: action '0Q1' has unknown code 'Q'"),
        ConfigError);
  }
  SUBCASE("a rank that is not a number") {
    CHECK_THROWS_WITH_AS(schedule_from_csv("x,0F0\n"),
                         doctest::Contains("rank 'x' is not an integer"), ConfigError);
  }
}

// Counts and numbers at the limits of int (found by fuzz/schedule_csv.cpp: they overflowed, and a
// tiny file declaring a huge run made validate() allocate and scan every declared microbatch).
TEST_CASE("CSVs that declare enormous runs are rejected quickly") {
  CHECK_THROWS_WITH_AS(schedule_from_csv("0,0F2147483647\n"),
                       doctest::Contains("names microbatch 2147483647"), ConfigError);
  CHECK_THROWS_WITH_AS(validate(schedule_from_csv("# pipeline.schedule/1 microbatches=2147483647 "
                                                  "minibatches=2147483647\n0,0F0,0B0,0ST0\n")),
                       doctest::Contains("more than 2147483647 microbatches in all"), ConfigError);
  CHECK_THROWS_WITH_AS(
      validate(schedule_from_csv("# pipeline.schedule/1 policy=stash\n"
                                 "0,0F2147483646,0B2147483646,0ST0\n")),
      doctest::Contains("rank 0: stage 0 is dealt 2147483647 of the run's 2147483647 microbatches"),
      ConfigError);
  // A replicated stage is dealt every other microbatch; its checks see only those.
  CHECK_THROWS_WITH_AS(validate(schedule_from_csv("# pipeline.schedule/1 microbatches=1000000 "
                                                  "minibatches=1\n0,0F0,0B0\n1,0F1,0B1,0ST0\n")),
                       doctest::Contains("stage 0 is dealt 500000 of the run's 1000000"),
                       ConfigError);
}

TEST_CASE("schedule CSV files") {
  auto path = (std::filesystem::temp_directory_path() / "pipeline_test_schedule.csv").string();
  Schedule s = generate_schedule("1f1b-flush", ScheduleSpec::straight(3, 4));
  write_schedule_csv(path, s);
  CHECK(read_schedule_csv(path).ranks == s.ranks);
  // Written whole through a temporary file: rewriting leaves the new schedule and nothing else.
  Schedule longer = generate_schedule("gpipe", ScheduleSpec::straight(3, 8));
  write_schedule_csv(path, longer);
  CHECK(read_schedule_csv(path).ranks == longer.ranks);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
  CHECK_THROWS_AS(read_schedule_csv(path), IoError);
  CHECK_THROWS_AS(write_schedule_csv("/nonexistent-dir/x.csv", s), IoError);
}

}  // namespace test_schedule_csv
