// Writes straight into a cache's RocksDB column families, bypassing the Store: to plant corrupt, foreign or
// other-format values where a Store would never write them.
#pragma once

#include <rocksdb/db.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::cache::testing {

inline void raw_put(const std::string& dir, const std::string& cf_name, const std::string& key,
                    const std::string& value) {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfds;
  for (const char* n : {"default", "binaries", "timings", "decisions", "meta"}) cfds.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), dir + "/db", cfds, &handles, &db).ok());
  size_t i = 0;
  while (cfds[i].name != cf_name) ++i;
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], key, value).ok());
  for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  delete db;
}

}  // namespace kiln::cache::testing
