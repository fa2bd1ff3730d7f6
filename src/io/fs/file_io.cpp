// Safe input opening and atomic output replacement (see file_io.h for why).
#include "io/fs/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

namespace zimage {

bool path_is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool path_is_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// The folder part and the name part of a path ("a/b.png" -> "a", "b.png"; "b.png" -> ".").
void split_path(const std::string& path, std::string* dir, std::string* base) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    *dir = ".";
    *base = path;
  } else {
    *dir = slash == 0 ? "/" : path.substr(0, slash);
    *base = path.substr(slash + 1);
  }
}

// Creates a new, empty temporary file next to `target` (same folder, so rename() is atomic):
// ".<name>.<pid>-<n>.tmp", mode 0666 less the umask.
Result<ScopedFd> create_temp_beside(const std::string& target, std::string* tmp_path) {
  static std::atomic<uint64_t> counter{0};
  std::string dir, base;
  split_path(target, &dir, &base);
  if (base.size() > 200) base.resize(200);  // keep the name within NAME_MAX
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string candidate = (dir == "/" ? "" : dir) + "/." + base + "." +
                                  std::to_string(::getpid()) + "-" +
                                  std::to_string(counter.fetch_add(1)) + ".tmp";
    const int fd =
        ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
    if (fd >= 0) {
      *tmp_path = candidate;
      return ScopedFd(fd);
    }
    if (errno == EINTR || errno == EEXIST) continue;
    const int err = errno;
    if (err == ENOENT) return IoError("folder '" + dir + "' does not exist");
    if (err == ENOTDIR) return IoError("'" + dir + "' is not a folder");
    return IoError("cannot create a file in '" + dir + "': " + errno_text(err));
  }
  return IoError("cannot create a temporary file in '" + dir + "'");
}

Status write_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = size < (size_t{1} << 30) ? size : (size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(ErrorCode::kIo, errno_text(errno));
    }
    if (n == 0) return Status(ErrorCode::kIo, "the device accepted no more bytes");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Best effort: makes the rename itself durable. A failure here changes nothing for the reader.
void sync_folder_of(const std::string& path) {
  std::string dir, base;
  split_path(path, &dir, &base);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

// ---- ScopedFd
// ------------------------------------------------------------------------------------

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string describe_file_type(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// ---- inputs
// --------------------------------------------------------------------------------------

Result<ScopedFd> open_input_file(const std::string& path, uint64_t* size) {
  if (path.empty()) return InvalidArgument("empty file name");
  // O_NONBLOCK: opening a FIFO without a writer (or a tty) must not wait; the descriptor is made
  // blocking again once fstat says it is a regular file.
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such file");
    if (err == ENOTDIR)
      return NotFound(path + ": no such file (a part of the path is not a folder)");
    return IoError(path + ": cannot open: " + errno_text(err));
  }
  ScopedFd fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return IoError(path + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) {
    return IoError(path + " is " + describe_file_type(st.st_mode) + ", not a regular file");
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    return IoError(path + ": cannot set blocking mode: " + errno_text(errno));
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

Result<std::string> read_input_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  ZI_ASSIGN_OR_RETURN(ScopedFd fd, open_input_file(path, &size));
  if (size > max_bytes) {
    return FormatError(path + ": " + std::to_string(size) + " bytes, more than the " +
                       std::to_string(max_bytes) + " allowed for this file");
  }
  std::string text;
  try {
    text.resize(static_cast<size_t>(size));
  } catch (const std::exception&) {
    return OutOfMemory(path + ": out of memory reading " + std::to_string(size) + " bytes");
  }
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(path + ": read failed: " + errno_text(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != text.size()) {
    return IoError(path + ": short read (" + std::to_string(got) + " of " +
                   std::to_string(text.size()) + " bytes; the file changed while being read?)");
  }
  return text;
}

// ---- outputs
// -------------------------------------------------------------------------------------

Result<std::unique_ptr<OutputFile>> OutputFile::create(const std::string& path) {
  if (path.empty()) return InvalidArgument("empty output file name");
  std::unique_ptr<OutputFile> out(new (std::nothrow) OutputFile());
  if (!out) return OutOfMemory(path + ": out of memory");
  out->path_ = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return IoError("cannot write " + path + ": it is a directory");
    if (!S_ISREG(st.st_mode)) {
      // A device or FIFO the user named on purpose: write to it, never replace or remove it.
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd < 0) return IoError("cannot open " + path + ": " + errno_text(errno));
      out->fd_ = ScopedFd(fd);
      out->target_ = path;
      return out;
    }
    // An existing regular file, maybe through symbolic links: replace the file they point to
    // (not the links), keeping its permission bits.
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr)
      return IoError("cannot resolve " + path + ": " + errno_text(errno));
    out->target_ = resolved;
    auto tmp = create_temp_beside(out->target_, &out->tmp_path_);
    if (!tmp.ok()) return tmp.status().with_context("writing " + path);
    out->fd_ = std::move(tmp).value();
    (void)::fchmod(out->fd_.get(), st.st_mode & 07777);
    return out;
  }
  const int err = errno;
  if (err != ENOENT) return IoError("cannot write " + path + ": " + errno_text(err));
  out->target_ = path;
  auto tmp = create_temp_beside(out->target_, &out->tmp_path_);
  if (!tmp.ok()) return tmp.status().with_context("writing " + path);
  out->fd_ = std::move(tmp).value();
  return out;
}

OutputFile::~OutputFile() {
  if (!committed_ && !tmp_path_.empty()) {
    fd_ = ScopedFd();
    ::unlink(tmp_path_.c_str());
  }
}

Status OutputFile::write(const void* data, size_t size) {
  if (committed_ || fd_.get() < 0) return InternalError(path_ + ": write after commit");
  const Status st = write_all(fd_.get(), data, size);
  if (!st.ok()) return IoError("cannot write " + path_ + ": " + st.message());
  return Status::Ok();
}

Status OutputFile::commit() {
  if (committed_ || fd_.get() < 0) return InternalError(path_ + ": commit called twice");
  const int fd = fd_.release();
  // fsync first: on NFS and with delayed allocation a full disk shows up only here. Devices and
  // pipes cannot be synced (EINVAL/EROFS): nothing is lost by skipping them.
  int err = 0;
  if (::fsync(fd) != 0 && !(tmp_path_.empty() && (errno == EINVAL || errno == EROFS))) err = errno;
  if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  if (err != 0) return IoError("cannot write " + path_ + ": " + errno_text(err));
  if (!tmp_path_.empty()) {
    if (::rename(tmp_path_.c_str(), target_.c_str()) != 0) {
      return IoError("cannot replace " + path_ + ": " + errno_text(errno));
    }
    sync_folder_of(target_);
  }
  committed_ = true;
  return Status::Ok();
}

Status write_output_file(const std::string& path, const void* data, size_t size) {
  ZI_ASSIGN_OR_RETURN(auto f, OutputFile::create(path));
  ZI_TRY(f->write(data, size));
  return f->commit();
}

Status write_output_files(const std::vector<std::string>& paths,
                          const std::vector<std::vector<uint8_t>>& contents) {
  if (paths.size() != contents.size())
    return InternalError("write_output_files: " + std::to_string(paths.size()) + " paths for " +
                         std::to_string(contents.size()) + " contents");
  std::vector<std::unique_ptr<OutputFile>> files;
  for (size_t i = 0; i < paths.size(); ++i) {
    ZI_ASSIGN_OR_RETURN(auto f, OutputFile::create(paths[i]));
    ZI_TRY(f->write(contents[i].data(), contents[i].size()));
    files.push_back(std::move(f));
  }
  // Every file is complete in its temporary: only renames are left, which do not fail for lack of
  // space. An error here still leaves the files not yet renamed untouched.
  for (auto& f : files) ZI_TRY(f->commit());
  return Status::Ok();
}

Status check_output_path(const std::string& path, std::string_view flag) {
  const std::string name(flag);
  if (path.empty()) return InvalidArgument(name + ": empty file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return InvalidArgument(name + ": '" + path + "' is a directory");
    if (!S_ISREG(st.st_mode)) {
      if (::access(path.c_str(), W_OK) != 0)
        return IoError(name + ": cannot write '" + path + "': " + errno_text(errno));
      return Status::Ok();
    }
  } else if (errno != ENOENT) {
    const int err = errno;
    if (err == ENOTDIR)
      return InvalidArgument(name + ": '" + path + "': a part of the path is not a folder");
    return IoError(name + ": cannot write '" + path + "': " + errno_text(err));
  }
  // A missing or wrong folder is a wrong path (kInvalidArgument); a folder that refuses files is
  // an I/O problem, found by probing with the same kind of temporary file the write will use.
  {
    std::string dir, base;
    split_path(path, &dir, &base);
    struct stat dst {};
    if (::stat(dir.c_str(), &dst) != 0)
      return InvalidArgument(name + ": folder '" + dir + "' does not exist");
    if (!S_ISDIR(dst.st_mode)) return InvalidArgument(name + ": '" + dir + "' is not a folder");
  }
  char resolved[PATH_MAX];
  const std::string target =
      (::stat(path.c_str(), &st) == 0 && ::realpath(path.c_str(), resolved) != nullptr) ? resolved
                                                                                        : path;
  std::string tmp;
  {
    auto probe = create_temp_beside(target, &tmp);
    if (!probe.ok()) return Status(probe.status().code(), name + ": " + probe.status().message());
  }  // closed here
  ::unlink(tmp.c_str());
  return Status::Ok();
}

}  // namespace zimage
