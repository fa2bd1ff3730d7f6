// See bundle.h. Files are streamed through zlib in 256 KiB pieces on both sides of the disk, so
// unpacking and verifying never hold a whole file in memory.
#include "io/fs/bundle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace zimage {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'Z', 'I', 'B', 'U', 'N', 'D', 'L', '1'};
constexpr size_t kChunk = size_t{256} << 10;
constexpr uint32_t kMaxFiles = 100000;

std::string errno_text(int e) {
  return std::strerror(e);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads little-endian integers and byte strings from a bounded view; any overrun sets `bad`.
struct Reader {
  std::string_view s;
  size_t pos = 0;
  bool bad = false;
  uint64_t le(int bytes) {
    if (s.size() - pos < static_cast<size_t>(bytes)) {
      bad = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + i])) << (8 * i);
    pos += bytes;
    return v;
  }
  std::string_view bytes(size_t n) {
    if (s.size() - pos < n) {
      bad = true;
      return {};
    }
    std::string_view v = s.substr(pos, n);
    pos += n;
    return v;
  }
};

bool safe_path(std::string_view p) {
  if (p.empty() || p.front() == '/' || p.find('\0') != std::string_view::npos ||
      p.find('\\') != std::string_view::npos)
    return false;
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find('/', start), p.size());
    const std::string_view part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

uint32_t crc_of(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status write_all(int fd, const unsigned char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return IoError(path + ": cannot write: " + errno_text(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status unpack_file(const BundleFile& f, std::string_view bytes, const std::string& path) {
  Fd out;
  out.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out.fd < 0) return IoError(path + ": cannot create: " + errno_text(errno));
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return InternalError("zlib inflateInit failed");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&z, inflateEnd);
  const std::string_view packed = bytes.substr(f.packed_offset, f.packed_size);
  size_t in_pos = 0;
  std::vector<unsigned char> buf(kChunk);
  uint64_t written = 0;
  uint32_t crc = crc_of(0, nullptr, 0);
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (z.avail_in == 0 && in_pos < packed.size()) {
      const size_t n = std::min<size_t>(packed.size() - in_pos, 1u << 30);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data() + in_pos));
      z.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    z.next_out = buf.data();
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END)
      return FormatError("bundle: " + f.path + ": damaged zlib stream (" + std::to_string(rc) +
                         ")");
    const size_t got = buf.size() - z.avail_out;
    if (written + got > f.size)
      return FormatError("bundle: " + f.path + ": unpacks past its size " + std::to_string(f.size));
    ZI_TRY(write_all(out.fd, buf.data(), got, path));
    crc = crc_of(crc, buf.data(), got);
    written += got;
    if (rc == Z_OK && got == 0 && z.avail_in == 0 && in_pos == packed.size())
      return FormatError("bundle: " + f.path + ": zlib stream ends early");
  }
  if (written != f.size || crc != f.crc32)
    return FormatError("bundle: " + f.path + ": unpacked " + std::to_string(written) +
                       " bytes that do not match the manifest");
  if (::close(out.fd) != 0) {
    out.fd = -1;
    return IoError(path + ": cannot write: " + errno_text(errno));
  }
  out.fd = -1;
  return Status::Ok();
}

}  // namespace

Result<std::string> pack_folder(const std::string& dir, int level) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound(dir + ": no such folder");
  std::vector<std::string> paths;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) continue;
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (!fs::is_regular_file(st))
      return InvalidArgument(rel + ": not a regular file or folder (a link or a device)");
    if (!safe_path(rel)) return InvalidArgument(rel + ": not a plain relative path");
    paths.push_back(rel);
  }
  if (ec) return IoError(dir + ": cannot list: " + ec.message());
  if (paths.size() > kMaxFiles) return InvalidArgument(dir + ": more than 100000 files");
  std::sort(paths.begin(), paths.end());

  std::string manifest(kMagic, sizeof kMagic), data;
  put_le(manifest, paths.size(), 4);
  for (const std::string& rel : paths) {
    std::string content;
    {
      std::FILE* f = std::fopen((dir + "/" + rel).c_str(), "rb");
      if (!f) return IoError(dir + "/" + rel + ": cannot open: " + errno_text(errno));
      char buf[1 << 16];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) content.append(buf, n);
      const bool failed = std::ferror(f) != 0;
      std::fclose(f);
      if (failed) return IoError(dir + "/" + rel + ": cannot read");
    }
    uLongf packed_size = compressBound(static_cast<uLong>(content.size()));
    std::string packed(packed_size, '\0');
    if (compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                  reinterpret_cast<const Bytef*>(content.data()),
                  static_cast<uLong>(content.size()), level) != Z_OK)
      return InternalError(rel + ": zlib compress2 failed");
    packed.resize(packed_size);
    if (rel.size() > 0xffff) return InvalidArgument(rel + ": path too long");
    put_le(manifest, rel.size(), 2);
    manifest += rel;
    put_le(manifest, content.size(), 8);
    put_le(manifest, crc_of(crc_of(0, nullptr, 0), content.data(), content.size()), 4);
    put_le(manifest, packed.size(), 8);
    data += packed;
  }
  return manifest + data;
}

Result<Bundle> Bundle::parse(std::string_view bytes) {
  Reader r{bytes};
  if (r.bytes(sizeof kMagic) != std::string_view(kMagic, sizeof kMagic))
    return FormatError("bundle: bad magic (not a zimage bundle)");
  const uint64_t count = r.le(4);
  if (r.bad || count > kMaxFiles) return FormatError("bundle: bad file count");
  Bundle b;
  b.bytes_ = bytes;
  for (uint64_t i = 0; i < count; ++i) {
    BundleFile f;
    const size_t len = static_cast<size_t>(r.le(2));
    f.path = std::string(r.bytes(len));
    f.size = r.le(8);
    f.crc32 = static_cast<uint32_t>(r.le(4));
    f.packed_size = r.le(8);
    if (r.bad) return FormatError("bundle: manifest truncated at file " + std::to_string(i));
    if (!safe_path(f.path))
      return FormatError("bundle: file " + std::to_string(i) + " has an unsafe path");
    b.files_.push_back(std::move(f));
  }
  uint64_t offset = r.pos;
  for (BundleFile& f : b.files_) {
    if (f.packed_size > bytes.size() - offset)
      return FormatError("bundle: " + f.path + ": data runs past the end of the bundle");
    f.packed_offset = offset;
    offset += f.packed_size;
  }
  if (offset != bytes.size())
    return FormatError("bundle: " + std::to_string(bytes.size() - offset) + " trailing bytes");
  b.crc32_ = crc_of(crc_of(0, nullptr, 0), bytes.data(), bytes.size());
  return b;
}

uint64_t Bundle::unpacked_bytes() const {
  uint64_t n = 0;
  for (const BundleFile& f : files_) n += f.size;
  return n;
}

Status Bundle::unpack(const std::string& dir) const {
  for (const BundleFile& f : files_) {
    const fs::path target = fs::path(dir) / f.path;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) return IoError(target.parent_path().string() + ": cannot create: " + ec.message());
    ZI_TRY(unpack_file(f, bytes_, target.string()));
  }
  return Status::Ok();
}

Status Bundle::verify(const std::string& dir) const {
  std::vector<char> buf(kChunk);
  for (const BundleFile& f : files_) {
    const std::string path = dir + "/" + f.path;
    Fd in;
    in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in.fd < 0) return NotFound(path + ": " + errno_text(errno));
    struct stat st {};
    if (::fstat(in.fd, &st) != 0 || !S_ISREG(st.st_mode))
      return FormatError(path + ": not a regular file");
    if (static_cast<uint64_t>(st.st_size) != f.size)
      return FormatError(path + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                         std::to_string(f.size));
    uint32_t crc = crc_of(0, nullptr, 0);
    uint64_t total = 0;
    for (;;) {
      const ssize_t n = ::read(in.fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(path + ": cannot read: " + errno_text(errno));
      if (n == 0) break;
      crc = crc_of(crc, buf.data(), static_cast<size_t>(n));
      total += static_cast<uint64_t>(n);
    }
    if (total != f.size || crc != f.crc32)
      return FormatError(path + ": content differs from the manifest (CRC-32 mismatch)");
  }
  return Status::Ok();
}

}  // namespace zimage
