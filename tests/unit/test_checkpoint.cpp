// Checkpoints: the manifest format and its checks, writing (single process and a 3-stage pipeline
// of in-process ranks), pruning, skipping interrupted writes, restoring under another partition,
// and rejecting corrupt shards with the file and tensor named.
#include <pipeline/comm/comms/local.hpp>
#include <pipeline/io/safetensors.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/checkpoint.hpp>
#include <pipeline/runtime/metrics.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "../support/temp_dir.hpp"

namespace test_checkpoint {

using namespace pipeline;
namespace fs = std::filesystem;

namespace {

// A model whose parameters and optimizer state have moved away from their initial values.
struct Trained {
  ZooModel zoo = make_model("mlp");
  ModelParams params;
  std::unique_ptr<Optimizer> optimizer = std::make_unique<AdamW>();

  explicit Trained(std::uint64_t seed = 3, int steps = 2) {
    params = zoo.model.init(seed);
    std::vector<Tensor> p = flatten_params(params);
    Rng rng(seed, "grads");
    for (int s = 0; s < steps; ++s) {
      std::vector<Tensor> g;
      for (auto& t : p) {
        Tensor x = Tensor::empty(t.shape());
        float* v = x.data<float>();
        for (std::int64_t i = 0; i < x.numel(); ++i) v[i] = static_cast<float>(rng.uniform() - 0.5);
        g.push_back(x);
      }
      optimizer->step(p, g, 1e-2f);
    }
  }
};

CheckpointRunInfo info_for(const Trained& t, int world = 1) {
  return {.model = t.zoo.model.name(),
          .architecture = t.zoo.architecture,
          .optimizer = "adamw",
          .seed = 3,
          .batch_size = 32,
          .world_size = world};
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.nbytes())) == 0;
}

void check_equal(const ModelParams& a, const ModelParams& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t l = 0; l < a.size(); ++l) {
    REQUIRE(a[l].params.size() == b[l].params.size());
    for (std::size_t k = 0; k < a[l].params.size(); ++k) CHECK(same(a[l].params[k], b[l].params[k]));
    for (std::size_t k = 0; k < a[l].buffers.size(); ++k) CHECK(same(a[l].buffers[k], b[l].buffers[k]));
  }
}

void check_equal(const Optimizer& a, const Optimizer& b) {
  REQUIRE(a.state().size() == b.state().size());
  for (std::size_t i = 0; i < a.state().size(); ++i) {
    CHECK(a.state()[i].step == b.state()[i].step);
    for (std::size_t k = 0; k < a.state()[i].buffers.size(); ++k)
      CHECK(same(a.state()[i].buffers[k], b.state()[i].buffers[k]));
  }
}

void save_single(const std::string& dir, Trained& t, std::int64_t step, int keep = 2) {
  Checkpointer c({dir, 0, keep}, info_for(t), CheckpointRole::single(t.zoo.model), nullptr);
  c.save(step, t.zoo.model, t.params, *t.optimizer);
  CHECK(c.finish() == (fs::path(dir) / checkpoint_dir_name(step)).string());
}

// A stage's slice of the trained parameters and optimizer state.
std::pair<ModelParams, std::unique_ptr<Optimizer>> stage_slice(const Trained& whole, LayerRange r) {
  const Sequential& model = whole.zoo.model;
  ModelParams p;
  for (int i = r.begin; i < r.end; ++i)
    p.push_back(whole.params[static_cast<std::size_t>(i)].clone());
  auto opt = std::make_unique<AdamW>();
  const auto all = whole.optimizer->state_tensors(parameter_names(model, model.all()));
  opt->load_state_tensors(all, parameter_shapes(model, r), parameter_names(model, r));
  return {std::move(p), std::move(opt)};
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("checkpoint manifest: round trip and malformed manifests") {
  CheckpointManifest m;
  m.step = 12;
  m.model = "mlp";
  m.architecture = {{"channels", 1}, {"width", 0.5}};  // the order in which they come back
  m.world_size = 2;
  m.schedule = "1f1b-flush";
  m.optimizer = "adamw";
  m.seed = 0xfedcba9876543210ULL;
  m.batch_size = 64;
  m.plan = {{"format", "pipeline.plan/1"}};
  m.training = {{"learning rate", "cosine:100:0 (lr 0.1)"}, {"--no-shuffle", "not given"}};
  m.shards = {{"stage-1.safetensors", 1, 3, 6, 100, 0xdeadbeef, {{"fc3.bias", "F32", Shape{10}}}},
              {"stage-0.safetensors", 0, 0, 3, 200, 7, {{"fc1.weight", "F32", Shape{4, 5}}}}};
  const std::string text = manifest_to_json(m).dump();
  CHECK(text.rfind("{\"format\":\"pipeline.checkpoint/1\"", 0) == 0);
  const CheckpointManifest back = parse_checkpoint_manifest(text, "m.json");
  CHECK(back.step == 12);
  CHECK(back.seed == m.seed);
  CHECK(back.plan == m.plan);
  CHECK(back.architecture == m.architecture);
  CHECK(back.training == m.training);
  // A resume is told which training options it gives otherwise (those both record).
  CheckpointRunInfo run;
  run.training = {{"learning rate", "cosine:200:0 (lr 0.1)"},
                  {"--no-shuffle", "not given"},
                  {"--clip-grad", "1"}};
  CHECK(training_differences(back, run) ==
        std::vector<std::string>{
            "learning rate cosine:200:0 (lr 0.1) (the checkpoint's: cosine:100:0 (lr 0.1))"});
  REQUIRE(back.shards.size() == 2);
  CHECK(back.shards[0].crc32 == 0xdeadbeef);
  CHECK(back.shards[0].tensors[0].shape == Shape{10});
  CHECK(back.shards[1].holds_layer(2));
  CHECK_FALSE(back.shards[1].holds_layer(3));

  auto broken = [&](auto edit) {
    nlohmann::json j = nlohmann::json::parse(text);
    edit(j);
    return message_of([&] { parse_checkpoint_manifest(j.dump(), "m.json"); });
  };
  CHECK(broken([](auto& j) { j["format"] = "pipeline.checkpoint/9"; }).find("format") != std::string::npos);
  CHECK(broken([](auto& j) { j.erase("step"); }).find("has no 'step'") != std::string::npos);
  CHECK(broken([](auto& j) { j["step"] = -1; }).find("'step'") != std::string::npos);
  CHECK(broken([](auto& j) { j["shards"][0]["file"] = "../x"; }).find("not a plain file name") !=
        std::string::npos);
  CHECK(broken([](auto& j) { j["shards"][0]["layers"] = {4, 6}; }).find("cover the layers once") !=
        std::string::npos);
  CHECK(broken([](auto& j) { j["shards"] = nlohmann::json::array(); }).find("non-empty") !=
        std::string::npos);
  CHECK(broken([](auto& j) { j["shards"][1]["tensors"][0]["shape"] = {-1}; }).find("bad dimension") !=
        std::string::npos);
  CHECK(message_of([] { parse_checkpoint_manifest("{\"format\":", "m.json"); }).find("not valid JSON") !=
        std::string::npos);
  CHECK(text.find("\"architecture\":{\"channels\":1,\"width\":0.5}") != std::string::npos);
  CHECK(broken([](auto& j) { j["architecture"] = 3; }).find("'architecture'") != std::string::npos);
  CHECK(broken([](auto& j) { j["training"]["--lr"] = 0.1; }).find("'training'") !=
        std::string::npos);
  CHECK(broken([](auto& j) { j["architecture"]["width"] = "wide"; }).find("'architecture'") !=
        std::string::npos);
  // Manifests written before the architecture was recorded still parse; a resume checks less.
  nlohmann::json old = nlohmann::json::parse(text);
  old.erase("architecture");
  old.erase("training");
  CHECK(parse_checkpoint_manifest(old.dump(), "m.json").architecture.empty());
  CHECK(training_differences(parse_checkpoint_manifest(old.dump(), "m.json"), run).empty());
}

TEST_CASE("checkpoint: single process, written and restored exactly (parameters and optimizer)") {
  testing::TempDir dir("ckpt_single");
  Trained t;
  save_single(dir.path.string(), t, 7);
  const auto c = find_latest_checkpoint(dir.path.string());
  REQUIRE(c.has_value());
  CHECK(c->manifest.step == 7);
  CHECK(c->manifest.shards.size() == 1);
  check_resume_compatible(c->manifest, info_for(t));

  Trained fresh(99, 0);
  restore_stage(*c, fresh.zoo.model, fresh.zoo.model.all(), fresh.params, *fresh.optimizer);
  check_equal(t.params, fresh.params);
  check_equal(*t.optimizer, *fresh.optimizer);

  // Into empty parameters: allocated from the layers.
  ModelParams empty;
  AdamW opt;
  restore_stage(*c, t.zoo.model, {1, 4}, empty, opt);
  CHECK(empty.size() == 3);
  CHECK(same(empty[0].params[0], t.params[1].params[0]));
}

TEST_CASE("checkpoint: keep the newest K, skip and delete interrupted writes") {
  testing::TempDir dir("ckpt_keep");
  Trained t;
  for (int step : {1, 2, 3, 4}) save_single(dir.path.string(), t, step, 2);
  CHECK(dir.listing() ==
        std::vector<std::string>{".lock", checkpoint_dir_name(3), checkpoint_dir_name(4)});

  // A write interrupted after its shard, before its manifest: never loaded.
  const fs::path partial = dir.path / checkpoint_dir_name(9);
  fs::create_directories(partial);
  fs::copy_file(dir.path / checkpoint_dir_name(4) / "stage-0.safetensors", partial / "stage-0.safetensors");
  const auto c = find_latest_checkpoint(dir.path.string());
  REQUIRE(c.has_value());
  CHECK(c->manifest.step == 4);
  // A new run's writer deletes it before writing anything.
  Checkpointer w({dir.path.string(), 0, 2}, info_for(t), CheckpointRole::single(t.zoo.model), nullptr);
  CHECK_FALSE(fs::exists(partial));
  CHECK_FALSE(find_latest_checkpoint((dir.path / "nothing-here").string()).has_value());
  // One checkpoint's directory given for the directory of them: refused, naming the parent.
  const std::string expected = fmt::format(
      "is one checkpoint, not a directory of them: give the directory that holds its step-<n> "
      "directories ('{}')",
      dir.path.string());
  for (const std::string suffix : {"", "/"})
    CHECK_THROWS_WITH_AS(
        find_latest_checkpoint((dir.path / checkpoint_dir_name(4)).string() + suffix),
        doctest::Contains(expected.c_str()), ConfigError);
}

TEST_CASE("checkpoint: a second job writing into the same directory is refused, naming the first") {
  testing::TempDir dir("ckpt_lock");
  Trained t;
  {
    Checkpointer first({dir.path.string(), 0, 2}, info_for(t), CheckpointRole::single(t.zoo.model),
                       nullptr);
    const std::string holder = fmt::format("pid {})", ::getpid());
    CHECK_THROWS_WITH_AS(Checkpointer({dir.path.string(), 0, 2}, info_for(t),
                                      CheckpointRole::single(t.zoo.model), nullptr),
                         doctest::Contains(holder.c_str()), ConfigError);
    CHECK_THROWS_WITH_AS(CheckpointDirLock(dir.path.string()),
                         doctest::Contains("is in use by another job"), ConfigError);
    // A lock file left read-only still locks (flock needs no write access).
    fs::permissions(dir.path / ".lock", fs::perms::owner_read | fs::perms::group_read);
    CHECK_THROWS_WITH_AS(CheckpointDirLock(dir.path.string()),
                         doctest::Contains("is in use by another job"), ConfigError);
    // Another process too (flock, not a lock of this process only).
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        CheckpointDirLock again(dir.path.string());
        ::_exit(1);
      } catch (const ConfigError&) {
        ::_exit(0);
      }
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  // Once the first has ended, the directory is free (the lock file stays, unlocked).
  CHECK(fs::exists(dir.path / ".lock"));
  Checkpointer second({dir.path.string(), 0, 2}, info_for(t), CheckpointRole::single(t.zoo.model),
                      nullptr);
}

TEST_CASE("checkpoint: a file system without room for one checkpoint is refused at the start") {
  testing::TempDir dir("ckpt_space");
  Trained t;
  const std::int64_t one = checkpoint_bytes(t.zoo.model, *t.optimizer);
  // Parameters, buffers and AdamW's two moments: what the shard holds, but for its header.
  save_single(dir.path.string(), t, 1);
  const auto shard = fs::file_size(dir.path / checkpoint_dir_name(1) / "stage-0.safetensors");
  CHECK(static_cast<double>(one) <= static_cast<double>(shard));
  CHECK(static_cast<double>(one) >= 0.95 * static_cast<double>(shard));
  CheckpointOptions huge{(dir.path / "more").string(), 0, 2, std::int64_t{1} << 60};
  CHECK_THROWS_WITH_AS(
      Checkpointer(huge, info_for(t), CheckpointRole::single(t.zoo.model), nullptr),
      doctest::Contains("but one checkpoint of this run takes about 1073741824.00 GiB"), IoError);
}

TEST_CASE("checkpoint: corrupt shards and manifests are rejected, naming the file and tensor") {
  testing::TempDir dir("ckpt_corrupt");
  Trained t;
  save_single(dir.path.string(), t, 5);
  const fs::path step_dir = dir.path / checkpoint_dir_name(5);
  const std::string shard = (step_dir / "stage-0.safetensors").string();
  const std::string manifest = (step_dir / "manifest.json").string();
  const std::string original = [&] {
    std::ifstream in(manifest);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto restore = [&](const Sequential& model) {
    return message_of([&] {
      const auto c = find_latest_checkpoint(dir.path.string());
      ModelParams p;
      AdamW opt;
      restore_stage(*c, model, model.all(), p, opt);
    });
  };

  SUBCASE("a flipped byte: the CRC-32 disagrees") {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
    f.close();
    const std::string e = restore(t.zoo.model);
    CHECK(e.find(shard) != std::string::npos);
    CHECK(e.find("CRC-32") != std::string::npos);
    // Damage, which a resume may pass over for an older checkpoint (other errors it must not).
    const auto c = find_latest_checkpoint(dir.path.string());
    ModelParams p;
    AdamW opt;
    CHECK_THROWS_AS(restore_stage(*c, t.zoo.model, t.zoo.model.all(), p, opt), CheckpointDamaged);
    CHECK(p.empty());
    fs::remove(shard);
    CHECK_THROWS_WITH_AS(restore_stage(*c, t.zoo.model, t.zoo.model.all(), p, opt),
                         doctest::Contains("is missing"), CheckpointDamaged);
  }
  SUBCASE("a truncated shard") {
    fs::resize_file(shard, fs::file_size(shard) - 10);
    CHECK(restore(t.zoo.model).find("is corrupt") != std::string::npos);
  }
  SUBCASE("the manifest's tensor shape disagrees with the file") {
    nlohmann::json j = nlohmann::json::parse(original);
    j["shards"][0]["tensors"][0]["shape"] = {1, 2};
    std::ofstream(manifest) << j.dump();
    const std::string e = restore(t.zoo.model);
    CHECK(e.find("fc1.weight") != std::string::npos);
    CHECK(e.find("in the manifest") != std::string::npos);
  }
  SUBCASE("another model: the tensor's shape disagrees with the model") {
    ZooOptions wide;
    wide.width = 2.0;
    ZooModel other = make_model("mlp", wide);
    const std::string e = restore(other.model);
    CHECK(e.find("fc1.weight") != std::string::npos);
    CHECK(e.find("needs") != std::string::npos);
  }
  SUBCASE("a manifest that does not parse: the older checkpoint, or an error when none") {
    // Its semantics wrong (valid JSON of another step) is no damage to pass over.
    nlohmann::json j = nlohmann::json::parse(original);
    j["step"] = 6;
    std::ofstream(manifest) << j.dump();
    CHECK(message_of([&] {
            find_latest_checkpoint(dir.path.string());
          }).find("is for step 6 but sits in the directory of step 5") != std::string::npos);
    std::ofstream(manifest) << "{\"format\": \"pipeline.checkpoint/1\", \"step\": ";
    const std::string e = message_of([&] { find_latest_checkpoint(dir.path.string()); });
    CHECK(e.find(manifest) != std::string::npos);
    CHECK(e.find("holds no older complete checkpoint") != std::string::npos);
    // A writer sets it aside (it would count among the kept ones); the older one is found.
    save_single(dir.path.string(), t, 3);
    CHECK(fs::exists(step_dir.string() + ".damaged"));
    const auto c = find_latest_checkpoint(dir.path.string());
    REQUIRE(c.has_value());
    CHECK(c->manifest.step == 3);
  }
  SUBCASE("older than a step; a damaged one set aside") {
    save_single(dir.path.string(), t, 3);
    CHECK(find_latest_checkpoint(dir.path.string(), 5)->manifest.step == 3);
    CHECK_FALSE(find_latest_checkpoint(dir.path.string(), 3).has_value());
    const std::string aside = set_aside_damaged_checkpoint(step_dir.string());
    CHECK(aside == step_dir.string() + ".damaged");
    CHECK(find_latest_checkpoint(dir.path.string())->manifest.step == 3);
    save_single(dir.path.string(), t, 5);
    CHECK(set_aside_damaged_checkpoint(step_dir.string()) == step_dir.string() + ".damaged-2");
  }
  SUBCASE("resume checks: model, architecture, seed, batch, optimizer") {
    const auto c = find_latest_checkpoint(dir.path.string());
    CheckpointRunInfo run = info_for(t);
    run.seed = 4;
    CHECK(message_of([&] { check_resume_compatible(c->manifest, run); }).find("--seed 3") !=
          std::string::npos);
    run = info_for(t);
    run.batch_size = 16;
    CHECK(message_of([&] { check_resume_compatible(c->manifest, run); }).find("--batch 32") !=
          std::string::npos);
    // The run's model from its plan: the plan is what to change, not --model.
    run = info_for(t);
    run.model = "fashion-cnn";
    CHECK(message_of([&] {
            check_resume_compatible(c->manifest, run);
          }).find("resume it with the program and --model it was written by (--model mlp)") !=
          std::string::npos);
    run.plan = {{"model", "fashion-cnn"}};
    CHECK(message_of([&] { check_resume_compatible(c->manifest, run); })
              .find("this run's --plan is for 'fashion-cnn': resume it with a plan made for "
                    "'mlp'") != std::string::npos);
    run = info_for(t);
    run.optimizer = "sgd";
    CHECK(message_of([&] { check_resume_compatible(c->manifest, run); }).find("--optimizer adamw") !=
          std::string::npos);
    // Options that give the same tensor shapes (transformer-lm's heads) are caught by the
    // recorded architecture, named as the trainers' flag.
    run = info_for(t);
    for (auto& [option, value] : run.architecture)
      if (option == "image_size") value = 32;
    CHECK(message_of([&] { check_resume_compatible(c->manifest, run); })
              .find("with --image-size 28 but this run builds it with --image-size 32: resume "
                    "with --image-size 28") != std::string::npos);
    CheckpointManifest older = c->manifest;
    older.architecture.clear();
    check_resume_compatible(older, run);
  }
}

TEST_CASE("checkpoint: a 3-stage pipeline of in-process ranks, restored under another partition") {
  testing::TempDir dir("ckpt_pipeline");
  Trained whole;
  const Sequential& model = whole.zoo.model;
  // Stages [0, 2) [2, 4) [4, 6), the middle one replicated: ranks 0 | 1 2 | 3.
  PipelineLayout layout;
  layout.stages = {{0, 2}, {2, 4}, {4, model.size()}};
  layout.stage_ranks = {{0}, {1, 2}, {3}};
  run_local(4, [&](Communicator& comm) {
    const CheckpointRole role = CheckpointRole::for_layout(layout, comm.rank());
    REQUIRE(role.stages.size() == 1);
    CHECK(role.writes(role.stages.front()) == (comm.rank() != 2));
    auto [params, opt] =
        stage_slice(whole, layout.stages[static_cast<std::size_t>(role.stages.front())]);
    Checkpointer c({dir.path.string(), 10, 2}, info_for(whole, 4), role, &comm);
    for (std::int64_t step = 10; step <= 30; step += 10) {
      CHECK(c.due(step));
      c.save(step, model, params, *opt);
      for (int i = 0; i < 5; ++i) c.poll();
    }
    const std::string done = c.finish();
    CHECK(done == (comm.rank() == 0 ? (dir.path / checkpoint_dir_name(30)).string() : ""));
    CHECK(c.max_stall_s() >= 0);
  });
  CHECK(dir.listing() ==
        std::vector<std::string>{".lock", checkpoint_dir_name(20), checkpoint_dir_name(30)});
  const auto c = find_latest_checkpoint(dir.path.string());
  REQUIRE(c.has_value());
  CHECK(c->manifest.world_size == 4);
  CHECK(c->manifest.shards.size() == 3);

  // One process with every layer, and two stages split elsewhere: each loads what it holds.
  Trained fresh(11, 0);
  restore_stage(*c, model, model.all(), fresh.params, *fresh.optimizer);
  check_equal(whole.params, fresh.params);
  check_equal(*whole.optimizer, *fresh.optimizer);
  ModelParams tail;
  AdamW opt;
  restore_stage(*c, model, {1, 5}, tail, opt);
  CHECK(same(tail[0].params[0], whole.params[1].params[0]));
  CHECK(opt.state().size() == parameter_shapes(model, {1, 5}).size());
}

TEST_CASE("checkpoint: ranks that run several stages (an interleaved layout) write a shard each") {
  testing::TempDir dir("ckpt_interleaved");
  Trained whole;
  const Sequential& model = whole.zoo.model;
  // Four stages, stage k on rank k % 2: rank 0 runs stages 0 and 2, rank 1 stages 1 and 3.
  PipelineLayout layout;
  layout.stages = {{0, 2}, {2, 3}, {3, 5}, {5, model.size()}};
  layout.stage_ranks = {{0}, {1}, {0}, {1}};
  run_local(2, [&](Communicator& comm) {
    const CheckpointRole role = CheckpointRole::for_layout(layout, comm.rank());
    CHECK(role.stages == std::vector<int>{comm.rank(), comm.rank() + 2});
    CHECK(role.writes(comm.rank() + 2));
    CHECK_FALSE(role.writes(1 - comm.rank()));
    std::map<int, std::pair<ModelParams, std::unique_ptr<Optimizer>>> state;
    for (int s : role.stages)
      state[s] = stage_slice(whole, layout.stages[static_cast<std::size_t>(s)]);
    Checkpointer c({dir.path.string(), 10, 2}, info_for(whole, 2), role, &comm);
    for (std::int64_t step = 10; step <= 20; step += 10) {
      // The stages save as they step: the later one first on rank 1, with polls in between, and
      // a stage saved twice at one step is written once.
      std::vector<int> order = role.stages;
      if (comm.rank() == 1) std::reverse(order.begin(), order.end());
      const std::int64_t before = step == 10 ? -1 : step - 10;
      for (int s : order) {
        c.save(step, s, model, state[s].first, *state[s].second);
        c.save(step, s, model, state[s].first, *state[s].second);
        CHECK(c.last_saved_step() == (s == order.back() ? step : before));
        c.poll();
      }
    }
    CHECK(c.finish() == (comm.rank() == 0 ? (dir.path / checkpoint_dir_name(20)).string() : ""));
    // A stage the rank does not run, and the one-stage form on a rank of two stages, are refused.
    CHECK(message_of([&] {
            c.save(30, 1 - comm.rank(), model, state[comm.rank()].first,
                   *state[comm.rank()].second);
          }).find("runs stage(s)") != std::string::npos);
    CHECK(message_of([&] {
            c.save(30, model, state[comm.rank()].first, *state[comm.rank()].second);
          }).find("save each with its stage number") != std::string::npos);
  });
  const auto c = find_latest_checkpoint(dir.path.string());
  REQUIRE(c.has_value());
  CHECK(c->manifest.step == 20);
  REQUIRE(c->manifest.shards.size() == 4);
  for (int s = 0; s < 4; ++s) {
    CHECK(c->manifest.shards[static_cast<std::size_t>(s)].stage == s);
    CHECK(c->manifest.shards[static_cast<std::size_t>(s)].file ==
          fmt::format("stage-{}.safetensors", s));
  }
  // The whole model and its optimizer state come back from the four shards.
  Trained fresh(11, 0);
  restore_stage(*c, model, model.all(), fresh.params, *fresh.optimizer);
  check_equal(whole.params, fresh.params);
  check_equal(*whole.optimizer, *fresh.optimizer);
}

TEST_CASE("checkpoint: finish() before every stage of the rank was saved names the stages") {
  testing::TempDir dir("ckpt_unsaved");
  Trained whole;
  PipelineLayout layout;
  layout.stages = {{0, 3}, {3, whole.zoo.model.size()}};
  layout.stage_ranks = {{0}, {0}};
  Checkpointer c({dir.path.string(), 0, 2}, info_for(whole), CheckpointRole::for_layout(layout, 0),
                 nullptr);
  auto [params, opt] = stage_slice(whole, layout.stages[0]);
  c.save(5, 0, whole.zoo.model, params, *opt);
  c.poll();  // does not wait for stage 1
  CHECK(c.last_saved_step() == -1);
  const std::string m = message_of([&] { c.finish(); });
  CHECK_MESSAGE(m.find("stage(s) [1] of rank 0 were never saved") != std::string::npos, m);
  CHECK_FALSE(fs::exists(dir.path / checkpoint_dir_name(5) / "manifest.json"));
}

TEST_CASE("metrics: a resumed run drops the records past its checkpoint's step") {
  const testing::TempDir dir("metrics");
  const std::string path = (dir.path / "m.jsonl").string();
  {
    MetricsWriter first(path);
    for (int step = 1; step <= 5; ++step) {
      first.write({{"step", step}, {"loss", 1.0 / step}});
      if (step == 2) first.write({{"epoch", 1}, {"test_accuracy", 0.5}});
    }
  }
  // The run died after step 5; its checkpoint was of step 3.
  MetricsWriter resumed(path, 3);
  resumed.write({{"step", 4}, {"loss", 0.2}});
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  CHECK(lines == std::vector<std::string>{R"({"loss":1.0,"step":1})", R"({"loss":0.5,"step":2})",
                                          R"({"epoch":1,"test_accuracy":0.5})",
                                          R"({"loss":0.3333333333333333,"step":3})",
                                          R"({"loss":0.2,"step":4})"});
  // A fresh run (step 0) starts the file over.
  MetricsWriter fresh(path);
  CHECK(std::filesystem::file_size(path) == 0);
}

}  // namespace test_checkpoint
