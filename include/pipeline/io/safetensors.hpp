// The safetensors file format (Hugging Face), for weights and checkpoints that PyTorch reads and
// writes directly: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "<name>": {"dtype": "F32", "shape": [..],
//                                            "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8, then the tensors' bytes, row-major, little-endian, at
// [begin, end) of the data section. Layouts are PyTorch's (Linear weight [out, in], conv weight
// [out, in, kh, kw]), which are this library's layouts too.
//
// Writing is atomic: the file is written to a temporary in the same directory, flushed to disk
// and renamed over the destination, so a crash never leaves a half-written file under its name.
// Reading validates everything before returning data — header length, JSON, dtypes (F32, I32,
// I64, BF16, F16), shapes, offsets in range, no overlaps or gaps, sizes equal to shape × dtype —
// and reports any problem as IoError naming the file and the tensor.
#pragma once

#include <pipeline/core/tensor.hpp>
#include <pipeline/nn/sequential.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// One tensor's entry in a file's header; offsets are relative to the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// Opens a file and validates its header; tensors are read on demand.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return m_path; }
  // In data order.
  const std::vector<SafetensorsEntry>& entries() const { return m_entries; }
  const Metadata& metadata() const { return m_metadata; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;

  Tensor read(const std::string& name) const;
  // Reads into an existing tensor of the same shape and dtype.
  void read_into(const std::string& name, Tensor& dst) const;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;

  std::string m_path;
  std::uint64_t m_data_start = 0;
  std::vector<SafetensorsEntry> m_entries;
  std::map<std::string, std::size_t> m_index;
  Metadata m_metadata;
};

// Size and zlib CRC-32 of a file's bytes.
struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
};

// Returns the digest of the bytes written, so that a manifest can record it.
FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                            const Metadata& metadata = {});
// The digest of a file as it is on disk; IoError when it cannot be read.
FileDigest digest_file(const std::string& path);
// Extends a CRC-32 over [data, data + n) (any size).
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n);
// The dtype as safetensors headers spell it: F32, I32, I64, BF16, F16.
const char* safetensors_dtype(DType dtype);
// Every tensor in file order; metadata is filled when given.
NamedTensors load_safetensors(const std::string& path, Metadata* metadata = nullptr);

// The parameters and buffers of layers [r.begin, r.end) (params[k] belongs to layer r.begin + k)
// under the names `<layer>.<param>`, e.g. conv1.weight, bn1.running_mean.
void save_parameters(const std::string& path, const Sequential& model, const ModelParams& params,
                     LayerRange r);
// Fills params (allocated from the layers' specs when empty) from a file that may hold more
// layers than r. Every missing or mis-shaped tensor is reported by name, with the expected and
// the found shape, in one IoError; params are only written once the whole file has checked out.
void load_parameters(const std::string& path, const Sequential& model, ModelParams& params,
                     LayerRange r);

}  // namespace pipeline
