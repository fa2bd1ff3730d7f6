// The read-only file mappings the weight readers hold, by address: which file (device and inode)
// and which offset a pointer into one of them stands for. The read-ahead's gate
// (io/fs/prefetch.h, core/read_gate.h) needs it: the CUDA uploader copies from a host address,
// and only a mapping of a file the read-ahead reads is worth waiting for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace zimage {

struct MappedFileSpot {
  uint64_t device = 0;  // st_dev
  uint64_t inode = 0;   // st_ino
  uint64_t offset = 0;  // of the address in the file
  uint64_t left = 0;    // bytes of the mapping from the address on
};

// Registers [base, base + bytes) as a mapping of the file `fd` refers to, from file offset 0,
// until destroyed. A registration that cannot be made (fstat fails, no memory) is empty: its
// mapping is simply not found, which costs a gate nothing but its wait.
class MappedFileRegistration {
 public:
  MappedFileRegistration() = default;
  MappedFileRegistration(const void* base, size_t bytes, int fd) noexcept;
  ~MappedFileRegistration();
  MappedFileRegistration(MappedFileRegistration&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  MappedFileRegistration& operator=(MappedFileRegistration&& o) noexcept;
  MappedFileRegistration(const MappedFileRegistration&) = delete;
  MappedFileRegistration& operator=(const MappedFileRegistration&) = delete;

  bool registered() const { return id_ != 0; }

 private:
  uint64_t id_ = 0;
};

// The registered mapping holding `p`, if any.
std::optional<MappedFileSpot> find_mapped_file(const void* p) noexcept;

}  // namespace zimage
