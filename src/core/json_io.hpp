// Reading and writing the JSON files the library keeps (plan.json, profile.json, topology.json).
// Internal to the library: every reader reports an unreadable file as IoError and an empty or
// malformed one as ConfigError naming the path, and every writer replaces the file atomically.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace pipeline::detail {

// Parses the JSON file at `path`. `what` names the file in the IoError when it cannot be opened
// ("plan file"); `empty_hint`, when not empty, is appended to the error for a blank file so that it
// says what the file should hold.
nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view empty_hint);

// Parses JSON text that came from `origin` (a path, or a name for text held in memory) with the
// same errors as read_json_file: ConfigError when it is blank or malformed.
nlohmann::json parse_json_text(std::string_view text, std::string_view origin,
                               std::string_view empty_hint);

// Writes `text` to `path` through `path`.tmp and a rename, so that a reader never sees half a file.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace pipeline::detail
