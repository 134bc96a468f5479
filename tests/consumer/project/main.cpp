// Compiles a kernel through an installed kiln and prints its key.
#include <cstdio>

#include <kiln/jit.h>

int main() {
  kiln::KernelSource src;
  src.name = "consumer";
  src.entry = "k";
  src.source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n";
  auto bin = kiln::compile(src, kiln::Target{"sm_90"});
  if (!bin.ok()) {
    std::fprintf(stderr, "%s\n", bin.status().to_string_with_detail().c_str());
    return 1;
  }
  std::printf("key %s, %zu bytes of cubin\n", bin->key.hex().c_str(), bin->cubin.size());
  return 0;
}
