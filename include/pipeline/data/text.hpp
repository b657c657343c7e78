// A byte-level language-modelling dataset over any file.
//
// Sample i is the window of seq_len + 1 bytes starting at byte i · stride of the chosen part of
// the file: inputs int32 [seq_len] are its first seq_len bytes and labels int32 [seq_len] the
// next byte at every position. The vocabulary is the 256 byte values. `begin`/`end` select a
// fraction of the file (e.g. [0, 0.9) to train and [0.9, 1) to validate).
#pragma once

#include <pipeline/data/dataset.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {

struct TextOptions {
  std::int64_t seq_len = 128;
  std::int64_t stride = 1;  // distance between consecutive windows; seq_len gives disjoint inputs
  double begin = 0.0;       // fraction of the file where this dataset starts
  double end = 1.0;         // fraction of the file where it ends
};

class TextDataset final : public Dataset {
 public:
  static constexpr int kVocab = 256;

  TextDataset(std::string path, TextOptions options);

  std::string name() const override;
  std::int64_t size() const override;
  Shape sample_shape() const override { return {m_options.seq_len}; }
  DType input_dtype() const override { return DType::Int32; }
  Shape label_shape() const override { return {m_options.seq_len}; }
  int num_classes() const override { return kVocab; }
  Batch get(std::span<const std::int64_t> indices) const override;

  std::int64_t bytes() const { return static_cast<std::int64_t>(m_bytes.size()); }

 private:
  std::string m_path;
  TextOptions m_options;
  std::vector<std::uint8_t> m_bytes;
};

}  // namespace pipeline
