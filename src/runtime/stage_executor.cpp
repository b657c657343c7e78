// The stage executor: one rank's action list, executed with non-blocking communication.
#include <pipeline/runtime/stage_executor.hpp>

#include <pipeline/core/allocator.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/grad_clip.hpp>
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <utility>

namespace pipeline {

// --- layout ------------------------------------------------------------------------------------

int PipelineLayout::num_ranks() const {
  int n = 0;
  for (auto& s : stage_ranks)
    for (int r : s) n = std::max(n, r + 1);
  return n;
}

std::vector<int> PipelineLayout::replica_counts() const {
  std::vector<int> counts;
  for (const std::vector<int>& ranks : stage_ranks)
    counts.push_back(static_cast<int>(ranks.size()));
  return counts;
}

int PipelineLayout::stage_of(int rank) const {
  for (int s = 0; s < num_stages(); ++s)
    for (int r : stage_ranks[s])
      if (r == rank) return s;
  PIPELINE_FAIL(ConfigError, "rank {} runs no stage of the pipeline ({} stages over {} ranks)",
                rank, num_stages(), num_ranks());
}

std::vector<int> PipelineLayout::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < num_stages(); ++s)
    for (int r : stage_ranks[s])
      if (r == rank) out.push_back(s);
  return out;
}

PipelineLayout PipelineLayout::straight(std::vector<LayerRange> stage_layers) {
  PipelineLayout l;
  for (std::size_t s = 0; s < stage_layers.size(); ++s)
    l.stage_ranks.push_back({static_cast<int>(s)});
  l.stages = std::move(stage_layers);
  return l;
}

PipelineLayout PipelineLayout::from_plan(const Plan& plan, const Sequential& model) {
  PIPELINE_CHECK_AS(ConfigError, plan.model.empty() || plan.model == model.name(),
                    "the plan is for model '{}' but the program trains '{}': give a plan made "
                    "from a profile of '{}' (pipeline-profile, then pipeline-partition), or train "
                    "the model the plan is for",
                    plan.model, model.name(), model.name());
  PIPELINE_CHECK_AS(ConfigError, plan.num_stages() >= 1, "the plan has no stages");
  PipelineLayout l;
  int expect = 0, next_rank = 0;
  for (int s = 0; s < plan.num_stages(); ++s) {
    const PlanStage& st = plan.stages[s];
    PIPELINE_CHECK_AS(ConfigError, st.layer_ids.empty(),
                      "stage {} of the plan is not one contiguous layer range (layer_ids given); "
                      "the runtime executes chains of layers only",
                      s);
    PIPELINE_CHECK_AS(ConfigError, st.begin == expect && st.end > st.begin,
                      "stage {} of the plan covers layers [{}, {}) but should start at layer {}: "
                      "stages must cover the model's layers in order",
                      s, st.begin, st.end, expect);
    expect = st.end;
    std::vector<int> ranks = st.ranks;
    if (ranks.empty())
      for (int i = 0; i < std::max(1, st.replicas); ++i) ranks.push_back(next_rank + i);
    next_rank += static_cast<int>(ranks.size());
    l.stages.push_back({st.begin, st.end});
    l.stage_ranks.push_back(std::move(ranks));
  }
  PIPELINE_CHECK_AS(ConfigError, expect == model.size(),
                    "the plan's stages cover layers [0, {}) but model '{}' has {} layers: the plan "
                    "was made for another model or another version of it",
                    expect, model.name(), model.size());
  return l;
}

// --- run state ---------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A double carried through a float allreduce without losing its low bits: hi + lo.
void put_double(float* out, double v) {
  const float hi = static_cast<float>(v);
  out[0] = hi;
  out[1] = static_cast<float>(v - static_cast<double>(hi));
}
double get_double(const float* in) {
  return static_cast<double>(in[0]) + static_cast<double>(in[1]);
}

// Removes and returns what was received for microbatch u. Receives are posted ahead of the
// compute that needs them, so a missing entry means the action list ran compute before its
// receive.
Tensor take_by_microbatch(std::map<int, Tensor>& received, int u, const char* action,
                          const char* what, int stage) {
  auto it = received.find(u);
  PIPELINE_CHECK(it != received.end(), "{} of microbatch {} on stage {} before its {} was received",
                 action, u, stage, what);
  Tensor t = std::move(it->second);
  received.erase(it);
  return t;
}

// Bytes of distinct storage among the tensors added: each allocation counted once, as far as
// the views of it that were added reach (a slice of a larger batch counts up to its end).
class StorageCounter {
 public:
  void add(const Tensor& t) {
    // The whole allocation, not only the part viewed: a microbatch's slice of a minibatch keeps
    // all of it alive.
    if (t.defined() && t.nbytes() > 0) m_views.emplace_back(t.storage_id(), t.storage_bytes());
  }
  void add(const Saved& s) {
    for (auto& t : s.tensors) add(t);
    for (auto& t : s.child_output_grads) add(t);
    for (auto& c : s.children) add(c);
  }
  std::int64_t bytes() {
    std::sort(m_views.begin(), m_views.end());
    std::int64_t n = 0;
    for (std::size_t i = 0; i < m_views.size(); ++i)
      if (i + 1 == m_views.size() || m_views[i + 1].first != m_views[i].first)
        n += static_cast<std::int64_t>(m_views[i].second);
    return n;
  }

 private:
  std::vector<std::pair<const void*, std::size_t>> m_views;
};

}  // namespace

void StageMemory::include(const StageMemory& now) {
  parameter_bytes = std::max(parameter_bytes, now.parameter_bytes);
  gradient_bytes = std::max(gradient_bytes, now.gradient_bytes);
  optimizer_bytes = std::max(optimizer_bytes, now.optimizer_bytes);
  stashed_weight_bytes = std::max(stashed_weight_bytes, now.stashed_weight_bytes);
  activation_bytes = std::max(activation_bytes, now.activation_bytes);
  total_bytes = std::max(total_bytes, now.total_bytes);
  allocator_bytes = std::max(allocator_bytes, now.allocator_bytes);
}

struct StageExecutor::PostedRecv {
  std::size_t index = 0;  // the receive action's index in the rank's list
  Tensor buffer;
  Request request;
  Tensor version;  // vertical sync: the input stage's weight tag
  Request version_request;
};

// One of a rank's stages while another one is active (several stages per rank, interleaved
// plans): what StageExecutor keeps per stage, swapped with its members by activate().
struct StageExecutor::StageSlot {
  int stage = 0;
  int replica = 0;
  Group replica_group;
  std::unique_ptr<WeightStore> store;
  ModelGrads grads;
  std::vector<ParamState> optimizer_state;  // the optimizer's per-parameter state for the stage
  bool recompute = false;
  std::vector<LayerRange> bucket_layers;
};

// The per-stage part of a run: the active stage's is the Run itself (its base), the others' are
// parked in Run::parked and swapped in by activate().
struct StageExecutor::RunSlot {
  std::unique_ptr<InFlightTable> table;
  std::map<int, Tensor> inputs;  // received activations by microbatch
  std::map<int, WeightStore::Tag> input_tags;
  std::map<int, Tensor> output_grads;  // received gradients by microbatch
  std::map<int, Tensor> input_grads;   // computed, to be sent
  // Replicated stage: the buckets' allreduces in flight, of round in_flight_round (-1: none).
  std::vector<Request> buckets_in_flight;
  std::size_t buckets_started = 0;
  int in_flight_round = -1;
  // A schedule may run a backward of the next round before the AR of the round in flight (a
  // replica that waits for its allreduce after its next backward): the round in flight's
  // gradients then move to `sealed` and the backward accumulates into a second set (`spare`,
  // zeroed, kept for reuse). closed_round: that next round once its backward closed it; its
  // buckets start when the AR of the round in flight has waited.
  ModelGrads sealed, spare;
  int closed_round = -1;
  AllReduceTiming allreduce;  // of the allreduce under way (record_trace)
};

struct StageExecutor::Run : RunSlot {
  const Schedule* schedule = nullptr;
  const std::vector<Action>* actions = nullptr;
  const MinibatchFeed* feed = nullptr;
  std::int64_t first_minibatch = 0;
  int microbatches = 1;  // per minibatch
  bool eval = false;
  bool stash = false;
  bool vertical_sync = false;
  bool two_buffered = false;       // UpdatePolicy::DoubleBuffered (2BW)
  WeightStore::Tag first_tag = 0;  // the store's latest version when the run began
  const LrFunction* lr = nullptr;
  const std::function<void(const MinibatchStats&)>* on_minibatch = nullptr;
  const StepDoneFunction* on_step_done = nullptr;
  std::int64_t frontier = -1;  // the highest global minibatch any executed action belonged to

  std::vector<std::size_t> recv_indices;  // indices of RA/RG actions, in order
  std::size_t next_to_post = 0;           // into recv_indices
  std::deque<PostedRecv> posted;

  std::vector<Request> sends;
  // Several stages per rank: the per-stage state (RunSlot) of the stages not active now, by their
  // index in StageExecutor::m_my_stages (the active one's entry is empty).
  std::vector<RunSlot> parked;

  std::int64_t cached_minibatch = -1;
  std::vector<Batch> cached;

  // Replicated stage: by action index, the allreduce round whose gradients the action (the
  // round's last B or W) completes, or -1 (closing_backwards): it starts the gradient buckets.
  std::vector<std::int32_t> closes_gradients;

  std::map<std::int64_t, MinibatchStats> stats;  // last stage, per minibatch being scored
  std::map<std::int64_t, int> scored;            // microbatches scored per minibatch
  double eval_loss = 0;
  std::int64_t eval_correct = 0, eval_count = 0;

  std::size_t current = 0;
  TrainResult result;
  // With clipping: the step whose global gradient norm is known, and that norm.
  std::int64_t clip_step = -1;
  double clip_norm = 0;

  std::int64_t minibatch_of(int u) const { return first_minibatch + u / microbatches; }
  int micro_of(int u) const { return u % microbatches; }
  // The microbatch number that travels in tags: global over the run.
  int global(int u) const { return static_cast<int>(first_minibatch * microbatches + u); }
};

namespace {

// A replicated stage's gradient buckets, in backward order: layers from the stage's last one down
// until a bucket holds allreduce_bucket_bytes (one bucket without overlap); layers without
// parameters ride with their neighbours.
std::vector<LayerRange> gradient_buckets(const ModelGrads& grads, LayerRange r,
                                         const ExecutorOptions& options) {
  const std::int64_t limit = options.overlap_allreduce
                                 ? std::max<std::int64_t>(1, options.allreduce_bucket_bytes)
                                 : std::numeric_limits<std::int64_t>::max();
  std::vector<LayerRange> buckets;
  std::int64_t bytes = 0;
  int end = r.end;
  for (int i = r.end - 1; i >= r.begin; --i) {
    for (const Tensor& g : grads[static_cast<std::size_t>(i - r.begin)])
      bytes += static_cast<std::int64_t>(g.nbytes());
    if (bytes >= limit || i == r.begin) {
      buckets.push_back({i, end});
      end = i;
      bytes = 0;
    }
  }
  return buckets;
}

}  // namespace

// --- executor ----------------------------------------------------------------------------------

StageExecutor::StageExecutor(const Sequential& model, Shape sample_shape, DType input_dtype,
                             PipelineLayout layout, Communicator& comm,
                             std::unique_ptr<Optimizer> optimizer, const ExecutorOptions& options)
    : m_model(&model),
      m_sample_shape(std::move(sample_shape)),
      m_input_dtype(input_dtype),
      m_layout(std::move(layout)),
      m_comm(&comm),
      m_optimizer(std::move(optimizer)),
      m_options(options) {
  PIPELINE_CHECK(m_optimizer != nullptr, "the stage executor needs an optimizer");
  PIPELINE_CHECK_AS(
      ConfigError,
      m_layout.num_stages() >= 1 && m_layout.stages.size() == m_layout.stage_ranks.size(),
      "pipeline layout: {} layer ranges for {} stages", m_layout.stages.size(),
      m_layout.stage_ranks.size());
  PIPELINE_CHECK_AS(ConfigError,
                    m_options.transfer_dtype == DType::Float32 ||
                        m_options.transfer_dtype == DType::BFloat16,
                    "activations and gradients move between stages as float32 or bfloat16, not {}",
                    dtype_name(m_options.transfer_dtype));
  PIPELINE_CHECK_AS(ConfigError, m_layout.num_ranks() == comm.size(),
                    "the pipeline needs {} ranks but the job has {}: start it with {} processes "
                    "(mpirun -np {}) or partition for {} workers",
                    m_layout.num_ranks(), comm.size(), m_layout.num_ranks(), m_layout.num_ranks(),
                    comm.size());
  int expect = 0;
  for (int s = 0; s < m_layout.num_stages(); ++s) {
    const LayerRange r = m_layout.stages[s];
    PIPELINE_CHECK_AS(ConfigError, r.begin == expect && r.end > r.begin && r.end <= model.size(),
                      "stage {} holds layers [{}, {}), expected a non-empty range starting at {} "
                      "within the model's {} layers",
                      s, r.begin, r.end, expect, model.size());
    expect = r.end;
  }
  PIPELINE_CHECK_AS(ConfigError, expect == model.size(),
                    "the stages cover layers [0, {}) of the model's {}", expect, model.size());
  m_stage = m_layout.stage_of(comm.rank());
  const auto& mine = m_layout.stage_ranks[m_stage];
  m_replica = static_cast<int>(std::find(mine.begin(), mine.end(), comm.rank()) - mine.begin());
  if (mine.size() > 1) m_replica_group = comm.create_group(mine);
  // mpirun binds each rank to one core by default. More compute threads than the rank's CPUs
  // share them, and every OpenMP parallel region then ends waiting for a thread that is not
  // running while its sibling spins (libgomp's default wait policy): with 2 threads per rank,
  // bench_pipeline's mlp took 116 ms per microbatch instead of 7-9 ms, 878 samples/s on 2 ranks
  // instead of ~12,000 (bench/RESULTS.md). Extra threads cannot add compute there, so the rank
  // runs on as many threads as it has CPUs.
  if (const int cpus = allowed_cpus(); num_threads() > cpus) {
    log_warn(
        "{} threads per rank were asked for but rank {} may run on only {} CPU(s) (mpirun "
        "binds each rank to a core unless started with --bind-to none): using {}",
        num_threads(), comm.rank(), cpus, cpus);
    set_num_threads(cpus);
  }
  ops::check_compute_dtype(m_options.compute_dtype);
  const bool bf16_stash = m_options.compute_dtype == DType::BFloat16 && m_options.bf16_stash;
  m_store = std::make_unique<WeightStore>(
      to_device(model.init(m_options.seed, layers()), m_options.device));
  if (bf16_stash) m_store->set_bf16_stash(bf16_stash_mask(model, layers()));
  m_grads = model.zero_grads(layers(), m_options.device);
  if (mine.size() > 1) m_bucket_layers = gradient_buckets(m_grads, layers(), m_options);
  m_recompute = static_cast<std::size_t>(m_stage) < m_options.recompute.size() &&
                m_options.recompute[static_cast<std::size_t>(m_stage)];
  // The rank's other stages (interleaved plans), parked until an action of theirs activates them.
  m_my_stages = m_layout.stages_of(comm.rank());
  // Several stages per rank only as an interleaved layout (ConfigError naming what breaks it).
  if (m_my_stages.size() > 1) interleaved_shape(m_layout.stage_ranks);
  m_slots.resize(m_my_stages.size());
  for (std::size_t i = 1; i < m_my_stages.size(); ++i) {
    const int s = m_my_stages[i];
    // Replicated stages of an interleaved plan: every stage of the rank has its replica group
    // (created in stage order, the same on every replica) and its gradient buckets.
    const auto& ranks = m_layout.stage_ranks[static_cast<std::size_t>(s)];
    StageSlot& slot = m_slots[i];
    slot.stage = s;
    slot.replica =
        static_cast<int>(std::find(ranks.begin(), ranks.end(), comm.rank()) - ranks.begin());
    if (ranks.size() > 1) slot.replica_group = comm.create_group(ranks);
    slot.store = std::make_unique<WeightStore>(
        to_device(model.init(m_options.seed, m_layout.stages[s]), m_options.device));
    if (bf16_stash) slot.store->set_bf16_stash(bf16_stash_mask(model, m_layout.stages[s]));
    slot.grads = model.zero_grads(m_layout.stages[s], m_options.device);
    if (ranks.size() > 1)
      slot.bucket_layers = gradient_buckets(slot.grads, m_layout.stages[s], m_options);
    slot.recompute = static_cast<std::size_t>(s) < m_options.recompute.size() &&
                     m_options.recompute[static_cast<std::size_t>(s)];
  }
}

void StageExecutor::activate(Run& run, int stage) {
  if (stage == m_stage) return;
  const auto it = std::find(m_my_stages.begin(), m_my_stages.end(), stage);
  PIPELINE_CHECK(it != m_my_stages.end(),
                 "an action of stage {} on rank {}, which runs stage(s) {}", stage, rank(),
                 m_my_stages);
  run.parked.resize(m_slots.size());
  const auto exchange = [&](std::size_t i) {
    StageSlot& s = m_slots[i];
    std::swap(m_stage, s.stage);
    std::swap(m_replica, s.replica);
    std::swap(m_replica_group, s.replica_group);
    std::swap(m_store, s.store);
    std::swap(m_grads, s.grads);
    std::swap(m_optimizer->state(), s.optimizer_state);
    std::swap(m_recompute, s.recompute);
    std::swap(m_bucket_layers, s.bucket_layers);
    std::swap(static_cast<RunSlot&>(run), run.parked[i]);
  };
  exchange(m_active);  // park the active stage
  m_active = static_cast<std::size_t>(it - m_my_stages.begin());
  exchange(m_active);  // and take out the requested one
}

void StageExecutor::for_each_stage(Run& run, const std::function<void()>& f) {
  for (int s : m_my_stages) {
    activate(run, s);
    f();
  }
  activate(run, m_my_stages.front());
}

void StageExecutor::for_each_stage(const std::function<void(int stage)>& f) {
  PIPELINE_CHECK(m_run == nullptr, "for_each_stage during train() or evaluate() on rank {}",
                 rank());
  Run idle;  // between runs no run holds per-stage state
  for_each_stage(idle, [&] { f(m_stage); });
}

StageExecutor::~StageExecutor() = default;

ModelParams& StageExecutor::params() {
  return m_store->latest();
}

ModelParams& StageExecutor::params(int stage) {
  if (stage == m_stage) return m_store->latest();
  const auto it = std::find(m_my_stages.begin(), m_my_stages.end(), stage);
  PIPELINE_CHECK(it != m_my_stages.end(), "rank {} holds stage(s) {}, not stage {}", rank(),
                 m_my_stages, stage);
  return m_slots[static_cast<std::size_t>(it - m_my_stages.begin())].store->latest();
}

StageMemory StageExecutor::measure(const Run* run) const {
  StorageCounter latest, others, grads, optimizer, activations;
  m_store->for_each_tensor(
      [&](const Tensor& t, bool is_latest) { (is_latest ? latest : others).add(t); });
  for (auto& layer : m_grads)
    for (auto& g : layer) grads.add(g);
  for (auto& s : m_optimizer->state())
    for (auto& b : s.buffers) optimizer.add(b);
  // The rank's parked stages (interleaved plans) hold theirs too.
  for (std::size_t i = 0; i < m_slots.size(); ++i) {
    const StageSlot& slot = m_slots[i];
    if (i == m_active || !slot.store) continue;
    slot.store->for_each_tensor(
        [&](const Tensor& t, bool is_latest) { (is_latest ? latest : others).add(t); });
    for (auto& layer : slot.grads)
      for (auto& g : layer) grads.add(g);
    for (auto& s : slot.optimizer_state)
      for (auto& b : s.buffers) optimizer.add(b);
  }
  if (run != nullptr)  // the second gradient set of a replica that delays its allreduce
    for (const ModelGrads* set : {&run->sealed, &run->spare})
      for (auto& layer : *set)
        for (auto& g : layer) grads.add(g);
  if (run != nullptr && run->table) {
    const auto add_context = [&](const MicrobatchContext& c) {
      for (auto& s : c.saved) activations.add(s);
      for (auto& g : c.layer_grads) activations.add(g);
      activations.add(c.input);
      activations.add(c.output);
      activations.add(c.loss_grad);
      activations.add(c.labels);
    };
    run->table->for_each_open(add_context);
    for (auto& [u, t] : run->inputs) activations.add(t);
    for (auto& [u, t] : run->output_grads) activations.add(t);
    for (auto& [u, t] : run->input_grads) activations.add(t);
    for (std::size_t i = 0; i < run->parked.size(); ++i) {
      const RunSlot& r = run->parked[i];
      if (i == m_active) continue;
      if (r.table) r.table->for_each_open(add_context);
      for (auto& [u, t] : r.inputs) activations.add(t);
      for (auto& [u, t] : r.output_grads) activations.add(t);
      for (auto& [u, t] : r.input_grads) activations.add(t);
    }
  }
  StageMemory m;
  m.parameter_bytes = latest.bytes();
  m.gradient_bytes = grads.bytes();
  m.optimizer_bytes = optimizer.bytes();
  m.stashed_weight_bytes = others.bytes();
  m.activation_bytes = activations.bytes();
  m.total_bytes = m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes +
                  m.stashed_weight_bytes + m.activation_bytes;
  return m;
}

StageMemory StageExecutor::memory_now() const {
  return measure(m_run);
}

void StageExecutor::sample_memory(Run& run) {
  if (run.eval) return;
  const StageMemory now = measure(&run);
  run.result.peak_memory.include(now);
  m_peak_memory.include(now);
}

void StageExecutor::recompute_forward(MicrobatchContext& c) {
  PIPELINE_CHECK(c.input.defined(),
                 "microbatch {} on stage {} has no stashed input to recompute its forward from",
                 c.microbatch, m_stage);
  ModelParams& w = m_store->params(c.version);
  // The first forward already updated the layers' buffers (batch-norm running statistics); the
  // second one must leave them as they were.
  std::vector<Tensor> buffers;
  for (auto& layer : w)
    for (auto& b : layer.buffers) buffers.push_back(b.clone());
  m_model->forward(layers(), w, c.input, c.saved, {Mode::Train, c.seed});
  std::size_t i = 0;
  for (auto& layer : w)
    for (auto& b : layer.buffers) b.copy_from(buffers[i++]);
  c.input = Tensor{};  // what backward needs of it, the saved records hold
}

Shape StageExecutor::activation_shape(std::int64_t samples, int layer_end) const {
  return m_model->shapes(m_sample_shape.batched(samples), {0, layer_end}).back();
}

void StageExecutor::check_feed_batch(const Batch& b, std::int64_t minibatch) const {
  // The output stage needs a label per sample: without them a flush schedule's microbatches
  // came out of a batch of 0 samples, and too few failed inside the loss.
  if (m_my_stages.back() == num_stages() - 1)
    PIPELINE_CHECK_AS(ConfigError, b.labels.defined() && b.labels.dim(0) == b.size(),
                      "the feed's minibatch {} has {} for {} samples: a training batch needs a "
                      "label per sample",
                      minibatch,
                      b.labels.defined() ? fmt::format("labels of shape {}", b.labels.shape().str())
                                         : std::string("no labels"),
                      b.size());
  // The model's input stage checks what a feed of the caller's gives it: a feed of another
  // model's samples would otherwise fail deep inside a layer.
  if (m_my_stages.front() == 0 && b.inputs.defined())
    PIPELINE_CHECK_AS(
        ConfigError,
        b.inputs.dtype() == m_input_dtype && b.inputs.shape() == m_sample_shape.batched(b.size()),
        "the feed's minibatch {} has inputs of {} {}, but the model takes samples "
        "of {} {} (the executor's sample shape and input dtype): feed it the "
        "data of the model it trains",
        minibatch, b.inputs.shape().str(), dtype_name(b.inputs.dtype()), m_sample_shape.str(),
        dtype_name(m_input_dtype));
}

Batch StageExecutor::microbatch_data(Run& run, int u) {
  const std::int64_t mb = run.eval ? u : run.minibatch_of(u);
  if (!run.eval && run.feed->load_samples) {
    // The microbatch's samples alone: the rest of the minibatch is not held meanwhile.
    const std::int64_t n = run.feed->size(mb);
    const IndexRange r = microbatch_range(n, run.microbatches, run.micro_of(u));
    Batch b = run.feed->load_samples(mb, r.begin, r.end);
    PIPELINE_CHECK(b.size() == r.size(),
                   "the feed's samples [{}, {}) of minibatch {} came as {} samples", r.begin, r.end,
                   mb, b.size());
    check_feed_batch(b, mb);
    return {is_first_stage() ? b.inputs.to(m_options.device) : Tensor{},
            is_last_stage() ? b.labels.to(m_options.device) : Tensor{}};
  }
  if (mb != run.cached_minibatch) {
    PIPELINE_CHECK(static_cast<bool>(run.feed->load), "the feed has no load function");
    // The last minibatch's views go first, so its storage is not held beside the next one's.
    run.cached.clear();
    Batch b = run.feed->load(mb);
    PIPELINE_CHECK(b.size() == run.feed->size(mb),
                   "the feed's minibatch {} has {} samples but its size function says {}", mb,
                   b.size(), run.feed->size(mb));
    check_feed_batch(b, mb);
    // Only what this rank's stages use: the input stage the inputs, the output stage the labels
    // (a minibatch of inputs held by the last stage was as large as its activations).
    // m_my_stages ascends: the rank holds the input stage if its first is 0.
    b.inputs = m_my_stages.front() == 0 ? b.inputs.to(m_options.device) : Tensor{};
    b.labels = m_my_stages.back() == num_stages() - 1 ? b.labels.to(m_options.device) : Tensor{};
    run.cached = split_microbatches(b, run.eval ? 1 : run.microbatches);
    run.cached_minibatch = mb;
  }
  return run.cached[static_cast<std::size_t>(run.eval ? 0 : run.micro_of(u))];
}

void StageExecutor::post_receives(Run& run, std::size_t upto) {
  const auto& acts = *run.actions;
  const std::size_t window = static_cast<std::size_t>(std::max(1, m_options.receive_lookahead));
  while (run.next_to_post < run.recv_indices.size() &&
         (run.posted.size() < window || run.recv_indices[run.next_to_post] <= upto)) {
    const std::size_t idx = run.recv_indices[run.next_to_post++];
    const Action& a = acts[idx];
    if (!run.eval && m_stop_before >= 0 && minibatch_of(run, a) >= m_stop_before) continue;
    const int u = a.microbatch;
    std::int64_t samples = 0;
    if (run.eval) {
      samples = run.feed->size(u);
    } else {
      samples =
          microbatch_range(run.feed->size(run.minibatch_of(u)), run.microbatches, run.micro_of(u))
              .size();
    }
    PostedRecv p;
    p.index = idx;
    const bool activation = a.kind == ActionKind::RecvActivation;
    // The receive's own stage, which on a rank of several stages need not be the active one.
    const LayerRange r = m_layout.stages[static_cast<std::size_t>(a.stage)];
    p.buffer = Tensor::empty(activation_shape(samples, activation ? r.begin : r.end),
                             m_options.transfer_dtype, m_options.device);
    Tag tag = activation ? Tag::activation(a.stage - 1, run.global(u))
                         : Tag::gradient(a.stage + 1, run.global(u));
    if (run.eval) tag = {TagKind::EvalActivation, a.stage - 1, u};
    p.request = m_comm->irecv(p.buffer, a.peer, tag);
    if (activation && run.vertical_sync) {
      p.version = Tensor::empty(Shape{2}, DType::Int32, m_options.device);
      p.version_request =
          m_comm->irecv(p.version, a.peer, Tag::version(a.stage - 1, run.global(u)));
    }
    run.posted.push_back(std::move(p));
  }
}

std::int64_t StageExecutor::minibatch_of(const Run& run, const Action& a) const {
  if (a.kind == ActionKind::AllReduce || a.kind == ActionKind::Step)
    return run.first_minibatch + std::int64_t{a.microbatch} * (run.stash ? replicas() : 1);
  return run.minibatch_of(a.microbatch);
}

void StageExecutor::stop_before(std::int64_t minibatch) {
  PIPELINE_CHECK(m_run != nullptr && !m_run->eval, "stop_before({}) outside of train()", minibatch);
  PIPELINE_CHECK(m_run->frontier < minibatch,
                 "stop before minibatch {} was decided too late: rank {} already ran minibatch {}",
                 minibatch, rank(), m_run->frontier);
  m_stop_before = minibatch;
  // Receives already posted for the skipped minibatches are cancelled (their senders skip them).
  std::erase_if(m_run->posted, [&](const PostedRecv& p) {
    return minibatch_of(*m_run, (*m_run->actions)[p.index]) >= minibatch;
  });
}

Tensor StageExecutor::take_received(Run& run, std::size_t index) {
  PIPELINE_CHECK(!run.posted.empty() && run.posted.front().index == index,
                 "internal: receive of action {} was not posted in order", index);
  PostedRecv p = std::move(run.posted.front());
  run.posted.pop_front();
  p.request.wait();
  if (p.version.defined()) {
    p.version_request.wait();
    run.input_tags[(*run.actions)[index].microbatch] =
        int64_from_message(p.version.to(Device::cpu()));
  }
  return ops::to_dtype(p.buffer, DType::Float32);
}

void StageExecutor::do_forward(Run& run, const Action& a) {
  const int u = a.microbatch;
  const LayerRange r = layers();
  Tensor x;
  Batch data;
  if (is_first_stage() || is_last_stage()) data = microbatch_data(run, u);
  if (is_first_stage()) {
    x = data.inputs;
  } else {
    x = take_by_microbatch(run.inputs, u, "forward", "activation", m_stage);
  }

  if (run.eval) {
    std::vector<Saved> saved;
    Tensor y = m_model->forward(r, m_store->latest(), x, saved, {Mode::Eval, 0});
    if (is_last_stage()) {
      LossResult l = m_loss(y, data.labels, 1.f);
      run.eval_loss += l.loss;
      run.eval_correct += l.correct;
      run.eval_count += l.count;
    } else {
      MicrobatchContext& c = run.table->open(u);
      c.output = y;
    }
    return;
  }

  MicrobatchContext& c = run.table->open(u);
  if (run.vertical_sync && !is_first_stage()) {
    auto it = run.input_tags.find(u);
    PIPELINE_CHECK(it != run.input_tags.end(),
                   "vertical sync: no weight version arrived with microbatch {}", u);
    c.input_tag = it->second;
    run.input_tags.erase(it);
    c.version = m_store->acquire(c.input_tag);
  } else if (run.two_buffered) {
    // 2BW: the whole minibatch runs on the weights after one step less than it closes.
    const auto k = static_cast<int>(run.minibatch_of(u) - run.first_minibatch);
    c.version = m_store->acquire(run.first_tag + double_buffered_version(k));
    c.input_tag = c.version;
  } else {
    c.version = m_store->acquire_latest();
    c.input_tag = c.version;
  }
  const std::int64_t mb = run.minibatch_of(u);
  ForwardContext ctx{Mode::Train, microbatch_seed(m_options.seed, mb, run.micro_of(u))};
  Tensor y = m_model->forward(r, m_store->params(c.version), x, c.saved, ctx);
  c.samples = x.dim(0);
  if (m_recompute) {
    // Keep the input and the dropout seed; the saved records are rebuilt at backward.
    c.input = x;
    c.seed = ctx.seed;
    c.saved.clear();
  }
  if (!is_last_stage()) {
    c.output = y;
    sample_memory(run);
    return;
  }
  const float scale = 1.f / static_cast<float>(run.feed->size(mb));
  LossResult l = m_loss(y, data.labels, scale);
  PIPELINE_CHECK(std::isfinite(l.loss),
                 "loss became {} at step {} (its microbatch {}): lower the learning rate or "
                 "enable gradient clipping (clip_norm; the trainers' --clip-grad)",
                 l.loss, mb + 1, run.micro_of(u));
  c.loss_grad = std::move(l.grad);
  MinibatchStats& st = run.stats[mb];
  st.minibatch = mb;
  st.loss += l.loss;
  st.correct += l.correct;
  st.count += l.count;
  // This replica scores the microbatches u' of the minibatch with u' % replicas == replica.
  int mine = 0;
  for (int k = 0; k < run.microbatches; ++k) {
    const int uu = static_cast<int>((mb - run.first_minibatch) * run.microbatches + k);
    if (run.schedule->rank_of(m_stage, uu) == rank()) ++mine;
  }
  // A replicated last stage completes a minibatch's statistics at its allreduce.
  if (++run.scored[mb] == mine && replicas() == 1) {
    run.result.loss += st.loss;
    run.result.correct += st.correct;
    run.result.count += st.count;
    ++run.result.minibatches;
    if (*run.on_minibatch) (*run.on_minibatch)(st);
    run.stats.erase(mb);
    run.scored.erase(mb);
  }
  sample_memory(run);
}

void StageExecutor::do_backward(Run& run, const Action& a, GradParts parts) {
  const int u = a.microbatch;
  const LayerRange r = layers();
  MicrobatchContext& c = run.table->at(u);
  const ModelParams& w = m_store->params(c.version);
  const bool need_dx = !is_first_stage();
  const int first_dx = m_model->first_input_grad_layer(r, need_dx);
  const bool weight_only = parts == GradParts::Weight;
  if (parts != GradParts::Input) seal_round_in_flight(run);

  if (!weight_only) {
    if (m_recompute) recompute_forward(c);
    Tensor dy;
    if (is_last_stage()) {
      dy = std::move(c.loss_grad);
    } else {
      dy = take_by_microbatch(run.output_grads, u, "backward", "gradient", m_stage);
    }
    if (parts == GradParts::Both) {
      Tensor dx;
      if (m_bucket_layers.empty()) {
        dx = m_model->backward(r, w, c.saved, std::move(dy), m_grads, need_dx);
      } else {
        // Sequential::backward layer by layer, so that finished buckets start their allreduce.
        const bool closes = starts_buckets(run);
        Tensor g = std::move(dy);
        for (int i = r.end - 1; i >= r.begin; --i) {
          const int j = m_model->runs_at(r, i);
          const auto k = static_cast<std::size_t>(j - r.begin);
          if (i >= first_dx)
            g = m_model->layer(j).backward(w[k], c.saved[k], g, m_grads[k], GradParts::Both);
          else if (!m_grads[k].empty())
            (void)m_model->layer(j).backward(w[k], c.saved[k], g, m_grads[k], GradParts::Weight);
          after_layer_backward(run, j, closes);
        }
        if (need_dx) dx = std::move(g);
      }
      if (need_dx) run.input_grads[u] = std::move(dx);
      sample_memory(run);  // saved records and the input gradient at once
    } else {
      // Input gradient only: keep the output gradients of the layers with weights for the weight
      // pass (the others have nothing to do there).
      c.layer_grads.assign(static_cast<std::size_t>(r.size()), Tensor{});
      Tensor g = std::move(dy);
      for (int i = r.end - 1; i >= r.begin; --i) {
        const int j = m_model->runs_at(r, i);
        const auto k = static_cast<std::size_t>(j - r.begin);
        if (!m_grads[k].empty()) c.layer_grads[k] = g;
        if (i < first_dx) break;
        g = m_model->layer(j).backward(w[k], c.saved[k], g, std::span<Tensor>(), GradParts::Input);
      }
      if (need_dx) run.input_grads[u] = std::move(g);
      sample_memory(run);
      return;  // the context lives on until W
    }
  } else {
    PIPELINE_CHECK(!c.layer_grads.empty(),
                   "weight gradient of microbatch {} on stage {} before its input gradient", u,
                   m_stage);
    const bool closes = !m_bucket_layers.empty() && starts_buckets(run);
    for (int i = r.end - 1; i >= r.begin; --i) {
      const int j = m_model->runs_at(r, i);
      const auto k = static_cast<std::size_t>(j - r.begin);
      if (!m_grads[k].empty())
        m_model->layer(j).backward(w[k], c.saved[k], c.layer_grads[k], m_grads[k],
                                   GradParts::Weight);
      if (!m_bucket_layers.empty()) after_layer_backward(run, j, closes);
    }
    sample_memory(run);
  }
  note_closed(run);
  m_store->release(c.version);
  run.table->close(u);
}

bool StageExecutor::starts_buckets(const Run& run) const {
  return m_options.overlap_allreduce && run.in_flight_round < 0 && !run.closes_gradients.empty() &&
         run.closes_gradients[run.current] >= 0;
}

void StageExecutor::seal_round_in_flight(Run& run) {
  if (run.in_flight_round < 0 || !run.sealed.empty()) {
    PIPELINE_CHECK(run.closed_round < 0,
                   "action {} of stage {} computes gradients while rounds {} and {} wait for "
                   "their allreduce; a schedule may run one backward of the next round before "
                   "an allreduce, not more",
                   run.current, m_stage, run.in_flight_round, run.closed_round);
    return;
  }
  run.sealed = std::move(m_grads);
  m_grads =
      run.spare.empty() ? m_model->zero_grads(layers(), m_options.device) : std::move(run.spare);
  run.spare.clear();
}

void StageExecutor::note_closed(Run& run) {
  if (run.closes_gradients.empty() || run.closes_gradients[run.current] < 0) return;
  (run.in_flight_round < 0 ? run.in_flight_round : run.closed_round) =
      run.closes_gradients[run.current];
}

ModelGrads& StageExecutor::round_grads(Run& run) {
  return run.sealed.empty() ? m_grads : run.sealed;
}

double StageExecutor::trace_now() const {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - m_t0;
}

void StageExecutor::start_bucket(Run& run, const ModelGrads& grads, std::size_t b) {
  const LayerRange layers_of = m_bucket_layers[b];
  std::vector<Tensor> g;
  std::int64_t bytes = 0;
  for (int i = layers_of.begin; i < layers_of.end; ++i)
    for (const Tensor& t : grads[static_cast<std::size_t>(i - layers().begin)]) {
      g.push_back(t);
      bytes += static_cast<std::int64_t>(t.nbytes());
    }
  if (m_options.record_trace) {
    if (run.allreduce.buckets == 0) run.allreduce.start_s = trace_now();
    ++run.allreduce.buckets;
    run.allreduce.bytes += bytes;
  }
  if (!g.empty())
    run.buckets_in_flight.push_back(m_comm->iallreduce_sum(std::span<Tensor>(g), m_replica_group));
  ++run.buckets_started;
}

void StageExecutor::progress_allreduce(Run& run) {
  if (run.buckets_in_flight.empty()) return;
  bool all = true;
  for (Request& q : run.buckets_in_flight) all = q.test() && all;
  if (all) {
    run.buckets_in_flight.clear();
    if (m_options.record_trace && run.buckets_started == m_bucket_layers.size())
      run.allreduce.end_s = trace_now();
  }
}

void StageExecutor::after_layer_backward(Run& run, int layer, bool closes) {
  // Buckets are in backward order: the next one is complete when its first layer is done.
  if (closes && run.buckets_started < m_bucket_layers.size() &&
      m_bucket_layers[run.buckets_started].begin == layer)
    start_bucket(run, m_grads, run.buckets_started);
  progress_allreduce(run);
}

void StageExecutor::do_allreduce(Run& run, const Action& a) {
  if (replicas() == 1) return;
  PIPELINE_CHECK(run.in_flight_round < 0 || run.in_flight_round == a.microbatch,
                 "allreduce {} of stage {} while the gradients of round {} wait for theirs",
                 a.microbatch, m_stage, run.in_flight_round);
  ModelGrads& grads = round_grads(run);
  // Buckets no backward started (this replica ran no backward of the minibatch, or overlap is
  // off) start now, in the same order on every replica.
  while (run.buckets_started < m_bucket_layers.size())
    start_bucket(run, grads, run.buckets_started);
  std::vector<Tensor> g = flatten_grads(grads);
  // On a replicated last stage the loss statistics of the minibatches this allreduce closes ride
  // along (flush: minibatch k, split among the replicas; stash: minibatches k r .. k r + r - 1,
  // one per replica), so the loss rank reports whole minibatches.
  std::vector<std::int64_t> closes;
  if (is_last_stage()) {
    if (run.stash)
      for (int i = 0; i < replicas(); ++i)
        closes.push_back(run.first_minibatch + std::int64_t{a.microbatch} * replicas() + i);
    else
      closes.push_back(run.first_minibatch + a.microbatch);
    Tensor stats = Tensor::zeros(Shape{static_cast<std::int64_t>(closes.size()) * 6});
    float* v = stats.data<float>();
    for (std::size_t i = 0; i < closes.size(); ++i) {
      auto it = run.stats.find(closes[i]);
      if (it == run.stats.end()) continue;
      put_double(v + 6 * i, it->second.loss);
      put_double(v + 6 * i + 2, static_cast<double>(it->second.correct));
      put_double(v + 6 * i + 4, static_cast<double>(it->second.count));
    }
    g.push_back(stats.to(m_options.device));
    run.buckets_in_flight.push_back(m_comm->iallreduce_sum(g.back(), m_replica_group));
  }
  for (Request& q : run.buckets_in_flight) q.wait();
  run.buckets_in_flight.clear();
  if (m_options.record_trace) {
    run.allreduce.stage = m_stage;
    run.allreduce.microbatch = a.microbatch;
    if (run.allreduce.end_s < run.allreduce.start_s) run.allreduce.end_s = trace_now();
    m_allreduce_trace.push_back(run.allreduce);
  }
  run.allreduce = AllReduceTiming{};
  run.buckets_started = 0;
  // The next round, closed meanwhile in the second set, goes now.
  run.in_flight_round = std::exchange(run.closed_round, -1);
  if (run.in_flight_round >= 0 && m_options.overlap_allreduce)
    while (run.buckets_started < m_bucket_layers.size())
      start_bucket(run, m_grads, run.buckets_started);
  if (is_last_stage()) {
    const Tensor summed = g.back().to(Device::cpu());
    g.pop_back();
    const float* v = summed.data<float>();
    for (std::size_t i = 0; i < closes.size(); ++i) {
      MinibatchStats st;
      st.minibatch = closes[i];
      st.loss = get_double(v + 6 * i);
      st.correct = std::llround(get_double(v + 6 * i + 2));
      st.count = std::llround(get_double(v + 6 * i + 4));
      run.stats.erase(closes[i]);
      run.scored.erase(closes[i]);
      run.result.loss += st.loss;
      run.result.correct += st.correct;
      run.result.count += st.count;
      ++run.result.minibatches;
      if (m_replica == 0 && *run.on_minibatch) (*run.on_minibatch)(st);
    }
  }
  // Under stash each replica's gradient is already a minibatch mean: the step takes their mean.
  if (run.stash) scale(std::span<Tensor>(g), 1.f / static_cast<float>(replicas()));
}

void StageExecutor::do_step(Run& run, const Action& a) {
  const LayerRange r = layers();
  ModelGrads& round = round_grads(run);
  std::vector<Tensor> grads = flatten_grads(round);
  std::vector<std::size_t> layer_of;  // of each gradient, to name the layer that overflowed
  for (int k = 0; k < r.size(); ++k)
    layer_of.insert(layer_of.end(), round[static_cast<std::size_t>(k)].size(),
                    static_cast<std::size_t>(k));
  const std::int64_t step = run.stash
                                ? run.first_minibatch + std::int64_t{a.microbatch} * replicas()
                                : run.first_minibatch + a.microbatch;
  // Every gradient's sum of squares (all at once: one wait on a GPU), added up per layer in
  // order; the stage's total.
  std::vector<double> sums(grads.size(), 0.0);
  auto stage_total = [&] {
    std::vector<double> layer_ss(static_cast<std::size_t>(r.size()), 0.0);
    for (std::size_t i = 0; i < sums.size(); ++i) layer_ss[layer_of[i]] += sums[i];
    double local = 0;
    for (double s : layer_ss) local += s;
    if (!std::isfinite(local)) {
      for (int k = 0; k < r.size(); ++k)
        if (!std::isfinite(layer_ss[static_cast<std::size_t>(k)]))
          PIPELINE_FAIL(Error,
                        "gradient of layer '{}' (stage {}) became {} at step {}: lower the "
                        "learning rate or enable gradient clipping (clip_norm; the trainers' --clip-grad)",
                        m_model->layer(r.begin + k).name(), m_stage,
                        layer_ss[static_cast<std::size_t>(k)], step + 1);
    }
    return local;
  };
  const bool clip = m_options.clip_norm > 0.f;
  if (clip) {
    sums = ops::sums_of_squares(grads);
    const double local = stage_total();
    // The norm over every stage of the model: one world sum per optimizer step of the model,
    // taken at the first of a rank's steps of the minibatch over all its stages (several on an
    // interleaved plan, whose flush schedules run every allreduce of the minibatch before its
    // steps, so their gradients are final); the rank's other steps of the minibatch reuse it.
    // Replicas hold identical gradients after the allreduce: each stage counts once.
    if (run.clip_step != step) {
      const int active = m_stage;
      double mine = 0;
      for_each_stage(run, [&] {
        if (m_replica != 0) return;
        if (m_stage == active) {
          mine += local;
          return;
        }
        for (double x : ops::sums_of_squares(flatten_grads(round_grads(run)))) mine += x;
      });
      activate(run, active);
      Tensor t = Tensor::zeros(Shape{2});
      put_double(t.data<float>(), mine);
      t = t.to(m_options.device);
      m_comm->allreduce_sum(t, m_comm->world());
      run.clip_step = step;
      run.clip_norm = std::sqrt(get_double(t.to(Device::cpu()).data<float>()));
    }
    scale(std::span<Tensor>(grads), clip_factor(run.clip_norm, m_options.clip_norm));
  }
  // 2BW: after step k only minibatches from k + 1 on run, on the weights after k steps or later.
  if (run.two_buffered) m_store->forget_below(m_store->latest_tag());
  ModelParams& p = m_store->begin_step();
  std::vector<Tensor> flat = flatten_params(p);
  if (clip) {
    m_optimizer->step(flat, grads, (*run.lr)(step));
    zero_all(grads);
  } else {
    // Without clipping the sums only find an overflow: taken in the update's pass, which zeroes
    // the gradients too (the overflow is then found after the update; the run stops either way).
    m_optimizer->step_and_zero(flat, grads, (*run.lr)(step), sums);
    stage_total();
  }
  if (!run.sealed.empty()) run.spare = std::exchange(run.sealed, {});
  sample_memory(run);  // a new weight version, and the optimizer state from the first step on
  ++m_steps;
  ++run.result.steps;
  if (*run.on_step_done) (*run.on_step_done)(step + (run.stash ? replicas() : 1));
}

void StageExecutor::execute(Run& run) {
  const ops::ComputeDTypeScope precision(m_options.compute_dtype);
  const auto& acts = *run.actions;
  for (std::size_t i = 0; i < acts.size(); ++i)
    if (is_recv(acts[i].kind)) run.recv_indices.push_back(i);
  // The backward after which the gradients of each AR's round are final.
  if (!m_bucket_layers.empty())
    run.closes_gradients = closing_backwards(acts, run.schedule->policy, run.microbatches);

  m_comm->set_context([this, &run] {
    const auto& a = *run.actions;
    return fmt::format("stage {} replica {}, action {} of {} ({})", m_stage, m_replica,
                       run.current + 1, a.size(),
                       run.current < a.size() ? to_string(a[run.current]) : std::string("end"));
  });
  struct ClearContext {
    Communicator* c;
    ~ClearContext() { c->set_context({}); }
  } clear{m_comm};

  const auto now = [this] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - m_t0;
  };
  for (std::size_t i = 0; i < acts.size(); ++i) {
    run.current = i;
    const Action& a = acts[i];
    PIPELINE_CHECK(std::find(m_my_stages.begin(), m_my_stages.end(), a.stage) != m_my_stages.end(),
                   "action {} ({}) is for stage {} but rank {} runs stage(s) {}", i, to_string(a),
                   a.stage, rank(), m_my_stages);
    activate(run, a.stage);
    if (!run.eval) {
      const std::int64_t mb = minibatch_of(run, a);
      if (m_stop_before >= 0 && mb >= m_stop_before) continue;
      run.frontier = std::max(run.frontier, mb);
    }
    post_receives(run, i);
    const bool compute = is_compute(a.kind);
    const double start = compute || m_options.record_trace ? now() : 0;
    switch (a.kind) {
      case ActionKind::Forward:
        do_forward(run, a);
        break;
      case ActionKind::Backward:
        do_backward(run, a, GradParts::Both);
        break;
      case ActionKind::BackwardInput:
        do_backward(run, a, GradParts::Input);
        break;
      case ActionKind::BackwardWeight:
        do_backward(run, a, GradParts::Weight);
        break;
      case ActionKind::SendActivation: {
        MicrobatchContext& c = run.table->at(a.microbatch);
        PIPELINE_CHECK(c.output.defined(), "send of microbatch {}'s activation before its forward",
                       a.microbatch);
        Tag tag = run.eval ? Tag{TagKind::EvalActivation, m_stage, a.microbatch}
                           : Tag::activation(m_stage, run.global(a.microbatch));
        run.sends.push_back(
            m_comm->isend(ops::to_dtype(c.output, m_options.transfer_dtype), a.peer, tag));
        if (run.vertical_sync && !run.eval)
          run.sends.push_back(m_comm->isend(int64_message(c.input_tag).to(m_options.device), a.peer,
                                            Tag::version(m_stage, run.global(a.microbatch))));
        c.output = Tensor{};
        if (run.eval) run.table->close(a.microbatch);
        break;
      }
      case ActionKind::SendGradient: {
        auto it = run.input_grads.find(a.microbatch);
        PIPELINE_CHECK(it != run.input_grads.end(),
                       "send of microbatch {}'s input gradient before its backward", a.microbatch);
        run.sends.push_back(m_comm->isend(ops::to_dtype(it->second, m_options.transfer_dtype),
                                          a.peer,
                                          Tag::gradient(m_stage, run.global(a.microbatch))));
        run.input_grads.erase(it);
        break;
      }
      case ActionKind::RecvActivation:
        run.inputs[a.microbatch] = take_received(run, i);
        break;
      case ActionKind::RecvGradient:
        run.output_grads[a.microbatch] = take_received(run, i);
        break;
      case ActionKind::AllReduce:
        do_allreduce(run, a);
        break;
      case ActionKind::Step:
        do_step(run, a);
        break;
    }
    if (compute) {
      if (m_options.after_compute) m_options.after_compute(a, now() - start);
      if (!run.eval) {
        run.result.compute_seconds += now() - start;
        run.result.forwards += a.kind == ActionKind::Forward;
      }
    }
    if (m_options.record_trace) m_trace.push_back({rank(), a, start, now(), -1});
    // Let completed sends go, so their buffers are freed early; move the gradient buckets on.
    std::erase_if(run.sends, [](Request& r) { return r.test(); });
    progress_allreduce(run);
  }
  run.current = acts.size();
  for (auto& r : run.sends) r.wait();
  run.sends.clear();
}

TrainResult StageExecutor::train(const Schedule& schedule, const MinibatchFeed& feed,
                                 std::int64_t first_minibatch, const LrFunction& lr,
                                 const std::function<void(const MinibatchStats&)>& on_minibatch,
                                 const StepDoneFunction& on_step_done) {
  PIPELINE_CHECK_AS(ConfigError, schedule.stage_ranks == m_layout.stage_ranks,
                    "schedule '{}' has {} stages on ranks {} but the pipeline has {} stages on "
                    "ranks {}: generate the schedule for this plan",
                    schedule.name, schedule.num_stages(), schedule.stage_ranks, num_stages(),
                    m_layout.stage_ranks);
  PIPELINE_CHECK_AS(ConfigError, schedule.num_ranks() == m_comm->size(),
                    "schedule '{}' is for {} ranks but the job has {}", schedule.name,
                    schedule.num_ranks(), m_comm->size());
  if (m_options.clip_norm > 0.f) check_global_norm_exists(schedule);
  PIPELINE_CHECK_AS(ConfigError, static_cast<bool>(lr),
                    "train: the learning-rate function is empty; pass one, e.g. "
                    "[](std::int64_t) {{ return 0.01f; }} or an LrSchedule's lr_at");
  const ValidationReport report = validate(schedule);
  PIPELINE_CHECK(static_cast<bool>(feed.size), "the feed has no size function");

  Run run;
  run.schedule = &schedule;
  run.actions = &schedule.ranks[static_cast<std::size_t>(rank())];
  run.feed = &feed;
  run.first_minibatch = first_minibatch;
  run.microbatches = schedule.microbatches;
  run.stash = schedule.policy == UpdatePolicy::Stash;
  run.vertical_sync = run.stash && schedule.vertical_sync;
  run.two_buffered = schedule.policy == UpdatePolicy::DoubleBuffered;
  run.lr = &lr;
  run.on_minibatch = &on_minibatch;
  run.on_step_done = &on_step_done;
  m_stop_before = -1;
  const int capacity = std::max(1, report.ranks[static_cast<std::size_t>(rank())].peak_activations);
  // Every stage of the rank (several on an interleaved plan) gets its table and store policy.
  for_each_stage(run, [&] {
    run.table = std::make_unique<InFlightTable>(capacity);
    // 2BW selects versions by tag like vertical sync: the store keeps what a later request may use.
    m_store->set_policy(run.stash ? replicas() : 1, run.vertical_sync || run.two_buffered);
  });
  run.first_tag = m_store->latest_tag();

  const auto t0 = Clock::now();
  sample_memory(run);
  // The allocator's peak over this run alone (not evaluations or loading between runs).
  const bool allocator_counts_rank = device().is_cuda() || ranks_per_process() == 1;
  if (allocator_counts_rank) reset_memory_peak(device());
  m_run = &run;
  struct Clear {
    Run*& r;
    ~Clear() { r = nullptr; }
  } clear{m_run};
  execute(run);
  if (allocator_counts_rank) {
    run.result.peak_memory.allocator_bytes = memory_use(device()).peak_in_use_bytes;
    m_peak_memory.include(run.result.peak_memory);
  }
  run.result.seconds = seconds_since(t0);
  if (run.result.minibatches > 0) run.result.loss /= static_cast<double>(run.result.minibatches);
  // Summed over the rank's stages (one, or several on an interleaved plan).
  run.result.peak_in_flight = 0;
  run.result.peak_weight_versions = 0;
  for_each_stage(run, [&] {
    run.result.peak_in_flight += run.table->peak();
    run.result.peak_weight_versions += m_store->peak();
    PIPELINE_CHECK(run.table->size() == 0,
                   "schedule '{}' ended with microbatches {} of stage {} in flight", schedule.name,
                   run.table->open_list(), m_stage);
  });
  return run.result;
}

StageExecutor::Eval StageExecutor::evaluate(const MinibatchFeed& feed, std::int64_t batches) {
  PIPELINE_CHECK_AS(ConfigError, batches >= 0, "evaluation of {} batches", batches);
  // A forward-only schedule: batch u runs on replica u % r of every stage.
  Schedule sched;
  sched.name = "eval";
  sched.stage_ranks = m_layout.stage_ranks;
  sched.minibatches = static_cast<int>(batches);
  sched.ranks.resize(static_cast<std::size_t>(m_comm->size()));
  for (int s = 0; s < num_stages(); ++s)
    for (int u = 0; u < batches; ++u) sched.ranks[sched.rank_of(s, u)].push_back(forward(s, u));
  insert_communication(sched);

  Run run;
  run.schedule = &sched;
  run.actions = &sched.ranks[static_cast<std::size_t>(rank())];
  run.feed = &feed;
  run.eval = true;
  std::function<void(const MinibatchStats&)> none;
  run.on_minibatch = &none;
  for_each_stage(run, [&] { run.table = std::make_unique<InFlightTable>(1); });
  execute(run);
  for_each_stage(run, [] {});  // the rank's first stage is active between calls

  Tensor t = Tensor::zeros(Shape{6});
  put_double(t.data<float>(), run.eval_loss);
  put_double(t.data<float>() + 2, static_cast<double>(run.eval_correct));
  put_double(t.data<float>() + 4, static_cast<double>(run.eval_count));
  t = t.to(m_options.device);
  m_comm->allreduce_sum(t, m_comm->world());
  t = t.to(Device::cpu());
  const float* v = t.data<float>();
  Eval e;
  e.count = static_cast<std::int64_t>(std::llround(get_double(v + 4)));
  if (e.count > 0) {
    e.loss = get_double(v) / static_cast<double>(e.count);
    e.accuracy = get_double(v + 2) / static_cast<double>(e.count);
  }
  return e;
}

}  // namespace pipeline
