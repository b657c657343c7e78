// IDX files (src/data/idx.cpp), plain or gzip-compressed: read_idx() reads through zlib from a
// path, so the bytes go to a scratch file first. What it accepts must hold exactly the elements
// its dimensions declare.
#include "fuzz_support.hpp"

#include <pipeline/data/idx.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  static fuzz::ScratchFile file("idx");
  const std::string& path = file.write(data, size);
  IdxArray array;
  if (!fuzz::accepts([&] { array = read_idx(path); })) return 0;
  fuzz::expect("IDX element count", [&] {
    return !array.dims.empty() && static_cast<std::size_t>(array.numel()) == array.data.size();
  });
  return 0;
}
