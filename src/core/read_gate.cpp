#include "core/read_gate.h"

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

namespace zimage {
namespace {

// A fixed table, so that registering and asking never allocate.
struct Gates {
  std::mutex mu;
  std::array<std::shared_ptr<ReadGate>, kMaxReadGates> slots;
  std::atomic<int> count{0};
};

Gates& gates() {
  static Gates g;
  return g;
}

}  // namespace

bool add_read_gate(std::shared_ptr<ReadGate> gate) noexcept {
  if (!gate) return false;
  Gates& g = gates();
  std::lock_guard<std::mutex> lock(g.mu);
  for (auto& slot : g.slots) {
    if (!slot) {
      slot = std::move(gate);
      g.count.fetch_add(1);
      return true;
    }
  }
  return false;
}

void remove_read_gate(const ReadGate* gate) noexcept {
  Gates& g = gates();
  std::lock_guard<std::mutex> lock(g.mu);
  for (auto& slot : g.slots) {
    if (slot && slot.get() == gate) {
      slot.reset();
      g.count.fetch_sub(1);
    }
  }
}

void wait_readable(const void* p, size_t n) noexcept {
  Gates& g = gates();
  if (g.count.load(std::memory_order_acquire) == 0 || n == 0) return;
  std::array<std::shared_ptr<ReadGate>, kMaxReadGates> now;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    now = g.slots;  // copies shared_ptrs: no allocation
  }
  for (const auto& gate : now)
    if (gate) gate->wait_readable(p, n);
}

}  // namespace zimage
