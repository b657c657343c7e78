#include <pipeline/data/fashion_mnist.hpp>
#include <pipeline/data/idx.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "support/temp_dir.hpp"

namespace test_idx {

using namespace pipeline;
namespace fs = std::filesystem;

namespace {

std::vector<std::uint8_t> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& p, const std::vector<std::uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

IdxArray images(std::int64_t n) {
  IdxArray a{{n, 28, 28}, {}};
  for (std::int64_t i = 0; i < n * 28 * 28; ++i)
    a.data.push_back(static_cast<std::uint8_t>(i * 7 % 256));
  return a;
}

}  // namespace

TEST_CASE("IDX round trip, plain and gzipped") {
  testing::TempDir dir("pipeline_test_idx");
  IdxArray a{{3, 2, 5}, {}};
  for (int i = 0; i < 30; ++i) a.data.push_back(static_cast<std::uint8_t>(i * 9));
  for (bool gz : {false, true}) {
    const std::string p = dir.file(gz ? "a.gz" : "a");
    write_idx(p, a, gz);
    const auto raw = read_bytes(p);
    if (gz)
      CHECK((raw[0] == 0x1f && raw[1] == 0x8b));
    else
      CHECK(raw.size() == 4 + 3 * 4 + 30);
    IdxArray b = read_idx(p);
    CHECK(b.dims == a.dims);
    CHECK(b.data == a.data);
  }
}

TEST_CASE("Truncated and corrupt IDX files give IoError") {
  testing::TempDir dir("pipeline_test_idx");
  IdxArray a{{4, 3}, std::vector<std::uint8_t>(12, 5)};
  const std::string good = dir.file("good");
  write_idx(good, a, false);
  const auto bytes = read_bytes(good);

  auto expect = [&](const std::vector<std::uint8_t>& content, const char* what) {
    const std::string p = dir.file("bad");
    write_bytes(p, content);
    INFO(what);
    CHECK_THROWS_WITH_AS(read_idx(p), doctest::Contains(what), IoError);
  };
  expect({}, "too short");
  expect({0, 0, 8}, "too short");
  expect({1, 2, 8, 2, 0, 0, 0, 4, 0, 0, 0, 3}, "bad magic");
  expect({0, 0, 0x0d, 2, 0, 0, 0, 4, 0, 0, 0, 3}, "element type 0x0d");
  expect({0, 0, 8, 0}, "declares 0 dimensions");
  expect({0, 0, 8, 2, 0, 0, 0}, "inside its 2 dimension sizes");
  expect({bytes.begin(), bytes.end() - 1}, "truncated");
  auto longer = bytes;
  longer.push_back(1);
  expect(longer, "beyond");
  // A header claiming a huge array must fail on the short data, not on allocation.
  expect({0, 0, 8, 3, 0, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 0, 0, 0, 1, 1, 2, 3}, "truncated");
  expect({0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1}, "implausible");
  CHECK_THROWS_WITH_AS(read_idx(dir.file("absent")), doctest::Contains("does not exist"), IoError);
  // The header alone: its own errors, but not the data's.
  const std::string header_only = dir.file("header");
  write_bytes(header_only, {1, 2, 8, 2, 0, 0, 0, 4, 0, 0, 0, 3});
  CHECK_THROWS_WITH_AS(read_idx_dims(header_only), doctest::Contains("bad magic"), IoError);
  write_bytes(header_only, {0, 0, 8, 2, 0, 0, 0});
  CHECK_THROWS_WITH_AS(read_idx_dims(header_only), doctest::Contains("dimension sizes"), IoError);
  write_bytes(header_only, {bytes.begin(), bytes.end() - 1});
  CHECK(read_idx_dims(header_only) == std::vector<std::int64_t>{4, 3});

  // A gzip stream cut in half, and one with its compressed body garbled.
  const std::string gz = dir.file("good.gz");
  IdxArray big = images(20);
  write_idx(gz, big, true);
  auto zipped = read_bytes(gz);
  expect({zipped.begin(), zipped.begin() + static_cast<std::ptrdiff_t>(zipped.size() / 2)},
         "truncated");
  auto garbled = zipped;
  for (std::size_t i = 20; i < garbled.size() - 8; i += 3) garbled[i] ^= 0x5a;
  const std::string p = dir.file("garbled.gz");
  write_bytes(p, garbled);
  CHECK_THROWS_AS(read_idx(p), IoError);
}

TEST_CASE("FashionMnist reads a directory of IDX files, .gz or plain") {
  testing::TempDir dir("pipeline_test_idx");
  IdxArray img = images(5);
  IdxArray lab{{5}, {0, 9, 3, 3, 1}};
  write_idx(dir.file("t10k-images-idx3-ubyte.gz"), img, true);
  write_idx(dir.file("t10k-labels-idx1-ubyte"), lab, false);
  FashionMnist test(dir.path.string(), Split::Test);
  CHECK(test.size() == 5);
  CHECK(test.sample_shape() == Shape{1, 28, 28});
  CHECK(test.num_classes() == 10);
  std::vector<std::int64_t> idx{4, 1};
  Batch b = test.get(idx);
  CHECK(b.inputs.shape() == Shape{2, 1, 28, 28});
  CHECK(b.labels.shape() == Shape{2});
  CHECK(b.labels.data<std::int32_t>()[0] == 1);
  CHECK(b.labels.data<std::int32_t>()[1] == 9);
  CHECK(b.inputs.values()[3] == doctest::Approx(img.data[4 * 784 + 3] / 255.0));
  CHECK(b.inputs.values()[784 + 10] == doctest::Approx(img.data[784 + 10] / 255.0));
  std::vector<std::int64_t> out_of_range{5};
  CHECK_THROWS(test.get(out_of_range));

  // Labels alone: the images' header is read (and checked against the labels), their pixels not.
  CHECK(read_idx_dims(dir.file("t10k-images-idx3-ubyte.gz")) ==
        std::vector<std::int64_t>{5, 28, 28});
  const FashionMnist labels(dir.path.string(), Split::Test, FashionMnist::Contents::Labels);
  CHECK(labels.size() == 5);
  CHECK(labels.sample_shape() == Shape{1, 28, 28});
  const Batch lb = labels.get(idx);
  CHECK_FALSE(lb.inputs.defined());
  CHECK(lb.size() == 2);
  CHECK(lb.labels.data<std::int32_t>()[0] == 1);
  CHECK(lb.labels.data<std::int32_t>()[1] == 9);
  IdxArray fewer = images(4);
  write_idx(dir.file("t10k-images-idx3-ubyte.gz"), fewer, true);
  CHECK_THROWS_WITH_AS(FashionMnist(dir.path.string(), Split::Test, FashionMnist::Contents::Labels),
                       doctest::Contains("holds 4 images"), IoError);
  write_idx(dir.file("t10k-images-idx3-ubyte.gz"), img, true);

  // The training split is missing: the error names the package and the flag.
  CHECK_THROWS_WITH_AS(FashionMnist(dir.path.string(), Split::Train),
                       doctest::Contains("dataset-fashion-mnist"), IoError);
  CHECK_THROWS_WITH_AS(FashionMnist(dir.path.string(), Split::Train), doctest::Contains("--data"),
                       IoError);

  // Inconsistent files: a label out of range, counts that disagree.
  write_idx(dir.file("t10k-labels-idx1-ubyte"), IdxArray{{5}, {0, 10, 3, 3, 1}}, false);
  CHECK_THROWS_WITH_AS(FashionMnist(dir.path.string(), Split::Test), doctest::Contains("label 10"),
                       IoError);
  write_idx(dir.file("t10k-labels-idx1-ubyte"), IdxArray{{4}, {0, 1, 3, 3}}, false);
  CHECK_THROWS_WITH_AS(FashionMnist(dir.path.string(), Split::Test), doctest::Contains("4 labels"),
                       IoError);
}

TEST_CASE("The installed Fashion-MNIST, when present") {
  if (!fs::exists(FashionMnist::kDefaultDir)) {
    MESSAGE("no Fashion-MNIST at ", FashionMnist::kDefaultDir, "; skipping");
    return;
  }
  FashionMnist train;
  FashionMnist test(FashionMnist::kDefaultDir, Split::Test);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  std::vector<std::int64_t> idx(1000);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i * 59);
  Batch b = train.get(idx);
  std::vector<int> counts(10, 0);
  for (std::int64_t i = 0; i < b.labels.numel(); ++i) {
    const int y = b.labels.data<std::int32_t>()[i];
    REQUIRE((y >= 0 && y < 10));
    ++counts[static_cast<std::size_t>(y)];
  }
  for (int c : counts) CHECK(c > 50);  // the classes are balanced
  float lo = 1.f, hi = 0.f;
  for (float v : b.inputs.values()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo == 0.f);
  CHECK(hi == 1.f);
}

}  // namespace test_idx
