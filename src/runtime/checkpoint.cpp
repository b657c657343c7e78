// Checkpoints: the manifest's JSON, the background writer and its coordination, and restoring a
// stage from the shards that hold its layers.
#include <pipeline/runtime/checkpoint.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/core/text.hpp>
#include <pipeline/io/safetensors.hpp>
#include <pipeline/optim/flatten.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "../core/json_io.hpp"

namespace fs = std::filesystem;

namespace pipeline {

// --- manifest ----------------------------------------------------------------------------------

nlohmann::ordered_json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (auto& s : m.shards) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (auto& t : s.tensors)
      tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape.dims()}});
    shards.push_back({{"file", s.file},
                      {"stage", s.stage},
                      {"layers", {s.layer_begin, s.layer_end}},
                      {"bytes", s.bytes},
                      {"crc32", s.crc32},
                      {"tensors", std::move(tensors)}});
  }
  // The format first (DESIGN.md's convention), then the fields in the order a reader wants them.
  return {{"format", CheckpointManifest::kFormat},
          {"step", m.step},
          {"model", m.model},
          {"architecture", architecture_to_json(m.architecture)},
          {"world_size", m.world_size},
          {"schedule", m.schedule},
          {"optimizer", m.optimizer},
          {"seed", m.seed},
          {"batch_size", m.batch_size},
          {"weight_versions", m.weight_versions},
          {"plan", nlohmann::ordered_json::parse(m.plan.dump())},
          {"training", m.training},
          {"shards", std::move(shards)}};
}

namespace {

// A checked view of one JSON object of the manifest: every getter names the field and the file.
struct Fields {
  const nlohmann::json& j;
  const std::string& origin;
  std::string where;

  const nlohmann::json& at(const char* key) const {
    PIPELINE_CHECK_AS(ConfigError, j.is_object() && j.contains(key),
                      "checkpoint manifest '{}': {} has no '{}'", origin, where, key);
    return j.at(key);
  }
  std::int64_t integer(const char* key, std::int64_t min, std::int64_t max) const {
    const auto& v = at(key);
    PIPELINE_CHECK_AS(ConfigError, v.is_number_integer(),
                      "checkpoint manifest '{}': {} field '{}' must be an integer, got {}", origin,
                      where, key, v.dump());
    // Unsigned values above int64's range would wrap: read them as unsigned first.
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max))
      PIPELINE_FAIL(ConfigError, "checkpoint manifest '{}': {} field '{}' = {} is out of range",
                    origin, where, key, v.dump());
    const auto x = v.get<std::int64_t>();
    PIPELINE_CHECK_AS(ConfigError, x >= min && x <= max,
                      "checkpoint manifest '{}': {} field '{}' = {} is outside [{}, {}]", origin,
                      where, key, x, min, max);
    return x;
  }
  std::string string(const char* key) const {
    const auto& v = at(key);
    PIPELINE_CHECK_AS(ConfigError, v.is_string(),
                      "checkpoint manifest '{}': {} field '{}' must be a string, got {}", origin,
                      where, key, v.dump());
    return v.get<std::string>();
  }
};

constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();

// One shard record of a manifest (also what a writer sends the coordinator); `index` and
// `origin` name it in errors.
CheckpointShard parse_shard(const nlohmann::json& j, const std::string& origin, std::size_t index) {
  const std::size_t i = index;
  const Fields f{j, origin, fmt::format("shard {}", i)};
  CheckpointShard s;
  s.file = f.string("file");
  PIPELINE_CHECK_AS(
      ConfigError,
      !s.file.empty() && s.file.find('/') == std::string::npos && s.file != "." && s.file != "..",
      "checkpoint manifest '{}': shard {} names file '{}', which is not a plain "
      "file name inside the checkpoint",
      origin, i, s.file);
  s.stage = static_cast<int>(f.integer("stage", 0, 1 << 20));
  const auto& layers = f.at("layers");
  PIPELINE_CHECK_AS(ConfigError,
                    layers.is_array() && layers.size() == 2 && layers[0].is_number_integer() &&
                        layers[1].is_number_integer(),
                    "checkpoint manifest '{}': shard {} 'layers' must be [begin, end]", origin, i);
  const auto b = layers[0].get<std::int64_t>(), e = layers[1].get<std::int64_t>();
  PIPELINE_CHECK_AS(ConfigError, 0 <= b && b < e && e <= (1 << 24),
                    "checkpoint manifest '{}': shard {} has layers [{}, {}), not a non-empty "
                    "range",
                    origin, i, b, e);
  s.layer_begin = static_cast<int>(b);
  s.layer_end = static_cast<int>(e);
  s.bytes = static_cast<std::uint64_t>(f.integer("bytes", 8, kMaxI64));
  s.crc32 = static_cast<std::uint32_t>(f.integer("crc32", 0, 0xffffffffLL));
  const auto& tensors = f.at("tensors");
  PIPELINE_CHECK_AS(ConfigError, tensors.is_array(),
                    "checkpoint manifest '{}': shard {} 'tensors' must be an array", origin, i);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Fields t{tensors[k], origin, fmt::format("shard {} tensor {}", i, k)};
    CheckpointTensor ct;
    ct.name = t.string("name");
    ct.dtype = t.string("dtype");
    const auto& shape = t.at("shape");
    PIPELINE_CHECK_AS(ConfigError, shape.is_array() && shape.size() <= 8,
                      "checkpoint manifest '{}': tensor '{}' has no valid shape", origin, ct.name);
    std::vector<std::int64_t> dims;
    for (auto& d : shape) {
      PIPELINE_CHECK_AS(ConfigError, d.is_number_integer() && d.get<std::int64_t>() >= 0,
                        "checkpoint manifest '{}': tensor '{}' has a bad dimension {}", origin,
                        ct.name, d.dump());
      dims.push_back(d.get<std::int64_t>());
    }
    ct.shape = Shape(dims);
    s.tensors.push_back(std::move(ct));
  }
  return s;
}

}  // namespace

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "checkpoint manifest '{}' is not valid JSON: {}", origin, e.what());
  }
  PIPELINE_CHECK_AS(ConfigError, j.is_object(), "checkpoint manifest '{}' is not a JSON object",
                    origin);
  const Fields top{j, origin, "the manifest"};
  const std::string format = top.string("format");
  PIPELINE_CHECK_AS(ConfigError, format == CheckpointManifest::kFormat,
                    "checkpoint manifest '{}' has format '{}', this library reads '{}'", origin,
                    format, CheckpointManifest::kFormat);
  CheckpointManifest m;
  m.step = top.integer("step", 0, kMaxI64);
  m.model = top.string("model");
  if (j.contains("architecture"))
    m.architecture = architecture_from_json(j.at("architecture"), "checkpoint manifest", origin);
  m.world_size = static_cast<int>(top.integer("world_size", 1, 1 << 20));
  m.schedule = top.string("schedule");
  m.optimizer = top.string("optimizer");
  const auto& seed = top.at("seed");
  PIPELINE_CHECK_AS(ConfigError, seed.is_number_unsigned() || seed.is_number_integer(),
                    "checkpoint manifest '{}': 'seed' must be an integer", origin);
  m.seed = seed.is_number_unsigned() ? seed.get<std::uint64_t>()
                                     : static_cast<std::uint64_t>(seed.get<std::int64_t>());
  m.batch_size = top.integer("batch_size", 1, kMaxI64);
  m.weight_versions = static_cast<int>(top.integer("weight_versions", 1, 1 << 20));
  m.plan = top.at("plan");
  PIPELINE_CHECK_AS(ConfigError, m.plan.is_null() || m.plan.is_object(),
                    "checkpoint manifest '{}': 'plan' must be a plan object or null", origin);
  if (j.contains("training")) {
    const nlohmann::json& t = j.at("training");
    PIPELINE_CHECK_AS(ConfigError,
                      t.is_object() && std::all_of(t.begin(), t.end(),
                                                   [](const auto& v) { return v.is_string(); }),
                      "checkpoint manifest '{}': 'training' must map flags to strings", origin);
    for (auto it = t.begin(); it != t.end(); ++it)
      m.training[it.key()] = it.value().get<std::string>();
  }
  const auto& shards = top.at("shards");
  PIPELINE_CHECK_AS(ConfigError, shards.is_array() && !shards.empty(),
                    "checkpoint manifest '{}': 'shards' must be a non-empty array", origin);
  for (std::size_t i = 0; i < shards.size(); ++i)
    m.shards.push_back(parse_shard(shards[i], origin, i));
  // The shards must hold each layer once, from layer 0 on without gaps.
  std::vector<const CheckpointShard*> order;
  for (auto& s : m.shards) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](auto* a, auto* b) { return a->layer_begin < b->layer_begin; });
  int expect = 0;
  for (auto* s : order) {
    PIPELINE_CHECK_AS(ConfigError, s->layer_begin == expect,
                      "checkpoint manifest '{}': shard '{}' holds layers [{}, {}) but the shards "
                      "before it end at layer {} (shards must cover the layers once, in order)",
                      origin, s->file, s->layer_begin, s->layer_end, expect);
    expect = s->layer_end;
  }
  return m;
}

// --- roles -------------------------------------------------------------------------------------

bool CheckpointRole::runs(int stage) const {
  return std::find(stages.begin(), stages.end(), stage) != stages.end();
}

CheckpointRole CheckpointRole::single(const Sequential& model) {
  CheckpointRole r;
  r.stages = {0};
  r.stage_writers = {0};
  r.stage_layers = {model.all()};
  return r;
}

CheckpointRole CheckpointRole::for_layout(const PipelineLayout& layout, int rank) {
  CheckpointRole r;
  r.rank = rank;
  r.stages = layout.stages_of(rank);
  PIPELINE_CHECK_AS(ConfigError, !r.stages.empty(), "checkpoints: rank {} runs no stage", rank);
  for (int s = 0; s < layout.num_stages(); ++s) {
    r.stage_writers.push_back(layout.stage_ranks[static_cast<std::size_t>(s)].front());
    r.stage_layers.push_back(layout.stages[static_cast<std::size_t>(s)]);
  }
  r.coordinator = r.stage_writers.front();
  return r;
}

std::string checkpoint_dir_name(std::int64_t step) {
  return fmt::format("step-{:09d}", step);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string shard_file_name(int stage) {
  return fmt::format("stage-{}.safetensors", stage);
}

// The step of a "step-<n>" directory name, or -1.
std::int64_t step_of_dir_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

struct StepDir {
  std::int64_t step;
  fs::path path;
  bool complete;  // has its manifest
};

// The step-<n> directories of `dir`, newest first.
std::vector<StepDir> step_dirs(const std::string& dir) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::int64_t step = step_of_dir_name(e.path().filename().string());
    if (step < 0) continue;
    out.push_back({step, e.path(), fs::exists(e.path() / "manifest.json", ec)});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step > b.step; });
  return out;
}

// Whether the checkpoint's manifest reads as JSON (a damaged one does not; its contents are
// checked where it is resumed).
bool manifest_is_json(const fs::path& step_dir) {
  try {
    detail::read_json_file((step_dir / "manifest.json").string(), "checkpoint manifest", "");
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

void remove_dir(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) log_warn("cannot delete old checkpoint '{}': {}", p.string(), ec.message());
}

// Keeps the newest `keep` complete checkpoints; deletes older complete ones and incomplete ones
// older than the newest complete (interrupted writes). Newer incomplete ones may be in progress.
void prune(const std::string& dir, int keep) {
  int complete = 0;
  bool seen_complete = false;
  for (const auto& d : step_dirs(dir)) {
    if (d.complete) {
      seen_complete = true;
      if (++complete > keep) remove_dir(d.path);
    } else if (seen_complete) {
      remove_dir(d.path);
    }
  }
}

// A copy of the stage's state under its checkpoint names, into the tensors of `reuse` (the
// previous checkpoint's copy) when they match: fresh allocations would add page faults to the
// time the copy holds up training, tens of milliseconds for a few hundred megabytes.
NamedTensors snapshot(const Sequential& model, LayerRange r, const ModelParams& params,
                      const Optimizer& optimizer, NamedTensors reuse) {
  PIPELINE_CHECK(static_cast<int>(params.size()) == r.size(),
                 "checkpoint: parameters for {} layers given for a stage of {}", params.size(),
                 r.size());
  NamedTensors out;
  out.reserve(reuse.size());
  auto add = [&](std::string name, const Tensor& t) {
    const std::size_t k = out.size();
    if (k < reuse.size() && reuse[k].first == name && reuse[k].second.shape() == t.shape() &&
        reuse[k].second.dtype() == t.dtype()) {
      reuse[k].second.copy_from(t);
      out.push_back(std::move(reuse[k]));
    } else {
      out.emplace_back(std::move(name), t.clone());
    }
  };
  for (int i = r.begin; i < r.end; ++i) {
    const Layer& layer = model.layer(i);
    const LayerParams& p = params[static_cast<std::size_t>(i - r.begin)];
    const auto specs = layer.parameters();
    const auto bufs = layer.buffers();
    for (std::size_t j = 0; j < specs.size(); ++j)
      add(layer.name() + "." + specs[j].name, p.params.at(j));
    for (std::size_t j = 0; j < bufs.size(); ++j)
      add(layer.name() + "." + bufs[j].name, p.buffers.at(j));
  }
  if (!optimizer.state().empty()) {
    const std::vector<std::string> names = parameter_names(model, r);
    for (auto& [name, t] : optimizer.state_tensors(names)) add("optimizer." + name, t);
  }
  return out;
}

// What the background write gives back: the shard's record, and the copy it wrote (for reuse).
struct WrittenShard {
  CheckpointShard record;
  NamedTensors state;
};

CheckpointShard write_shard(const std::string& dir, int stage, LayerRange r,
                            const NamedTensors& tensors, const Metadata& metadata) {
  CheckpointShard s;
  s.file = shard_file_name(stage);
  s.stage = stage;
  s.layer_begin = r.begin;
  s.layer_end = r.end;
  const FileDigest d = save_safetensors((fs::path(dir) / s.file).string(), tensors, metadata);
  s.bytes = d.bytes;
  s.crc32 = d.crc32;
  for (auto& [name, t] : tensors)
    s.tensors.push_back({name, safetensors_dtype(t.dtype()), t.shape()});
  return s;
}

CheckpointShard shard_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "a checkpoint shard record is not valid JSON: {}", e.what());
  }
  return parse_shard(j, "a shard record", 0);
}

std::string shard_to_json(const CheckpointShard& s) {
  CheckpointManifest m;
  m.shards = {s};
  return manifest_to_json(m)["shards"][0].dump();
}

// Control-message numbers of a shard record (per writer's stage): its length, then its text.
constexpr int kRecordLength = 2;
constexpr int kRecordBody = 3;
// The length message: the text's length and the shard's step (two 31-bit halves).
constexpr std::int64_t kRecordHeader = 3;

// A read-only or full file system found at the start, not at the first checkpoint after hours of
// training: a file is created in `dir` and removed.
void check_writable(const std::string& dir, int rank) {
  const fs::path probe = fs::path(dir) / fmt::format(".write-test-{}-{}", rank, ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  const int error = f ? 0 : errno;
  const bool written = f && std::fputc('x', f) != EOF && std::fflush(f) == 0;
  if (f) std::fclose(f);
  std::error_code ec;
  fs::remove(probe, ec);
  PIPELINE_CHECK_AS(IoError, f && written,
                    "cannot write checkpoints in '{}': {}; give --checkpoint-dir a directory this "
                    "job can write",
                    dir,
                    f ? "a test write failed (is the file system full?)" : std::strerror(error));
}

// A full file system found at the start, not at the first checkpoint after hours of training:
// the run fails when not one checkpoint fits, and is warned when the `keep` it keeps and the one
// it writes next (its peak) do not.
// `existing`: the run's complete checkpoints already there.
void check_free_space(const std::string& dir, std::int64_t bytes, int keep, int existing) {
  if (bytes <= 0) return;
  struct statvfs fs_stats {};
  if (::statvfs(dir.c_str(), &fs_stats) != 0) return;  // (no figure: nothing to check against)
  const auto free_bytes =
      static_cast<std::int64_t>(fs_stats.f_bavail) * static_cast<std::int64_t>(fs_stats.f_frsize);
  const std::int64_t peak = std::max(1, keep + 1 - existing) * bytes;
  PIPELINE_CHECK_AS(IoError, free_bytes >= bytes,
                    "the file system of '{}' has {} free, but one checkpoint of this run takes "
                    "about {}: free space there, or give --checkpoint-dir a directory on a larger "
                    "file system",
                    dir, format_bytes(free_bytes), format_bytes(bytes));
  if (free_bytes < peak)
    log_warn(
        "the file system of '{}' has {} free, but keeping {} checkpoint(s) of about {} "
        "while writing the next needs {} more: the run may fail at a checkpoint; free space "
        "there or lower --checkpoint-keep",
        dir, format_bytes(free_bytes), keep, format_bytes(bytes), format_bytes(peak));
}

}  // namespace

std::int64_t checkpoint_bytes(const Sequential& model, const Optimizer& optimizer) {
  const auto state_per_parameter = static_cast<std::int64_t>(optimizer.buffer_names().size());
  std::int64_t bytes = 0;
  for (int i = 0; i < model.size(); ++i) {
    const Layer& layer = model.layer(i);
    for (const ParamSpec& p : layer.parameters())
      bytes += p.shape.numel() *
               (static_cast<std::int64_t>(dtype_size(p.dtype)) + state_per_parameter * 4);
    for (const ParamSpec& b : layer.buffers())
      bytes += b.shape.numel() * static_cast<std::int64_t>(dtype_size(b.dtype));
  }
  return bytes;
}

// --- the directory's lock
// -------------------------------------------------------------------------

// Two jobs writing into one directory would each delete the other's checkpoints (an unfinished
// write looks like an interrupted one; pruning counts both jobs' steps). The coordinator holds an
// exclusive lock on <dir>/.lock while the job runs; the kernel drops it when the process ends,
// however it ends, so no stale lock is ever left. The file names its holder for the message.
CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  m_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // Left read-only (by another user's job, or a copy): flock needs no write access, only the
  // holder's record is lost.
  const bool writable = m_fd >= 0;
  if (!writable && (errno == EACCES || errno == EPERM || errno == EROFS))
    m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PIPELINE_CHECK_AS(IoError, m_fd >= 0,
                    "cannot open the checkpoint directory's lock '{}': {}; remove it (no job "
                    "runs there) or give this run another --checkpoint-dir",
                    path, std::strerror(errno));
  if (::flock(m_fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(m_fd, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(m_fd);
    m_fd = -1;
    PIPELINE_CHECK_AS(IoError, error == EWOULDBLOCK, "cannot lock '{}': {}", path,
                      std::strerror(error));
    PIPELINE_FAIL(ConfigError,
                  "the checkpoint directory '{}' is in use by another job ({}): two jobs writing "
                  "there would delete each other's checkpoints; give this run another "
                  "--checkpoint-dir, or wait for that job to end",
                  dir, who.empty() ? "its lock file names no process" : who);
  }
  const std::string me = detail::host_and_pid() + "\n";
  if (writable && (::ftruncate(m_fd, 0) != 0 || ::pwrite(m_fd, me.data(), me.size(), 0) < 0))
    log_warn("cannot record this job in '{}': {}", path, std::strerror(errno));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (m_fd >= 0) ::close(m_fd);  // releases the lock
}

// --- writer ------------------------------------------------------------------------------------

struct Checkpointer::InFlight {
  std::int64_t step = 0;
  std::string path;
  std::vector<int> unsaved;  // this rank's stages whose save() for this step has not come yet
  // This rank's shards: their background writes, by stage, until each is taken.
  std::map<int, std::future<WrittenShard>> writes;
  // Non-coordinator writers: the records on their way to the coordinator (length and text each).
  std::vector<Tensor> record_tensors;
  std::vector<Request> sends;
  // Coordinator: every stage's record, the length receives still open, the manifest write.
  std::vector<std::optional<CheckpointShard>> records;
  std::vector<Tensor> lengths;
  std::vector<Request> length_requests;
  std::future<void> manifest;
  bool manifest_started = false;
};

Checkpointer::Checkpointer(CheckpointOptions options, CheckpointRunInfo info, CheckpointRole role,
                           Communicator* comm)
    : m_options(std::move(options)),
      m_info(std::move(info)),
      m_role(std::move(role)),
      m_comm(comm) {
  PIPELINE_CHECK_AS(ConfigError, !m_options.dir.empty(), "checkpointing needs a directory");
  PIPELINE_CHECK_AS(ConfigError, m_options.keep >= 1,
                    "--checkpoint-keep must be at least 1, got {}", m_options.keep);
  PIPELINE_CHECK_AS(ConfigError, m_options.every >= 0, "--checkpoint-every must be >= 0, got {}",
                    m_options.every);
  const int rank = m_comm ? m_comm->rank() : 0;
  if (rank == m_role.coordinator) {
    std::error_code ec;
    fs::create_directories(m_options.dir, ec);
    PIPELINE_CHECK_AS(IoError, !ec && fs::is_directory(m_options.dir),
                      "cannot create the checkpoint directory '{}': {}", m_options.dir,
                      ec ? ec.message() : "not a directory");
    m_lock = std::make_unique<CheckpointDirLock>(m_options.dir);
    // No write of this job is in flight yet: directories without a manifest are leftovers of a
    // write that an earlier job did not finish.
    int intact = 0;
    for (const auto& d : step_dirs(m_options.dir))
      if (!d.complete) {
        log_warn("deleting incomplete checkpoint '{}' (its write was interrupted)",
                 d.path.string());
        remove_dir(d.path);
      } else if (!manifest_is_json(d.path)) {
        // Damaged: it would count among the kept ones (pruning an intact one in its place).
        log_warn("moved checkpoint '{}' aside to '{}': its manifest is damaged", d.path.string(),
                 set_aside_damaged_checkpoint(d.path.string()));
      } else {
        ++intact;
      }
    check_writable(m_options.dir, rank);
    check_free_space(m_options.dir, m_options.checkpoint_bytes, m_options.keep, intact);
  }
  if (m_comm) m_comm->barrier();
  // A writer on another host may not share the coordinator's file system.
  if (rank != m_role.coordinator && std::any_of(m_role.stages.begin(), m_role.stages.end(),
                                                [&](int s) { return m_role.writes(s); })) {
    std::error_code ec;
    fs::create_directories(m_options.dir, ec);
    check_writable(m_options.dir, rank);
  }
}

Checkpointer::~Checkpointer() {
  if (!m_flight) return;
  try {
    for (auto& [stage, write] : m_flight->writes)
      if (write.valid()) write.wait();
    if (m_flight->manifest.valid()) m_flight->manifest.wait();
  } catch (...) {
  }
}

void Checkpointer::begin(std::int64_t step) {
  finish();
  auto f = std::make_unique<InFlight>();
  f->step = step;
  f->path = (fs::path(m_options.dir) / checkpoint_dir_name(step)).string();
  f->unsaved = m_role.stages;
  const int rank = m_comm ? m_comm->rank() : 0;
  if (rank == m_role.coordinator) {
    const std::size_t stages = m_role.stage_writers.size();
    f->records.resize(stages);
    f->lengths.resize(stages);
    f->length_requests.resize(stages);
    for (std::size_t s = 0; s < stages; ++s) {
      if (m_role.stage_writers[s] == rank) continue;
      f->lengths[s] = Tensor::empty(Shape{kRecordHeader}, DType::Int32);
      f->length_requests[s] = m_comm->irecv(f->lengths[s], m_role.stage_writers[s],
                                            Tag::control(static_cast<int>(s), kRecordLength));
    }
  }
  m_flight = std::move(f);
  m_last_stall_s = 0;
}

void Checkpointer::save(std::int64_t step, int stage, const Sequential& model,
                        const ModelParams& params, const Optimizer& optimizer) {
  PIPELINE_CHECK(m_role.runs(stage), "checkpoint: stage {} saved on a rank that runs stage(s) {}",
                 stage, m_role.stages);
  const auto t0 = Clock::now();
  if (!m_flight || m_flight->step != step) begin(step);
  InFlight& f = *m_flight;
  const auto pending = std::find(f.unsaved.begin(), f.unsaved.end(), stage);
  if (pending == f.unsaved.end()) return;  // already saved at this step
  f.unsaved.erase(pending);
  if (m_role.writes(stage)) {
    std::error_code ec;
    fs::create_directories(f.path, ec);
    PIPELINE_CHECK_AS(IoError, !ec, "cannot create checkpoint directory '{}': {}", f.path,
                      ec.message());
    const LayerRange r = m_role.stage_layers.at(static_cast<std::size_t>(stage));
    NamedTensors state = snapshot(model, r, params, optimizer, std::move(m_spare[stage]));
    Metadata meta{{"format", "pipeline.checkpoint-shard/1"},
                  {"model", model.name()},
                  {"step", std::to_string(step)},
                  {"layers", fmt::format("{}:{}", r.begin, r.end)}};
    f.writes[stage] = std::async(
        std::launch::async,
        [dir = f.path, stage, r, state = std::move(state), meta = std::move(meta)]() mutable {
          CheckpointShard record = write_shard(dir, stage, r, state, meta);
          return WrittenShard{std::move(record), std::move(state)};
        });
  }
  if (f.unsaved.empty()) m_last_step = step;
  m_last_stall_s += std::chrono::duration<double>(Clock::now() - t0).count();
  m_max_stall_s = std::max(m_max_stall_s, m_last_stall_s);
}

void Checkpointer::save(std::int64_t step, const Sequential& model, const ModelParams& params,
                        const Optimizer& optimizer) {
  PIPELINE_CHECK(m_role.stages.size() == 1,
                 "checkpoint: this rank runs stages {}: save each with its stage number",
                 m_role.stages);
  save(step, m_role.stages.front(), model, params, optimizer);
}

void Checkpointer::send_record(InFlight& f, const CheckpointShard& record) {
  const std::string text = shard_to_json(record);
  // The length, and the step the shard is of, which the coordinator checks against its own.
  Tensor length =
      Tensor::from_ints(Shape{kRecordHeader}, {static_cast<std::int32_t>(text.size()),
                                               static_cast<std::int32_t>(f.step >> 31),
                                               static_cast<std::int32_t>(f.step & 0x7fffffff)});
  Tensor body =
      Tensor::zeros(Shape{static_cast<std::int64_t>((text.size() + 3) / 4)}, DType::Int32);
  std::memcpy(body.raw(), text.data(), text.size());
  f.sends.push_back(
      m_comm->isend(length, m_role.coordinator, Tag::control(record.stage, kRecordLength)));
  f.sends.push_back(
      m_comm->isend(body, m_role.coordinator, Tag::control(record.stage, kRecordBody)));
  f.record_tensors.push_back(std::move(length));
  f.record_tensors.push_back(std::move(body));
}

void Checkpointer::take_own_shards(InFlight& f, bool block) {
  const int rank = m_comm ? m_comm->rank() : 0;
  for (auto it = f.writes.begin(); it != f.writes.end();) {
    std::future<WrittenShard>& write = it->second;
    if (!block && write.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    WrittenShard written = write.get();  // rethrows a failed write
    const int stage = it->first;
    m_spare[stage] = std::move(written.state);
    if (rank == m_role.coordinator)
      f.records[static_cast<std::size_t>(stage)] = std::move(written.record);
    else
      send_record(f, written.record);
    it = f.writes.erase(it);
  }
}

void Checkpointer::receive_records(InFlight& f, bool block) {
  const int rank = m_comm ? m_comm->rank() : 0;
  for (std::size_t s = 0; s < f.length_requests.size(); ++s) {
    Request& r = f.length_requests[s];
    if (m_role.stage_writers[s] == rank || f.records[s]) continue;
    if (block)
      r.wait();
    else if (!r.test())
      continue;
    const std::int32_t* header = f.lengths[s].data<std::int32_t>();
    const std::int32_t n = header[0];
    const std::int64_t step = (std::int64_t{header[1]} << 31) | header[2];
    PIPELINE_CHECK(n > 0 && n < (1 << 30), "checkpoint: stage {} sent a record of {} bytes", s, n);
    // Records are matched by stage: one of another step means the stages' steps went apart.
    PIPELINE_CHECK(step == f.step,
                   "internal: stage {}'s checkpoint record is of step {}, but step {}'s checkpoint "
                   "is being written (its writer did not save step {})",
                   s, step, f.step, f.step);
    // The text follows its length at once, so this receive does not wait long.
    Tensor body = Tensor::empty(Shape{(n + 3) / 4}, DType::Int32);
    m_comm->recv(body, m_role.stage_writers[s], Tag::control(static_cast<int>(s), kRecordBody));
    f.records[s] = shard_from_json(
        std::string(static_cast<const char*>(body.raw()), static_cast<std::size_t>(n)));
  }
}

void Checkpointer::start_manifest(InFlight& f) {
  CheckpointManifest m;
  m.step = f.step;
  m.model = m_info.model;
  m.architecture = m_info.architecture;
  m.world_size = m_info.world_size;
  m.schedule = m_info.schedule;
  m.optimizer = m_info.optimizer;
  m.seed = m_info.seed;
  m.batch_size = m_info.batch_size;
  m.plan = m_info.plan;
  m.training = m_info.training;
  for (auto& r : f.records) m.shards.push_back(*r);
  f.manifest = std::async(std::launch::async, [m = std::move(m), path = f.path, dir = m_options.dir,
                                               keep = m_options.keep] {
    detail::write_file_atomically((fs::path(path) / "manifest.json").string(),
                                  manifest_to_json(m).dump(1));
    prune(dir, keep);
  });
  f.manifest_started = true;
}

bool Checkpointer::advance(bool block) {
  if (!m_flight) return true;
  InFlight& f = *m_flight;
  if (!f.unsaved.empty()) {
    // This rank's part is not all there yet: its other stages save when they step.
    PIPELINE_CHECK(!block,
                   "checkpoint of step {}: stage(s) {} of rank {} were never saved; every stage "
                   "a rank runs must be saved before finish()",
                   f.step, f.unsaved, m_comm ? m_comm->rank() : 0);
    return false;
  }
  take_own_shards(f, block);
  const int rank = m_comm ? m_comm->rank() : 0;
  if (rank != m_role.coordinator) {
    if (!f.writes.empty()) return false;
    for (auto& r : f.sends) {
      if (block)
        r.wait();
      else if (!r.test())
        return false;
    }
    m_flight.reset();
    return true;
  }
  receive_records(f, block);
  if (!f.manifest_started) {
    if (!std::all_of(f.records.begin(), f.records.end(), [](auto& r) { return r.has_value(); }))
      return false;
    start_manifest(f);
  }
  if (!block && f.manifest.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return false;
  f.manifest.get();  // rethrows a failed manifest write
  m_last_complete = f.path;
  m_flight.reset();
  return true;
}

void Checkpointer::poll() {
  advance(false);
}

std::string Checkpointer::finish() {
  advance(true);
  return m_last_complete;
}

// --- reading -----------------------------------------------------------------------------------

std::optional<Checkpoint> find_latest_checkpoint(const std::string& dir, std::int64_t before) {
  // One checkpoint given for the directory of them: it holds no step directories, so the run
  // would start from step 0 and write its own checkpoints inside the old one.
  std::error_code ec;
  std::filesystem::path given = std::filesystem::path(dir).lexically_normal();
  if (!given.has_filename()) given = given.parent_path();  // "DIR/"
  PIPELINE_CHECK_AS(ConfigError, !std::filesystem::exists(given / "manifest.json", ec),
                    "'{}' is one checkpoint, not a directory of them: give the directory that "
                    "holds its step-<n> directories ('{}'); the newest complete one is resumed",
                    dir, given.parent_path().string());
  std::optional<ConfigError> damaged;  // the newest damaged manifest's error
  for (const auto& d : step_dirs(dir)) {
    if (d.step >= before) continue;
    if (!d.complete) {
      log_warn("skipping checkpoint '{}': it has no manifest (its write was interrupted)",
               d.path.string());
      continue;
    }
    const std::string file = (d.path / "manifest.json").string();
    nlohmann::json j;
    try {
      j = detail::read_json_file(file, "checkpoint manifest", "; the checkpoint is damaged");
    } catch (const ConfigError& e) {
      log_warn("skipping checkpoint '{}': {}", d.path.string(), detail::unprefixed_message(e));
      if (!damaged) damaged = e;
      continue;
    }
    Checkpoint c{d.path.string(), parse_checkpoint_manifest(j.dump(), file)};
    PIPELINE_CHECK_AS(
        ConfigError, c.manifest.step == d.step,
        "checkpoint manifest '{}' is for step {} but sits in the directory of step {}", file,
        c.manifest.step, d.step);
    return c;
  }
  PIPELINE_CHECK_AS(ConfigError, !damaged,
                    "{}; '{}' holds no older complete checkpoint: start afresh (an empty "
                    "--checkpoint-dir, no --resume) or restore the directory from a copy",
                    damaged ? detail::unprefixed_message(*damaged) : "", dir);
  return std::nullopt;
}

std::string set_aside_damaged_checkpoint(const std::string& path) {
  std::string to = path + ".damaged";
  std::error_code ec;
  for (int n = 2; fs::exists(to, ec); ++n) to = fmt::format("{}.damaged-{}", path, n);
  fs::rename(path, to, ec);
  PIPELINE_CHECK_AS(IoError, !ec, "cannot move the damaged checkpoint '{}' aside to '{}': {}", path,
                    to, ec.message());
  return to;
}

void check_resume_compatible(const CheckpointManifest& m, const CheckpointRunInfo& run) {
  // A plan is made for one model: changing --model alone would only trade this error for the
  // plan's.
  const bool plan_pins_model = run.plan.is_object() && run.plan.value("model", "") == run.model;
  PIPELINE_CHECK_AS(ConfigError, m.model == run.model || !plan_pins_model,
                    "the checkpoint is of model '{}' but this run's --plan is for '{}': resume it "
                    "with a plan made for '{}' (pipeline-profile --model {}, then "
                    "pipeline-partition), or without --plan",
                    m.model, run.model, m.model, m.model);
  PIPELINE_CHECK_AS(ConfigError, m.model == run.model,
                    "the checkpoint is of model '{}' but this run trains '{}': resume it with "
                    "the program and --model it was written by (--model {})",
                    m.model, run.model, m.model);
  // Options that give the same tensor shapes (transformer-lm's heads) would load without error.
  if (const auto d = first_difference(m.architecture, run.architecture))
    PIPELINE_FAIL(ConfigError,
                  "the checkpoint is of {} with {} but this run builds it with {}: resume with {}",
                  m.model, d->recorded_flags, d->our_flags, d->recorded_flags);
  PIPELINE_CHECK_AS(
      ConfigError, m.seed == run.seed,
      "the checkpoint was written by a run with --seed {} but this run has --seed "
      "{}: the data order and dropout masks follow the seed, so resume with --seed {}",
      m.seed, run.seed, m.seed);
  PIPELINE_CHECK_AS(ConfigError, m.batch_size == run.batch_size,
                    "the checkpoint was written with --batch {} but this run has --batch {}: "
                    "resume with --batch {}",
                    m.batch_size, run.batch_size, m.batch_size);
  PIPELINE_CHECK_AS(ConfigError, m.optimizer == run.optimizer,
                    "the checkpoint holds {} optimizer state but this run uses {}: resume with "
                    "--optimizer {}",
                    m.optimizer, run.optimizer, m.optimizer);
}

std::vector<std::string> training_differences(const CheckpointManifest& m,
                                              const CheckpointRunInfo& run) {
  std::vector<std::string> out;
  for (const auto& [flag, value] : run.training) {
    const auto recorded = m.training.find(flag);
    if (recorded != m.training.end() && recorded->second != value)
      out.push_back(fmt::format("{} {} (the checkpoint's: {})", flag, value, recorded->second));
  }
  return out;
}

namespace {

// One shard opened for reading: its file checked against the manifest's size and CRC-32 once.
struct OpenShard {
  const CheckpointShard* record;
  std::unique_ptr<SafetensorsReader> reader;
  std::map<std::string, const CheckpointTensor*> listed;
};

}  // namespace

void restore_stage(const Checkpoint& checkpoint, const Sequential& model, LayerRange r,
                   ModelParams& params, Optimizer& optimizer) {
  PIPELINE_CHECK_AS(ConfigError, 0 <= r.begin && r.begin < r.end && r.end <= model.size(),
                    "restore: layers [{}, {}) are not within model '{}' of {} layers", r.begin,
                    r.end, model.name(), model.size());
  std::map<const CheckpointShard*, OpenShard> open;
  auto shard_of = [&](int layer) -> OpenShard& {
    const CheckpointShard* rec = nullptr;
    for (auto& s : checkpoint.manifest.shards)
      if (s.holds_layer(layer)) rec = &s;
    PIPELINE_CHECK_AS(IoError, rec != nullptr,
                      "checkpoint '{}' has no shard holding layer {} ('{}'): it was written for "
                      "another model",
                      checkpoint.path, layer, model.layer(layer).name());
    auto it = open.find(rec);
    if (it != open.end()) return it->second;
    const std::string file = (fs::path(checkpoint.path) / rec->file).string();
    std::error_code ec;
    PIPELINE_CHECK_AS(CheckpointDamaged, fs::exists(file, ec),
                      "checkpoint shard '{}' is missing, though the manifest lists it; resume "
                      "from an older checkpoint (delete this step's directory)",
                      file);
    const FileDigest d = digest_file(file);
    PIPELINE_CHECK_AS(CheckpointDamaged, d.bytes == rec->bytes && d.crc32 == rec->crc32,
                      "checkpoint shard '{}' is corrupt: {} bytes with CRC-32 {:08x}, but the "
                      "manifest records {} bytes with CRC-32 {:08x}; resume from an older "
                      "checkpoint (delete this step's directory)",
                      file, d.bytes, d.crc32, rec->bytes, rec->crc32);
    OpenShard o{rec, std::make_unique<SafetensorsReader>(file), {}};
    for (auto& t : rec->tensors) o.listed[t.name] = &t;
    return open.emplace(rec, std::move(o)).first->second;
  };
  // A tensor of the shard, checked against the manifest and the expected dtype and shape.
  auto locate = [&](OpenShard& o, const std::string& name, DType dtype,
                    const Shape& shape) -> const SafetensorsEntry* {
    const std::string file = o.reader->path();
    auto it = o.listed.find(name);
    const SafetensorsEntry* e = o.reader->find(name);
    if (it == o.listed.end() && e == nullptr) return nullptr;
    PIPELINE_CHECK_AS(IoError, it != o.listed.end() && e != nullptr,
                      "checkpoint shard '{}': tensor '{}' is {} the manifest but {} the file", file,
                      name, it != o.listed.end() ? "in" : "not in", e != nullptr ? "in" : "not in");
    const CheckpointTensor& listed = *it->second;
    PIPELINE_CHECK_AS(
        IoError, listed.dtype == safetensors_dtype(e->dtype) && listed.shape == e->shape,
        "checkpoint shard '{}': tensor '{}' is {} {} in the file but {} {} in the "
        "manifest",
        file, name, safetensors_dtype(e->dtype), e->shape, listed.dtype, listed.shape);
    PIPELINE_CHECK_AS(IoError, e->dtype == dtype && e->shape == shape,
                      "checkpoint shard '{}': tensor '{}' is {} {} but model '{}' needs {} {}: the "
                      "checkpoint is of another model or configuration",
                      file, name, safetensors_dtype(e->dtype), e->shape, model.name(),
                      safetensors_dtype(dtype), shape);
    return e;
  };

  ModelParams loaded;
  NamedTensors optimizer_state;
  std::size_t params_with_state = 0, params_total = 0;
  const auto names = optimizer.buffer_names();
  for (int i = r.begin; i < r.end; ++i) {
    const Layer& layer = model.layer(i);
    OpenShard& o = shard_of(i);
    LayerParams lp;
    auto read = [&](const ParamSpec& spec) {
      const std::string name = layer.name() + "." + spec.name;
      const SafetensorsEntry* e = locate(o, name, spec.dtype, spec.shape);
      PIPELINE_CHECK_AS(IoError, e != nullptr, "checkpoint shard '{}' has no tensor '{}'",
                        o.reader->path(), name);
      return o.reader->read(name);
    };
    for (auto& spec : layer.parameters()) {
      lp.params.push_back(read(spec));
      ++params_total;
      const std::string base = "optimizer." + layer.name() + "." + spec.name;
      const SafetensorsEntry* step = locate(o, base + ".step", DType::Int32, Shape{});
      if (step == nullptr) continue;
      ++params_with_state;
      optimizer_state.emplace_back(base.substr(10) + ".step", o.reader->read(base + ".step"));
      for (auto& b : names) {
        PIPELINE_CHECK_AS(IoError, locate(o, base + "." + b, DType::Float32, spec.shape) != nullptr,
                          "checkpoint shard '{}' has no optimizer state '{}': it was written with "
                          "another optimizer",
                          o.reader->path(), base + "." + b);
        optimizer_state.emplace_back(base.substr(10) + "." + b, o.reader->read(base + "." + b));
      }
    }
    for (auto& spec : layer.buffers()) lp.buffers.push_back(read(spec));
    loaded.push_back(std::move(lp));
  }
  PIPELINE_CHECK_AS(IoError, params_with_state == 0 || params_with_state == params_total,
                    "checkpoint '{}' holds optimizer state for {} of the {} parameters of layers "
                    "[{}, {}): it is incomplete",
                    checkpoint.path, params_with_state, params_total, r.begin, r.end);
  if (params_with_state > 0) {
    const std::vector<Shape> shapes = parameter_shapes(model, r);
    const std::vector<std::string> param_names = parameter_names(model, r);
    optimizer.load_state_tensors(optimizer_state, shapes, param_names);
  } else {
    optimizer.reset();
  }
  if (params.empty()) {
    params = std::move(loaded);
    return;
  }
  PIPELINE_CHECK(static_cast<int>(params.size()) == r.size(),
                 "restore: parameters for {} layers given for a range of {}", params.size(),
                 r.size());
  for (std::size_t k = 0; k < loaded.size(); ++k) {
    for (std::size_t j = 0; j < loaded[k].params.size(); ++j)
      params[k].params[j].copy_from(loaded[k].params[j]);
    for (std::size_t j = 0; j < loaded[k].buffers.size(); ++j)
      params[k].buffers[j].copy_from(loaded[k].buffers[j]);
  }
}

}  // namespace pipeline
