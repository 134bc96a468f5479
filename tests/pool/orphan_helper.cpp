// Helper for ProcessPool.KillingTheHostLeavesNoWorkerBehind: owns a process pool whose two workers are busy
// with hanging jobs, reports their pids ("pid pid\n") on fd 3, then waits to be SIGKILLed.
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/pool/process_pool.h"

int main() {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> busy;
  kiln::ProcessPoolOptions o;
  o.workers = 2;
  o.enable_test_faults = true;
  o.observer = [&](const kiln::PoolEvent& e) {
    if (e.kind != kiln::PoolEvent::Kind::kJobSent) return;
    std::lock_guard lock(mu);
    busy.push_back(e.pid);
    cv.notify_all();
  };
  auto pool = kiln::ProcessPool::start(o);
  if (!pool.ok()) return 1;
  if (!(*pool)->wait_ready(std::chrono::seconds(60))) return 2;
  std::vector<kiln::Future<kiln::Binary>> hung;
  for (int i = 0; i < 2; ++i) {
    kiln::CompileJob j;
    j.source.name = "hang" + std::to_string(i);
    j.source.entry = "k";
    j.source.source = "extern \"C\" __global__ void k() {}\n";
    j.source.options = {"-DKILN_WORKER_TEST=hang"};
    j.target.arch = "sm_90";
    hung.push_back((*pool)->submit(j).future);
  }
  {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return busy.size() >= 2; })) return 3;
  }
  std::string line = std::to_string(busy[0]) + " " + std::to_string(busy[1]) + "\n";
  if (::write(3, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 4;
  ::close(3);
  while (true) ::pause();
}
