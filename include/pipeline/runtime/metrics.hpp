// Metrics as JSON lines: one JSON object per line, flushed as it is written, so a run that dies
// leaves every completed record readable and tools can tail the file while training runs.
// Records are e.g. {"step": 12, "loss": 0.53, "samples_per_s": 812.4} per step and
// {"epoch": 1, "test_accuracy": 0.9012} per evaluation.
#pragma once

#include <pipeline/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace pipeline {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // `append`: keep what the file holds (a resumed run continues its records).
  explicit MetricsWriter(const std::string& path, bool append = false) {
    if (path.empty()) return;
    m_file.reset(std::fopen(path.c_str(), append ? "a" : "w"));
    PIPELINE_CHECK_AS(IoError, m_file != nullptr, "cannot open metrics file '{}' for writing: {}",
                      path, std::strerror(errno));
    m_path = path;
  }

  bool enabled() const { return m_file != nullptr; }

  void write(const nlohmann::json& record) {
    if (!m_file) return;
    std::string line = record.dump() + "\n";
    bool ok = std::fwrite(line.data(), 1, line.size(), m_file.get()) == line.size() &&
              std::fflush(m_file.get()) == 0;
    PIPELINE_CHECK_AS(IoError, ok, "writing metrics to '{}' failed: {}", m_path, std::strerror(errno));
  }

 private:
  struct Closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> m_file;
  std::string m_path;
};

}  // namespace pipeline
