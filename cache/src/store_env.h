// Internal: the file system behind StoreOptions::env (a test hook). Tests wrap RocksDB's file system to inject
// faults (tests/cache/fault_fs.h) and hand the result here; the store gives this Env to the database and to
// the staging files it writes, so every byte kiln stores through RocksDB passes the wrapper.
#pragma once

#include <rocksdb/env.h>

#include <memory>

#include "kiln/cache/store.h"

namespace kiln::cache {

struct StoreEnv {
  std::shared_ptr<rocksdb::Env> env;
};

/// The Env of `options` (the real one when none is given).
inline rocksdb::Env* env_of(const StoreOptions& options) {
  return options.env && options.env->env ? options.env->env.get() : rocksdb::Env::Default();
}

}  // namespace kiln::cache
