// The model zoo: models by name, as Sequential stacks whose layer names are stable (they are the
// keys of checkpoints and of the safetensors interchange with PyTorch).
//
//   mlp             Flatten → fc1 → ReLU → fc2 → ReLU → fc3 (Fashion-MNIST shaped input)
//   fashion-cnn     conv1(1→32, 5×5, pad 2) → ReLU → MaxPool 2 → conv2(32→64, 5×5, pad 2) → ReLU
//                   → MaxPool 2 → Flatten → fc1(3136→1024) → ReLU → fc2(1024→10)
//   vgg16           VGG-16 (configuration D) with a width multiplier and any input size
//   resnet18        ResNet-18 of basic residual blocks (CIFAR-style 3×3 stem for small inputs)
//   transformer-lm  byte embedding (+ learned positions) → N pre-norm blocks → LayerNorm → head
#pragma once

#include <pipeline/core/dtype.hpp>
#include <pipeline/nn/architecture.hpp>
#include <pipeline/nn/sequential.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

struct ZooOptions {
  // Images (mlp, fashion-cnn, vgg16, resnet18).
  std::int64_t channels = 0;  // 0: the model's default (1 for Fashion-MNIST models, 3 otherwise)
  std::int64_t image_size =
      0;  // 0: the model's default (28 for Fashion-MNIST models, 32 otherwise)
  std::int64_t num_classes = 10;
  double width = 1.0;  // channel / hidden-size multiplier for vgg16 and resnet18
  // Sequences (transformer-lm).
  std::int64_t vocab = 256;
  std::int64_t seq_len = 64;
  std::int64_t dim = 128;
  std::int64_t heads = 4;
  std::int64_t blocks = 4;
  float dropout = 0.f;
};

struct ZooModel {
  Sequential model;
  Shape sample_shape;  // one sample's input shape, without the batch dimension
  DType input_dtype = DType::Float32;
  std::int64_t num_classes = 0;  // classes, or vocabulary size for language models

  // The options that define this model, as resolved (defaults filled in), by option name:
  // channels, image_size, num_classes, width for image models; vocab, seq_len, dim, heads, blocks
  // for transformer-lm. Profiles, plans and checkpoints record them (architecture.hpp).
  Architecture architecture;

  // The shape of a batch of `batch` inputs: {batch, sample_shape...}.
  Shape input_shape(std::int64_t batch) const { return sample_shape.batched(batch); }
};

// Throws ConfigError naming the known models when `name` is not one of them.
ZooModel make_model(std::string_view name, const ZooOptions& options = {});
std::vector<std::string> zoo_model_names();

}  // namespace pipeline
