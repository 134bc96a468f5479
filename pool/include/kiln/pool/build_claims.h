// BuildClaims: what the precompile gate asks before compiling a key, so that processes sharing a cache
// compile each kernel once. The pool does not know where claims live: the cache implements them
// (kiln/cache/build_claims.h, lease files in the cache folder) and the runtime plugs them in
// (runtime::make_cached_gate). Tests plug in fakes.
#pragma once

#include <string>

#include "kiln/jit/key.h"
#include "kiln/status.h"

namespace kiln {

enum class ClaimVerdict {
  kBuild,   // this process builds the key (it holds the claim, or claims are unusable here)
  kWait,    // another process builds it, or has just built it: wait for the binary to appear in the cache
  kFailed,  // its builder recorded a deterministic failure: `failure`
};

struct ClaimReply {
  ClaimVerdict verdict = ClaimVerdict::kBuild;
  Status failure;      // kFailed
  std::string holder;  // kWait: who builds it, for messages
  bool built = false;  // kWait: the build finished moments ago; the binary is (or is about to be) in the cache
  bool took_over = false;  // kBuild: from an expired claim or a dead builder
};

/// Implementations are thread-safe and never block for long (a few file operations).
class BuildClaims {
 public:
  virtual ~BuildClaims() = default;
  /// Before compiling `key`: build it, wait for someone else's build, or return their recorded failure. An
  /// implementation that cannot reach its claims answers kBuild (compiling locally loses nothing).
  virtual ClaimReply claim(const KernelKey& key) = 0;
  /// After this process's compile of a key it was told to build: `result` is OK once the binary is stored;
  /// a deterministic failure (`deterministic`) is recorded for the waiters; anything else (cancelled, crashed,
  /// shut down) gives the key back so another process builds it.
  virtual void release(const KernelKey& key, const Status& result, bool deterministic) = 0;
};

}  // namespace kiln
