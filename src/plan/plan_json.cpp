#include <pipeline/plan/plan_json.hpp>

#include <pipeline/plan/interleaved_layout.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/nn/architecture.hpp>

#include "../core/json_io.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <set>

namespace pipeline {
namespace {

using nlohmann::json;

template <typename T>
T get(const json& j, const char* key, std::string_view where, std::string_view origin) {
  auto it = j.find(key);
  PIPELINE_CHECK_AS(ConfigError, it != j.end(), "{}: {} has no field \"{}\"", origin, where, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    PIPELINE_FAIL(ConfigError, "{}: {} field \"{}\" has the wrong type: {}", origin, where, key,
                  it->dump());
  }
}

// Integers are read only from JSON integers within [lo, hi]: nlohmann's get<int>() would
// truncate 1.5 and convert 1e300 with undefined behaviour.
std::int64_t integer_value(const json& v, std::int64_t lo, std::int64_t hi, std::string_view what,
                           std::string_view origin) {
  const bool fits =
      (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi)) ||
      (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= lo &&
       v.get<std::int64_t>() <= hi);
  PIPELINE_CHECK_AS(ConfigError, fits, "{}: {} must be an integer in [{}, {}], got {}", origin,
                    what, lo, hi, v.dump());
  return v.get<std::int64_t>();
}

int get_int(const json& j, const char* key, std::string_view where, std::string_view origin) {
  auto it = j.find(key);
  PIPELINE_CHECK_AS(ConfigError, it != j.end(), "{}: {} has no field \"{}\"", origin, where, key);
  return static_cast<int>(integer_value(*it, std::numeric_limits<int>::min(),
                                        std::numeric_limits<int>::max(),
                                        fmt::format("{} field \"{}\"", where, key), origin));
}

std::vector<std::int64_t> get_integers(const json& j, const char* key, std::int64_t lo,
                                       std::int64_t hi, std::string_view where,
                                       std::string_view origin) {
  auto it = j.find(key);
  PIPELINE_CHECK_AS(ConfigError, it != j.end(), "{}: {} has no field \"{}\"", origin, where, key);
  PIPELINE_CHECK_AS(ConfigError, it->is_array(), "{}: {} field \"{}\" must be an array, got {}",
                    origin, where, key, it->dump());
  std::vector<std::int64_t> out;
  for (const json& v : *it)
    out.push_back(
        integer_value(v, lo, hi, fmt::format("{} field \"{}\" entry", where, key), origin));
  return out;
}

std::vector<int> get_ints(const json& j, const char* key, std::string_view where,
                          std::string_view origin) {
  std::vector<int> out;
  for (std::int64_t v : get_integers(j, key, std::numeric_limits<int>::min(),
                                     std::numeric_limits<int>::max(), where, origin))
    out.push_back(static_cast<int>(v));
  return out;
}

double number_or(const json& j, const char* key, double fallback, std::string_view origin) {
  if (!j.contains(key)) return fallback;
  PIPELINE_CHECK_AS(ConfigError, j.at(key).is_number() && std::isfinite(j.at(key).get<double>()),
                    "{}: field \"{}\" must be a finite number, got {}", origin, key,
                    j.at(key).dump());
  return j.at(key).get<double>();
}

}  // namespace

json plan_to_json(const Plan& p) {
  json stages = json::array();
  for (const PlanStage& s : p.stages) {
    json sj = {{"layers", {s.begin, s.end}}, {"replicas", s.replicas}, {"ranks", s.ranks}};
    if (!s.layer_ids.empty()) sj["layer_ids"] = s.layer_ids;
    if (s.recompute) sj["recompute"] = true;
    if (s.in_flight > 0) sj["in_flight"] = s.in_flight;
    if (!s.delay_allreduce) sj["delay_allreduce"] = false;
    if (!s.device.empty()) sj["device"] = s.device;
    sj["predicted"] = {{"compute_s", s.compute_s},
                       {"sync_s", s.sync_s},
                       {"transfer_s", s.transfer_s},
                       {"memory_bytes", s.memory_bytes}};
    if (s.workspace_bytes != 0) sj["predicted"]["workspace_bytes"] = s.workspace_bytes;
    if (s.input_message_s > 0) sj["predicted"]["input_message_s"] = s.input_message_s;
    stages.push_back(std::move(sj));
  }
  json j;
  j["format"] = p.interleaved() ? kPlanFormatInterleaved : kPlanFormat;
  j["model"] = p.model;
  if (!p.architecture.empty()) j["architecture"] = architecture_to_json(p.architecture);
  if (p.batch_size > 0) j["batch_size"] = p.batch_size;
  j["workers"] = p.workers;
  if (p.interleaved()) j["virtual_stages"] = p.virtual_stages;
  if (p.microbatch_group > 0) j["microbatch_group"] = p.microbatch_group;
  j["schedule"] = p.schedule;
  j["in_flight"] = p.in_flight;
  if (p.microbatches > 0) j["microbatches"] = p.microbatches;
  j["config"] = p.config;
  if (!p.cost_model.empty()) j["cost_model"] = p.cost_model;
  if (!p.optimizer.empty()) j["optimizer"] = p.optimizer;
  if (!p.dtype.empty()) j["dtype"] = p.dtype;
  if (p.profile_threads > 0) j["profile_threads"] = p.profile_threads;
  if (!p.transfer_dtype.empty()) j["transfer_dtype"] = p.transfer_dtype;
  j["stages"] = std::move(stages);
  j["predicted"] = {
      {"time_per_minibatch_s", p.predicted.time_per_minibatch_s},
      {"samples_per_s", p.predicted.samples_per_s},
      {"data_parallel_time_per_minibatch_s", p.predicted.data_parallel_time_per_minibatch_s},
      {"bubble_fraction", p.predicted.bubble_fraction},
      {"peak_memory_bytes", p.predicted.peak_memory_bytes}};
  return j;
}

Plan plan_from_json(const json& j, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, j.is_object(), "{}: expected a JSON object, got {}", origin,
                    j.type_name());
  auto format = get<std::string>(j, "format", "the plan", origin);
  const bool version2 = format == kPlanFormatInterleaved;
  PIPELINE_CHECK_AS(ConfigError, format == kPlanFormat || version2,
                    "{}: format is \"{}\", expected \"{}\" (or \"{}\" for an interleaved plan)",
                    origin, format, kPlanFormat, kPlanFormatInterleaved);
  Plan p;
  p.model = j.contains("model") ? get<std::string>(j, "model", "the plan", origin) : "";
  if (j.contains("architecture"))
    p.architecture = architecture_from_json(j.at("architecture"), "the plan", std::string(origin));
  if (j.contains("batch_size")) {
    p.batch_size = get_int(j, "batch_size", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.batch_size >= 1, "{}: batch_size = {}; need at least 1",
                      origin, p.batch_size);
  }
  p.workers = get_int(j, "workers", "the plan", origin);
  PIPELINE_CHECK_AS(ConfigError, p.workers >= 1, "{}: workers = {}; need at least 1", origin,
                    p.workers);
  if (j.contains("virtual_stages"))
    p.virtual_stages = get_int(j, "virtual_stages", "the plan", origin);
  if (version2)
    PIPELINE_CHECK_AS(ConfigError, j.contains("virtual_stages") && p.virtual_stages >= 2,
                      "{}: a \"{}\" plan is interleaved and needs \"virtual_stages\" >= 2 (stages "
                      "per rank), got {}",
                      origin, kPlanFormatInterleaved,
                      j.contains("virtual_stages") ? j.at("virtual_stages").dump() : "none");
  else
    PIPELINE_CHECK_AS(ConfigError, p.virtual_stages == 1,
                      "{}: virtual_stages = {} needs format \"{}\"; a \"{}\" plan has one stage "
                      "per rank",
                      origin, p.virtual_stages, kPlanFormatInterleaved, kPlanFormat);
  if (j.contains("microbatch_group")) {
    PIPELINE_CHECK_AS(ConfigError, version2,
                      "{}: \"microbatch_group\" is for interleaved plans (format \"{}\"); leave "
                      "it out of a plan of one stage per rank",
                      origin, kPlanFormatInterleaved);
    p.microbatch_group = get_int(j, "microbatch_group", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.microbatch_group >= 1,
                      "{}: \"microbatch_group\" = {}; a group has at least 1 microbatch per rank "
                      "of a pipeline (or leave it out)",
                      origin, p.microbatch_group);
  }
  if (j.contains("schedule")) p.schedule = get<std::string>(j, "schedule", "the plan", origin);
  if (j.contains("in_flight")) p.in_flight = get_int(j, "in_flight", "the plan", origin);
  PIPELINE_CHECK_AS(ConfigError, p.in_flight >= 1, "{}: in_flight = {}; need at least 1", origin,
                    p.in_flight);
  if (j.contains("microbatches")) {
    p.microbatches = get_int(j, "microbatches", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.microbatches >= 1,
                      "{}: \"microbatches\" = {}; a minibatch has at least 1 (or leave it out)",
                      origin, p.microbatches);
  }
  if (j.contains("config")) p.config = get<std::string>(j, "config", "the plan", origin);
  if (j.contains("cost_model"))
    p.cost_model = get<std::string>(j, "cost_model", "the plan", origin);
  if (j.contains("optimizer")) {
    p.optimizer = get<std::string>(j, "optimizer", "the plan", origin);
    PIPELINE_CHECK_AS(
        ConfigError, p.optimizer == "sgd" || p.optimizer == "momentum" || p.optimizer == "adamw",
        "{}: \"optimizer\" is \"{}\"; expected sgd, momentum or adamw", origin, p.optimizer);
  }
  if (j.contains("dtype")) {
    p.dtype = get<std::string>(j, "dtype", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.dtype == "bfloat16" || p.dtype == "float32",
                      "{}: \"dtype\" is \"{}\"; expected bfloat16 or float32", origin, p.dtype);
    if (p.dtype == "float32") p.dtype.clear();
  }
  if (j.contains("profile_threads")) {
    p.profile_threads = get_int(j, "profile_threads", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.profile_threads >= 1,
                      "{}: \"profile_threads\" = {}; a profile is timed on at least 1 thread (or "
                      "leave it out)",
                      origin, p.profile_threads);
  }
  if (j.contains("transfer_dtype")) {
    p.transfer_dtype = get<std::string>(j, "transfer_dtype", "the plan", origin);
    PIPELINE_CHECK_AS(ConfigError, p.transfer_dtype == "bfloat16" || p.transfer_dtype == "float32",
                      "{}: \"transfer_dtype\" is \"{}\"; expected bfloat16 or float32", origin,
                      p.transfer_dtype);
    if ((p.transfer_dtype == "bfloat16") == (p.dtype == "bfloat16")) p.transfer_dtype.clear();
  }
  const json& stages = j.contains("stages") ? j.at("stages") : json();
  PIPELINE_CHECK_AS(ConfigError, stages.is_array() && !stages.empty(),
                    "{}: \"stages\" must be a non-empty array", origin);
  std::set<int> used;
  int prev_end = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const json& sj = stages[i];
    std::string where = fmt::format("stage {}", i);
    PIPELINE_CHECK_AS(ConfigError, sj.is_object(), "{}: {} must be an object", origin, where);
    PlanStage s;
    auto layers = get_ints(sj, "layers", where, origin);
    PIPELINE_CHECK_AS(ConfigError, layers.size() == 2 && layers[0] >= 0 && layers[1] > layers[0],
                      "{}: {} \"layers\" must be [begin, end) with begin < end, got {}", origin,
                      where, sj.at("layers").dump());
    s.begin = layers[0];
    s.end = layers[1];
    s.replicas = get_int(sj, "replicas", where, origin);
    PIPELINE_CHECK_AS(ConfigError, s.replicas >= 1, "{}: {} has {} replicas; need at least 1",
                      origin, where, s.replicas);
    s.ranks = get_ints(sj, "ranks", where, origin);
    PIPELINE_CHECK_AS(ConfigError, static_cast<int>(s.ranks.size()) == s.replicas,
                      "{}: {} lists {} ranks for {} replicas", origin, where, s.ranks.size(),
                      s.replicas);
    for (int r : s.ranks) {
      PIPELINE_CHECK_AS(ConfigError, r >= 0 && r < p.workers, "{}: {} uses rank {}, outside 0..{}",
                        origin, where, r, p.workers - 1);
      if (!p.interleaved())
        PIPELINE_CHECK_AS(ConfigError, used.insert(r).second,
                          "{}: rank {} serves more than one stage", origin, r);
    }
    if (p.interleaved())
      PIPELINE_CHECK_AS(ConfigError, !sj.contains("layer_ids"),
                        "{}: {} of an interleaved plan ({} stages per rank) must be one contiguous "
                        "layer range, not \"layer_ids\"",
                        origin, where, p.virtual_stages);
    if (sj.contains("layer_ids")) {
      s.layer_ids = get_ints(sj, "layer_ids", where, origin);
      for (int v : s.layer_ids)
        PIPELINE_CHECK_AS(ConfigError, v >= s.begin && v < s.end,
                          "{}: {} layer_ids entry {} is outside [{}, {})", origin, where, v,
                          s.begin, s.end);
    } else {
      PIPELINE_CHECK_AS(ConfigError, s.begin == prev_end,
                        "{}: {} starts at layer {} but the previous stage ended at {}", origin,
                        where, s.begin, prev_end);
    }
    prev_end = s.end;
    if (sj.contains("recompute")) {
      PIPELINE_CHECK_AS(ConfigError, sj.at("recompute").is_boolean(),
                        "{}: {} field \"recompute\" must be true or false, got {}", origin, where,
                        sj.at("recompute").dump());
      s.recompute = sj.at("recompute").get<bool>();
    }
    if (sj.contains("in_flight")) {
      s.in_flight = get_int(sj, "in_flight", where, origin);
      PIPELINE_CHECK_AS(ConfigError, s.in_flight >= 1,
                        "{}: {} field \"in_flight\" is {}; a stage holds at least 1 minibatch",
                        origin, where, s.in_flight);
    }
    if (sj.contains("delay_allreduce")) {
      PIPELINE_CHECK_AS(ConfigError, sj.at("delay_allreduce").is_boolean(),
                        "{}: {} field \"delay_allreduce\" must be true or false, got {}", origin,
                        where, sj.at("delay_allreduce").dump());
      s.delay_allreduce = sj.at("delay_allreduce").get<bool>();
    }
    if (sj.contains("device")) {
      const json& d = sj.at("device");
      PIPELINE_CHECK_AS(ConfigError, d.is_string() && !d.get<std::string>().empty(),
                        "{}: {} field \"device\" must be a worker type name, got {}", origin, where,
                        d.dump());
      s.device = d.get<std::string>();
    }
    if (sj.contains("predicted") && sj.at("predicted").is_object()) {
      const json& pj = sj.at("predicted");
      s.compute_s = number_or(pj, "compute_s", 0, origin);
      s.sync_s = number_or(pj, "sync_s", 0, origin);
      s.transfer_s = number_or(pj, "transfer_s", 0, origin);
      s.memory_bytes = number_or(pj, "memory_bytes", 0, origin);
      s.workspace_bytes = number_or(pj, "workspace_bytes", 0, origin);
      s.input_message_s = number_or(pj, "input_message_s", 0, origin);
    }
    p.stages.push_back(std::move(s));
  }
  if (p.interleaved()) {
    // Stage k on the ranks of stage k mod p, with r pipelines of p ranks: v·p stages in all.
    std::vector<std::vector<int>> stage_ranks;
    for (const PlanStage& s : p.stages) stage_ranks.push_back(s.ranks);
    InterleavedShape shape;
    try {
      shape = interleaved_shape(stage_ranks);
    } catch (const ConfigError& e) {
      PIPELINE_FAIL(ConfigError, "{}: {}", origin, e.what());
    }
    const std::int64_t pipelines = shape.replicas;
    PIPELINE_CHECK_AS(
        ConfigError,
        static_cast<std::int64_t>(p.num_stages()) * pipelines ==
            std::int64_t{p.virtual_stages} * p.workers,
        "{}: an interleaved plan of {} stages per rank on {} workers ({} pipeline(s) of {}) "
        "needs {} stages, got {}",
        origin, p.virtual_stages, p.workers, pipelines, p.workers / pipelines,
        std::int64_t{p.virtual_stages} * p.workers / pipelines, p.num_stages());
    try {
      check_microbatch_group(p.microbatch_group, shape.positions);
    } catch (const ConfigError& e) {
      PIPELINE_FAIL(ConfigError, "{}: \"microbatch_group\": {}", origin, e.what());
    }
  }
  if (j.contains("predicted")) {
    const json& pj = j.at("predicted");
    PIPELINE_CHECK_AS(ConfigError, pj.is_object(), "{}: \"predicted\" must be an object", origin);
    p.predicted.time_per_minibatch_s = number_or(pj, "time_per_minibatch_s", 0, origin);
    p.predicted.samples_per_s = number_or(pj, "samples_per_s", 0, origin);
    p.predicted.data_parallel_time_per_minibatch_s =
        number_or(pj, "data_parallel_time_per_minibatch_s", 0, origin);
    p.predicted.bubble_fraction = number_or(pj, "bubble_fraction", 0, origin);
    if (pj.contains("peak_memory_bytes"))
      p.predicted.peak_memory_bytes =
          get_integers(pj, "peak_memory_bytes", 0, std::numeric_limits<std::int64_t>::max(),
                       "predicted", origin);
  }
  return p;
}

// What an empty or malformed plan file should have held (the profile and topology readers say the
// same).
constexpr std::string_view kPlanFileHint =
    "; expected a pipeline.plan/1 JSON object, as pipeline-partition writes";

Plan parse_plan(std::string_view text, std::string_view origin) {
  return plan_from_json(detail::parse_json_text(text, origin, kPlanFileHint), origin);
}

Plan read_plan(const std::string& path) {
  return plan_from_json(detail::read_json_file(path, "plan file", kPlanFileHint), path);
}

void write_plan(const Plan& plan, const std::string& path) {
  detail::write_file_atomically(path, detail::dump_format_first(plan_to_json(plan)));
}

}  // namespace pipeline
