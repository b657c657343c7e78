// safetensors (src/io/safetensors.cpp): the reader takes a path, so the bytes go to a scratch
// file. An accepted header must keep the format's contract — every tensor's bytes are exactly its
// shape times its dtype's size, counted without overflow — and every tensor is then read, as
// load_safetensors() does.
#include "fuzz_support.hpp"

#include <pipeline/io/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  static fuzz::ScratchFile file("safetensors");
  const std::string& path = file.write(data, size);
  fuzz::accepts([&] {
    SafetensorsReader reader(path);
    for (const SafetensorsEntry& e : reader.entries()) {
      fuzz::expect("tensor bytes are shape x dtype size", [&] {
        return static_cast<unsigned __int128>(e.shape.numel()) * dtype_size(e.dtype) ==
               e.end - e.begin;
      });
      Tensor t = reader.read(e.name);
      fuzz::expect("tensor as declared", [&] {
        return t.shape() == e.shape && t.dtype() == e.dtype && t.nbytes() == e.end - e.begin;
      });
    }
  });
  return 0;
}
