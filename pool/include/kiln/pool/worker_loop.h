// The skeleton every kiln worker process runs (the compile worker, the bench worker, the tests' fake
// workers): read a framed request, run a handler, write a framed reply, until the host closes the stream.
//
// Faults end in one of three ways, the same in every worker:
//   - the host closes the stream (EOF at a frame boundary) or is gone (a write fails): exit status 0;
//   - a frame that does not parse (another protocol, another build's version, an unknown type, a stream
//     that ends inside a frame): the stream cannot be trusted any further, so a line on stderr naming the
//     fault, and exit status 2 (the host sees a worker crash with that line in its tail);
//   - the handler fails (a payload that does not decode, a request the worker cannot serve): the loop's
//     error_reply answers it when the protocol has one, else the same as a bad frame.
// Start-up is shared as well: parse_worker_args reads --fd and --parent-pid, attach_to_host makes the
// worker die with its host.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/codec/frame.h"
#include "kiln/status.h"

namespace kiln {

/// A worker's command line: `--fd N` (the socket, default 3), `--parent-pid P` (0: unknown) and any other
/// `--name value` pairs.
struct WorkerArgs {
  int fd = 3;
  long parent = 0;
  std::map<std::string, std::string, std::less<>> other;

  /// The integer value of `--name`, or `fallback` when absent.
  long get(std::string_view name, long fallback) const;
};
WorkerArgs parse_worker_args(int argc, char** argv);

/// Ties the worker's life to its host: SIGKILL when the host dies (PR_SET_PDEATHSIG), SIGPIPE ignored, and a
/// thread that ends the process as soon as the socket hangs up, even while a request is being served (a
/// compile, a kernel that never returns). False when the host had already gone: the worker should exit 0.
bool attach_to_host(const WorkerArgs& args);

/// Dies by `sig` with its default action (a sanitizer's handler would turn it into an exit): for the faults
/// tests inject into workers.
[[noreturn]] void die_by_signal(int sig);

struct WorkerLoop {
  const codec::Protocol* protocol = nullptr;
  int fd = 3;
  /// For messages on stderr: "kiln-compile-worker[1234]".
  std::string name;
  /// Serves one request frame: the reply frame to write, nullopt for a message that wants none, or an error.
  std::function<Result<std::optional<std::string>>(const codec::Frame&)> handle;
  /// Turns a handler's error into a reply frame; unset: a handler error ends the worker like a bad frame.
  std::function<Result<std::string>(const Status&)> error_reply;
};

/// Runs until the host closes the stream or a fault ends it; returns the worker's exit status (0 or 2).
int run_worker_loop(const WorkerLoop& loop);

}  // namespace kiln
