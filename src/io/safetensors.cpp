#include <pipeline/io/safetensors.hpp>

#include "../core/output_file.hpp"

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <zlib.h>

namespace pipeline {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Larger headers are refused, as by the reference implementation: no real file needs more and a
// corrupt length must not make us allocate gigabytes.
constexpr std::uint64_t kMaxHeader = 100'000'000;

const char* file_dtype(DType t) {
  switch (t) {
    case DType::Float32:
      return "F32";
    case DType::Int32:
      return "I32";
    case DType::Int64:
      return "I64";
    case DType::BFloat16:
      return "BF16";
    case DType::Float16:
      return "F16";
  }
  return "?";
}

std::string shape_str(const std::vector<std::int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

}  // namespace

// --- reading -----------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::string path) : m_path(std::move(path)) {
  std::error_code ec;
  PIPELINE_CHECK_AS(IoError, fs::is_regular_file(m_path, ec),
                    "safetensors file '{}' does not exist or is not a regular file", m_path);
  const std::uint64_t file_size = fs::file_size(m_path, ec);
  PIPELINE_CHECK_AS(IoError, !ec, "cannot size safetensors file '{}': {}", m_path, ec.message());
  std::ifstream in(m_path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open safetensors file '{}': {}", m_path,
                    std::strerror(errno));

  PIPELINE_CHECK_AS(IoError, file_size >= 8,
                    "'{}' is not a safetensors file: {} bytes, too short for the 8-byte header "
                    "length",
                    m_path, file_size);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  PIPELINE_CHECK_AS(IoError, header_len <= file_size - 8,
                    "'{}' is truncated or not a safetensors file: the header length {} exceeds "
                    "the {} bytes that follow it",
                    m_path, header_len, file_size - 8);
  PIPELINE_CHECK_AS(IoError, header_len <= kMaxHeader,
                    "'{}': header length {} exceeds the {}-byte limit of the format", m_path,
                    header_len, kMaxHeader);
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  PIPELINE_CHECK_AS(IoError, in.gcount() == static_cast<std::streamsize>(header_len),
                    "'{}': could not read the {}-byte header", m_path, header_len);
  m_data_start = 8 + header_len;
  const std::uint64_t data_len = file_size - m_data_start;

  // Duplicate names are an error: a JSON object keeps only one of them.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    PIPELINE_FAIL(IoError, "'{}': the safetensors header is not valid JSON: {}", m_path, e.what());
  }
  PIPELINE_CHECK_AS(IoError, header.is_object(),
                    "'{}': the safetensors header is not a JSON object", m_path);
  PIPELINE_CHECK_AS(IoError, duplicate.empty(), "'{}': tensor '{}' appears twice in the header",
                    m_path, duplicate);

  for (auto& item : header.items()) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const std::string& name = item.key();
    auto& value = item.value();
    if (name == "__metadata__") {
      PIPELINE_CHECK_AS(IoError, value.is_object(), "'{}': __metadata__ is not a JSON object",
                        m_path);
      for (auto& [k, v] : value.items()) {
        PIPELINE_CHECK_AS(IoError, v.is_string(), "'{}': metadata '{}' is not a string", m_path, k);
        m_metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      PIPELINE_FAIL(IoError, "'{}': tensor '{}': {}", m_path, name, why);
    };
    if (!value.is_object()) bad("its header entry is not a JSON object");
    for (auto& [k, v] : value.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        bad(fmt::format("unexpected field '{}' (expected dtype, shape, data_offsets)", k));
    if (!value.contains("dtype") || !value["dtype"].is_string()) bad("no dtype string");
    if (!value.contains("shape") || !value["shape"].is_array()) bad("no shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2)
      bad("data_offsets is not a pair [begin, end]");

    SafetensorsEntry e;
    e.name = name;
    const std::string dt = value["dtype"].get<std::string>();
    if (dt == "F32")
      e.dtype = DType::Float32;
    else if (dt == "I32")
      e.dtype = DType::Int32;
    else if (dt == "I64")
      e.dtype = DType::Int64;
    else if (dt == "BF16")
      e.dtype = DType::BFloat16;
    else if (dt == "F16")
      e.dtype = DType::Float16;
    else
      bad(fmt::format("dtype '{}' is not supported (supported: F32, I32, I64, BF16, F16)", dt));

    std::vector<std::int64_t> dims;
    std::uint64_t numel = 1;
    for (auto& d : value["shape"]) {
      if (!d.is_number_unsigned())
        bad(fmt::format("shape {} has an extent that is not a non-negative integer",
                        value["shape"].dump()));
      const std::uint64_t n = d.get<std::uint64_t>();
      // At most 2^59 elements, so that their bytes (8 per element at most) fit 64 bits: a shape
      // of 2^62 F32 elements wrapped to 0 bytes and matched empty data_offsets.
      if (n > (std::uint64_t{1} << 48) || (n != 0 && numel > (std::uint64_t{1} << 59) / n))
        bad(fmt::format("shape {} is implausibly large", value["shape"].dump()));
      numel *= n;
      dims.push_back(static_cast<std::int64_t>(n));
    }
    e.shape = Shape(dims);
    for (auto& o : value["data_offsets"])
      if (!o.is_number_unsigned()) bad("data_offsets are not non-negative integers");
    e.begin = value["data_offsets"][0].get<std::uint64_t>();
    e.end = value["data_offsets"][1].get<std::uint64_t>();
    if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] run backwards", e.begin, e.end));
    if (e.end > data_len)
      bad(fmt::format(
          "data_offsets [{}, {}] run past the {} bytes of data in the file (truncated?)", e.begin,
          e.end, data_len));
    const std::uint64_t bytes = numel * dtype_size(e.dtype);
    if (e.end - e.begin != bytes)
      bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}",
                      shape_str(dims), dt, bytes, e.begin, e.end, e.end - e.begin));
    m_entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlaps, no gaps, nothing after.
  std::sort(m_entries.begin(), m_entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const SafetensorsEntry* prev = nullptr;
  for (auto& e : m_entries) {
    PIPELINE_CHECK_AS(IoError, e.begin >= at,
                      "'{}': tensor '{}' at [{}, {}) overlaps tensor '{}' at [{}, {})", m_path,
                      e.name, e.begin, e.end, prev ? prev->name : "", prev ? prev->begin : 0, at);
    PIPELINE_CHECK_AS(IoError, e.begin == at,
                      "'{}': {} unused bytes before tensor '{}' at offset {} in the data section",
                      m_path, e.begin - at, e.name, e.begin);
    at = e.end;
    prev = &e;
  }
  PIPELINE_CHECK_AS(IoError, at == data_len,
                    "'{}': the tensors cover {} bytes but the data section holds {}; the file "
                    "has trailing bytes",
                    m_path, at, data_len);
  for (std::size_t i = 0; i < m_entries.size(); ++i) m_index[m_entries[i].name] = i;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_entries[it->second];
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  PIPELINE_CHECK_AS(IoError, e != nullptr, "'{}' holds no tensor named '{}'", m_path, name);
  return *e;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  read_into(name, t);
  return t;
}

void SafetensorsReader::read_into(const std::string& name, Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  PIPELINE_CHECK_AS(IoError, dst.shape() == e.shape && dst.dtype() == e.dtype,
                    "'{}': tensor '{}' is {} {} but the destination is {} {}", m_path, name,
                    e.shape, file_dtype(e.dtype), dst.shape(), file_dtype(dst.dtype()));
  if (!dst.device().is_cpu()) {
    // A device destination (a GPU run's parameters) is read on the host and copied over.
    Tensor host = Tensor::empty(dst.shape(), dst.dtype());
    read_into(name, host);
    dst.copy_from(host);
    return;
  }
  if (e.end == e.begin) return;
  std::ifstream in(m_path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(m_data_start + e.begin));
  in.read(static_cast<char*>(dst.raw()), static_cast<std::streamsize>(e.end - e.begin));
  PIPELINE_CHECK_AS(
      IoError, in.good() && in.gcount() == static_cast<std::streamsize>(e.end - e.begin),
      "'{}': reading tensor '{}' failed (the file changed or is unreadable)", m_path, name);
}

NamedTensors load_safetensors(const std::string& path, Metadata* metadata) {
  SafetensorsReader reader(path);
  NamedTensors out;
  for (auto& e : reader.entries()) out.emplace_back(e.name, reader.read(e.name));
  if (metadata) *metadata = reader.metadata();
  return out;
}

// --- writing -----------------------------------------------------------------------------------

FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata) {
  // Device tensors (a GPU run's parameters) are copied to the host before anything is written;
  // host tensors are shared, not copied.
  NamedTensors host_tensors;
  host_tensors.reserve(tensors.size());
  for (auto& [name, t] : tensors)
    host_tensors.emplace_back(name, t.defined() ? t.to(Device::cpu()) : t);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) m[k] = v;
  }
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    PIPELINE_CHECK_AS(ConfigError, !name.empty() && name != "__metadata__",
                      "safetensors: '{}' is not a usable tensor name", name);
    PIPELINE_CHECK_AS(ConfigError, names.insert(name).second,
                      "safetensors: two tensors are named '{}'", name);
    PIPELINE_CHECK_AS(ConfigError, t.defined(), "safetensors: tensor '{}' is undefined", name);
    header[name] = {{"dtype", file_dtype(t.dtype())},
                    {"shape", t.shape().dims()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    PIPELINE_FAIL(ConfigError, "safetensors: cannot encode the header of '{}': {}", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i)
    len_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);

  detail::OutputFile out(path);
  // The digest covers exactly the bytes written, so a reader can check the file against it.
  FileDigest digest;
  digest.crc32 = static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0));
  auto put = [&](const void* data, std::size_t n, const char* what) {
    out.write(data, n, what);
    digest.crc32 = crc32_update(digest.crc32, data, n);
    digest.bytes += n;
  };
  put(len_bytes, 8, "writing the header");
  put(text.data(), text.size(), "writing the header");
  for (auto& [name, t] : host_tensors) put(t.raw(), t.nbytes(), "writing tensor data");
  out.commit();
  return digest;
}

const char* safetensors_dtype(DType dtype) {
  return file_dtype(dtype);
}

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
  // zlib takes 32-bit lengths: feed larger buffers in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, p, piece);
    p += piece;
    n -= piece;
  }
  return static_cast<std::uint32_t>(c);
}

FileDigest digest_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open '{}' to check it: {}", path,
                    std::strerror(errno));
  FileDigest d;
  d.crc32 = static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0));
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    d.crc32 = crc32_update(d.crc32, buf.data(), got);
    d.bytes += got;
  }
  PIPELINE_CHECK_AS(IoError, in.eof(), "reading '{}' to check it failed", path);
  return d;
}

// --- model parameters --------------------------------------------------------------------------

void save_parameters(const std::string& path, const Sequential& model, const ModelParams& params,
                     LayerRange r) {
  PIPELINE_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= model.size(),
                 "save_parameters: layer range [{}, {}) out of bounds for {} layers", r.begin,
                 r.end, model.size());
  PIPELINE_CHECK(static_cast<int>(params.size()) == r.size(),
                 "save_parameters: parameters for {} layers given for a range of {}", params.size(),
                 r.size());
  NamedTensors tensors;
  for (int i = r.begin; i < r.end; ++i) {
    const Layer& layer = model.layer(i);
    const LayerParams& p = params[static_cast<std::size_t>(i - r.begin)];
    const auto specs = layer.parameters();
    const auto bufs = layer.buffers();
    PIPELINE_CHECK(p.params.size() == specs.size() && p.buffers.size() == bufs.size(),
                   "save_parameters: layer '{}' has {} parameters and {} buffers, given {} and {}",
                   layer.name(), specs.size(), bufs.size(), p.params.size(), p.buffers.size());
    for (std::size_t j = 0; j < specs.size(); ++j)
      tensors.emplace_back(layer.name() + "." + specs[j].name, p.params[j]);
    for (std::size_t j = 0; j < bufs.size(); ++j)
      tensors.emplace_back(layer.name() + "." + bufs[j].name, p.buffers[j]);
  }
  save_safetensors(path, tensors,
                   {{"format", "pipeline.params/1"},
                    {"model", model.name()},
                    {"layers", fmt::format("{}:{}", r.begin, r.end)}});
}

void load_parameters(const std::string& path, const Sequential& model, ModelParams& params,
                     LayerRange r) {
  PIPELINE_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= model.size(),
                 "load_parameters: layer range [{}, {}) out of bounds for {} layers", r.begin,
                 r.end, model.size());
  SafetensorsReader reader(path);
  ModelParams fresh;
  const bool allocate = params.empty();
  if (!allocate)
    PIPELINE_CHECK(static_cast<int>(params.size()) == r.size(),
                   "load_parameters: parameters for {} layers given for a range of {}",
                   params.size(), r.size());

  std::vector<std::string> missing, misshapen;
  std::vector<std::pair<std::string, Tensor>> plan;  // file name -> destination
  for (int i = r.begin; i < r.end; ++i) {
    const Layer& layer = model.layer(i);
    const auto k = static_cast<std::size_t>(i - r.begin);
    if (allocate) {
      LayerParams lp;
      for (auto& s : layer.parameters()) lp.params.push_back(Tensor::empty(s.shape, s.dtype));
      for (auto& s : layer.buffers()) lp.buffers.push_back(Tensor::empty(s.shape, s.dtype));
      fresh.push_back(std::move(lp));
    }
    LayerParams& dst = allocate ? fresh.back() : params[k];
    const auto specs = layer.parameters();
    const auto bufs = layer.buffers();
    PIPELINE_CHECK(dst.params.size() == specs.size() && dst.buffers.size() == bufs.size(),
                   "load_parameters: layer '{}' has {} parameters and {} buffers, given {} and {}",
                   layer.name(), specs.size(), bufs.size(), dst.params.size(), dst.buffers.size());
    auto want = [&](const ParamSpec& s, Tensor& t) {
      const std::string name = layer.name() + "." + s.name;
      const SafetensorsEntry* e = reader.find(name);
      if (!e) {
        missing.push_back(name);
      } else if (e->shape != s.shape || e->dtype != s.dtype) {
        misshapen.push_back(fmt::format("{} (expected {} {}, found {} {})", name, s.shape,
                                        file_dtype(s.dtype), e->shape, file_dtype(e->dtype)));
      } else {
        PIPELINE_CHECK(t.shape() == s.shape && t.dtype() == s.dtype,
                       "load_parameters: the tensor given for '{}' is {} but the layer declares {}",
                       name, t.shape(), s.shape);
        plan.emplace_back(name, t);
      }
    };
    for (std::size_t j = 0; j < specs.size(); ++j) want(specs[j], dst.params[j]);
    for (std::size_t j = 0; j < bufs.size(); ++j) want(bufs[j], dst.buffers[j]);
  }
  if (!missing.empty() || !misshapen.empty()) {
    std::string msg = fmt::format("'{}' does not fit layers [{}, {}) of model '{}':", path, r.begin,
                                  r.end, model.name());
    if (!missing.empty()) msg += fmt::format(" missing tensors: {};", fmt::join(missing, ", "));
    if (!misshapen.empty())
      msg += fmt::format(" mis-shaped tensors: {};", fmt::join(misshapen, ", "));
    msg.pop_back();
    PIPELINE_FAIL(IoError, "{}", msg);
  }
  for (auto& [name, t] : plan) reader.read_into(name, t);
  if (allocate) params = std::move(fresh);
}

}  // namespace pipeline
