// plan.json I/O: the "pipeline.plan/1" format of DESIGN.md.
//
// Extension fields: per stage "layer_ids" (only for a DAG stage that is not one contiguous
// range) and "predicted" {compute_s, sync_s, transfer_s, memory_bytes}; at the top level
// "cost_model". Reading validates the format, that stages are non-empty, that every stage has
// `replicas` distinct ranks in [0, workers) and that no rank serves two stages; failures throw
// ConfigError (contents) or IoError (file) naming the file and the field.
#pragma once

#include <pipeline/plan/plan.hpp>

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace pipeline {

inline constexpr std::string_view kPlanFormat = "pipeline.plan/1";

nlohmann::json plan_to_json(const Plan& plan);
Plan plan_from_json(const nlohmann::json& j, std::string_view origin);
// Parses the text of a plan.json; `origin` names it in error messages.
Plan parse_plan(std::string_view text, std::string_view origin);
Plan read_plan(const std::string& path);
void write_plan(const Plan& plan, const std::string& path);

}  // namespace pipeline
