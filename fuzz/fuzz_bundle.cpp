// Any bytes as a bundle file, imported into a scratch cache: entries are stored or rejected, the file is
// refused, never a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kiln/cache/bundle.h"
#include "kiln/cache/store.h"

namespace {

struct Scratch {
  std::filesystem::path dir;
  std::unique_ptr<kiln::cache::Store> store;
  Scratch() {
    dir = std::filesystem::temp_directory_path() / ("kiln-fuzz-bundle-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    kiln::cache::StoreOptions o;
    o.dir = (dir / "cache").string();
    o.role = kiln::cache::Role::kWriter;
    auto s = kiln::cache::Store::open(o);
    if (!s.ok()) std::abort();
    store = std::move(s).value();
  }
  ~Scratch() {
    store.reset();
    std::filesystem::remove_all(dir);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Scratch scratch;
  const std::string path = (scratch.dir / "bundle.json").string();
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  (void)kiln::cache::import_bundle(*scratch.store, path);
  return 0;
}
