// install_crash_trace() (kiln/runtime/comm.h): the stack of a crashing rank process, printed by a signal handler.
// The handler writes with write(2) into a stack buffer; backtrace() and dladdr() are not async-signal-safe, which
// a diagnostic on its way to the default action accepts.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kiln/runtime/comm.h"

namespace kiln::runtime {

namespace {

void crash_trace_handler(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  char line[512];
  int len = std::snprintf(line, sizeof line, "kiln crash trace: signal %d in pid %d\n", sig, getpid());
  if (write(2, line, len) < 0) {}
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    if (dladdr(frames[i], &info) && info.dli_fname) {
      len = std::snprintf(line, sizeof line, "  #%d %s+0x%lx\n", i, info.dli_fname,
                          static_cast<unsigned long>(reinterpret_cast<char*>(frames[i]) - static_cast<char*>(info.dli_fbase)));
    } else {
      len = std::snprintf(line, sizeof line, "  #%d %p\n", i, frames[i]);
    }
    if (write(2, line, len) < 0) {}
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void install_crash_trace() {
  if (!std::getenv("KILN_CRASH_TRACE")) return;
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT}) signal(sig, crash_trace_handler);
}

}  // namespace kiln::runtime
