// The bench worker of the isolation GPU tests: kiln-bench-worker plus the planted op, registered exactly as the
// test process registers it. This is how a program isolates its own ops (kiln/runtime/isolation.h).
#include <cstdio>

#include "kiln/runtime/bench_worker.h"
#include "test_isolation_planted.h"

int main(int argc, char** argv) {
  if (kiln::Status s = kiln::runtime::planted::register_ops(); !s.ok()) {
    std::fprintf(stderr, "test_isolation_worker: %s\n", s.to_string().c_str());
    return 1;
  }
  return kiln::runtime::bench_worker_main(argc, argv, kiln::runtime::default_ops());
}
