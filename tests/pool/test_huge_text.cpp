// Moving NVRTC's code onto huge pages (pool/src/huge_text.h, what a compile worker does): the moved bytes are
// the library file's, and NVRTC compiles to the same cubin afterwards. Its own program: the move is for the life
// of the process.
#include "huge_text.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "kiln/jit/compiler.h"
#include "kiln/jit/key.h"
#include "kiln_test.h"

namespace kiln {
namespace {

using pool_detail::move_text_to_huge_pages;

KernelSource source() {
  KernelSource s;
  s.name = "huge_text";
  s.entry = "k";
  s.source = "extern \"C\" __global__ void k(float* p, int n) { for (int i = threadIdx.x; i < n; i += 32) p[i] *= 2.0f; }\n";
  return s;
}

TEST(HugeText, NamesALibraryThatIsNotLoaded) {
  auto moved = move_text_to_huge_pages("libkiln-no-such-library.so");
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(moved.status().message().find("libkiln-no-such-library.so"), std::string::npos) << moved.status().to_string();
  EXPECT_FALSE(move_text_to_huge_pages("").ok());
}

TEST(HugeText, NvrtcCompilesTheSameAfterItsCodeMoved) {
  const Target target{"sm_90a"};
  KILN_ASSERT_OK_AND_ASSIGN(Binary before, compile(source(), target));
  auto moved = move_text_to_huge_pages("libnvrtc.so");
  if (!moved.ok() && moved.status().code() == ErrorCode::kUnavailable) {
    GTEST_SKIP() << "this machine cannot back code with huge pages: " << moved.status().to_string();
  }
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_NE(moved->path.find("libnvrtc.so"), std::string::npos);
  ASSERT_GT(moved->bytes_moved, 0u);
  EXPECT_EQ(moved->bytes_moved % (2u << 20), 0u);
  EXPECT_EQ(moved->address % (2u << 20), 0u);
  EXPECT_LE(moved->huge_bytes, moved->bytes_moved);
  // The code now at the old addresses is the file's.
  std::ifstream file(moved->path, std::ios::binary);
  ASSERT_TRUE(file) << moved->path;
  std::string bytes(moved->bytes_moved, '\0');
  file.seekg(static_cast<std::streamoff>(moved->file_offset));
  ASSERT_TRUE(file.read(bytes.data(), static_cast<std::streamsize>(bytes.size())));
  EXPECT_EQ(std::memcmp(bytes.data(), reinterpret_cast<const void*>(moved->address), bytes.size()), 0);
  KILN_ASSERT_OK_AND_ASSIGN(Binary after, compile(source(), target));
  EXPECT_EQ(after.cubin, before.cubin);
  EXPECT_EQ(after.key, before.key);
}

}  // namespace
}  // namespace kiln
