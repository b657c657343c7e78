// plan.json I/O: the "pipeline.plan/1" format of DESIGN.md, and "pipeline.plan/2" for
// interleaved plans.
//
// Extension fields: per stage "layer_ids" (only for a DAG stage that is not one contiguous
// range), "recompute" (true when the stage recomputes its activations; written only then, so a
// plan without recomputation reads and writes exactly as before, and needs no new format
// version), "device" (the worker type of the stage in a plan over a mixed cluster, e.g. "h100";
// written only for such plans, so plans over one kind of worker read and write as before) and
// "predicted" {compute_s, sync_s, transfer_s, memory_bytes}; at the top level "cost_model",
// "optimizer" and "dtype" ("bfloat16" for a plan made from a bf16 profile; absent: float32).
// Reading validates the format, that stages are non-empty, that every stage has `replicas` distinct
// ranks in [0, workers) and that no rank serves two stages; failures throw ConfigError (contents)
// or IoError (file) naming the file and the field.
//
// Versions: an interleaved plan (Plan::virtual_stages = v > 1) is written as "pipeline.plan/2"
// with a top-level "virtual_stages": v; every other plan is still written as "pipeline.plan/1",
// byte for byte as before. The bump is only for the plans that need it because a rank of such a
// plan serves v stages: a reader that knows only /1 would have to refuse it anyway, and now says
// so by its format check instead of a misleading "rank serves more than one stage". Both versions
// are read. A /2 plan must have v >= 2 and be an interleaved layout (interleaved_layout.hpp): r
// pipelines of p = workers / r ranks, exactly v · p contiguous stages of r replicas each, stage k
// on the ranks of stage k mod p (looped) or, with v = 2, of stage 2p − 1 − k for k ≥ p (a V, for
// zb-v); a /1 plan must not have "virtual_stages" other than 1.
#pragma once

#include <pipeline/plan/plan.hpp>

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace pipeline {

inline constexpr std::string_view kPlanFormat = "pipeline.plan/1";
inline constexpr std::string_view kPlanFormatInterleaved = "pipeline.plan/2";

nlohmann::json plan_to_json(const Plan& plan);
Plan plan_from_json(const nlohmann::json& j, std::string_view origin);
// Parses the text of a plan.json; `origin` names it in error messages.
Plan parse_plan(std::string_view text, std::string_view origin);
Plan read_plan(const std::string& path);
void write_plan(const Plan& plan, const std::string& path);

}  // namespace pipeline
