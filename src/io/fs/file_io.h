// Opening the files zimage reads and replacing the files it writes, safely. Why one module: every
// input may be something other than the user thinks (a FIFO that blocks the first read forever, a
// directory, a device), and every output may replace something the user cares about. So:
//   - inputs are opened non-blocking and checked with fstat before a single byte is read: only
//     regular files are accepted, and the message says what the path really is;
//   - outputs are written to a temporary file in the target's folder, flushed to disk and renamed
//     over the target, so a failed write (full disk, quota, EIO) leaves the old file as it was
//     and removes only the temporary file; the error carries the real errno ("No space left on
//     device"). A target that exists and is not a regular file (/dev/null, /dev/stdout, a FIFO)
//     is written in place and never removed or replaced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace zimage {

// An open file descriptor, closed on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Whether `path` exists and is a regular file / a folder (symbolic links followed).
bool path_is_file(const std::string& path);
bool path_is_folder(const std::string& path);

// What a path is, in words for messages: "a directory", "a FIFO", "a character device", ...
std::string describe_file_type(unsigned mode);

// Opens `path` for reading (blocking reads), after checking without blocking that it is a regular
// file. `size` receives its size. kNotFound for a missing path; kIo for anything that is not a
// regular file ("<path> is a FIFO, not a regular file") or cannot be opened.
Result<ScopedFd> open_input_file(const std::string& path, uint64_t* size = nullptr);

// The whole of a regular file, at most `max_bytes` (kFormat above that, naming the limit).
Result<std::string> read_input_file(const std::string& path, uint64_t max_bytes);

// A file being written: data goes to a temporary sibling until commit() renames it over the
// target (or, for an existing non-regular target, straight to it). Destroying an uncommitted
// OutputFile removes the temporary file and nothing else.
class OutputFile {
 public:
  static Result<std::unique_ptr<OutputFile>> create(const std::string& path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  Status write(const void* data, size_t size);
  // Flushes to disk (fsync) and renames over the target. After an error nothing was replaced.
  Status commit();
  const std::string& path() const { return path_; }

 private:
  OutputFile() = default;
  std::string path_;      // as given (messages)
  std::string target_;    // where it ends up (symbolic links resolved)
  std::string tmp_path_;  // empty when writing in place
  ScopedFd fd_;
  bool committed_ = false;
};

// create + write + commit.
Status write_output_file(const std::string& path, const void* data, size_t size);
inline Status write_output_file(const std::string& path, std::string_view bytes) {
  return write_output_file(path, bytes.data(), bytes.size());
}

// Checks before any work is done that `path` can be written: its folder exists and accepts a new
// file (probed by creating and removing a temporary file), and the path is not a folder.
// `flag` names the option in messages ("--output").
Status check_output_path(const std::string& path, std::string_view flag);

// Writes several files all or nothing: every file goes to its temporary first, and only when all
// were written are they renamed into place. On error no target was touched.
Status write_output_files(const std::vector<std::string>& paths,
                          const std::vector<std::vector<uint8_t>>& contents);

}  // namespace zimage
