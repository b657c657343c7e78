// Dataset: random access to labelled samples, gathered into batches.
//
// get(indices) returns one Batch: inputs [B, sample_shape...] (float32 features, or int32 token
// ids when input_dtype() is Int32) and labels int32 [B, label_shape...] (class indices in
// [0, num_classes()), or next tokens for language models). Datasets are immutable after
// construction, so get() may be called from several threads.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/even_split.hpp>
#include <pipeline/core/tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pipeline {

struct Batch {
  Tensor inputs;
  Tensor labels;

  // Either may be left out where it is not needed (a pipeline's last stage keeps only labels).
  std::int64_t size() const {
    return inputs.defined() ? inputs.dim(0) : labels.defined() ? labels.dim(0) : 0;
  }
  // Samples [begin, end) as views sharing this batch's storage.
  Batch slice(std::int64_t begin, std::int64_t end) const {
    const auto part = [&](const Tensor& t) { return t.defined() ? t.slice(begin, end) : Tensor{}; };
    return {part(inputs), part(labels)};
  }
};

// Samples of microbatch i when n samples are cut into m microbatches: the first (n % m)
// microbatches are one sample larger. The trainer, the executor's loads and its receive buffers
// all cut here.
inline IndexRange microbatch_range(std::int64_t n, int m, int i) {
  return even_part(n, m, i);
}

// Cuts a batch into m microbatches (views, no copies), as microbatch_range does; losses
// averaged per microbatch then need weighting by microbatch size to equal the whole batch's.
inline std::vector<Batch> split_microbatches(const Batch& batch, int m) {
  const std::int64_t n = batch.size();
  PIPELINE_CHECK_AS(ConfigError, m >= 1 && m <= n,
                    "cannot cut a batch of {} samples into {} microbatches: use 1 to {}", n, m, n);
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i) {
    const IndexRange r = microbatch_range(n, m, i);
    out.push_back(batch.slice(r.begin, r.end));
  }
  return out;
}

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual std::string name() const = 0;
  virtual std::int64_t size() const = 0;
  // Shape of one sample's input, without the batch dimension.
  virtual Shape sample_shape() const = 0;
  virtual DType input_dtype() const { return DType::Float32; }
  // Shape of one sample's label, without the batch dimension ([] for classification).
  virtual Shape label_shape() const { return Shape{}; }
  // Number of classes (the vocabulary size for token datasets).
  virtual int num_classes() const = 0;

  virtual Batch get(std::span<const std::int64_t> indices) const = 0;

 protected:
  void check_indices(std::span<const std::int64_t> indices) const {
    const std::int64_t n = size();
    for (auto i : indices)
      PIPELINE_CHECK(i >= 0 && i < n, "{}: sample index {} out of range [0, {})", name(), i, n);
  }
  // Empty batch tensors of the right shapes for `count` samples.
  Batch allocate(std::int64_t count) const {
    return {Tensor::empty(sample_shape().batched(count), input_dtype()),
            Tensor::empty(label_shape().batched(count), DType::Int32)};
  }
};

}  // namespace pipeline
