#include <pipeline/profile/profile_json.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/nn/architecture.hpp>

#include "../core/json_io.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

namespace pipeline {
namespace {

using nlohmann::json;

constexpr std::string_view kProfileFileHint = "; expected a pipeline.profile/1 JSON object";

const json& require(const json& obj, const char* key, std::string_view where,
                    std::string_view origin) {
  auto it = obj.find(key);
  if (it == obj.end())
    PIPELINE_FAIL(ConfigError, "{}: {} has no field \"{}\"; add it (see DESIGN.md, profile.json)",
                  origin, where, key);
  return *it;
}

double get_number(const json& obj, const char* key, std::string_view where, std::string_view origin,
                  bool required) {
  if (!required && !obj.contains(key)) return 0.0;
  const json& v = require(obj, key, where, origin);
  if (!v.is_number())
    PIPELINE_FAIL(ConfigError, "{}: {} field \"{}\" must be a number, got {}", origin, where, key,
                  v.dump());
  return v.get<double>();
}

std::string get_string(const json& obj, const char* key, std::string_view where,
                       std::string_view origin, bool required) {
  if (!required && !obj.contains(key)) return {};
  const json& v = require(obj, key, where, origin);
  if (!v.is_string())
    PIPELINE_FAIL(ConfigError, "{}: {} field \"{}\" must be a string, got {}", origin, where, key,
                  v.dump());
  return v.get<std::string>();
}

std::int64_t get_bytes(const json& obj, const char* key, std::string_view where,
                       std::string_view origin) {
  double v = get_number(obj, key, where, origin, true);
  if (!std::isfinite(v) || v < 0 || v > static_cast<double>(kMaxProfileBytes) || v != std::floor(v))
    PIPELINE_FAIL(ConfigError,
                  "{}: {} field \"{}\" must be a whole number of bytes in [0, {}], got {}", origin,
                  where, key, kMaxProfileBytes, obj.at(key).dump());
  return static_cast<std::int64_t>(v);
}

// An optional true/false field: false where absent.
bool get_flag(const json& obj, const char* key, std::string_view where, std::string_view origin) {
  if (!obj.contains(key)) return false;
  const json& v = obj.at(key);
  PIPELINE_CHECK_AS(ConfigError, v.is_boolean(),
                    "{}: {} field \"{}\" must be true or false, got {}", origin, where, key,
                    v.dump());
  return v.get<bool>();
}

constexpr double kMaxPassSeconds = 86400;

void check_time(double v, const char* field, int layer, const std::string& name,
                std::string_view origin) {
  // (A day a pass is beyond any layer; larger values are damage, and overflow the plan's sums.)
  if (!std::isfinite(v) || v < 0 || v > kMaxPassSeconds)
    PIPELINE_FAIL(ConfigError,
                  "{}: layer {} (\"{}\") has {} = {}; times must be non-negative seconds, at "
                  "most {:g} (a day)",
                  origin, layer, name, field, v, kMaxPassSeconds);
}

// What a layer keeps of its input is part of what it keeps, and then it does not free it.
void check_saved_input(std::int64_t saved_input, std::int64_t saved, bool frees, const char* prefix,
                       int layer, const std::string& name, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, saved_input >= 0 && saved_input <= saved,
                    "{}: layer {} (\"{}\") has {}saved_input_bytes = {}, which must be between 0 "
                    "and its {}saved_bytes ({}): it is the part of them that is the layer's input",
                    origin, layer, name, prefix, saved_input, prefix, saved);
  PIPELINE_CHECK_AS(ConfigError, !(frees && saved_input > 0),
                    "{}: layer {} (\"{}\") has {}frees_input true and {}saved_input_bytes = {}: a "
                    "layer that keeps part of its input does not free it; drop one of the two",
                    origin, layer, name, prefix, prefix, saved_input);
}

}  // namespace

void validate_profile(const Profile& p, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, p.size() > 0, "{}: the profile has no layers", origin);
  // Any other spelling would be taken for float32, and bf16 transfers charged at twice their
  // bytes.
  PIPELINE_CHECK_AS(ConfigError, p.dtype == "float32" || p.dtype == "bfloat16",
                    "{}: dtype \"{}\" is not one the profiler writes: \"float32\" or "
                    "\"bfloat16\" (pipeline-profile --dtype bf16)",
                    origin, p.dtype);
  PIPELINE_CHECK_AS(ConfigError, p.batch_size >= 0, "{}: batch_size = {} is negative", origin,
                    p.batch_size);
  PIPELINE_CHECK_AS(ConfigError, p.runtime_bytes >= 0 && p.runtime_bytes <= kMaxProfileBytes,
                    "{}: runtime_bytes = {} is out of range (0 to {} bytes)", origin,
                    p.runtime_bytes, kMaxProfileBytes);
  PIPELINE_CHECK_AS(ConfigError,
                    p.loss_gradient_bytes >= 0 && p.loss_gradient_bytes <= kMaxProfileBytes,
                    "{}: loss_gradient_bytes = {} is out of range (0 to {} bytes)", origin,
                    p.loss_gradient_bytes, kMaxProfileBytes);
  PIPELINE_CHECK_AS(ConfigError, p.input_bytes >= 0 && p.input_bytes <= kMaxProfileBytes,
                    "{}: input_bytes = {} is out of range (0 to {} bytes)", origin, p.input_bytes,
                    kMaxProfileBytes);
  const int n = p.size();
  std::vector<std::vector<int>> succ(static_cast<std::size_t>(n));
  std::vector<int> indegree(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    const LayerProfile& l = p.layers[static_cast<std::size_t>(i)];
    check_time(l.forward_s, "forward_s", i, l.name, origin);
    check_time(l.backward_s, "backward_s", i, l.name, origin);
    check_time(l.backward_input_s, "backward_input_s", i, l.name, origin);
    check_time(l.backward_weight_s, "backward_weight_s", i, l.name, origin);
    check_time(l.forward_spread_s, "forward_spread_s", i, l.name, origin);
    check_time(l.backward_spread_s, "backward_spread_s", i, l.name, origin);
    check_time(l.step_s.sgd, "step_s.sgd", i, l.name, origin);
    check_time(l.step_s.momentum, "step_s.momentum", i, l.name, origin);
    check_time(l.step_s.adamw, "step_s.adamw", i, l.name, origin);
    PIPELINE_CHECK_AS(
        ConfigError,
        l.output_bytes >= 0 && l.parameter_bytes >= 0 && l.saved_bytes >= 0 &&
            l.split_kept_bytes >= 0 && l.stashed_parameter_bytes >= 0 && l.workspace_bytes >= 0 &&
            l.stashed_parameter_bytes <= l.parameter_bytes && l.output_bytes <= kMaxProfileBytes &&
            l.parameter_bytes <= kMaxProfileBytes && l.saved_bytes <= kMaxProfileBytes &&
            l.split_kept_bytes <= kMaxProfileBytes && l.workspace_bytes <= kMaxProfileBytes &&
            l.gradient_bytes >= 0 && l.gradient_bytes <= kMaxProfileBytes,
        "{}: layer {} (\"{}\") has sizes out of range (output_bytes = {}, parameter_bytes = {}, "
        "saved_bytes = {}, split_kept_bytes = {}, stashed_parameter_bytes = {}, workspace_bytes = "
        "{}, gradient_bytes = {}); sizes are 0 to {} bytes, and a stashed version is at most "
        "parameter_bytes",
        origin, i, l.name, l.output_bytes, l.parameter_bytes, l.saved_bytes, l.split_kept_bytes,
        l.stashed_parameter_bytes, l.workspace_bytes, l.gradient_bytes, kMaxProfileBytes);
    check_saved_input(l.saved_input_bytes, l.saved_bytes, l.frees_input, "", i, l.name, origin);
    if (const auto& e = l.at_stage_end) {
      check_time(e->forward_s, "at_stage_end.forward_s", i, l.name, origin);
      check_time(e->backward_s, "at_stage_end.backward_s", i, l.name, origin);
      check_time(e->backward_input_s, "at_stage_end.backward_input_s", i, l.name, origin);
      check_time(e->backward_weight_s, "at_stage_end.backward_weight_s", i, l.name, origin);
      PIPELINE_CHECK_AS(
          ConfigError,
          e->saved_bytes >= 0 && e->saved_bytes <= kMaxProfileBytes && e->gradient_bytes >= 0 &&
              e->gradient_bytes <= kMaxProfileBytes,
          "{}: layer {} (\"{}\") has at_stage_end.saved_bytes = {}, at_stage_end.gradient_bytes "
          "= {}; sizes are 0 to {} bytes",
          origin, i, l.name, e->saved_bytes, e->gradient_bytes, kMaxProfileBytes);
      check_saved_input(e->saved_input_bytes, e->saved_bytes, e->frees_input, "at_stage_end.", i,
                        l.name, origin);
    }
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(l.flops) && l.flops >= 0,
                      "{}: layer {} (\"{}\") has flops = {}; must be finite and non-negative",
                      origin, i, l.name, l.flops);
    PIPELINE_CHECK_AS(ConfigError, !(l.source && !l.inputs.empty()),
                      "{}: layer {} (\"{}\") is marked \"source\" but lists inputs", origin, i,
                      l.name);
    for (int in : l.inputs) {
      PIPELINE_CHECK_AS(ConfigError, in >= 0 && in < n && in != i,
                        "{}: layer {} (\"{}\") has input {}, which is not another layer (0..{})",
                        origin, i, l.name, in, n - 1);
    }
    for (int in : p.predecessors(i)) {
      succ[static_cast<std::size_t>(in)].push_back(i);
      ++indegree[static_cast<std::size_t>(i)];
    }
  }
  // A layer with end-of-stage costs runs reordered with the next one, which only a pair that
  // exchanges nothing with other layers can.
  for (int i = 0; i < n; ++i)
    PIPELINE_CHECK_AS(
        ConfigError,
        !p.layers[static_cast<std::size_t>(i)].at_stage_end ||
            (i + 1 < n && succ[static_cast<std::size_t>(i)] == std::vector<int>{i + 1} &&
             p.predecessors(i + 1) == std::vector<int>{i}),
        "{}: layer {} (\"{}\") has \"at_stage_end\" costs, which only a layer "
        "whose output the next layer alone takes, and takes alone, can have; "
        "remove the field",
        origin, i, p.layers[static_cast<std::size_t>(i)].name);
  // Kahn's algorithm: whatever is left with a positive in-degree lies on a cycle.
  std::vector<int> ready;
  for (int i = 0; i < n; ++i)
    if (indegree[static_cast<std::size_t>(i)] == 0) ready.push_back(i);
  int seen = 0;
  while (!ready.empty()) {
    int v = ready.back();
    ready.pop_back();
    ++seen;
    for (int s : succ[static_cast<std::size_t>(v)])
      if (--indegree[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
  }
  if (seen != n) {
    int first = 0;
    while (indegree[static_cast<std::size_t>(first)] == 0) ++first;
    PIPELINE_FAIL(ConfigError,
                  "{}: the layers' inputs form a cycle (layer {} \"{}\" is on or after one); a "
                  "profile must be a DAG",
                  origin, first, p.layers[static_cast<std::size_t>(first)].name);
  }
}

Profile profile_from_json(const json& j, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, j.is_object(), "{}: expected a JSON object, got {}", origin,
                    j.type_name());
  std::string format = get_string(j, "format", "the profile", origin, true);
  PIPELINE_CHECK_AS(ConfigError, format == kProfileFormat, "{}: format is \"{}\", expected \"{}\"",
                    origin, format, kProfileFormat);
  Profile p;
  p.model = get_string(j, "model", "the profile", origin, false);
  if (j.contains("architecture"))
    p.architecture =
        architecture_from_json(j.at("architecture"), "the profile", std::string(origin));
  p.device = get_string(j, "device", "the profile", origin, false);
  if (j.contains("dtype")) p.dtype = get_string(j, "dtype", "the profile", origin, true);
  // Absent: not recorded (0); the partitioner then asks for --batch.
  double batch = get_number(j, "batch_size", "the profile", origin, false);
  PIPELINE_CHECK_AS(ConfigError,
                    std::isfinite(batch) && batch >= 0 && batch == std::floor(batch) && batch < 1e9,
                    "{}: batch_size must be a non-negative integer, got {}", origin,
                    j.contains("batch_size") ? j.at("batch_size").dump() : std::string("nothing"));
  p.batch_size = static_cast<int>(batch);
  if (j.contains("threads")) {
    const double threads = get_number(j, "threads", "the profile", origin, true);
    PIPELINE_CHECK_AS(ConfigError,
                      std::isfinite(threads) && threads >= 1 && threads == std::floor(threads) &&
                          threads <= 1 << 16,
                      "{}: threads must be a positive integer, got {}", origin,
                      j.at("threads").dump());
    p.threads = static_cast<int>(threads);
  }
  if (j.contains("runtime_bytes"))
    p.runtime_bytes = get_bytes(j, "runtime_bytes", "the profile", origin);
  if (j.contains("loss_gradient_bytes"))
    p.loss_gradient_bytes = get_bytes(j, "loss_gradient_bytes", "the profile", origin);
  if (j.contains("input_bytes")) p.input_bytes = get_bytes(j, "input_bytes", "the profile", origin);
  const json& layers = require(j, "layers", "the profile", origin);
  PIPELINE_CHECK_AS(ConfigError, layers.is_array(), "{}: \"layers\" must be an array, got {}",
                    origin, layers.type_name());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const json& lj = layers[i];
    std::string where = fmt::format("layer {}", i);
    PIPELINE_CHECK_AS(ConfigError, lj.is_object(), "{}: {} must be an object, got {}", origin,
                      where, lj.dump());
    LayerProfile l;
    l.name = get_string(lj, "name", where, origin, true);
    where = fmt::format("layer {} (\"{}\")", i, l.name);
    l.kind = get_string(lj, "kind", where, origin, false);
    l.forward_s = get_number(lj, "forward_s", where, origin, true);
    l.backward_s = get_number(lj, "backward_s", where, origin, true);
    l.backward_input_s = get_number(lj, "backward_input_s", where, origin, false);
    l.backward_weight_s = get_number(lj, "backward_weight_s", where, origin, false);
    l.forward_spread_s = get_number(lj, "forward_spread_s", where, origin, false);
    l.backward_spread_s = get_number(lj, "backward_spread_s", where, origin, false);
    l.flops = get_number(lj, "flops", where, origin, false);
    l.output_bytes = get_bytes(lj, "output_bytes", where, origin);
    l.parameter_bytes = get_bytes(lj, "parameter_bytes", where, origin);
    if (lj.contains("saved_bytes")) l.saved_bytes = get_bytes(lj, "saved_bytes", where, origin);
    if (lj.contains("stashed_parameter_bytes"))
      l.stashed_parameter_bytes = get_bytes(lj, "stashed_parameter_bytes", where, origin);
    if (lj.contains("saved_input_bytes"))
      l.saved_input_bytes = get_bytes(lj, "saved_input_bytes", where, origin);
    if (lj.contains("split_kept_bytes"))
      l.split_kept_bytes = get_bytes(lj, "split_kept_bytes", where, origin);
    if (lj.contains("workspace_bytes"))
      l.workspace_bytes = get_bytes(lj, "workspace_bytes", where, origin);
    if (lj.contains("gradient_bytes"))
      l.gradient_bytes = get_bytes(lj, "gradient_bytes", where, origin);
    if (lj.contains("step_s")) {
      const json& st = lj.at("step_s");
      PIPELINE_CHECK_AS(ConfigError, st.is_object(),
                        "{}: {} field \"step_s\" must be an object of seconds per optimizer "
                        "(\"sgd\", \"momentum\", \"adamw\"), got {}",
                        origin, where, st.dump());
      for (const auto& [rule, value] : st.items()) {
        PIPELINE_CHECK_AS(ConfigError, rule == "sgd" || rule == "momentum" || rule == "adamw",
                          "{}: {} field \"step_s\" has \"{}\"; its keys are sgd, momentum and "
                          "adamw",
                          origin, where, rule);
        l.step_s.of(rule) = get_number(st, rule.c_str(), where + " step_s", origin, true);
      }
    }
    if (lj.contains("at_stage_end")) {
      const json& e = lj.at("at_stage_end");
      const std::string in_e = where + " at_stage_end";
      PIPELINE_CHECK_AS(ConfigError, e.is_object(),
                        "{}: {} field \"at_stage_end\" must be an object (forward_s, backward_s, "
                        "backward_input_s, backward_weight_s, saved_bytes), got {}",
                        origin, where, e.dump());
      StageEndCosts c;
      c.forward_s = get_number(e, "forward_s", in_e, origin, true);
      c.backward_s = get_number(e, "backward_s", in_e, origin, true);
      c.backward_input_s = get_number(e, "backward_input_s", in_e, origin, false);
      c.backward_weight_s = get_number(e, "backward_weight_s", in_e, origin, false);
      c.saved_bytes = get_bytes(e, "saved_bytes", in_e, origin);
      if (e.contains("saved_input_bytes"))
        c.saved_input_bytes = get_bytes(e, "saved_input_bytes", in_e, origin);
      c.frees_input = get_flag(e, "frees_input", in_e, origin);
      if (e.contains("gradient_bytes"))
        c.gradient_bytes = get_bytes(e, "gradient_bytes", in_e, origin);
      l.at_stage_end = c;
    }
    if (lj.contains("inputs")) {
      const json& in = lj.at("inputs");
      PIPELINE_CHECK_AS(ConfigError, in.is_array(),
                        "{}: {} field \"inputs\" must be an array, got {}", origin, where,
                        in.dump());
      for (const json& v : in) {
        PIPELINE_CHECK_AS(ConfigError, v.is_number_integer(),
                          "{}: {} field \"inputs\" must hold layer indices, got {}", origin, where,
                          v.dump());
        long long x = v.get<long long>();
        PIPELINE_CHECK_AS(ConfigError, x >= 0 && x < static_cast<long long>(layers.size()),
                          "{}: {} has a dangling input {} (there are {} layers)", origin, where, x,
                          layers.size());
        l.inputs.push_back(static_cast<int>(x));
      }
    }
    l.source = get_flag(lj, "source", where, origin);
    l.frees_input = get_flag(lj, "frees_input", where, origin);
    p.layers.push_back(std::move(l));
  }
  validate_profile(p, origin);
  return p;
}

json profile_to_json(const Profile& p) {
  json layers = json::array();
  for (const LayerProfile& l : p.layers) {
    json lj = {{"name", l.name},
               {"kind", l.kind},
               {"forward_s", l.forward_s},
               {"backward_s", l.backward_s},
               {"output_bytes", l.output_bytes},
               {"parameter_bytes", l.parameter_bytes},
               {"inputs", l.inputs}};
    if (l.backward_input_s != 0 || l.backward_weight_s != 0) {
      lj["backward_input_s"] = l.backward_input_s;
      lj["backward_weight_s"] = l.backward_weight_s;
    }
    if (l.forward_spread_s != 0 || l.backward_spread_s != 0) {
      lj["forward_spread_s"] = l.forward_spread_s;
      lj["backward_spread_s"] = l.backward_spread_s;
    }
    if (l.flops != 0) lj["flops"] = l.flops;
    if (l.saved_bytes != 0) lj["saved_bytes"] = l.saved_bytes;
    if (l.stashed_parameter_bytes != 0) lj["stashed_parameter_bytes"] = l.stashed_parameter_bytes;
    if (l.saved_input_bytes != 0) lj["saved_input_bytes"] = l.saved_input_bytes;
    if (l.split_kept_bytes != 0) lj["split_kept_bytes"] = l.split_kept_bytes;
    if (l.workspace_bytes != 0) lj["workspace_bytes"] = l.workspace_bytes;
    if (l.gradient_bytes != 0) lj["gradient_bytes"] = l.gradient_bytes;
    if (l.step_s.measured())
      lj["step_s"] = {
          {"sgd", l.step_s.sgd}, {"momentum", l.step_s.momentum}, {"adamw", l.step_s.adamw}};
    if (l.frees_input) lj["frees_input"] = true;
    if (const auto& e = l.at_stage_end) {
      json& ej = lj["at_stage_end"] = {{"forward_s", e->forward_s},
                                       {"backward_s", e->backward_s},
                                       {"backward_input_s", e->backward_input_s},
                                       {"backward_weight_s", e->backward_weight_s},
                                       {"saved_bytes", e->saved_bytes}};
      if (e->saved_input_bytes != 0) ej["saved_input_bytes"] = e->saved_input_bytes;
      if (e->frees_input) ej["frees_input"] = true;
      if (e->gradient_bytes != 0) ej["gradient_bytes"] = e->gradient_bytes;
    }
    if (l.source) lj["source"] = true;
    layers.push_back(std::move(lj));
  }
  json j;
  j["format"] = kProfileFormat;
  j["model"] = p.model;
  if (!p.architecture.empty()) j["architecture"] = architecture_to_json(p.architecture);
  j["batch_size"] = p.batch_size;
  j["device"] = p.device;
  j["dtype"] = p.dtype;
  if (p.threads > 0) j["threads"] = p.threads;
  if (p.runtime_bytes != 0) j["runtime_bytes"] = p.runtime_bytes;
  if (p.loss_gradient_bytes != 0) j["loss_gradient_bytes"] = p.loss_gradient_bytes;
  if (p.input_bytes != 0) j["input_bytes"] = p.input_bytes;
  j["layers"] = std::move(layers);
  return j;
}

Profile parse_profile(std::string_view text, std::string_view origin) {
  return profile_from_json(detail::parse_json_text(text, origin, kProfileFileHint), origin);
}

Profile read_profile(const std::string& path) {
  return profile_from_json(detail::read_json_file(path, "profile file", kProfileFileHint), path);
}

void write_profile(const Profile& profile, const std::string& path) {
  validate_profile(profile, path);
  detail::write_file_atomically(path, detail::dump_format_first(profile_to_json(profile)));
}

}  // namespace pipeline
