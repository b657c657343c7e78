// Fashion-MNIST (Zalando): 60 000 training and 10 000 test greyscale 28×28 images of 10 kinds of
// clothing, in the IDX files of the original distribution, gzip-compressed or not.
//
// Samples are inputs float32 [1, 28, 28] with pixels scaled to [0, 1] (value / 255) and labels
// int32 in [0, 10). The default directory is where the Debian package dataset-fashion-mnist
// installs the files; a missing file throws IoError saying so.
//
// Contents::Labels reads the images' header but not their pixels: batches then hold labels only
// (inputs undefined). It is what a pipeline rank without the first stage needs: the last stage
// uses the labels, the middle ones only the sample count (47 MB and most of the read saved).
#pragma once

#include <pipeline/data/dataset.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {

enum class Split { Train, Test };

class FashionMnist final : public Dataset {
 public:
  static constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
  static constexpr int kClasses = 10;
  static constexpr std::int64_t kRows = 28, kCols = 28;

  enum class Contents { Everything, Labels };

  explicit FashionMnist(std::string dir = kDefaultDir, Split split = Split::Train,
                        Contents contents = Contents::Everything);

  std::string name() const override;
  std::int64_t size() const override { return static_cast<std::int64_t>(m_labels.size()); }
  Shape sample_shape() const override { return {1, kRows, kCols}; }
  int num_classes() const override { return kClasses; }
  Batch get(std::span<const std::int64_t> indices) const override;

  // The class names in label order.
  static const std::vector<std::string>& class_names();

  // The IDX files it read, as found (images, labels; compressed or not).
  const std::vector<std::string>& files() const { return m_files; }

 private:
  std::string m_dir;
  std::vector<std::string> m_files;
  Split m_split;
  Contents m_contents;
  std::vector<std::uint8_t> m_pixels;  // N × 28 × 28 (empty under Contents::Labels)
  std::vector<std::uint8_t> m_labels;
};

}  // namespace pipeline
