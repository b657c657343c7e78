#include <pipeline/nn/zoo.hpp>

#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/batch_norm.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/embedding.hpp>
#include <pipeline/nn/layers/flatten.hpp>
#include <pipeline/nn/layers/layer_norm.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/layers/pool2d.hpp>
#include <pipeline/nn/layers/residual_block.hpp>
#include <pipeline/nn/layers/transformer_block.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace pipeline {

namespace {

std::int64_t scaled(std::int64_t n, double width) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::lround(n * width)));
}

// An empty image classifier named `model` taking [channels, size, size] float images: fills in
// the default channels and size where the options leave them 0, then checks the options (images
// at least min_size square).
ZooModel image_model(std::string_view model, ZooOptions& o, std::int64_t default_channels,
                     std::int64_t default_size, std::int64_t min_size) {
  if (o.channels == 0) o.channels = default_channels;
  if (o.image_size == 0) o.image_size = default_size;
  PIPELINE_CHECK_AS(
      ConfigError, o.channels > 0 && o.image_size >= min_size,
      "model '{}' needs at least {}x{} images with >= 1 channel, got {} channels of {}x{}", model,
      min_size, min_size, o.channels, o.image_size, o.image_size);
  PIPELINE_CHECK_AS(ConfigError, o.num_classes >= 2, "model '{}': num_classes must be >= 2, got {}",
                    model, o.num_classes);
  PIPELINE_CHECK_AS(ConfigError, o.width > 0 && std::isfinite(o.width),
                    "model '{}': width multiplier must be positive, got {}", model, o.width);
  return ZooModel{Sequential(std::string(model)),
                  {o.channels, o.image_size, o.image_size},
                  DType::Float32,
                  o.num_classes,
                  {{"channels", static_cast<double>(o.channels)},
                   {"image_size", static_cast<double>(o.image_size)},
                   {"num_classes", static_cast<double>(o.num_classes)},
                   {"width", o.width}}};
}

ZooModel mlp(ZooOptions o) {
  ZooModel z = image_model("mlp", o, 1, 28, 1);
  const std::int64_t in = o.channels * o.image_size * o.image_size;
  const std::int64_t hidden = scaled(256, o.width);
  z.model.emplace<Flatten>("flatten")
      .emplace<Linear>("fc1", in, hidden)
      .emplace<ReLU>("relu1")
      .emplace<Linear>("fc2", hidden, hidden)
      .emplace<ReLU>("relu2")
      .emplace<Linear>("fc3", hidden, o.num_classes);
  return z;
}

ZooModel fashion_cnn(ZooOptions o) {
  ZooModel z = image_model("fashion-cnn", o, 1, 28, 4);
  const std::int64_t s = o.image_size / 2 / 2;
  z.model.emplace<Conv2d>("conv1", o.channels, 32, 5, 1, 2)
      .emplace<ReLU>("relu1")
      .emplace<MaxPool2d>("pool1", 2)
      .emplace<Conv2d>("conv2", 32, 64, 5, 1, 2)
      .emplace<ReLU>("relu2")
      .emplace<MaxPool2d>("pool2", 2)
      .emplace<Flatten>("flatten")
      .emplace<Linear>("fc1", 64 * s * s, 1024)
      .emplace<ReLU>("relu3")
      .emplace<Linear>("fc2", 1024, o.num_classes);
  return z;
}

ZooModel vgg16(ZooOptions o) {
  ZooModel z = image_model("vgg16", o, 3, 32, 32);
  // Configuration D of Simonyan & Zisserman: 13 convolutions in 5 blocks, each ending in a pool.
  const std::vector<std::vector<std::int64_t>> blocks = {
      {64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}};
  std::int64_t in = o.channels, size = o.image_size;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (std::size_t c = 0; c < blocks[b].size(); ++c) {
      std::int64_t out = scaled(blocks[b][c], o.width);
      std::string id = fmt::format("{}_{}", b + 1, c + 1);
      z.model.emplace<Conv2d>("conv" + id, in, out, 3, 1, 1).emplace<ReLU>("relu" + id);
      in = out;
    }
    z.model.emplace<MaxPool2d>(fmt::format("pool{}", b + 1), 2);
    size /= 2;
  }
  const std::int64_t hidden = scaled(4096, o.width);
  z.model.emplace<Flatten>("flatten")
      .emplace<Linear>("fc1", in * size * size, hidden)
      .emplace<ReLU>("relu_fc1")
      .emplace<Dropout>("drop1", o.dropout > 0 ? o.dropout : 0.5f)
      .emplace<Linear>("fc2", hidden, hidden)
      .emplace<ReLU>("relu_fc2")
      .emplace<Dropout>("drop2", o.dropout > 0 ? o.dropout : 0.5f)
      .emplace<Linear>("fc3", hidden, o.num_classes);
  return z;
}

ZooModel resnet18(ZooOptions o) {
  ZooModel z = image_model("resnet18", o, 3, 32, 8);
  std::int64_t in = scaled(64, o.width);
  z.model.emplace<Conv2d>("conv1", o.channels, in, 3, 1, 1, false)
      .emplace<BatchNorm2d>("bn1", in)
      .emplace<ReLU>("relu1");
  const std::int64_t widths[] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    std::int64_t out = scaled(widths[stage], o.width);
    for (int b = 0; b < 2; ++b) {
      std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      z.model.emplace<ResidualBlock>(fmt::format("layer{}_{}", stage + 1, b + 1), in, out, stride);
      in = out;
    }
  }
  z.model.emplace<GlobalAvgPool>("avgpool").emplace<Linear>("fc", in, o.num_classes);
  return z;
}

ZooModel transformer_lm(const ZooOptions& o) {
  PIPELINE_CHECK_AS(ConfigError, o.vocab >= 2 && o.seq_len >= 1 && o.dim >= 1 && o.blocks >= 1,
                    "transformer-lm needs vocab >= 2, seq_len >= 1, dim >= 1, blocks >= 1; got "
                    "vocab {}, seq_len {}, dim {}, blocks {}",
                    o.vocab, o.seq_len, o.dim, o.blocks);
  PIPELINE_CHECK_AS(ConfigError, o.heads >= 1 && o.dim % o.heads == 0,
                    "transformer-lm: dim {} must be divisible by heads {}", o.dim, o.heads);
  ZooModel z{Sequential("transformer-lm"),
             {o.seq_len},
             DType::Int32,
             o.vocab,
             {{"vocab", static_cast<double>(o.vocab)},
              {"seq_len", static_cast<double>(o.seq_len)},
              {"dim", static_cast<double>(o.dim)},
              {"heads", static_cast<double>(o.heads)},
              {"blocks", static_cast<double>(o.blocks)}}};
  z.model.emplace<Embedding>("embed", o.vocab, o.dim, o.seq_len);
  for (std::int64_t b = 0; b < o.blocks; ++b)
    z.model.emplace<TransformerBlock>(fmt::format("block{}", b + 1), o.dim, o.heads, 4, o.dropout);
  z.model.emplace<LayerNorm>("ln_f", o.dim).emplace<Linear>("head", o.dim, o.vocab);
  return z;
}

}  // namespace

std::vector<std::string> zoo_model_names() {
  return {"mlp", "fashion-cnn", "vgg16", "resnet18", "transformer-lm"};
}

ZooModel make_model(std::string_view name, const ZooOptions& options) {
  if (name == "mlp") return mlp(options);
  if (name == "fashion-cnn") return fashion_cnn(options);
  if (name == "vgg16") return vgg16(options);
  if (name == "resnet18") return resnet18(options);
  if (name == "transformer-lm") return transformer_lm(options);
  PIPELINE_FAIL(ConfigError, "unknown model '{}': choose one of {}", name,
                fmt::join(zoo_model_names(), ", "));
}

}  // namespace pipeline
