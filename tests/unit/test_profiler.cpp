// The profiler on zoo models: one entry per layer with the layer's own sizes and FLOPs, positive
// times, the backward split where the layer has weights, and a result that the JSON I/O and the
// partitioner accept as it is.
#include <pipeline/core/error.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/profile/profiler.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace test_profiler {

using namespace pipeline;

namespace {

ProfileOptions quick() {
  ProfileOptions o;
  o.warmup = 1;
  o.repeat = 3;
  return o;
}

// Checks everything that follows from the model alone, and that the times are plausible.
void check_against_model(const Profile& p, const ZooModel& z, int batch) {
  const Sequential& m = z.model;
  const auto shapes = m.shapes(z.input_shape(batch), m.all());

  CHECK(p.model == m.name());
  CHECK(p.batch_size == batch);
  CHECK(p.device.rfind("cpu: ", 0) == 0);
  CHECK(p.device.find(std::to_string(num_threads()) + " thread") != std::string::npos);
  CHECK(p.dtype == "float32");
  REQUIRE(p.size() == m.size());
  CHECK(p.is_chain());
  for (int i = 0; i < m.size(); ++i) {
    const LayerProfile& l = p.layers[static_cast<std::size_t>(i)];
    const Layer& layer = m.layer(i);
    CAPTURE(l.name);
    CHECK(l.name == layer.name());
    CHECK(l.kind == layer.kind());
    CHECK(l.inputs.empty());
    CHECK(l.forward_s > 0);
    CHECK(l.backward_s > 0);
    CHECK(l.forward_spread_s >= 0);
    CHECK(l.backward_spread_s >= 0);
    CHECK(l.output_bytes == 4 * shapes[static_cast<std::size_t>(i) + 1].numel());
    CHECK(l.parameter_bytes == static_cast<std::int64_t>(layer.parameter_bytes()));
    CHECK(l.flops == doctest::Approx(layer.flops(shapes[static_cast<std::size_t>(i)])));
    if (layer.parameters().empty()) {
      CHECK(l.parameter_bytes == 0);
      CHECK(l.backward_weight_s == 0);
      CHECK(l.backward_input_s == l.backward_s);
      CHECK(!l.step_s.measured());
    } else {
      CHECK(l.parameter_bytes > 0);
      CHECK(l.backward_input_s > 0);
      CHECK(l.backward_weight_s > 0);
      // Every update rule's step over the layer's weights was timed.
      CHECK(l.step_s.sgd > 0);
      CHECK(l.step_s.momentum > 0);
      CHECK(l.step_s.adamw > 0);
    }
  }
}

}  // namespace

TEST_CASE("profile of mlp and fashion-cnn matches the layers") {
  const int batch = 4;
  for (std::string name : {"mlp", "fashion-cnn"}) {
    CAPTURE(name);
    ZooModel z = make_model(name);
    Profile p = profile(z, batch, Device::cpu(), quick());
    check_against_model(p, z, batch);
    CHECK(p.threads == num_threads());  // what a rank's compute must run on for these times
    if (name == "fashion-cnn") {
      // Times are not compared with each other: on a loaded machine any run can be preempted.
      CHECK(p.layers[0].kind == "Conv2d");
      CHECK(p.layers[0].flops == doctest::Approx(2.0 * batch * 32 * 28 * 28 * 25));
      CHECK(p.layers[7].parameter_bytes == (3136 * 1024 + 1024) * 4);
      CHECK(p.layers[7].output_bytes == batch * 1024 * 4);
    }
    // A ReLU before a max pool runs after it inside a stage, keeping the pooled tensor; a stage
    // that ends at the ReLU runs it on, and keeps, the full one: both are profiled.
    for (int i = 0; i < p.size(); ++i) {
      CAPTURE(i);
      const LayerProfile& l = p.layers[static_cast<std::size_t>(i)];
      const bool pair = z.model.runs_after_next(i);
      CHECK(pair == (name == "fashion-cnn" && (i == 1 || i == 4)));
      REQUIRE(l.at_stage_end.has_value() == pair);
      if (!pair) continue;
      CHECK(l.at_stage_end->forward_s > 0);
      CHECK(l.at_stage_end->backward_s > 0);
      CHECK(l.at_stage_end->backward_input_s == l.at_stage_end->backward_s);
      CHECK(l.at_stage_end->saved_bytes == l.output_bytes);
      CHECK(l.saved_bytes == p.layers[static_cast<std::size_t>(i) + 1].output_bytes);
    }
  }
}

TEST_CASE("the Sequential overload and the zoo overload agree on everything but times") {
  ZooModel z = make_model("mlp");
  Profile a = profile(z.model, z.sample_shape, 3, Device::cpu(), quick());
  Profile b = profile(z, 3, Device::cpu(), quick());
  REQUIRE(a.size() == b.size());
  for (int i = 0; i < a.size(); ++i) {
    CHECK(a.layers[i].output_bytes == b.layers[i].output_bytes);
    CHECK(a.layers[i].parameter_bytes == b.layers[i].parameter_bytes);
    CHECK(a.layers[i].flops == b.layers[i].flops);
  }
}

TEST_CASE("the transformer-lm embedding runs on int32 token ids") {
  ZooOptions o;
  o.seq_len = 8;
  o.dim = 16;
  o.heads = 2;
  o.blocks = 1;
  ZooModel z = make_model("transformer-lm", o);
  Profile p = profile(z, 2, Device::cpu(), quick());
  check_against_model(p, z, 2);
  CHECK(p.layers[0].kind == z.model.layer(0).kind());
}

TEST_CASE("saved bytes: what each layer keeps for backward, shared storage counted once") {
  ZooOptions o;
  o.seq_len = 8;
  o.dim = 16;
  o.heads = 2;
  o.blocks = 2;
  const ZooModel z = make_model("transformer-lm", o);
  const Profile p = profile(z, 2, Device::cpu(), quick());
  // A transformer block keeps far more than its output (attention probabilities, the MLP's
  // hidden activations, norms' statistics), and its split backward keeps its children's output
  // gradients from I to W.
  CHECK(p.layers[1].saved_bytes > 4 * p.layers[1].output_bytes);
  CHECK(p.layers[1].split_kept_bytes > p.layers[1].output_bytes);
  // Tanh keeps its output, which the next Linear saves as its input: counted at the Tanh only.
  Sequential m("saved-bytes");
  m.emplace<Linear>("fc1", 8, 16);
  m.emplace<Tanh>("tanh");
  m.emplace<Linear>("fc2", 16, 4);
  const Profile q = profile(m, Shape{8}, 4, Device::cpu(), quick());
  CHECK(q.layers[0].saved_bytes == 4 * 8 * 4);   // fc1: its input
  CHECK(q.layers[1].saved_bytes == 4 * 16 * 4);  // tanh: its output
  CHECK(q.layers[2].saved_bytes == 0);           // fc2: the same tensor
}

TEST_CASE("layers profiled in groups of their own give the whole model's profile") {
  // A model too large for the device at once is profiled a few layers at a time: each group on
  // random activations of its input shape. Everything but the times is the whole model's, also
  // where a group would end at a ReLU that runs after its max pool (fashion-cnn).
  ZooOptions o;
  o.seq_len = 8;
  o.dim = 16;
  o.heads = 2;
  o.blocks = 3;
  for (const char* name : {"transformer-lm", "fashion-cnn"}) {
    CAPTURE(name);
    const ZooModel model =
        make_model(name, std::string_view(name) == "fashion-cnn" ? ZooOptions{} : o);
    const Profile whole = profile(model, 2, Device::cpu(), quick());
    for (const int per_pass : {1, 2, 4}) {
      CAPTURE(per_pass);
      ProfileOptions groups = quick();
      groups.layers_per_pass = per_pass;
      const Profile p = profile(model, 2, Device::cpu(), groups);
      check_against_model(p, model, 2);
      REQUIRE(p.size() == whole.size());
      for (int i = 0; i < p.size(); ++i) {
        CAPTURE(i);
        const LayerProfile &a = p.layers[i], &b = whole.layers[i];
        CHECK(a.name == b.name);
        CHECK(a.output_bytes == b.output_bytes);
        CHECK(a.parameter_bytes == b.parameter_bytes);
        CHECK(a.saved_bytes == b.saved_bytes);
        CHECK(a.saved_input_bytes == b.saved_input_bytes);
        CHECK(a.gradient_bytes == b.gradient_bytes);
        CHECK(a.frees_input == b.frees_input);
        CHECK(a.split_kept_bytes == b.split_kept_bytes);
        CHECK(a.flops == b.flops);
        CHECK(a.at_stage_end.has_value() == b.at_stage_end.has_value());
        CHECK(a.forward_s > 0);
        CHECK(a.backward_s > 0);
        CHECK((a.step_s.of("adamw") > 0) == (b.step_s.of("adamw") > 0));
      }
    }
  }
  ProfileOptions bad = quick();
  bad.layers_per_pass = -1;
  CHECK_THROWS_WITH_AS(profile(make_model("transformer-lm", o), 2, Device::cpu(), bad),
                       doctest::Contains("layers per"), ConfigError);
}

TEST_CASE("workspace bytes: the temporaries of a layer's passes, as the allocator counts them") {
  // A transformer block's backward makes its children's gradients before its saved tensors go:
  // temporaries of several outputs' size. A ReLU writes only its output: none. The allocator
  // counts buffers of 64 KiB and more, so the activations here are larger than that.
  ZooOptions o;
  o.seq_len = 64;
  o.dim = 64;
  o.heads = 2;
  o.blocks = 1;
  const ZooModel z = make_model("transformer-lm", o);
  const Profile p = profile(z, 8, Device::cpu(), quick());
  REQUIRE(p.layers[1].kind == "TransformerBlock");
  CHECK(p.layers[1].workspace_bytes >= 2 * p.layers[1].output_bytes);
  CHECK(p.runtime_bytes == 0);  // nothing is kept on the CPU besides tensors
  // The weight half of a split backward lets go of the children's output gradients that the
  // input half kept (split_kept_bytes, charged apart): they are not its temporaries, so the split
  // halves add nothing to what the whole backward makes (they added 1.5 times the whole
  // backward's temporaries when a pass's were counted beyond its end alone).
  ProfileOptions whole = quick();
  whole.split_backward = false;
  const Profile w = profile(z, 8, Device::cpu(), whole);
  CHECK(p.layers[1].split_kept_bytes > p.layers[1].output_bytes);
  CHECK(p.layers[1].workspace_bytes == w.layers[1].workspace_bytes);
  Sequential m("relu");
  m.emplace<ReLU>("relu");
  const Profile q = profile(m, Shape{4096}, 16, Device::cpu(), quick());
  CHECK(q.layers[0].workspace_bytes == 0);
}

TEST_CASE("split_backward off leaves the split unknown") {
  ProfileOptions o = quick();
  o.split_backward = false;
  Profile p = profile(make_model("mlp"), 2, Device::cpu(), o);
  for (const auto& l : p.layers) {
    CHECK(l.backward_s > 0);
    CHECK(l.backward_input_s == 0);
    CHECK(l.backward_weight_s == 0);
  }
}

TEST_CASE("a profile survives the JSON round trip and is accepted by the partitioner") {
  ZooModel z = make_model("fashion-cnn");
  Profile p = profile(z, 4, Device::cpu(), quick());

  Profile q = profile_from_json(profile_to_json(p), "round trip");
  REQUIRE(q.size() == p.size());
  CHECK(q.model == p.model);
  CHECK(q.device == p.device);
  CHECK(q.batch_size == p.batch_size);
  for (int i = 0; i < p.size(); ++i) {
    const auto &a = p.layers[i], &b = q.layers[i];
    CHECK(a.name == b.name);
    CHECK(a.kind == b.kind);
    CHECK(a.forward_s == doctest::Approx(b.forward_s));
    CHECK(a.backward_s == doctest::Approx(b.backward_s));
    CHECK(a.backward_input_s == doctest::Approx(b.backward_input_s));
    CHECK(a.backward_weight_s == doctest::Approx(b.backward_weight_s));
    CHECK(a.forward_spread_s == doctest::Approx(b.forward_spread_s));
    CHECK(a.output_bytes == b.output_bytes);
    CHECK(a.parameter_bytes == b.parameter_bytes);
    CHECK(a.flops == doctest::Approx(b.flops));
  }

  const std::string path = "test_profiler_profile.json";
  write_profile(p, path);
  Profile r = read_profile(path);
  CHECK(r.size() == p.size());
  std::remove(path.c_str());

  Topology topo;
  topo.levels.push_back({4, 1.25e9});
  Plan plan = partition(r, topo);
  REQUIRE(plan.num_stages() >= 1);
  CHECK(plan.stages.front().begin == 0);
  CHECK(plan.stages.back().end == p.size());
  for (std::size_t s = 1; s < plan.stages.size(); ++s)
    CHECK(plan.stages[s].begin == plan.stages[s - 1].end);
  CHECK(plan.predicted.time_per_minibatch_s > 0);
}

TEST_CASE("bad arguments are ConfigErrors") {
  ZooModel z = make_model("mlp");
  CHECK_THROWS_AS(profile(z, 0, Device::cpu(), quick()), ConfigError);
  ProfileOptions none = quick();
  none.repeat = 0;
  CHECK_THROWS_AS(profile(z, 2, Device::cpu(), none), ConfigError);
  ProfileOptions negative = quick();
  negative.warmup = -1;
  CHECK_THROWS_AS(profile(z, 2, Device::cpu(), negative), ConfigError);
#ifndef PIPELINE_WITH_CUDA
  CHECK_THROWS_WITH_AS(profile(z, 2, Device::cuda(), quick()), doctest::Contains("no CUDA support"),
                       ConfigError);
#else
  CHECK_THROWS_WITH_AS(profile(z, 2, Device::cuda(999), quick()), doctest::Contains("cuda:999"),
                       ConfigError);
#endif
  // An input shape the first layer cannot take.
  CHECK_THROWS_AS(profile(z.model, Shape{3, 5}, 2, Device::cpu(), quick()), ConfigError);
  CHECK_THROWS_AS(profile(Sequential("empty"), Shape{4}, 2, Device::cpu(), quick()), ConfigError);
}

}  // namespace test_profiler
