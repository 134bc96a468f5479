// kiln: JIT-compile and autotune CUDA kernels from the command line.
#include "commands.h"

int main(int argc, char** argv) { return kiln::cli::run(argc, argv, /*run_commands=*/true); }
