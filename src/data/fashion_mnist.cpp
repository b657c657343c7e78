#include <pipeline/data/fashion_mnist.hpp>

#include <pipeline/data/idx.hpp>

#include <fmt/ranges.h>

#include <filesystem>

namespace pipeline {

namespace {

// The file for `stem` in dir: the .gz of the original distribution, else an unpacked copy.
std::string locate(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  if (fs::is_regular_file(gz)) return gz.string();
  if (fs::is_regular_file(plain)) return plain.string();
  PIPELINE_FAIL(IoError,
                "Fashion-MNIST file not found: neither '{}' nor '{}' exists. Install the Debian "
                "package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass "
                "--data with the directory holding the IDX files",
                gz.string(), plain.string());
}

}  // namespace

FashionMnist::FashionMnist(std::string dir, Split split, Contents contents)
    : m_dir(std::move(dir)), m_split(split), m_contents(contents) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string image_path = locate(m_dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = locate(m_dir, prefix + "-labels-idx1-ubyte");
  m_files = {image_path, label_path};
  IdxArray images;
  if (contents == Contents::Everything)
    images = read_idx(image_path);
  else
    images.dims = read_idx_dims(image_path);
  IdxArray labels = read_idx(label_path);
  PIPELINE_CHECK_AS(IoError,
                    images.dims.size() == 3 && images.dims[1] == kRows && images.dims[2] == kCols,
                    "'{}' should hold N × 28 × 28 images but declares {}", image_path,
                    fmt::join(images.dims, " x "));
  PIPELINE_CHECK_AS(IoError, labels.dims.size() == 1,
                    "'{}' should hold a vector of labels but declares {}", label_path,
                    fmt::join(labels.dims, " x "));
  PIPELINE_CHECK_AS(IoError, images.dims[0] == labels.dims[0],
                    "'{}' holds {} images but '{}' holds {} labels", image_path, images.dims[0],
                    label_path, labels.dims[0]);
  for (std::size_t i = 0; i < labels.data.size(); ++i)
    PIPELINE_CHECK_AS(IoError, labels.data[i] < kClasses,
                      "'{}': label {} of sample {} is not a class in [0, {})", label_path,
                      labels.data[i], i, kClasses);
  m_pixels = std::move(images.data);
  m_labels = std::move(labels.data);
}

std::string FashionMnist::name() const {
  return fmt::format("fashion-mnist/{}", m_split == Split::Train ? "train" : "test");
}

Batch FashionMnist::get(std::span<const std::int64_t> indices) const {
  check_indices(indices);
  const auto count = static_cast<std::int64_t>(indices.size());
  Batch b = m_contents == Contents::Labels
                ? Batch{Tensor(), Tensor::empty(label_shape().batched(count), DType::Int32)}
                : allocate(count);
  std::int32_t* y = b.labels.data<std::int32_t>();
  for (std::size_t k = 0; k < indices.size(); ++k)
    y[k] = m_labels[static_cast<std::size_t>(indices[k])];
  if (m_contents == Contents::Labels) return b;
  constexpr std::int64_t kPixels = kRows * kCols;
  float* x = b.inputs.data<float>();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::uint8_t* src = m_pixels.data() + indices[k] * kPixels;
    float* dst = x + static_cast<std::int64_t>(k) * kPixels;
    for (std::int64_t p = 0; p < kPixels; ++p) dst[p] = static_cast<float>(src[p]) / 255.f;
  }
  return b;
}

const std::vector<std::string>& FashionMnist::class_names() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                              "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                              "Bag",         "Ankle boot"};
  return names;
}

}  // namespace pipeline
