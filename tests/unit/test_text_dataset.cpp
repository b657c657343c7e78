#include <pipeline/data/text.hpp>

#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

namespace test_text_dataset {

using namespace pipeline;
namespace fs = std::filesystem;

namespace {
std::string write_temp(const std::string& content) {
  static int counter = 0;
  fs::path p =
      fs::temp_directory_path() / fmt::format("pipeline_test_text_{}_{}", ::getpid(), counter++);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}
}  // namespace

TEST_CASE("Text windows: inputs are T bytes, labels the next bytes") {
  const std::string text = "hello, world\n\xff";
  const std::string path = write_temp(text);
  TextDataset d(path, {.seq_len = 4});
  CHECK(d.size() == static_cast<std::int64_t>(text.size()) - 4);
  CHECK(d.num_classes() == 256);
  CHECK(d.input_dtype() == DType::Int32);
  CHECK(d.sample_shape() == Shape{4});
  std::vector<std::int64_t> idx{1, d.size() - 1};
  Batch b = d.get(idx);
  REQUIRE(b.inputs.shape() == Shape{2, 4});
  REQUIRE(b.labels.shape() == Shape{2, 4});
  const std::int32_t* x = b.inputs.data<std::int32_t>();
  const std::int32_t* y = b.labels.data<std::int32_t>();
  CHECK(std::string{char(x[0]), char(x[1]), char(x[2]), char(x[3])} == "ello");
  CHECK(std::string{char(y[0]), char(y[1]), char(y[2]), char(y[3])} == "llo,");
  CHECK(y[7] == 255);  // bytes are unsigned
  std::vector<std::int64_t> bad{d.size()};
  CHECK_THROWS(d.get(bad));
  fs::remove(path);
}

TEST_CASE("Stride and file parts") {
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const std::string path = write_temp(text);
  TextDataset disjoint(path, {.seq_len = 10, .stride = 10});
  CHECK(disjoint.size() == 9);  // windows of 11 bytes start at 0, 10, ..., 80
  std::vector<std::int64_t> idx{8};
  CHECK(disjoint.get(idx).inputs.data<std::int32_t>()[0] == text[80]);

  TextDataset train(path, {.seq_len = 5, .begin = 0.0, .end = 0.9});
  TextDataset val(path, {.seq_len = 5, .begin = 0.9, .end = 1.0});
  CHECK(train.bytes() == 90);
  CHECK(val.bytes() == 10);
  CHECK(val.size() == 5);
  std::vector<std::int64_t> zero{0};
  CHECK(val.get(zero).inputs.data<std::int32_t>()[0] == text[90]);
  fs::remove(path);
}

TEST_CASE("Missing or too short files give clear errors") {
  CHECK_THROWS_WITH_AS(TextDataset("/nonexistent/corpus.txt", {.seq_len = 8}),
                       doctest::Contains("does not exist"), IoError);
  const std::string path = write_temp("abcd");
  CHECK_THROWS_WITH_AS(TextDataset(path, {.seq_len = 4}), doctest::Contains("too short"), IoError);
  CHECK_NOTHROW(TextDataset(path, {.seq_len = 3}));
  CHECK_THROWS_AS(TextDataset(path, {.seq_len = 0}), ConfigError);
  CHECK_THROWS_AS(TextDataset(path, {.seq_len = 2, .begin = 0.5, .end = 0.5}), ConfigError);
  fs::remove(path);
}

}  // namespace test_text_dataset
