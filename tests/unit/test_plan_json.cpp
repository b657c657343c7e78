// plan.json: the round trip, and malformed plans rejected as ConfigError naming the field —
// including numbers that are not integers where integers belong (1.5 workers, 1e91 bytes), which
// were once truncated or converted with undefined behaviour (found by fuzz/plan_json.cpp).
#include <pipeline/core/error.hpp>
#include <pipeline/plan/plan_json.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace test_plan_json {

using namespace pipeline;

namespace {

const char* kPlan = R"({"format": "pipeline.plan/1", "model": "mlp", "workers": 3,
  "schedule": "1f1b-flush", "in_flight": 2, "config": "2-1", "optimizer": "adamw",
  "stages": [{"layers": [0, 2], "replicas": 2, "ranks": [0, 1], "in_flight": 3,
              "delay_allreduce": false},
             {"layers": [2, 5], "replicas": 1, "ranks": [2]}],
  "predicted": {"time_per_minibatch_s": 0.02, "peak_memory_bytes": [100, 100, 5000000000]}})";

// The message of the ConfigError that parsing `edit`ed kPlan throws; empty when it parses.
template <typename Edit>
std::string error_of(Edit edit) {
  nlohmann::json j = nlohmann::json::parse(kPlan);
  edit(j);
  try {
    parse_plan(j.dump(), "plan.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool mentions(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("plan.json round trip") {
  const Plan p = parse_plan(kPlan, "plan.json");
  CHECK(p.workers == 3);
  REQUIRE(p.num_stages() == 2);
  CHECK(p.stages[0].ranks == std::vector<int>{0, 1});
  CHECK(p.predicted.peak_memory_bytes.back() == 5000000000);
  const Plan q = parse_plan(plan_to_json(p).dump(), "again");
  {  // written with its format line first, and read back the same
    const std::string path =
        (std::filesystem::temp_directory_path() / "pipeline_test_plan_format.json").string();
    write_plan(p, path);
    std::ifstream in(path);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    CHECK(second == " \"format\": \"pipeline.plan/1\",");
    CHECK(plan_to_json(read_plan(path)) == plan_to_json(p));
    std::remove(path.c_str());
  }
  CHECK(q.stages[1].begin == 2);
  CHECK(q.stages[1].end == 5);
  CHECK(q.predicted.peak_memory_bytes == p.predicted.peak_memory_bytes);
  CHECK(q.optimizer == "adamw");
  CHECK(q.architecture.empty());  // a plan without "architecture" (PipeDream's, older files)
  Plan with = p;
  with.architecture = {{"heads", 4}, {"dim", 128}};
  with.batch_size = 32;
  const Plan back = parse_plan(plan_to_json(with).dump(), "again");
  CHECK(back.architecture == Architecture{{"dim", 128}, {"heads", 4}});
  CHECK(back.batch_size == 32);
  CHECK(q.batch_size == 0);  // not recorded
  // Per stage: the minibatches held and whether the replicas may delay their allreduces.
  CHECK(q.stages[0].in_flight == 3);
  CHECK(!q.stages[0].delay_allreduce);
  CHECK(q.stages[1].in_flight == 0);
  CHECK(q.stages[1].delay_allreduce);
  CHECK(!plan_to_json(q)["stages"][1].contains("in_flight"));
  CHECK(!plan_to_json(q)["stages"][1].contains("delay_allreduce"));
  // A plan that names no optimizer stays without one.
  Plan r = p;
  r.optimizer.clear();
  CHECK(!plan_to_json(r).contains("optimizer"));
  // The profile's threads, where known, travel with the plan.
  CHECK(!plan_to_json(r).contains("profile_threads"));
  r.profile_threads = 2;
  CHECK(parse_plan(plan_to_json(r).dump(), "threads").profile_threads == 2);
  r.profile_threads = 0;
  // A float32 plan writes no dtype; a bf16 one says so.
  CHECK(q.dtype.empty());
  CHECK(!plan_to_json(q).contains("dtype"));
  r.dtype = "bfloat16";
  CHECK(parse_plan(plan_to_json(r).dump(), "bf16").dtype == "bfloat16");
  auto j = plan_to_json(q);
  j["dtype"] = "float32";
  CHECK(parse_plan(j.dump(), "explicit float32").dtype.empty());
  // Transfers in another dtype than the plan's are recorded; the implied one is not written.
  CHECK(!q.transfer_bf16());
  CHECK(!plan_to_json(q).contains("transfer_dtype"));
  j["transfer_dtype"] = "bfloat16";
  const Plan t = parse_plan(j.dump(), "bf16 transfers");
  CHECK(t.transfer_bf16());
  CHECK(plan_to_json(t)["transfer_dtype"] == "bfloat16");
  j["dtype"] = "bfloat16";
  CHECK(parse_plan(j.dump(), "implied").transfer_dtype.empty());
  CHECK(parse_plan(j.dump(), "implied").transfer_bf16());
  j["transfer_dtype"] = "float32";
  CHECK(!parse_plan(j.dump(), "float32 transfers of a bf16 plan").transfer_bf16());
  j["transfer_dtype"] = "fp8";
  CHECK(mentions(
      [&] {
        try {
          parse_plan(j.dump(), "bad");
        } catch (const ConfigError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      "\"transfer_dtype\" is \"fp8\"; expected bfloat16 or float32"));
}

TEST_CASE("integer fields of plan.json take only integers in range") {
  CHECK(error_of([](auto&) {}).empty());
  CHECK(mentions(error_of([](auto& j) { j["workers"] = 1.5; }), "\"workers\""));
  CHECK(mentions(error_of([](auto& j) { j["workers"] = 1e300; }), "\"workers\""));
  CHECK(mentions(error_of([](auto& j) { j["workers"] = 4294967299u; }), "\"workers\""));
  CHECK(mentions(error_of([](auto& j) { j["in_flight"] = "2"; }), "\"in_flight\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][0]["layers"] = {0, 2.5}; }), "\"layers\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][0]["ranks"] = {0, -1e30}; }), "\"ranks\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][1]["replicas"] = true; }), "\"replicas\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][0]["in_flight"] = 0; }), "\"in_flight\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][0]["in_flight"] = 1.5; }), "\"in_flight\""));
  CHECK(mentions(error_of([](auto& j) { j["stages"][0]["delay_allreduce"] = 1; }),
                 "\"delay_allreduce\""));
  CHECK(mentions(error_of([](auto& j) { j["predicted"]["peak_memory_bytes"] = {1e91}; }),
                 "\"peak_memory_bytes\""));
  CHECK(mentions(error_of([](auto& j) { j["predicted"]["peak_memory_bytes"] = {-1}; }),
                 "\"peak_memory_bytes\""));
  CHECK(mentions(error_of([](auto& j) { j["predicted"]["peak_memory_bytes"] = 7; }),
                 "\"peak_memory_bytes\""));
}

TEST_CASE("malformed plans name the problem and the origin") {
  CHECK(mentions(error_of([](auto& j) { j["format"] = "pipeline.profile/1"; }), "format"));
  CHECK(mentions(error_of([](auto& j) { j["stages"] = nlohmann::json::array(); }), "stages"));
  CHECK(mentions(error_of([](auto& j) { j["stages"][1]["ranks"] = {1}; }),
                 "rank 1 serves more than one stage"));
  CHECK(mentions(error_of([](auto& j) { j["stages"][1]["layers"] = {3, 5}; }), "previous stage"));
  CHECK(mentions(error_of([](auto& j) { j["optimizer"] = "lamb"; }),
                 "expected sgd, momentum or adamw"));
  CHECK(
      mentions(error_of([](auto& j) { j["dtype"] = "float16"; }), "expected bfloat16 or float32"));
  CHECK(mentions(error_of([](auto& j) { j["batch_size"] = 0; }), "batch_size = 0"));
  CHECK(mentions(error_of([](auto& j) {
                   j["architecture"] = {{"dim", "wide"}};
                 }),
                 "'architecture' must be an object of the model's options"));
  CHECK_THROWS_WITH_AS(
      parse_plan(" \n", "empty.json"),
      doctest::Contains("empty.json: the file is empty; expected a pipeline.plan/1"), ConfigError);
  try {
    parse_plan("{\"format\": ", "broken.json");
    FAIL("malformed JSON parsed");
  } catch (const ConfigError& e) {
    CHECK(mentions(e.what(), "broken.json"));
  }
}

}  // namespace test_plan_json
