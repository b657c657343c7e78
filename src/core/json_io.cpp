#include "json_io.hpp"

#include <pipeline/core/error.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipeline::detail {

nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view hint) {
  std::error_code ec;
  PIPELINE_CHECK_AS(IoError, !std::filesystem::is_directory(path, ec),
                    "{} '{}' is a directory; give the file", what, path);
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open {} '{}' for reading", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path, hint);
}

nlohmann::json parse_json_text(std::string_view text, std::string_view origin,
                               std::string_view hint) {
  PIPELINE_CHECK_AS(ConfigError, text.find_first_not_of(" \t\r\n") != std::string_view::npos,
                    "{}: the file is empty{}", origin, hint);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "{}: malformed JSON: {}{}", origin, e.what(), hint);
  }
}

std::string dump_format_first(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("format")) return j.dump(1) + '\n';
  nlohmann::ordered_json out;
  out["format"] = j.at("format");
  for (const auto& [key, value] : j.items())
    if (key != "format") out[key] = value;
  return out.dump(1) + '\n';
}

}  // namespace pipeline::detail
