#include <pipeline/data/text.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace pipeline {

TextDataset::TextDataset(std::string path, TextOptions options)
    : m_path(std::move(path)), m_options(options) {
  PIPELINE_CHECK_AS(ConfigError, options.seq_len >= 1,
                    "text dataset: sequence length {} must be >= 1", options.seq_len);
  PIPELINE_CHECK_AS(ConfigError, options.stride >= 1, "text dataset: stride {} must be >= 1",
                    options.stride);
  PIPELINE_CHECK_AS(ConfigError,
                    0.0 <= options.begin && options.begin < options.end && options.end <= 1.0,
                    "text dataset: the part [{}, {}) of the file is not a non-empty part of [0, 1]",
                    options.begin, options.end);
  std::error_code ec;
  PIPELINE_CHECK_AS(IoError, std::filesystem::is_regular_file(m_path, ec),
                    "text file '{}' does not exist or is not a regular file", m_path);
  std::ifstream in(m_path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open text file '{}': {}", m_path,
                    std::strerror(errno));
  const auto total = static_cast<std::int64_t>(std::filesystem::file_size(m_path, ec));
  PIPELINE_CHECK_AS(IoError, !ec, "cannot size text file '{}': {}", m_path, ec.message());
  const auto first =
      static_cast<std::int64_t>(std::floor(options.begin * static_cast<double>(total)));
  const auto last = static_cast<std::int64_t>(std::floor(options.end * static_cast<double>(total)));
  m_bytes.resize(static_cast<std::size_t>(last - first));
  in.seekg(first);
  in.read(reinterpret_cast<char*>(m_bytes.data()), static_cast<std::streamsize>(m_bytes.size()));
  PIPELINE_CHECK_AS(IoError, in.gcount() == static_cast<std::streamsize>(m_bytes.size()),
                    "text file '{}': read {} of {} bytes", m_path, in.gcount(), m_bytes.size());
  PIPELINE_CHECK_AS(IoError, bytes() >= options.seq_len + 1,
                    "text file '{}' is too short: {} bytes in the part [{}, {}) of its {} bytes, "
                    "but one sample of sequence length {} needs {}: give a longer file, or a "
                    "sequence length of at most {} (--seq-len)",
                    m_path, bytes(), options.begin, options.end, total, options.seq_len,
                    options.seq_len + 1, std::max<std::int64_t>(bytes() - 1, 1));
}

std::string TextDataset::name() const {
  return fmt::format("text:{}[{}:{}]", m_path, m_options.begin, m_options.end);
}

std::int64_t TextDataset::size() const {
  return (bytes() - m_options.seq_len - 1) / m_options.stride + 1;
}

Batch TextDataset::get(std::span<const std::int64_t> indices) const {
  check_indices(indices);
  Batch b = allocate(static_cast<std::int64_t>(indices.size()));
  const std::int64_t t = m_options.seq_len;
  std::int32_t* x = b.inputs.data<std::int32_t>();
  std::int32_t* y = b.labels.data<std::int32_t>();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::uint8_t* w = m_bytes.data() + indices[k] * m_options.stride;
    for (std::int64_t j = 0; j < t; ++j) {
      x[static_cast<std::int64_t>(k) * t + j] = w[j];
      y[static_cast<std::int64_t>(k) * t + j] = w[j + 1];
    }
  }
  return b;
}

}  // namespace pipeline
