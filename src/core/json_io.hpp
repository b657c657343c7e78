// Reading and writing the JSON files the library keeps (plan.json, profile.json, topology.json).
// Internal to the library: every reader reports an unreadable file as IoError and an empty or
// malformed one as ConfigError naming the path, and every writer replaces the file atomically.
#pragma once

#include "output_file.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace pipeline::detail {

// Parses the JSON file at `path`. `what` names the file in the IoError when it cannot be opened
// ("plan file"); `hint`, when not empty, is appended to the error for a blank or malformed file so
// that it says what the file should hold or what to do.
nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view hint);

// Parses JSON text that came from `origin` (a path, or a name for text held in memory) with the
// same errors as read_json_file: ConfigError when it is blank or malformed.
nlohmann::json parse_json_text(std::string_view text, std::string_view origin,
                               std::string_view hint);

// `j` as the library's files hold it: indented by one space, its "format" field first (the
// version a reader checks before anything else), the other keys in order; a final newline.
std::string dump_format_first(const nlohmann::json& j);

}  // namespace pipeline::detail
