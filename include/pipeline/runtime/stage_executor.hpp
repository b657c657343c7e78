// StageExecutor: runs one rank's action list of a Schedule — the runtime of a pipeline stage.
//
// Each rank builds only its own stage's layers' parameters, with Sequential::init over the
// stage's LayerRange (every tensor is drawn from Rng(seed, "<layer>.<param>"), so the values are
// those a single process with the same seed would have). It then executes its list of actions
// exactly as the schedule gives them:
//   F   forward through the stage with the weight version the policy picks (see below); the first
//       stage takes the microbatch's inputs from the feed, the last stage scores the output
//       against the labels with the loss scaled by 1/minibatch size (SequentialTrainer's
//       convention, so microbatch gradients accumulate to the minibatch's gradient)
//   B   backward with the weights its forward used; gradients accumulate into the stage's buffers
//   I/W the split backward: input gradient first (each layer's output gradient is kept), then the
//       weight gradient
//   SA/SG  non-blocking sends of the output / the input gradient
//   RA/RG  waits for receives that were posted ahead of time (a window of upcoming receives is
//       always posted), so transfers overlap with compute
//   AR  sum of the weight gradients over the stage's replicas (Stash: then divided by the
//       replica count, since each replica's gradient is already a minibatch mean). The sum runs
//       in buckets of layers, in backward order (ExecutorOptions::allreduce_bucket_bytes): the
//       last B (or W) of this replica before the AR starts a bucket's non-blocking allreduce as
//       soon as it has finished the bucket's layers and tests the buckets in flight after every
//       layer, so the transfers overlap the rest of the backward (as DDP does); AR itself only
//       waits for what is still in flight. Each element is summed over the replicas in replica
//       order whatever the buckets (communicator.hpp), so the result is bitwise that of one
//       allreduce of all gradients at the AR.
//   ST  optional global gradient-norm clipping (one world allreduce, the same factor on every
//       stage), a finiteness check naming the layer, and one optimizer update
// Update policies: Flush — one weight version, gradients accumulate over the minibatch and the
// step closes it (== sequential training); Stash — a step after every backward, each in-flight
// microbatch keeps the version its forward used in the WeightStore (with vertical sync: the
// version whose tag the input stage used, which travels with the activation); DoubleBuffered
// (2BW) — gradients accumulate over the minibatch as under Flush, but minibatch k runs on the
// version one step older than the latest (the store keeps two), so the next minibatch need not
// wait for the step. A 2BW run starts with both buffers equal (so does a resumed one).
//
// Per-microbatch state lives in an InFlightTable sized by the schedule's validated peak of
// stashed activations on this rank; a context is freed as soon as its backward is done.
//
// Activation recomputation (ExecutorOptions::recompute, the plan's per-stage choice): the
// forward keeps only the stage's input and frees what its layers saved; the backward (or the I
// of a split one) first runs the forward again with the same weight version and the same
// dropout seed (microbatch_seed of the run seed, minibatch and microbatch), with the layers'
// buffers (batch-norm running statistics) put back afterwards, so gradients and weights equal a
// stashing stage's bit for bit.
//
// Memory as measured (StageMemory): after every forward, backward and step the executor counts
// the bytes of storage it holds — each allocation once, however many tensors view it — and
// keeps the peak: the latest weights, the gradient accumulators, the optimizer state, the other
// weight versions (stashed, and spare copies kept for reuse) and the per-microbatch state
// (saved records or recomputation inputs, outputs not yet sent, received activations and
// gradients not yet used, input gradients not yet sent).
//
// On a GPU (ExecutorOptions::device) the same actions run on the calling thread's current stream
// of that device; only the loss, the gradient norms and the statistics come back to the host.
//
// Errors: the schedule is validated before anything runs (ConfigError on every rank alike); a
// non-finite loss or gradient throws naming the step, microbatch and layer; communication waits
// time out (TimeoutError with this rank's position in its list). The caller catches and aborts
// the job through the communicator so that no peer hangs.
//
// Several stages per rank (interleaved plans, Plan::virtual_stages > 1): a rank may hold any
// number of unreplicated stages. Each has its own weights, gradients, optimizer state and
// in-flight table; the executor activates the stage of every action before running it (the code
// that runs an action sees that stage through stage(), layers(), params() and the members it
// reads), and parks the others. Tags already name the sending stage, so a rank's stages never
// receive each other's messages. Between calls the rank's first stage is the active one;
// per-stage accessors (stage(), layers(), params(), weights()) refer to it.
//
// Contract: the constructor and evaluate() are collective over all ranks of the communicator
// (they create groups and reduce); train() is collective in the sense that every rank runs its
// own list of the same schedule. One thread uses an executor at a time.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/data/dataset.hpp>
#include <pipeline/nn/loss.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/optim/optimizer.hpp>
#include <pipeline/plan/allreduce_buckets.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/plan.hpp>
#include <pipeline/runtime/microbatch_context.hpp>
#include <pipeline/runtime/weight_store.hpp>
#include <pipeline/schedule/schedule.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pipeline {

// Which layers every stage holds and which ranks hold it.
struct PipelineLayout {
  std::vector<LayerRange> stages;
  std::vector<std::vector<int>> stage_ranks;  // stage -> its replicas' ranks, in replica order

  int num_stages() const { return static_cast<int>(stages.size()); }
  int num_ranks() const;
  std::vector<int> replica_counts() const;  // each stage's, in stage order
  // The stage a rank runs, its first one if it runs several (ConfigError when it runs none).
  int stage_of(int rank) const;
  // Every stage a rank runs, ascending (several on an interleaved plan; empty when none).
  std::vector<int> stages_of(int rank) const;

  // One stage per entry of `stage_layers`, rank s running stage s.
  static PipelineLayout straight(std::vector<LayerRange> stage_layers);
  // The plan's stages. Checks that the plan is for `model` (its name and its layer count) and
  // that its stages cover the model's layers in order; ConfigError naming the problem otherwise.
  static PipelineLayout from_plan(const Plan& plan, const Sequential& model);
};

// Where the first and last stages get their data. Minibatch indices are global over the run.
struct MinibatchFeed {
  // The whole minibatch (inputs and labels). Called only on ranks of the first and last stage,
  // by each at most once per minibatch in order, so a rank's own feed may be backed by a
  // DataLoader iterator. Ranks that are threads of one process (run_in_process) call a feed they
  // share at once: keep it stateless, or give each rank its own.
  std::function<Batch(std::int64_t minibatch)> load;
  // Samples in a minibatch; called on every rank (receive buffers are sized from it).
  std::function<std::int64_t(std::int64_t minibatch)> size;
  // Optional: samples [begin, end) of a minibatch alone, those load(minibatch) holds there, asked
  // for at each microbatch's forward (minibatches in order, a microbatch possibly twice on a rank
  // that runs the first and the last stage). Given it, the input stage holds the inputs of its
  // microbatches in flight, as the memory models charge them; without it, the whole minibatch
  // loaded at its first microbatch (under a flush schedule of M microbatches, M of them).
  std::function<Batch(std::int64_t minibatch, std::int64_t begin, std::int64_t end)> load_samples;
};

struct ExecutorOptions {
  std::uint64_t seed = 0;     // initial parameters and dropout masks (microbatch_seed)
  // Where the stage computes: its weights, gradients, optimizer state, stashed versions and
  // activations live there, the feed's batches are moved there, and every message (activations,
  // gradients, weight tags, the small statistics and norms the ranks sum) is a tensor there, so
  // a device communicator (NCCL, or the in-process one on GPUs) moves it device to device.
  Device device = Device::cpu();
  // The element type of the activations and gradients sent between stages: float32, or bfloat16
  // for half the bytes on the wire (ops/convert.hpp: rounded to nearest even before the send,
  // widened back to float32 on receipt; compute stays float32).
  DType transfer_dtype = DType::Float32;
  // The dtype the products (gemm, convolution, attention) compute in (ops/precision.hpp):
  // float32, or bfloat16 — mixed precision: bf16 operands, fp32 accumulation, fp32 master
  // weights, optimizer state, norms, softmax and losses.
  DType compute_dtype = DType::Float32;
  // Under a bf16 compute dtype, weight versions besides the latest keep their weight matrices in
  // bf16 (WeightStore::set_bf16_stash): half their bytes, the same results. false: float32.
  bool bf16_stash = true;
  float clip_norm = 0.f;      // global gradient-norm clipping (0: off)
  bool record_trace = false;  // keep every executed action's timing (trace_events())
  // Receives posted ahead of the action that waits for them; more overlap for more memory held
  // in posted buffers (which the planner charges for kPostedReceives of them, plan/cost_model.hpp).
  int receive_lookahead = kPostedReceives;
  // Per stage of the layout: the stage recomputes its activations in backward instead of
  // stashing them (PlanStage::recompute). Empty, or shorter than the stages: no recomputation.
  std::vector<bool> recompute;
  // Replicated stages: start the gradient allreduce during the backward, in buckets of layers
  // of at least this many gradient bytes (the last bucket, the stage's first layers, may be
  // smaller). false: one allreduce of every gradient at the AR action (no overlap).
  bool overlap_allreduce = true;
  std::int64_t allreduce_bucket_bytes = kAllreduceBucketBytes;
  // Called after every forward and backward (B, I, W) with the action and the seconds it took;
  // what it does counts as part of the action (a test's slowed rank sleeps here,
  // examples/common/fault_injection.hpp). Empty: nothing.
  std::function<void(const Action&, double seconds)> after_compute;
};

// One gradient allreduce of a replicated stage (with ExecutorOptions::record_trace): when its
// first bucket started and when the last one was seen complete, on the trace's clock. The AR
// action's own trace event is the wait for what was still in flight at the AR; with overlap it
// is shorter than end_s - start_s.
struct AllReduceTiming {
  int stage = 0;
  int microbatch = 0;  // the AR action's
  int buckets = 0;     // allreduce calls of the gradients
  std::int64_t bytes = 0;
  double start_s = 0;
  double end_s = 0;
};

// Bytes of storage a stage's rank holds, by what for. Each field of a peak is its own maximum
// over the run; total_bytes is the maximum of their sum at one moment.
struct StageMemory {
  std::int64_t parameter_bytes = 0;       // the latest weights and buffers
  std::int64_t gradient_bytes = 0;        // gradient accumulators
  std::int64_t optimizer_bytes = 0;       // optimizer state (momentum, Adam moments)
  std::int64_t stashed_weight_bytes = 0;  // weight versions besides the latest, and spare copies
  std::int64_t activation_bytes = 0;      // per-microbatch state (see StageExecutor)
  std::int64_t total_bytes = 0;
  // What the device's allocator had in use at most during train() (memory_use of
  // core/allocator.hpp): the above and everything else the rank's ops allocated, their
  // temporaries included, which the planner charges as PlanStage::workspace_bytes. 0 where the
  // allocator does not count one rank alone (CPU ranks that are threads of one process).
  std::int64_t allocator_bytes = 0;
  void include(const StageMemory& now);  // raises every field to at least `now`'s
};

// What the last stage observed for one minibatch.
struct MinibatchStats {
  std::int64_t minibatch = 0;
  double loss = 0;  // sum of the scaled microbatch losses: the minibatch's mean loss
  std::int64_t correct = 0;
  std::int64_t count = 0;
};

struct TrainResult {
  std::int64_t minibatches = 0;  // minibatches of the schedule
  std::int64_t steps = 0;        // optimizer steps this rank took
  double loss = 0;               // last stage: mean over the minibatches it scored
  std::int64_t correct = 0, count = 0;
  double seconds = 0;
  // This rank's forwards and the seconds its compute actions (F, B, I, W, with
  // ExecutorOptions::after_compute) took: its speed, without the time it waited for others.
  std::int64_t forwards = 0;
  double compute_seconds = 0;
  int peak_in_flight = 0;  // most microbatch contexts open at once
  int peak_weight_versions = 1;
  StageMemory peak_memory;  // of this run
};

using LrFunction = std::function<float(std::int64_t step)>;
// Called after each optimizer step with the number of minibatches the stage has absorbed since
// the start of the run (its position: the global index of the next minibatch it will train).
using StepDoneFunction = std::function<void(std::int64_t position)>;

class StageExecutor {
 public:
  // `model` is used, not copied: it must outlive the executor (a temporary does not compile).
  StageExecutor(const Sequential&&, Shape, DType, PipelineLayout, Communicator&,
                std::unique_ptr<Optimizer>, const ExecutorOptions& = {}) = delete;
  StageExecutor(const Sequential& model, Shape sample_shape, DType input_dtype,
                PipelineLayout layout, Communicator& comm, std::unique_ptr<Optimizer> optimizer,
                const ExecutorOptions& options = {});
  ~StageExecutor();
  StageExecutor(const StageExecutor&) = delete;
  StageExecutor& operator=(const StageExecutor&) = delete;

  int rank() const { return m_comm->rank(); }
  Device device() const { return m_options.device; }
  int stage() const { return m_stage; }
  int replica() const { return m_replica; }
  int replicas() const { return static_cast<int>(m_layout.stage_ranks[m_stage].size()); }
  int num_stages() const { return m_layout.num_stages(); }
  bool is_first_stage() const { return m_stage == 0; }
  bool is_last_stage() const { return m_stage == num_stages() - 1; }
  // The rank that writes metrics and prints results: replica 0 of the last stage.
  bool is_loss_rank() const { return m_layout.stage_ranks.back().front() == rank(); }
  // The stages this rank holds, ascending: one, or v of an interleaved plan.
  const std::vector<int>& stages() const { return m_my_stages; }
  LayerRange layers() const { return m_layout.stages[m_stage]; }
  const PipelineLayout& layout() const { return m_layout; }
  const Sequential& model() const { return *m_model; }

  // The latest weights of this stage's layers (params()[k] is layer layers().begin + k).
  ModelParams& params();
  // The latest weights of any of this rank's stages (layout().stages[stage]'s layers).
  ModelParams& params(int stage);
  const WeightStore& weights() const { return *m_store; }
  // The optimizer, holding the active stage's state (during train()'s callbacks, the stage whose
  // action is running; between calls, the rank's first stage).
  Optimizer& optimizer() { return *m_optimizer; }
  // Calls f(s) for each of this rank's stages s with s active: stage(), layers(), params() and
  // optimizer() are then s's. Between train() and evaluate() calls only (checkpoints, restoring,
  // loading parameters); the first stage is active again afterwards.
  void for_each_stage(const std::function<void(int stage)>& f);
  std::int64_t steps_done() const { return m_steps; }
  // Whether this rank's stage recomputes its activations.
  bool recomputes() const { return m_recompute; }
  // The peak bytes held over every train() so far (TrainResult::peak_memory has one run's).
  const StageMemory& peak_memory() const { return m_peak_memory; }
  // The bytes held now.
  StageMemory memory_now() const;

  // Runs this rank's list of `schedule`, whose minibatch 0 is the run's minibatch
  // `first_minibatch`. The schedule must have this executor's stages and ranks; it is validated
  // first. `lr(step)` gives the learning rate of the stage's optimizer step; `on_minibatch` (may
  // be empty) is called on the last stage when a minibatch's loss is known: on its only rank, or,
  // for a replicated last stage, on replica 0 after the replicas' allreduce has summed the
  // minibatch's statistics (TrainResult then counts whole minibatches on every replica).
  TrainResult train(const Schedule& schedule, const MinibatchFeed& feed,
                    std::int64_t first_minibatch, const LrFunction& lr,
                    const std::function<void(const MinibatchStats&)>& on_minibatch = {},
                    const StepDoneFunction& on_step_done = {});

  // Ends the running train() early: actions of minibatches `minibatch` and later (global
  // indices) are skipped and their posted receives cancelled, so the stage stops after the step
  // that brings it to `minibatch`. Called from train()'s callbacks, on every rank with the same
  // value (StopAgreement), early enough that no rank has started such a minibatch: a rank that
  // already has throws. `minibatch` must end a group of the stage's replicas' steps.
  void stop_before(std::int64_t minibatch);
  // The stop requested for the running (or last) train(), -1 when none.
  std::int64_t stop_position() const { return m_stop_before; }

  // Forward-only evaluation (Mode::Eval) of `batches` batches through the pipeline, batch u on
  // replica u % r of every stage, with the latest weights. Collective over every rank; every rank
  // returns the same result (loss is the mean per sample).
  struct Eval {
    double loss = 0;
    double accuracy = 0;
    std::int64_t count = 0;
  };
  Eval evaluate(const MinibatchFeed& feed, std::int64_t batches);

  // Actions executed so far with their start and end, when ExecutorOptions::record_trace is set.
  // Times are seconds of the monotonic clock, which all processes of one host share, so the
  // traces of the ranks of a job line up when merged.
  const std::vector<TraceEvent>& trace_events() const { return m_trace; }
  // The gradient allreduces so far (replicated stages, with ExecutorOptions::record_trace).
  const std::vector<AllReduceTiming>& allreduce_timings() const { return m_allreduce_trace; }
  // The buckets of this rank's stage's gradients, in the order they are reduced (backward):
  // each a range of the stage's layers, [begin, end) in model indices. Empty unless replicated.
  const std::vector<LayerRange>& allreduce_buckets() const { return m_bucket_layers; }

 private:
  struct PostedRecv;
  struct Run;
  struct StageSlot;
  struct RunSlot;

  void execute(Run& run);
  void do_forward(Run& run, const Action& a);
  void do_backward(Run& run, const Action& a, GradParts parts);
  void do_allreduce(Run& run, const Action& a);
  // Gradient buckets: start bucket `b`'s allreduce; test those in flight; after layer `layer`
  // (model index) of a backward that closes the minibatch, start the buckets it completes.
  void start_bucket(Run& run, const ModelGrads& grads, std::size_t b);
  // A second gradient set for a backward of the next round before the AR of the round in flight
  // (Run::sealed): whether the action under way starts its round's buckets, the sealing of the
  // round in flight before a backward writes gradients, the closing of a round after its last
  // backward, and the set the AR and step of the round in flight use.
  bool starts_buckets(const Run& run) const;
  void seal_round_in_flight(Run& run);
  void note_closed(Run& run);
  ModelGrads& round_grads(Run& run);
  void progress_allreduce(Run& run);
  void after_layer_backward(Run& run, int layer, bool closes);
  double trace_now() const;
  void do_step(Run& run, const Action& a);
  void post_receives(Run& run, std::size_t upto);
  Tensor take_received(Run& run, std::size_t index);
  Shape activation_shape(std::int64_t samples, int layer_end) const;
  Batch microbatch_data(Run& run, int u);
  void check_feed_batch(const Batch& b, std::int64_t minibatch) const;
  std::int64_t minibatch_of(const Run& run, const Action& a) const;
  void recompute_forward(MicrobatchContext& c);
  StageMemory measure(const Run* run) const;
  void sample_memory(Run& run);
  // Several stages per rank: makes `stage` (one of this rank's) the active one.
  void activate(Run& run, int stage);
  // Calls f() with each of this rank's stages active in turn, then activates its first stage.
  void for_each_stage(Run& run, const std::function<void()>& f);

  const Sequential* m_model;
  Shape m_sample_shape;
  DType m_input_dtype;
  PipelineLayout m_layout;
  Communicator* m_comm;
  std::unique_ptr<Optimizer> m_optimizer;
  ExecutorOptions m_options;
  int m_stage = 0;
  int m_replica = 0;
  Group m_replica_group;
  Group m_last_stage_group;
  std::unique_ptr<WeightStore> m_store;
  ModelGrads m_grads;
  SoftmaxCrossEntropy m_loss;
  std::int64_t m_steps = 0;
  std::vector<TraceEvent> m_trace;
  std::vector<AllReduceTiming> m_allreduce_trace;
  std::vector<LayerRange> m_bucket_layers;  // see allreduce_buckets()
  double m_t0 = 0;
  bool m_recompute = false;
  StageMemory m_peak_memory;
  Run* m_run = nullptr;  // the train() in progress
  // This rank's stages (ascending) and the parked state of all but the active one, m_active.
  std::vector<int> m_my_stages;
  std::vector<StageSlot> m_slots;
  std::size_t m_active = 0;
  std::int64_t m_stop_before = -1;
};

}  // namespace pipeline
