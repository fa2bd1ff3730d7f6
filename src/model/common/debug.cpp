// The directory dump sink: downloads each wanted tensor as float32 and writes it as .npy, so
// dumps can be compared with NumPy against tensors dumped from the diffusers reference.
#include "model/common/debug.h"

#include <cstdio>
#include <filesystem>

#include "core/log.h"
#include "io/fs/file_io.h"

namespace zimage {

Status write_npy_f32(const std::string& path, const Tensor& host_f32) {
  if (!host_f32.defined() || host_f32.dtype() != DType::kF32 || host_f32.device() != Device::kCPU) {
    return InvalidArgument("write_npy_f32(" + path + "): needs a float32 host tensor, got " +
                           (host_f32.defined() ? host_f32.describe() : std::string("undefined")));
  }
  std::string shape = "(";
  for (int64_t d : host_f32.shape()) shape += std::to_string(d) + ", ";
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic (6) + version (2) + header length (2) + header + '\n' must be a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  const char prefix[10] = {'\x93',
                           'N',
                           'U',
                           'M',
                           'P',
                           'Y',
                           1,
                           0,
                           static_cast<char>(hlen & 0xff),
                           static_cast<char>(hlen >> 8)};
  ZI_ASSIGN_OR_RETURN(auto f, OutputFile::create(path));  // temporary + rename: io/fs/file_io.h
  ZI_TRY(f->write(prefix, sizeof(prefix)));
  ZI_TRY(f->write(header.data(), header.size()));
  ZI_TRY(f->write(host_f32.data(), host_f32.nbytes()));
  return f->commit();
}

namespace {

class DirectoryDumpSink final : public DebugSink {
 public:
  DirectoryDumpSink(std::string dir, std::string filter)
      : dir_(std::move(dir)), filter_(std::move(filter)) {}

  bool wants(const std::string& name) const override {
    return filter_.empty() || name.find(filter_) != std::string::npos;
  }

  // The first failure is kept (status()) and ends the dumping: a full disk or a bad folder gives
  // one error for the call, not a warning per tensor and a success.
  void tensor(const std::string& name, Backend& be, const Tensor& t) override {
    if (!status_.ok()) return;
    const Status st = write(name, be, t);
    if (!st.ok()) status_ = st.with_context("debug dump of " + name);
  }

  Status status() const override { return status_; }

 private:
  Status write(const std::string& name, Backend& be, const Tensor& t) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) return IoError("cannot create dump directory " + dir_ + ": " + ec.message());
    Tensor host = Tensor::host(DType::kF32, t.shape());  // same shape as t, f32
    if (!host.defined()) return OutOfMemory("host buffer for " + t.describe());
    ZI_TRY(be.download(t, host));
    return write_npy_f32(dir_ + "/" + name + ".npy", host);
  }

  std::string dir_;
  std::string filter_;
  Status status_;
};

}  // namespace

std::unique_ptr<DebugSink> make_directory_dump_sink(const std::string& dir,
                                                    const std::string& filter) {
  return std::make_unique<DirectoryDumpSink>(dir, filter);
}

}  // namespace zimage
