// profile.json round trip and validation: every kind of bad input is a ConfigError/IoError that
// names the file and the offending field or value.
#include <pipeline/core/error.hpp>
#include <pipeline/profile/profile_json.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

namespace test_profile_json {

using namespace pipeline;

namespace {

Profile small_dag() {
  Profile p;
  p.model = "dag";
  p.batch_size = 8;
  p.device = "cpu: test";
  for (int i = 0; i < 4; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.kind = "Linear";
    l.forward_s = 0.001 * (i + 1);
    l.backward_s = 0.002 * (i + 1);
    l.backward_input_s = 0.001 * (i + 1);
    l.backward_weight_s = 0.001 * (i + 1);
    l.output_bytes = 1000 * (i + 1);
    l.parameter_bytes = 10 * i;
    l.flops = 1e6;
    p.layers.push_back(l);
  }
  p.layers[2].inputs = {0};
  p.layers[3].inputs = {1, 2};
  return p;
}

std::string temp_path(const char* name) { return fmt::format("/tmp/pipeline_test_{}", name); }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string error_of(const std::string& text) {
  std::string path = temp_path("bad.json");
  write_text(path, text);
  try {
    read_profile(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("profile.json round trip keeps every field") {
  Profile p = small_dag();
  p.layers[1].source = false;
  p.layers[2].saved_bytes = 4096;
  p.layers[2].saved_input_bytes = 1024;
  p.layers[2].split_kept_bytes = 2048;
  p.layers[2].step_s = {.sgd = 1e-4, .momentum = 2.5e-4, .adamw = 4.75e-4};
  p.dtype = "bfloat16";
  p.layers[2].stashed_parameter_bytes = p.layers[2].parameter_bytes / 2;
  p.layers[3].workspace_bytes = 1 << 20;
  p.layers[3].gradient_bytes = 3 << 10;
  p.runtime_bytes = 32 << 20;
  p.threads = 3;
  p.architecture = {{"dim", 128}, {"width", 0.5}};
  std::string path = temp_path("roundtrip.json");
  write_profile(p, path);
  {  // the format line first, as the file formats promise, before the sorted keys
    std::ifstream in(path);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    CHECK(second.rfind(" \"format\": \"pipeline.profile/", 0) == 0);
  }
  Profile q = read_profile(path);
  REQUIRE(q.size() == 4);
  CHECK(q.model == "dag");
  CHECK(q.architecture == Architecture{{"dim", 128}, {"width", 0.5}});
  CHECK(q.batch_size == 8);
  CHECK(q.device == "cpu: test");
  CHECK(q.bf16());
  CHECK(q.runtime_bytes == 32 << 20);
  CHECK(q.threads == 3);
  for (int i = 0; i < 4; ++i) {
    CHECK(q.layers[i].workspace_bytes == p.layers[i].workspace_bytes);
    CHECK(q.layers[i].gradient_bytes == p.layers[i].gradient_bytes);
    CHECK(q.layers[i].stashed_parameter_bytes == p.layers[i].stashed_parameter_bytes);
    CHECK(q.layers[i].forward_s == p.layers[i].forward_s);
    CHECK(q.layers[i].backward_s == p.layers[i].backward_s);
    CHECK(q.layers[i].backward_weight_s == p.layers[i].backward_weight_s);
    CHECK(q.layers[i].output_bytes == p.layers[i].output_bytes);
    CHECK(q.layers[i].parameter_bytes == p.layers[i].parameter_bytes);
    CHECK(q.layers[i].inputs == p.layers[i].inputs);
    CHECK(q.layers[i].flops == p.layers[i].flops);
    CHECK(q.layers[i].saved_bytes == p.layers[i].saved_bytes);
    CHECK(q.layers[i].saved_input_bytes == p.layers[i].saved_input_bytes);
    CHECK(q.layers[i].split_kept_bytes == p.layers[i].split_kept_bytes);
    CHECK(q.layers[i].step_s.sgd == p.layers[i].step_s.sgd);
    CHECK(q.layers[i].step_s.momentum == p.layers[i].step_s.momentum);
    CHECK(q.layers[i].step_s.adamw == p.layers[i].step_s.adamw);
  }
  CHECK(q.layers[2].step_s.of("adamw") == 4.75e-4);
  CHECK(q.layers[2].step_s.of("adam") == 4.75e-4);
  CHECK_THROWS_AS((void)q.layers[2].step_s.of("lamb"), ConfigError);
  // Unmeasured steps are not written.
  CHECK(!profile_to_json(q)["layers"][0].contains("step_s"));
  // Unmeasured, the memory models fall back to the layer's output.
  CHECK(stash_bytes(q.layers[0]) == q.layers[0].output_bytes);
  CHECK(stash_bytes(q.layers[2]) == 4096);
  CHECK(split_kept_bytes(q.layers[2]) == 2048);
  CHECK(version_bytes(q.layers[2]) == q.layers[2].parameter_bytes / 2);
  CHECK(version_bytes(q.layers[0]) == q.layers[0].parameter_bytes);
  CHECK(!profile_to_json(q)["layers"][0].contains("stashed_parameter_bytes"));
  CHECK(!profile_to_json(q)["layers"][0].contains("workspace_bytes"));  // 0: unknown, not written
  q.runtime_bytes = 0;
  CHECK(!profile_to_json(q).contains("runtime_bytes"));
  q.threads = 0;  // unknown (a GPU's, an imported profile's): not written
  CHECK(!profile_to_json(q).contains("threads"));
  q.layers[3].workspace_bytes = -1;
  CHECK_THROWS_WITH_AS(validate_profile(q, "q"), doctest::Contains("workspace_bytes = -1"),
                       ConfigError);
  CHECK(!q.is_chain());
  CHECK(!q.layers[0].at_stage_end);
  CHECK(!profile_to_json(q)["layers"][0].contains("at_stage_end"));  // written only when set
  CHECK(q.predecessors(1) == std::vector<int>{0});
  CHECK(q.predecessors(3) == std::vector<int>{1, 2});
}

TEST_CASE(
    "end-of-stage costs of a layer that runs after the next one: kept, and only on such a pair") {
  Profile p = small_dag();
  p.layers[2].inputs.clear();  // l0 -> l1 -> l2 -> l3 (and l1 -> l3)
  p.layers[3].inputs = {2};
  p.layers[1].at_stage_end = StageEndCosts{0.004, 0.005, 0.0045, 0.0005, 8192, 2000, false, 7000};
  p.layers[1].saved_bytes = 500;
  p.layers[1].frees_input = true;
  const std::string path = temp_path("stage_end.json");
  write_profile(p, path);
  const Profile q = read_profile(path);
  REQUIRE(q.layers[1].at_stage_end.has_value());
  const StageEndCosts& e = *q.layers[1].at_stage_end;
  CHECK(e.forward_s == 0.004);
  CHECK(e.backward_s == 0.005);
  CHECK(e.backward_input_s == 0.0045);
  CHECK(e.backward_weight_s == 0.0005);
  CHECK(e.saved_bytes == 8192);
  CHECK(e.saved_input_bytes == 2000);
  CHECK(e.gradient_bytes == 7000);
  CHECK(as_last_of_stage(q.layers[1]).gradient_bytes == 7000);
  CHECK_FALSE(e.frees_input);
  CHECK(q.layers[1].frees_input);
  CHECK_FALSE(q.layers[2].frees_input);
  CHECK(!profile_to_json(q)["layers"][2].contains("frees_input"));  // written only when set
  const LayerProfile last = as_last_of_stage(q.layers[1]);
  CHECK(last.forward_s == 0.004);
  CHECK(last.saved_bytes == 8192);
  CHECK(last.saved_input_bytes == 2000);
  CHECK_FALSE(last.frees_input);
  // A stage starting at l1 frees its input where l1 and l2, which runs before it there, keep
  // none of it; one of l1 alone as the at_stage_end costs say. Not where l1 shares its input.
  Profile r = q;
  r.layers[2].frees_input = true;
  const std::vector<char> alone = r.input_read_alone();
  CHECK(alone == std::vector<char>{0, 1, 1, 1});
  CHECK(r.stage_frees_input(alone, 1, 3));
  CHECK_FALSE(r.stage_frees_input(alone, 1, 1));  // at_stage_end: kept in place
  CHECK_FALSE(r.stage_frees_input(alone, 0, 3));  // the first stage receives nothing
  r.layers[2].frees_input = false;
  CHECK_FALSE(r.stage_frees_input(alone, 1, 3));
  CHECK(small_dag().input_read_alone() == std::vector<char>{0, 0, 0, 0});
  CHECK(as_last_of_stage(q.layers[0]).forward_s == q.layers[0].forward_s);
  // Only where the next layer takes the output alone, and nothing else does.
  const std::string good = profile_to_json(p).dump();
  auto error_with = [&](auto edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return error_of(j.dump());
  };
  CHECK(error_with([](auto& j) {
          j["layers"][3]["inputs"] = {1, 2};
        }).find("layer 1 (\"l1\") has \"at_stage_end\"") != std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][3]["at_stage_end"] = j["layers"][1]["at_stage_end"];
        }).find("remove the field") != std::string::npos);  // the last layer
  CHECK(error_with([](auto& j) {
          j["layers"][1]["at_stage_end"]["forward_s"] = -1;
        }).find("at_stage_end.forward_s = -1") != std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][1]["at_stage_end"].erase("saved_bytes");
        }).find("saved_bytes") != std::string::npos);
  CHECK(error_with([](auto& j) { j["layers"][1]["at_stage_end"] = 3; }).find("must be an object") !=
        std::string::npos);
  CHECK(error_with([](auto& j) { j["layers"][1]["at_stage_end"]["saved_input_bytes"] = 9000; })
            .find("at_stage_end.saved_input_bytes = 9000, which must be between 0 and its "
                  "at_stage_end.saved_bytes (8192)") != std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][1]["at_stage_end"]["frees_input"] = true;
        }).find("at_stage_end.frees_input true and at_stage_end.saved_input_bytes = 2000") !=
        std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][1]["saved_input_bytes"] = 100;
        }).find("drop one of the two") != std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][1]["at_stage_end"]["gradient_bytes"] = -5;
        }).find("at_stage_end field \"gradient_bytes\" must be a whole number of bytes") !=
        std::string::npos);
  CHECK(error_with([](auto& j) {
          j["layers"][1]["frees_input"] = 1;
        }).find("field \"frees_input\" must be true or false, got 1") != std::string::npos);
}

TEST_CASE("bad profiles are rejected with a message naming the problem") {
  const std::string good = profile_to_json(small_dag()).dump();
  auto with = [&](auto edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return j.dump();
  };
  CHECK(error_of("").find("empty") != std::string::npos);
  CHECK(error_of("{\"format\": ").find("malformed JSON") != std::string::npos);
  CHECK(error_of("[1, 2]").find("object") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["format"] = "pipeline.plan/1"; })).find("pipeline.plan/1") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][2]["forward_s"] = -1.5; })).find("-1.5") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][2]["backward_s"] = "slow"; })).find("backward_s") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][1]["inputs"] = {7}; })).find("dangling input 7") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][1]["inputs"] = {3};
        })).find("cycle") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"] = nlohmann::json::array(); })).find("no layers") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][0].erase("output_bytes"); })).find("output_bytes") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][0]["parameter_bytes"] = 1.5; })).find("parameter_bytes") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][0]["saved_bytes"] = 100;
          j["layers"][0]["saved_input_bytes"] = 200;
        })).find("saved_input_bytes = 200") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][0]["stashed_parameter_bytes"] = 4;  // layer 0 has no parameters
        })).find("a stashed version is at most parameter_bytes") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][0]["step_s"] = {{"lamb", 0.1}};
        })).find("its keys are sgd, momentum and adamw") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][0]["step_s"] = {{"adamw", -2.0}};
        })).find("step_s.adamw = -2") != std::string::npos);
  CHECK(error_of(with([](auto& j) { j["layers"][0]["step_s"] = 0.5; })).find("object") !=
        std::string::npos);
  // Another spelling of bfloat16 would be taken for float32 and its transfers charged double.
  CHECK(error_of(with([](auto& j) { j["dtype"] = "bf16"; })).find("\"float32\" or \"bfloat16\"") !=
        std::string::npos);
  CHECK(error_of(with([](auto& j) { j["dtype"] = "float16"; })).find("dtype \"float16\"") !=
        std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["layers"][1]["forward_s"] = 1e300;
        })).find("at most 86400") != std::string::npos);
  CHECK(error_of(with([](auto& j) {
          j["architecture"] = {{"channels", -1}};
        })).find("architecture option 'channels' is -1") != std::string::npos);
  // NaN cannot be written as JSON by a conforming writer, but files may still hold it.
  std::string nan_text = good;
  auto pos = nan_text.find("\"forward_s\":");
  nan_text.replace(pos, std::string("\"forward_s\":0.001").size(), "\"forward_s\":NaN");
  CHECK(!error_of(nan_text).empty());
  // The error names the file.
  CHECK(error_of("{}").find(temp_path("bad.json")) != std::string::npos);
}

TEST_CASE("missing files are IoErrors and NaN times fail validation") {
  CHECK_THROWS_AS(read_profile("/nonexistent/dir/profile.json"), IoError);
  Profile p = small_dag();
  p.layers[1].backward_s = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(validate_profile(p, "x"), ConfigError);
  CHECK_THROWS_AS(write_profile(small_dag(), "/nonexistent/dir/profile.json"), IoError);
}

}  // namespace test_profile_json
