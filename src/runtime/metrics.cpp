#include <pipeline/runtime/metrics.hpp>

#include <fstream>

#include "../core/output_file.hpp"

namespace pipeline {

void MetricsWriter::keep_records_to(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<std::int64_t>() > step) {
      in.close();
      detail::write_file_atomically(path, kept);
      return;
    }
    kept += line + "\n";
  }
}

}  // namespace pipeline
