// Prints the key of test_kernels::probe_source(argv[1]) for sm_90: the other process of the key tests.
#include <cstdio>

#include "kiln/jit/key.h"
#include "shared_kernels.h"

int main(int argc, char** argv) {
  kiln::KernelSource src = kiln::test_kernels::probe_source(argc > 1 ? argv[1] : "");
  std::printf("%s\n", kiln::make_key(src, kiln::Target{"sm_90"}).hex().c_str());
  return 0;
}
