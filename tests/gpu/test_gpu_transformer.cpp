// The zoo's transformer-lm trained on cuda:0 follows the CPU's trajectory: embedding, layer norm,
// fused attention, GELU, dropout (masks drawn bit for bit as on the CPU), the language-model
// softmax cross-entropy and AdamW, five steps from the same initialisation, with gradient
// clipping and two microbatches per step. Losses agree within 1e-4 relative, every parameter
// within 1e-3 after the last step.
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <doctest/doctest.h>

#include "gpu_compare.hpp"
#include "support/param_compare.hpp"

namespace test_gpu_transformer {

using namespace pipeline;
using pipeline::testing::max_rel_diff;

TEST_CASE("transformer-lm trains on cuda:0 as on the CPU") {
  for (const float dropout : {0.f, 0.1f}) {
    CAPTURE(dropout);
    ZooOptions zo;
    zo.vocab = 64;
    zo.seq_len = 32;
    zo.dim = 64;
    zo.heads = 4;  // head dim 16: the kernels' zero-padded tail
    zo.blocks = 2;
    zo.dropout = dropout;
    const ZooModel zoo = make_model("transformer-lm", zo);
    const ModelParams init = zoo.model.init(13);
    auto adamw = [] { return std::make_unique<AdamW>(AdamWOptions{.weight_decay = 1e-2f}); };
    SequentialTrainer cpu(zoo.model, init, adamw(), 3, /*clip_norm=*/1.f);
    SequentialTrainer gpu(zoo.model, to_device(init, Device::cuda(0)), adamw(), 3, 1.f);
    REQUIRE(gpu.device() == Device::cuda(0));
    for (std::int64_t step = 0; step < 5; ++step) {
      CAPTURE(step);
      const Batch b = gpu_test::token_batch(8, zo.seq_len, static_cast<std::int32_t>(zo.vocab),
                                            static_cast<std::uint64_t>(100 + step));
      const StepResult rc = cpu.step(b, 1e-3f, 2);
      const StepResult rg = gpu.step(b, 1e-3f, 2);
      CHECK(rg.loss == doctest::Approx(rc.loss).epsilon(1e-4));
      CHECK(rg.grad_norm == doctest::Approx(rc.grad_norm).epsilon(1e-3));
    }
    const ModelParams back = to_device(gpu.params(), Device::cpu());
    CHECK(max_rel_diff(back, cpu.params(), zoo.model.all()) <= 1e-3);
  }
}

}  // namespace test_gpu_transformer
