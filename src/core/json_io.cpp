#include "json_io.hpp"

#include <pipeline/core/error.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace pipeline::detail {

nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view empty_hint) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open {} '{}' for reading", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  PIPELINE_CHECK_AS(ConfigError, text.find_first_not_of(" \t\r\n") != std::string::npos,
                    "{}: the file is empty{}", path, empty_hint);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "{}: malformed JSON: {}", path, e.what());
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    PIPELINE_CHECK_AS(IoError, out.good(), "cannot open '{}' for writing", tmp);
    out << text;
    out.flush();
    PIPELINE_CHECK_AS(IoError, out.good(), "writing '{}' failed (disk full?)", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    PIPELINE_FAIL(IoError, "cannot rename '{}' to '{}'", tmp, path);
  }
}

}  // namespace pipeline::detail
