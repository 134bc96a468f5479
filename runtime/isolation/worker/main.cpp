// kiln-bench-worker: the bench worker of kiln's tuner (kiln/runtime/isolation.h). It knows the built-in ops; a
// program with ops of its own builds its own worker the same way, registering them before handing over.
#include "kiln/runtime/bench_worker.h"
#include "kiln/runtime/builtin.h"

int main(int argc, char** argv) { return kiln::runtime::bench_worker_main(argc, argv, kiln::runtime::default_ops()); }
