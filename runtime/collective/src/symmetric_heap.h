// The bookkeeping of AllReduce's symmetric heap (private to the collective library): which byte ranges of the
// peer-mapped heap are handed out, free, or freed but perhaps still read or written by a call in flight. Pure
// host logic (no CUDA): the offsets it gives depend only on the sequence of allocate/free calls, so ranks that
// make the same calls get the same offsets, which is what lets a kernel address a peer's tensor as
// peer_base + offset. Waiting for calls in flight is injected (AllReduce waits on CUDA events; tests on fakes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::runtime::detail {

class SymmetricHeap {
 public:
  /// Blocks until the calls recorded against a freed range have completed (AllReduce: event synchronisation).
  using Wait = std::function<Status()>;

  /// A heap of `bytes` (rounded down to `alignment`, a power of two) handing out offsets aligned to `alignment`.
  explicit SymmetricHeap(size_t bytes, size_t alignment = 256);

  /// First fit: the lowest free offset that holds `bytes` (rounded up to the alignment; 0 counts as one
  /// alignment unit). A freed range that is still waited on is used like a free one, in the same place (so the
  /// offset never depends on how far the GPU got), after its wait has returned. kOutOfRange names the
  /// heap's size, what is in use and what was asked.
  Result<size_t> allocate(size_t bytes);
  /// Returns the allocation at `offset` to the heap; `wait` (may be empty: nothing in flight) runs before the
  /// range is handed out again. kInvalidArgument for an offset that is not a live allocation (double free, a
  /// pointer from elsewhere); `what` names it in the message.
  Status free(size_t offset, Wait wait, const std::string& what);
  /// Takes back an allocation at once, without waiting (a collective allocate that the ranks disagreed on).
  void rollback(size_t offset);

  /// The live allocation holding [offset, offset + bytes): its start, or npos.
  size_t find(size_t offset, size_t bytes) const;
  /// Size of the live allocation starting at `offset`, or 0.
  size_t size_of(size_t offset) const;

  size_t capacity() const { return capacity_; }
  size_t alignment() const { return alignment_; }
  size_t used() const { return used_; }
  size_t live() const { return live_.size(); }
  /// A digest of the live allocations (offsets and sizes): equal on ranks that made the same calls.
  uint64_t digest() const;
  /// Runs every pending wait and forgets it (teardown; returns the first failure).
  Status drain();

  static constexpr size_t npos = static_cast<size_t>(-1);

 private:
  size_t round_up(size_t bytes) const;
  void insert_free(size_t offset, size_t bytes);

  size_t capacity_;
  size_t alignment_;
  size_t used_ = 0;
  std::map<size_t, size_t> live_;  // offset -> bytes
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  struct Retiring {
    size_t bytes;
    Wait wait;
  };
  std::map<size_t, Retiring> retiring_;  // freed ranges (inside free_) whose last calls may still be running
};

/// What one rank says about one collective allocate: exchanged with all_gather so ranks can compare.
struct AllocRecord {
  uint64_t asked = 0;    // bytes asked
  uint64_t offset = 0;   // what this rank's heap gave (SymmetricHeap::npos: it could not)
  uint64_t used = 0;     // heap bytes in use before this allocate
  uint64_t digest = 0;   // SymmetricHeap::digest() before this allocate
  std::string encode() const;  // fixed size (32 bytes), so every rank passes the same size to all_gather
  static Result<AllocRecord> decode(const std::string& s);
};

/// Every rank's record for one allocate (indexed by rank) agree: OK, or kInvalidArgument naming what differed
/// (the sizes asked, else the heaps' states) and the ranks. Pure, so every rank reaches the same verdict.
Status check_agreement(const std::vector<AllocRecord>& records);

}  // namespace kiln::runtime::detail
