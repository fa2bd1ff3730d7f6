#include "io/fs/mapped_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

namespace zimage {
namespace {

struct Entry {
  uint64_t id;
  uintptr_t begin, end;
  uint64_t device, inode;
};

struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;  // a handful: one per open weight file
  uint64_t next_id = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

void unregister(uint64_t id) noexcept {
  if (id == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.entries.erase(std::remove_if(r.entries.begin(), r.entries.end(),
                                 [id](const Entry& e) { return e.id == id; }),
                  r.entries.end());
}

}  // namespace

MappedFileRegistration::MappedFileRegistration(const void* base, size_t bytes, int fd) noexcept {
  struct stat st {};
  if (base == nullptr || bytes == 0 || ::fstat(fd, &st) != 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto begin = reinterpret_cast<uintptr_t>(base);
  try {
    r.entries.push_back({r.next_id, begin, begin + bytes, static_cast<uint64_t>(st.st_dev),
                         static_cast<uint64_t>(st.st_ino)});
  } catch (const std::bad_alloc&) {
    return;
  }
  id_ = r.next_id++;
}

MappedFileRegistration::~MappedFileRegistration() {
  unregister(id_);
}

MappedFileRegistration& MappedFileRegistration::operator=(MappedFileRegistration&& o) noexcept {
  if (this != &o) {
    unregister(id_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

std::optional<MappedFileSpot> find_mapped_file(const void* p) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Entry& e : r.entries) {
    if (a >= e.begin && a < e.end) return MappedFileSpot{e.device, e.inode, a - e.begin, e.end - a};
  }
  return std::nullopt;
}

}  // namespace zimage
