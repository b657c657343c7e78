// Metrics as JSON lines: one JSON object per line, flushed as it is written, so a run that dies
// leaves every completed record readable and tools can tail the file while training runs.
// Records are e.g. {"step": 12, "loss": 0.53, "samples_per_s": 812.4} per step and
// {"epoch": 1, "test_accuracy": 0.9012} per evaluation.
#pragma once

#include <pipeline/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace pipeline {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // A run that starts at step `resumed_at` > 0 (resumed from a checkpoint) continues the records
  // the file holds up to that step: those written after it, by a run that went on past the
  // checkpoint before it died, are dropped, so each step has one record.
  explicit MetricsWriter(const std::string& path, std::int64_t resumed_at = 0) {
    if (path.empty()) return;
    if (resumed_at > 0) keep_records_to(path, resumed_at);
    m_file.reset(std::fopen(path.c_str(), resumed_at > 0 ? "a" : "w"));
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
  // Rewrites `path` (if it exists) with its records before the first of a step past `step`.
  static void keep_records_to(const std::string& path, std::int64_t step);

  struct Closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> m_file;
  std::string m_path;
};

}  // namespace pipeline
