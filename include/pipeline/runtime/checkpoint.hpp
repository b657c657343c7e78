// Checkpoints of a training run: writing them without stalling the pipeline, finding the newest
// complete one, and restoring a stage from it under any plan. The on-disk layout and the
// manifest are described in checkpoint_manifest.hpp.
//
// Writing (Checkpointer): at a checkpoint step every stage's first replica copies its layers'
// parameters, buffers and optimizer state to memory — the only part that holds up training —
// and a background thread writes that copy as the stage's shard (temporary file, fsync, rename,
// directory fsync). The shard's record (size, CRC-32, tensor list) goes to the coordinator (the
// first stage's first replica), which writes the manifest, atomically and last, once every
// shard is on disk, then deletes checkpoints beyond the newest `keep` and directories left
// incomplete by an interrupted write. Records travel as messages that poll() sends and receives
// without blocking, so the manifest appears within a step of the last shard; finish() waits for
// it. One checkpoint is in flight at a time: save() first finishes the previous one. A rank that
// runs several stages (an interleaved plan) saves each of them, as its stages step, and writes a
// shard per stage.
//
// Checkpoints are taken between pipeline segments, when no microbatch is in flight, so each stage
// holds exactly one weight version: there are no stashed versions to save, and a run resumed
// under 1F1B-stash starts its pipeline afresh from the newest weights.
//
// Reading: find_latest_checkpoint() returns the newest directory with a manifest (skipping, and
// naming, directories without one); restore_stage() loads one stage's layers from whichever shards
// hold them, rejecting a shard whose CRC-32 or size disagrees with the manifest (CheckpointDamaged,
// on which a resume may take an older checkpoint), or a tensor whose dtype or shape disagrees with
// the manifest or the model, with the file and tensor named.
//
// Collective use: the Checkpointer's constructor (it locks the directory against other jobs,
// cleans up incomplete directories and synchronises) is collective; save(), poll() and finish()
// are called by every rank at the same steps, and only writers and the coordinator do anything
// in them.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/optim/optimizer.hpp>
#include <pipeline/runtime/checkpoint_manifest.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pipeline {

struct CheckpointOptions {
  std::string dir;         // checkpoints go to <dir>/step-<step>/
  std::int64_t every = 0;  // steps between checkpoints (0: only when asked, e.g. preemption)
  int keep = 2;            // complete checkpoints kept (older ones are deleted)
  // About one checkpoint's size (checkpoint_bytes()), for the check of the file system's free
  // space at the start; 0: not checked.
  std::int64_t checkpoint_bytes = 0;
};

// About the bytes of one checkpoint of `model` trained with `optimizer`: every parameter and
// buffer, and the optimizer's state of each parameter (fp32, one per buffer_names()).
std::int64_t checkpoint_bytes(const Sequential& model, const Optimizer& optimizer);

// What a run records about itself in every manifest (and what a resume checks it against).
struct CheckpointRunInfo {
  std::string model;
  Architecture architecture;  // ZooModel::architecture
  std::string schedule = "sequential";
  std::string optimizer;
  std::uint64_t seed = 0;
  std::int64_t batch_size = 0;
  int world_size = 1;
  nlohmann::json plan;  // null for a single-process run
  std::map<std::string, std::string> training;  // CheckpointManifest::training
};

// Who writes which shard: one writer per stage (its first replica), and the coordinator. A rank
// runs one stage, or several on an interleaved plan (each unreplicated, so it writes them all).
struct CheckpointRole {
  int rank = 0;
  std::vector<int> stages;               // the stages this rank runs, ascending
  int coordinator = 0;                   // rank that writes manifests
  std::vector<int> stage_writers;        // stage -> writer rank
  std::vector<LayerRange> stage_layers;  // stage -> its layers

  bool runs(int stage) const;
  bool writes(int stage) const { return runs(stage) && stage_writers.at(stage) == rank; }

  // A single process holding every layer.
  static CheckpointRole single(const Sequential& model);
  // Rank `rank` of a pipeline.
  static CheckpointRole for_layout(const PipelineLayout& layout, int rank);
};

// The step-<step> directory name for a step ("step-000000200").
std::string checkpoint_dir_name(std::int64_t step);

// An exclusive lock on <dir>/.lock, held while a job writes checkpoints into `dir`: a second job
// given the same directory is refused (ConfigError naming the holder's host and pid) instead of
// deleting the first one's checkpoints. Released when destroyed or when the process ends.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int m_fd = -1;
};

class Checkpointer {
 public:
  // `comm` is null for a single process. Collective.
  Checkpointer(CheckpointOptions options, CheckpointRunInfo info, CheckpointRole role,
               Communicator* comm);
  ~Checkpointer();  // waits for writes in flight (their errors are logged, not thrown)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  const CheckpointOptions& options() const { return m_options; }
  int coordinator() const { return m_role.coordinator; }
  // Whether the regular cadence asks for a checkpoint after `step` steps.
  bool due(std::int64_t step) const {
    return m_options.every > 0 && step > 0 && step % m_options.every == 0;
  }

  // Copies stage `stage`'s state after `step` steps and starts writing it (`params[k]` is layer
  // stage_layers[stage].begin + k; `optimizer` holds that stage's state). A rank calls it once per
  // stage it runs, in any order and at any time before finish(); the first call for a new step
  // finishes the previous checkpoint first, and a call for a stage already saved at this step
  // does nothing. A later replica (which writes nothing) calls it too.
  void save(std::int64_t step, int stage, const Sequential& model, const ModelParams& params,
            const Optimizer& optimizer);
  // The same for the rank's only stage.
  void save(std::int64_t step, const Sequential& model, const ModelParams& params,
            const Optimizer& optimizer);
  // Moves writes in flight along without blocking (see the header comment). Call every step.
  void poll();
  // Blocks until the checkpoint in flight, if any, is complete (Error if a stage of this rank was
  // not saved for it). Returns the directory of the newest checkpoint this run completed (on the
  // coordinator; empty elsewhere or if none).
  std::string finish();

  // The newest step whose every stage on this rank was saved (-1: none yet).
  std::int64_t last_saved_step() const { return m_last_step; }
  // Time save() held up training (a step's calls summed): the last step's and the longest so
  // far, in seconds.
  double last_stall_s() const { return m_last_stall_s; }
  double max_stall_s() const { return m_max_stall_s; }

 private:
  struct InFlight;

  void begin(std::int64_t step);
  void send_record(InFlight& f, const CheckpointShard& record);
  void take_own_shards(InFlight& f, bool block);
  void receive_records(InFlight& f, bool block);
  void start_manifest(InFlight& f);
  // Moves the checkpoint in flight along (waiting for each part when `block`); true once done.
  bool advance(bool block);

  CheckpointOptions m_options;
  CheckpointRunInfo m_info;
  CheckpointRole m_role;
  Communicator* m_comm;
  std::unique_ptr<CheckpointDirLock> m_lock;  // on the coordinator
  std::unique_ptr<InFlight> m_flight;
  std::map<int, NamedTensors> m_spare;  // per stage, the last checkpoint's copy for the next
  std::int64_t m_last_step = -1;
  std::string m_last_complete;
  double m_last_stall_s = 0, m_max_stall_s = 0;
};

struct Checkpoint {
  std::string path;  // the step-<step> directory
  CheckpointManifest manifest;
};

// A complete checkpoint that is damaged: a shard missing, or its size or CRC-32 not the
// manifest's. A resume may fall back to an older checkpoint on it; on other errors (another
// model, a tensor of another shape) it must not, as every checkpoint of the run would fail alike.
class CheckpointDamaged : public IoError {
 public:
  using IoError::IoError;
};

// The newest complete checkpoint in `dir` of a step before `before` (nullopt when there is none
// or the directory does not exist). Directories without a manifest are skipped with a warning
// naming them, and so are those whose manifest is not valid JSON (a damaged file) where an older
// complete one remains; with none, that manifest's error is thrown (ConfigError naming the
// file): damage never turns into a start from step 0.
std::optional<Checkpoint> find_latest_checkpoint(
    const std::string& dir, std::int64_t before = std::numeric_limits<std::int64_t>::max());

// Renames a damaged checkpoint's directory to <path>.damaged (.damaged-2, ... when taken), out of
// the way of find_latest_checkpoint and of the run's own checkpoint of that step, and kept for
// inspection. Returns the new path.
std::string set_aside_damaged_checkpoint(const std::string& path);

// ConfigError when the run cannot continue the checkpoint: another model, seed, batch size or
// optimizer (each names the flag to change).
void check_resume_compatible(const CheckpointManifest& manifest, const CheckpointRunInfo& run);

// The training options (CheckpointManifest::training) that the run gives otherwise than the
// checkpoint recorded, as "--weight-decay 0.1 (the checkpoint's: 0)", in the order of their names.
std::vector<std::string> training_differences(const CheckpointManifest& manifest,
                                              const CheckpointRunInfo& run);

// Loads layers `r` of `model` (into `params`, allocated when empty) and their optimizer state
// from the checkpoint's shards, verifying checksums, dtypes and shapes (IoError naming the file
// and tensor; CheckpointDamaged for a missing shard or a checksum that disagrees). Optimizer
// state is restored only when the checkpoint has it for every parameter. Nothing is changed
// when it throws.
void restore_stage(const Checkpoint& checkpoint, const Sequential& model, LayerRange r,
                   ModelParams& params, Optimizer& optimizer);

}  // namespace pipeline
