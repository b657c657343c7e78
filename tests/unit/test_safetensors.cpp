#include <pipeline/io/safetensors.hpp>
#include <pipeline/nn/layers/linear.hpp>

#include <doctest/doctest.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/temp_dir.hpp"

namespace test_safetensors {

using namespace pipeline;
namespace fs = std::filesystem;

namespace {

std::vector<char> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A file assembled by hand: length, header text, data bytes.
void write_raw(const std::string& p, const std::string& header, const std::vector<char>& data,
               std::int64_t claimed_len = -1) {
  std::uint64_t n = claimed_len < 0 ? header.size() : static_cast<std::uint64_t>(claimed_len);
  std::ofstream out(p, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A layer with a parameter and a buffer, standing in for batch norm.
class ScaleLayer final : public Layer {
 public:
  ScaleLayer(std::string name, std::int64_t n) : Layer(std::move(name)), m_n(n) {}
  std::string kind() const override { return "Scale"; }
  Shape output_shape(const Shape& in) const override { return in; }
  double flops(const Shape& in) const override { return static_cast<double>(in.numel()); }
  std::vector<ParamSpec> parameters() const override { return {{"weight", {m_n}, Init::ones()}}; }
  std::vector<ParamSpec> buffers() const override {
    return {{"running_mean", {m_n}, Init::zeros()},
            {"num_batches", {1}, Init::zeros(), DType::Int32}};
  }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved&, const ForwardContext&) const override {
    return x;
  }
  Tensor backward_impl(const LayerParams&, const Saved&, const Tensor& dy, std::span<Tensor>,
                       GradParts) const override {
    return dy;
  }

 private:
  std::int64_t m_n;
};

Sequential make_model(std::int64_t hidden = 4) {
  Sequential m("toy");
  m.emplace<Linear>("fc1", 3, hidden)
      .emplace<ScaleLayer>("bn1", hidden)
      .emplace<Linear>("fc2", hidden, 2);
  return m;
}

}  // namespace

TEST_CASE("Round trip of named tensors with metadata") {
  testing::TempDir dir("pipeline_test_st");
  NamedTensors t;
  t.emplace_back("w", Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, -6.5f}));
  t.emplace_back("labels", Tensor::from_ints({4}, {0, 7, -1, 2147483647}));
  t.emplace_back("scalar", Tensor::from_vector(Shape{}, {3.25f}));
  t.emplace_back("empty", Tensor::zeros({0, 5}));
  const std::string p = dir.file("a.safetensors");
  save_safetensors(p, t, {{"format", "test"}, {"note", "ünïcode"}});

  Metadata meta;
  NamedTensors back = load_safetensors(p, &meta);
  REQUIRE(back.size() == 4);
  CHECK(meta.at("format") == "test");
  CHECK(meta.at("note") == "ünïcode");
  for (auto& entry : t) {
    const std::string& name = entry.first;
    const Tensor& tensor = entry.second;
    auto it = std::find_if(back.begin(), back.end(), [&](auto& e) { return e.first == name; });
    REQUIRE(it != back.end());
    CHECK(it->second.shape() == tensor.shape());
    CHECK(it->second.dtype() == tensor.dtype());
    CHECK(it->second.nbytes() == tensor.nbytes());
    if (tensor.nbytes() > 0)
      CHECK(std::memcmp(it->second.raw(), tensor.raw(), tensor.nbytes()) == 0);
  }

  // The layout is the documented one: a little-endian length, a space-padded JSON header whose
  // length is a multiple of 8, then the data in order.
  auto bytes = read_bytes(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  CHECK(n % 8 == 0);
  auto header = nlohmann::json::parse(
      std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n)));
  CHECK(header["w"]["dtype"] == "F32");
  CHECK(header["w"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["w"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["labels"]["dtype"] == "I32");
  CHECK(header["labels"]["data_offsets"] == nlohmann::json::array({24, 40}));
  CHECK(header["scalar"]["shape"] == nlohmann::json::array());
  CHECK(bytes.size() == 8 + n + 24 + 16 + 4);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  CHECK(first == 1.f);

  SafetensorsReader reader(p);
  CHECK(reader.entries().size() == 4);
  CHECK(reader.find("labels") != nullptr);
  CHECK(reader.find("nope") == nullptr);
  CHECK_THROWS_WITH_AS(reader.read("nope"), doctest::Contains("no tensor named 'nope'"), IoError);
  Tensor wrong = Tensor::zeros({3, 2});
  CHECK_THROWS_AS(reader.read_into("w", wrong), IoError);
}

TEST_CASE("A file written by another implementation reads") {
  // As written by the Python safetensors package (keys sorted, tensors packed in that order).
  testing::TempDir dir("pipeline_test_st");
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I32","shape":[1,1],"data_offsets":[8,12]}})";
  std::vector<char> data(12);
  const float a[2] = {0.5f, -2.f};
  const std::int32_t b = -7;
  std::memcpy(data.data(), a, 8);
  std::memcpy(data.data() + 8, &b, 4);
  write_raw(dir.file("x"), header, data);
  Metadata meta;
  auto t = load_safetensors(dir.file("x"), &meta);
  CHECK(meta.at("format") == "pt");
  REQUIRE(t.size() == 2);
  CHECK(t[0].second.to_vector() == std::vector<float>{0.5f, -2.f});
  CHECK(t[1].second.shape() == Shape{1, 1});
  CHECK(t[1].second.data<std::int32_t>()[0] == -7);
}

TEST_CASE("Every kind of corruption is an IoError naming the file and the problem") {
  testing::TempDir dir("pipeline_test_st");
  const std::string p = dir.file("bad.safetensors");
  auto entry = [](const char* name, const char* dtype, const char* shape, int b, int e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                       shape, b, e);
  };
  auto expect = [&](const std::string& header, std::size_t data_bytes, const char* what,
                    std::int64_t claimed = -1) {
    write_raw(p, header, std::vector<char>(data_bytes, 0), claimed);
    INFO(header);
    CHECK_THROWS_WITH_AS(SafetensorsReader{p}, doctest::Contains(what), IoError);
    CHECK_THROWS_WITH_AS(SafetensorsReader{p}, doctest::Contains("bad.safetensors"), IoError);
  };
  auto obj = [](std::initializer_list<std::string> entries) {
    return fmt::format("{{{}}}", fmt::join(entries, ","));
  };
  const std::string ok = entry("x", "F32", "[2]", 0, 8);

  {
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK_THROWS_WITH_AS(SafetensorsReader{p}, doctest::Contains("too short"), IoError);
  }
  expect(obj({ok}), 8, "exceeds", 1'000'000);
  expect(obj({ok}).substr(0, ok.size()), 8, "not valid JSON");
  expect("[1, 2]", 0, "not a JSON object");
  expect(obj({entry("x", "F32", "[2]", 0, 8)}), 4, "run past");  // truncated data
  expect(obj({entry("x", "F32", "[2]", 8, 16)}), 8, "run past");
  expect(obj({entry("x", "F32", "[3]", 0, 8)}), 8, "needs 12 bytes");
  expect(obj({entry("x", "F64", "[1]", 0, 8)}), 8, "dtype 'F64' is not supported");
  expect(obj({entry("x", "Q7", "[1]", 0, 8)}), 8, "dtype 'Q7'");
  expect(obj({entry("x", "F32", "[-2]", 0, 8)}), 8, "not a non-negative integer");
  expect(obj({entry("x", "F32", "[2.5]", 0, 8)}), 8, "not a non-negative integer");
  expect(obj({entry("x", "F32", "[2]", 8, 0)}), 8, "run backwards");
  expect(obj({ok, entry("y", "F32", "[2]", 4, 12)}), 12, "overlaps");
  expect(obj({ok, entry("y", "F32", "[1]", 12, 16)}), 16, "unused bytes");
  expect(obj({ok}), 12, "trailing bytes");
  expect(obj({ok, ok}), 8, "appears twice");
  expect(R"({"x":{"dtype":"F32","shape":[2]}})", 8, "data_offsets");
  expect(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8,
         "unexpected field");
  expect(R"({"x":[1,2]})", 8, "not a JSON object");
  expect(R"({"__metadata__":{"a":1}})", 0, "not a string");
  expect(obj({entry("x", "F32", "[4294967296,4294967296]", 0, 8)}), 8, "implausibly large");
  // 2^62 F32 elements: 2^64 bytes, which wrapped to 0 and matched empty data_offsets (fuzzing).
  expect(obj({entry("x", "F32", "[1099511627776,4194304]", 0, 0)}), 0, "implausibly large");
  CHECK_THROWS_WITH_AS(SafetensorsReader{dir.file("absent")}, doctest::Contains("does not exist"),
                       IoError);
}

TEST_CASE("Atomic writes leave no temporary behind") {
  testing::TempDir dir("pipeline_test_st");
  NamedTensors t{{"a", Tensor::full({100}, 1.f)}};
  const std::string p = dir.file("ckpt.safetensors");
  save_safetensors(p, t);
  t[0].second.fill(2.f);
  save_safetensors(p, t);  // overwrite in place
  CHECK(dir.listing() == std::vector<std::string>{"ckpt.safetensors"});
  CHECK(load_safetensors(p)[0].second.values()[99] == 2.f);

  // The destination cannot be replaced (it is a directory): IoError, old contents kept, no temp.
  fs::create_directories(dir.path / "sub");
  CHECK_THROWS_AS(save_safetensors(dir.file("sub"), t), IoError);
  CHECK(dir.listing() == std::vector<std::string>{"ckpt.safetensors", "sub"});
  CHECK_THROWS_AS(save_safetensors(dir.file("missing/dir/x.safetensors"), t), IoError);

  // Bad input is refused before anything is written.
  NamedTensors dup{{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({1})}};
  CHECK_THROWS_AS(save_safetensors(dir.file("dup"), dup), ConfigError);
  CHECK_THROWS_AS(
      save_safetensors(dir.file("meta"), NamedTensors{{"__metadata__", Tensor::zeros({1})}}),
      ConfigError);
  CHECK(dir.listing() == std::vector<std::string>{"ckpt.safetensors", "sub"});
}

TEST_CASE("Model parameters save and load by layer-qualified name") {
  testing::TempDir dir("pipeline_test_st");
  Sequential model = make_model();
  ModelParams params = model.init(42);
  params[1].buffers[0].fill(0.25f);
  params[1].buffers[1].data<std::int32_t>()[0] = 17;
  const std::string p = dir.file("model.safetensors");
  save_parameters(p, model, params, model.all());

  SafetensorsReader reader(p);
  std::vector<std::string> names;
  for (auto& e : reader.entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "bn1.weight",
                                          "bn1.running_mean", "bn1.num_batches", "fc2.weight",
                                          "fc2.bias"});
  CHECK(reader.metadata().at("model") == "toy");
  CHECK(reader.find("fc1.weight")->shape == Shape{4, 3});  // PyTorch layout [out, in]

  // Into freshly allocated parameters, and into existing ones.
  ModelParams loaded;
  load_parameters(p, model, loaded, model.all());
  REQUIRE(loaded.size() == 3);
  CHECK(loaded[0].params[0].to_vector() == params[0].params[0].to_vector());
  CHECK(loaded[1].buffers[0].to_vector() == params[1].buffers[0].to_vector());
  CHECK(loaded[1].buffers[1].data<std::int32_t>()[0] == 17);
  ModelParams other = model.init(7);
  load_parameters(p, model, other, model.all());
  CHECK(other[2].params[1].to_vector() == params[2].params[1].to_vector());

  // One stage's layers from the whole-model file; and a stage's file holds only its layers.
  ModelParams stage;
  load_parameters(p, model, stage, {1, 3});
  REQUIRE(stage.size() == 2);
  CHECK(stage[1].params[0].to_vector() == params[2].params[0].to_vector());
  const std::string stage_file = dir.file("stage1.safetensors");
  save_parameters(stage_file, model, stage, {1, 3});
  CHECK(SafetensorsReader(stage_file).entries().size() == 5);
  ModelParams first;
  CHECK_THROWS_WITH_AS(load_parameters(stage_file, model, first, model.all()),
                       doctest::Contains("missing tensors: fc1.weight, fc1.bias"), IoError);
}

TEST_CASE("Loading into a model of another shape names every mis-shaped tensor") {
  testing::TempDir dir("pipeline_test_st");
  Sequential model = make_model(4);
  ModelParams params = model.init(1);
  const std::string p = dir.file("m.safetensors");
  save_parameters(p, model, params, model.all());

  Sequential wider = make_model(5);
  ModelParams target = wider.init(2);
  const auto before = target[0].params[0].to_vector();
  try {
    load_parameters(p, wider, target, wider.all());
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("m.safetensors") != std::string::npos);
    CHECK(msg.find("fc1.weight (expected [5, 3] F32, found [4, 3] F32)") != std::string::npos);
    CHECK(msg.find("bn1.running_mean (expected [5] F32, found [4] F32)") != std::string::npos);
    CHECK(msg.find("fc2.weight (expected [2, 5] F32, found [2, 4] F32)") != std::string::npos);
    CHECK(msg.find("fc2.bias") == std::string::npos);  // this one fits
  }
  CHECK(target[0].params[0].to_vector() == before);  // nothing was written
}

}  // namespace test_safetensors
