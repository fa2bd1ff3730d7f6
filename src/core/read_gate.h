// Lets code that copies out of memory-mapped files wait for a read-ahead to bring the bytes into
// the page cache, instead of faulting them in a few pages at a time.
//
// Why: from a cold page cache, a loader that copies a mapped weight file on 16 threads faults
// every thread's next pages in with small synchronous reads (the kernel's read-around window,
// typically 128 KiB), and those small reads compete on the disk with the large sequential ones of
// the read-ahead (io/fs/prefetch.h). Session 15 measured such a load reading at 1.05 GB/s where
// `dd` read the same files at 1.70 GB/s. Waiting here until the read-ahead has read a piece
// leaves the disk to the large reads only.
//
// The gates are process-wide because the copy happens deep in a backend (the CUDA uploader) that
// knows host addresses, not files; a gate decides for itself whether an address is one it
// covers (io/fs/mapped_files.h tells a file mapping's file and offset) and returns at once
// otherwise. With no gate registered, wait_readable() is one atomic load.
#pragma once

#include <cstddef>
#include <memory>

namespace zimage {

class ReadGate {
 public:
  virtual ~ReadGate() = default;
  // Returns once [p, p + n) can be read without waiting on the disk page by page, or when this
  // gate cannot bring it in (not its file, its read-ahead stopped or failed). Never throws.
  virtual void wait_readable(const void* p, size_t n) noexcept = 0;
};

// Registers a gate until remove_read_gate(); false when the process already has kMaxReadGates
// gates (the copies then simply fault, as without one). A gate stays alive while a wait_readable
// call is inside it, even after its removal (callers hold a shared_ptr for the call's duration).
inline constexpr int kMaxReadGates = 8;
bool add_read_gate(std::shared_ptr<ReadGate> gate) noexcept;
void remove_read_gate(const ReadGate* gate) noexcept;

// Asks every registered gate in turn; returns at once when there is none.
void wait_readable(const void* p, size_t n) noexcept;

}  // namespace zimage
