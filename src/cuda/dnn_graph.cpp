#include <pipeline/core/log.hpp>
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/check.hpp>
#include <pipeline/cuda/dnn.hpp>
#include <pipeline/cuda/dnn_graph.hpp>
#include <pipeline/cuda/graph.hpp>
#include <pipeline/cuda/stream.hpp>

#include "alignment.hpp"
#include "call_workspace.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Two attributes this file sets (the handle of an operation graph and of an execution plan) are
// marked deprecated in cuDNN 9, which fires only when CUDNN_WARN_DEPRECATED is defined: as in
// dnn.cpp, silenced here.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

namespace pipeline::cuda {

namespace dnn_graph {
namespace {

// Engine configurations timed per problem, and the most workspace one may have.
constexpr int kGraphCandidates = 8;
constexpr std::int64_t kMaxWorkspace = std::int64_t{1} << 30;
constexpr int kTimedRuns = 3;

GraphConvolutions from_environment() {
  const char* v = std::getenv("PIPELINE_CUDNN_GRAPH");
  if (v == nullptr) return GraphConvolutions::Bf16;
  const std::string_view name(v);
  if (name == "none") return GraphConvolutions::None;
  if (name == "all") return GraphConvolutions::All;
  if (name != "bf16")
    log_warn("PIPELINE_CUDNN_GRAPH={} is none of none, bf16, all: bf16 it is", name);
  return GraphConvolutions::Bf16;
}
std::atomic<GraphConvolutions> g_setting{from_environment()};

enum class Pass : int { Forward = 0, BackwardData = 1, BackwardFilter = 2 };
constexpr const char* kPassNames[] = {"forward", "backward-data", "backward-filter"};

// The three tensors of every pass by role: the input side x (dx in backward-data), the filter w
// (dw in backward-filter) and the output side y (dy in both backward passes).
constexpr std::int64_t kX = 'x', kW = 'w', kY = 'y';
constexpr std::array<std::int64_t, 3> kIds{kX, kW, kY};
// The role each pass writes.
constexpr int kWrites[] = {2, 0, 1};

// What a call computes besides its shapes: the element type, what its output keeps (beta), and
// which engines may compute it.
struct Numerics {
  bool bf16 = true;    // bf16 elements, else float32
  float beta = 0.f;    // out = pass(...) + beta · out
  bool det = true;     // deterministic engines only (cuda::deterministic())
  bool exact = false;  // float32 without TF32: no tensor cores
  bool transformed = false;  // FFT and Winograd engines allowed (bf16, TF32, or asked for)
};

// Owns one backend descriptor.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    PIPELINE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &m_desc));
  }
  Descriptor(Descriptor&& o) noexcept : m_desc(std::exchange(o.m_desc, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept {
    std::swap(m_desc, o.m_desc);
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (m_desc != nullptr) (void)cudnnBackendDestroyDescriptor(m_desc);
  }
  cudnnBackendDescriptor_t get() const { return m_desc; }

  // Attribute `name` := `count` values of `type` at `values`.
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  std::int64_t count, const void* values) {
    PIPELINE_CUDNN_CHECK(cudnnBackendSetAttribute(m_desc, name, type, count, values));
    return *this;
  }
  // Attribute `name` := another descriptor.
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& d) {
    const cudnnBackendDescriptor_t raw = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  Descriptor& finalize() {
    PIPELINE_CUDNN_CHECK(cudnnBackendFinalize(m_desc));
    return *this;
  }
  // For what cuDNN may decline (an engine configuration it cannot build here).
  bool try_finalize() { return cudnnBackendFinalize(m_desc) == CUDNN_STATUS_SUCCESS; }

 private:
  cudnnBackendDescriptor_t m_desc = nullptr;
};

// What the tensor promises cuDNN: a power of two up to 16 (every element type here is at least
// 2-byte aligned).
std::int64_t alignment_of(const void* p) {
  return std::max<std::int64_t>(detail::pointer_alignment(p, 16), 2);
}

// A packed NCHW tensor of bf16 or float32 elements.
Descriptor tensor(std::int64_t id, const std::array<std::int64_t, 4>& dims, bool bf16,
                  std::int64_t alignment) {
  const std::array<std::int64_t, 4> strides{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3],
                                            1};
  const cudnnDataType_t type = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment)
      .finalize();
  return d;
}

// Cross-correlation with symmetric zero padding, dilation 1, fp32 accumulation.
Descriptor convolution(const Conv2dProblem& p) {
  const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial = 2;
  const std::array<std::int64_t, 2> dilation{1, 1}, stride{p.stride_h, p.stride_w},
      padding{p.pad_h, p.pad_w};
  Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &accumulate)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data())
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data())
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data())
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data())
      .finalize();
  return d;
}

// The elements of each role's tensor.
std::array<std::int64_t, 3> role_elements(const Conv2dProblem& p) {
  const auto i = [](int v) { return static_cast<std::int64_t>(v); };
  return {i(p.n) * p.c * p.h * p.w, i(p.m) * p.c * p.kh * p.kw,
          i(p.n) * p.m * p.out_h() * p.out_w()};
}

// Each pass's operation and the names of its attributes, its tensors by role (x, w, y).
struct OperationNames {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
constexpr OperationNames kOperations[] = {
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};

// The operation graph of one pass (alpha 1, beta as asked).
Descriptor operation_graph(cudnnHandle_t handle, Pass pass, const Conv2dProblem& p,
                           const Numerics& num, const std::array<std::int64_t, 3>& alignments) {
  const Descriptor x = tensor(kX, {p.n, p.c, p.h, p.w}, num.bf16, alignments[0]);
  const Descriptor w = tensor(kW, {p.m, p.c, p.kh, p.kw}, num.bf16, alignments[1]);
  const Descriptor y = tensor(kY, {p.n, p.m, p.out_h(), p.out_w()}, num.bf16, alignments[2]);
  const Descriptor conv = convolution(p);
  const float alpha = 1.f, beta = num.beta;
  const OperationNames& names = kOperations[static_cast<int>(pass)];
  Descriptor op(names.type);
  op.set(names.x, x)
      .set(names.w, w)
      .set(names.y, y)
      .set(names.conv, conv)
      .set(names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(names.beta, CUDNN_TYPE_FLOAT, 1, &beta)
      .finalize();
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, op)
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .finalize();
  return graph;
}

// The engine configurations cuDNN's heuristics of `mode` rank for `graph`, best first (none when
// the mode has nothing for it).
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!heuristics.try_finalize()) return {};
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS)
    return {};
  // cuDNN fills descriptors the caller made.
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  configs.erase(configs.begin() + std::min(returned, count), configs.end());
  return configs;
}

// What cuDNN says of the engine of a configuration: its global index and numerical notes.
struct EngineInfo {
  std::int64_t index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
};

std::optional<EngineInfo> engine_info(const Descriptor& config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  EngineInfo info;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<std::int64_t>(notes.size()), &n,
                               notes.data()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  info.notes.assign(notes.begin(), notes.begin() + std::clamp<std::int64_t>(n, 0, notes.size()));
  (void)cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                 &info.index);
  return info;
}

// Whether an engine keeps the contract: products accumulated in fp32 (no reduced-precision
// reduction), the same result on every run when determinism is asked for, and for exact float32
// neither inputs rounded (TF32 tensor cores) nor a transformed domain (FFT, Winograd: their
// rounding is far from fp32's, dnn.cpp).
bool keeps_contract(const EngineInfo& engine, const Numerics& num) {
  // Engine 17 (cuDNN 9.19, H200) carries no note, yet its float32 weight gradients of
  // fashion-cnn's convolutions came out 0.7-2% from the CPU's (TF32's size): not exact.
  constexpr std::int64_t kRoundingUnnoted[] = {17};
  if (num.exact && std::ranges::find(kRoundingUnnoted, engine.index) != std::end(kRoundingUnnoted))
    return false;
  for (const auto note : engine.notes) {
    if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
    if (num.det && note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
    if (num.bf16 && note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (num.exact && (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
                      note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
      return false;
    if (!num.transformed &&
        (note == CUDNN_NUMERICAL_NOTE_FFT || note == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
         note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
         note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
         note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13))
      return false;
  }
  return true;
}

// PIPELINE_CUDNN_GRAPH_LOG=1: each choice is logged with every candidate's engine, notes and time.
bool log_choices() {
  static const bool on = [] {
    const char* v = std::getenv("PIPELINE_CUDNN_GRAPH_LOG");
    return v != nullptr && std::string_view(v) != "0";
  }();
  return on;
}

std::string describe(const EngineInfo& engine) {
  std::string s = fmt::format("engine {} notes [", engine.index);
  for (std::size_t i = 0; i < engine.notes.size(); ++i)
    s += fmt::format("{}{}", i ? " " : "", static_cast<int>(engine.notes[i]));
  return s + "]";
}

// A plan cuDNN can run, with the workspace it needs.
struct Plan {
  Descriptor plan;
  std::int64_t workspace = 0;
  EngineInfo engine;
};

std::optional<Plan> build_plan(cudnnHandle_t handle, const Descriptor& config, EngineInfo engine) {
  Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (!plan.try_finalize()) return std::nullopt;
  std::int64_t bytes = 0, n = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &n, &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes > kMaxWorkspace)
    return std::nullopt;
  return Plan{std::move(plan), bytes, std::move(engine)};
}

// Queues `plan` on the handle's stream with the pass's three tensors (x, w, y by role).
cudnnStatus_t execute(cudnnHandle_t handle, const Plan& plan, const std::array<void*, 3>& data,
                      void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kIds.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, data.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  return cudnnBackendExecute(handle, plan.plan.get(), pack.get());
}

// Milliseconds of kTimedRuns runs of `plan` after one warm-up; infinity when it fails to run.
// `data` are the call's tensors: an output that accumulates (beta != 0) is a scratch one here.
float time_plan(cudnnHandle_t handle, int device, cudaStream_t stream, const Plan& plan,
                std::array<void*, 3> data, Pass pass, const Conv2dProblem& p, const Numerics& num) {
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  std::optional<detail::CallWorkspace> ws, scratch;
  try {
    ws.emplace(device, static_cast<std::size_t>(plan.workspace), stream);
    if (num.beta != 0.f) {
      const int out = kWrites[static_cast<int>(pass)];
      const std::size_t bytes =
          static_cast<std::size_t>(role_elements(p)[out]) * (num.bf16 ? 2 : 4);
      scratch.emplace(device, bytes, stream);
      data[static_cast<std::size_t>(out)] = scratch->get();
    }
  } catch (const CudaError&) {
    return kFailed;  // no room for this candidate's workspace now
  }
  if (execute(handle, plan, data, ws->get()) != CUDNN_STATUS_SUCCESS) return kFailed;
  Event start = Event::create(device, true), stop = Event::create(device, true);
  start.record(stream);
  for (int r = 0; r < kTimedRuns; ++r)
    if (execute(handle, plan, data, ws->get()) != CUDNN_STATUS_SUCCESS) return kFailed;
  stop.record(stream);
  stop.synchronize();
  return Event::elapsed_ms(start, stop);
}

// Everything the choice depends on.
using Key = std::array<std::int64_t, 20>;

Key make_key(Pass pass, const Conv2dProblem& p, const Numerics& num,
             const std::array<std::int64_t, 3>& alignments) {
  Key key{};
  const auto shape = p.fields();
  auto at = std::copy(shape.begin(), shape.end(), key.begin());
  for (const std::int64_t v :
       {static_cast<std::int64_t>(pass), std::int64_t{num.bf16}, std::int64_t{num.beta != 0.f},
        std::int64_t{num.det}, std::int64_t{num.exact}, std::int64_t{num.transformed},
        alignments[0], alignments[1], alignments[2]})
    *at++ = v;
  return key;
}

// The chosen plan of each problem on one device and thread; nullopt: no engine qualifies.
using PlanCache = std::map<Key, std::optional<Plan>>;

PlanCache& plan_cache(int device) {
  thread_local std::map<int, PlanCache> caches;
  return caches[device];
}

// The fastest qualifying plan for `key` (or, while the stream is being captured into a CUDA
// graph, where nothing may wait, the best ranked one); nullopt when none qualifies.
std::optional<Plan> choose(cudnnHandle_t handle, int device, cudaStream_t stream, Pass pass,
                           const Conv2dProblem& p, const Numerics& num,
                           const std::array<std::int64_t, 3>& alignments,
                           const std::array<void*, 3>& data) {
  const Descriptor graph = operation_graph(handle, pass, p, num, alignments);
  std::vector<Plan> candidates;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (const Descriptor& config : engine_configs(graph, mode)) {
      if (static_cast<int>(candidates.size()) == kGraphCandidates) break;
      auto engine = engine_info(config);
      if (!engine || !keeps_contract(*engine, num)) continue;
      if (auto plan = build_plan(handle, config, std::move(*engine)))
        candidates.push_back(std::move(*plan));
    }
    if (!candidates.empty()) break;  // the fallback list only when mode A offered nothing
  }
  if (candidates.empty()) return std::nullopt;
  // One candidate, or a capture (nothing may wait): the best ranked, untimed.
  const bool timed = candidates.size() > 1 && !capturing(stream);
  std::size_t best = 0;
  float best_ms = timed ? std::numeric_limits<float>::infinity() : 0.f;
  std::string timings;
  for (std::size_t i = 0; timed && i < candidates.size(); ++i) {
    const float ms = time_plan(handle, device, stream, candidates[i], data, pass, p, num);
    if (ms < best_ms) best_ms = ms, best = i;
    if (log_choices())
      timings += fmt::format("\n  {} {:.4f} ms", describe(candidates[i].engine), ms / kTimedRuns);
  }
  if (log_choices())
    log_info("cuDNN graph {} {} beta {} [{}, {}, {}, {}] by [{}, {}, {}, {}]: {} of {}{}",
             kPassNames[static_cast<int>(pass)],
             num.bf16 ? "bf16" : (num.exact ? "exact float32" : "TF32"), num.beta, p.n, p.c, p.h,
             p.w, p.m, p.c, p.kh, p.kw, describe(candidates[best].engine), candidates.size(),
             timings);
  if (best_ms == std::numeric_limits<float>::infinity()) return std::nullopt;
  return std::move(candidates[best]);
}

bool run(Pass pass, cudaStream_t stream, int device, const Conv2dProblem& p, bool bf16, float beta,
         const void* x, const void* w, const void* y) {
  if (p.n == 0) return true;
  const DeviceGuard guard(device);
  // The handle first: its thread-local context then outlives the plans made with it.
  const cudnnHandle_t handle = dnn_handle(device, stream);
  const std::array<std::int64_t, 3> alignments{alignment_of(x), alignment_of(w), alignment_of(y)};
  const bool exact = !bf16 && !allow_tf32();
  const Numerics num{bf16, beta, deterministic(), exact, !exact || transformed_convolutions()};
  const std::array<void*, 3> data{const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  PlanCache& cache = plan_cache(device);
  const Key key = make_key(pass, p, num, alignments);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, choose(handle, device, stream, pass, p, num, alignments, data)).first;
    if (!it->second)
      log_warn(
          "cuDNN's graph API has no {}{} {} engine for the convolution of [{}, {}, {}, {}] by "
          "[{}, {}, {}, {}] (stride {}x{}, padding {}x{}) on {}: it runs through the legacy API",
          num.det ? "deterministic " : "", bf16 ? "bf16" : (num.exact ? "exact float32" : "TF32"),
          kPassNames[static_cast<int>(pass)], p.n, p.c, p.h, p.w, p.m, p.c, p.kh, p.kw, p.stride_h,
          p.stride_w, p.pad_h, p.pad_w, current_device_name());
  }
  if (!it->second) return false;
  const Plan& plan = *it->second;
  const detail::CallWorkspace ws(device, static_cast<std::size_t>(plan.workspace), stream);
  if (const cudnnStatus_t status = execute(handle, plan, data, ws.get());
      status != CUDNN_STATUS_SUCCESS) {
    // A plan that built but will not run (one chosen untimed during a capture, say): the legacy
    // path from now on, for this problem.
    log_warn(
        "cuDNN's graph API could not run its {} plan for the convolution of [{}, {}, {}, {}] "
        "by [{}, {}, {}, {}] on {} ({}): it runs through the legacy API",
        kPassNames[static_cast<int>(pass)], p.n, p.c, p.h, p.w, p.m, p.c, p.kh, p.kw,
        current_device_name(), cudnnGetErrorString(status));
    it->second.reset();
    return false;
  }
  return true;
}

}  // namespace
}  // namespace dnn_graph

void set_graph_convolutions(GraphConvolutions which) {
  dnn_graph::g_setting = which;
}
GraphConvolutions graph_convolutions() {
  return dnn_graph::g_setting;
}

bool conv2d_forward_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                         const std::uint16_t* x, const std::uint16_t* weight, std::uint16_t* y) {
  return dnn_graph::run(dnn_graph::Pass::Forward, stream, device, p, true, 0.f, x, weight, y);
}
bool conv2d_backward_data_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                               const std::uint16_t* dy, const std::uint16_t* weight,
                               std::uint16_t* dx) {
  return dnn_graph::run(dnn_graph::Pass::BackwardData, stream, device, p, true, 0.f, dx, weight,
                        dy);
}
bool conv2d_backward_filter_bf16(cudaStream_t stream, int device, const Conv2dProblem& p,
                                 const std::uint16_t* x, const std::uint16_t* dy,
                                 std::uint16_t* dweight) {
  return dnn_graph::run(dnn_graph::Pass::BackwardFilter, stream, device, p, true, 0.f, x, dweight,
                        dy);
}

bool conv2d_forward_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                              const float* x, const float* weight, float beta, float* y) {
  return dnn_graph::run(dnn_graph::Pass::Forward, stream, device, p, false, beta, x, weight, y);
}
bool conv2d_backward_data_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                    const float* dy, const float* weight, float beta, float* dx) {
  return dnn_graph::run(dnn_graph::Pass::BackwardData, stream, device, p, false, beta, dx, weight,
                        dy);
}
bool conv2d_backward_filter_graph_f32(cudaStream_t stream, int device, const Conv2dProblem& p,
                                      const float* x, const float* dy, float beta, float* dweight) {
  return dnn_graph::run(dnn_graph::Pass::BackwardFilter, stream, device, p, false, beta, x, dweight,
                        dy);
}

}  // namespace pipeline::cuda
