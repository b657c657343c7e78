// A deterministic, learnable random dataset of any sample shape, for tests and benchmarks.
//
// Sample i is generated on demand from (seed, i) alone, so nothing is stored and any rank draws
// the same sample for the same index. The input's elements are standard normal; the label is the
// argmax over classes of a fixed random projection of a fixed subset of at most 64 input
// coordinates (the same for every sample). So
// the label is a function of the input that a linear classifier can learn exactly, and the cost
// of a sample is O(features + 64 · classes) whatever its size.
#pragma once

#include <pipeline/core/rng.hpp>
#include <pipeline/data/dataset.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pipeline {

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(Shape sample_shape, int num_classes, std::int64_t size, std::uint64_t seed = 0)
      : m_shape(std::move(sample_shape)), m_classes(num_classes), m_size(size), m_seed(seed) {
    PIPELINE_CHECK_AS(ConfigError, m_classes >= 1, "synthetic dataset: {} classes; need >= 1",
                      m_classes);
    PIPELINE_CHECK_AS(ConfigError, m_size >= 0, "synthetic dataset: size {} is negative", m_size);
    PIPELINE_CHECK_AS(ConfigError, m_shape.numel() >= 1,
                      "synthetic dataset: sample shape {} has no elements", m_shape);
    const std::int64_t features = m_shape.numel();
    const std::int64_t k = std::min<std::int64_t>(features, kProjected);
    // Evenly spread coordinates, so that both ends of an image are involved.
    for (std::int64_t j = 0; j < k; ++j) m_coords.push_back(j * features / k);
    Rng rng(seed, "synthetic.projection");
    m_projection.resize(static_cast<std::size_t>(k * m_classes));
    for (float& w : m_projection) w = rng.normal();
  }

  std::string name() const override {
    return fmt::format("synthetic{}x{}", m_shape.str(), m_classes);
  }
  std::int64_t size() const override { return m_size; }
  Shape sample_shape() const override { return m_shape; }
  int num_classes() const override { return m_classes; }

  Batch get(std::span<const std::int64_t> indices) const override {
    check_indices(indices);
    Batch b = allocate(static_cast<std::int64_t>(indices.size()));
    const std::int64_t features = m_shape.numel();
    float* x = b.inputs.data<float>();
    std::int32_t* y = b.labels.data<std::int32_t>();
    for (std::size_t s = 0; s < indices.size(); ++s) {
      float* row = x + static_cast<std::int64_t>(s) * features;
      Rng rng(m_seed ^ (static_cast<std::uint64_t>(indices[s]) * 0x9e3779b97f4a7c15ull),
              "synthetic.sample");
      for (std::int64_t j = 0; j < features; ++j) row[j] = rng.normal();
      y[s] = label_of(row);
    }
    return b;
  }

  // The class of an input sample (features in the flattened order).
  std::int32_t label_of(const float* x) const {
    const std::size_t k = m_coords.size();
    std::int32_t best = 0;
    float best_score = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < m_classes; ++c) {
      float score = 0.f;
      for (std::size_t j = 0; j < k; ++j)
        score += m_projection[static_cast<std::size_t>(c) * k + j] * x[m_coords[j]];
      if (score > best_score) {
        best_score = score;
        best = c;
      }
    }
    return best;
  }

 private:
  static constexpr std::int64_t kProjected = 64;

  Shape m_shape;
  int m_classes;
  std::int64_t m_size;
  std::uint64_t m_seed;
  std::vector<std::int64_t> m_coords;
  std::vector<float> m_projection;  // classes × coords
};

}  // namespace pipeline
