// NCCL communicators for sequence parallelism (backend/comm.h): one process, one rank per GPU,
// each rank driven by its own host thread on its CUDA backend's stream. Built only when CMake
// finds nccl.h and libnccl (ZIMAGE_WITH_NCCL).
//
// all_to_all_v is a group of ncclSend / ncclRecv pairs (uneven counts, empty blocks skipped);
// all_gather_v the same with this rank's block sent to every peer (its own block a device copy);
// barrier an all-reduce of one float, waited for. The exchanges only queue work on the rank's
// stream, so they can be captured into a CUDA graph (recordable()). Bytes travel as ncclUint8,
// whatever the dtype.
//
// abort(): collectives called afterwards fail at once with its Status. A collective another rank
// has already queued cannot be recalled (NCCL has no cancellation of queued work in blocking
// communicators): the forward checks its inputs before its first collective so that the usual
// errors come before any exchange.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>

#include "backend/comm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace zimage {

namespace {

Status nccl_status(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return Status::Ok();
  std::string m = std::string(call) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') m += " (" + std::string(last) + ")";
  return DeviceError(m);
}

#define ZI_NCCL_TRY(call) ZI_TRY(nccl_status((call), #call))

struct NcclShared {
  std::vector<ncclComm_t> comms;
  std::mutex mu;
  std::atomic<bool> aborted{false};
  Status abort_status;

  ~NcclShared() {
    // Flush then free every rank's communicator (finalize is grouped: one thread, many ranks).
    ncclGroupStart();
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommFinalize(c);
    ncclGroupEnd();
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mu);
    return abort_status;
  }
};

class NcclComm final : public Communicator {
 public:
  NcclComm(std::shared_ptr<NcclShared> s, int rank, cuda::CudaBackend* be)
      : s_(std::move(s)), rank_(rank), be_(be) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(s_->comms.size()); }
  std::string name() const override {
    return "nccl " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
           std::to_string(NCCL_PATCH) + " (" + std::to_string(size()) + " ranks)";
  }

  Status all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                      const std::vector<int64_t>& recv_counts) override {
    if (s_->aborted) return s_->status();
    ZI_TRY(check_all_to_all_args(*this, send, send_counts, recv, recv_counts));
    const size_t es = dtype_size(send.dtype());
    const char* sp = static_cast<const char*>(send.data());
    char* rp = static_cast<char*>(recv.data());
    ZI_NCCL_TRY(ncclGroupStart());
    int64_t so = 0, ro = 0;
    Status st;
    for (int j = 0; j < size() && st.ok(); ++j) {
      if (send_counts[j] > 0)
        st =
            nccl_status(ncclSend(sp + so * es, send_counts[j] * es, ncclUint8, j, comm(), stream()),
                        "ncclSend");
      if (st.ok() && recv_counts[j] > 0)
        st =
            nccl_status(ncclRecv(rp + ro * es, recv_counts[j] * es, ncclUint8, j, comm(), stream()),
                        "ncclRecv");
      so += send_counts[j];
      ro += recv_counts[j];
    }
    const Status end = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    return st.ok() ? end : st;
  }

  Status all_gather_v(const Tensor& send, Tensor& recv,
                      const std::vector<int64_t>& counts) override {
    if (s_->aborted) return s_->status();
    ZI_TRY(check_all_gather_args(*this, send, recv, counts));
    const size_t es = dtype_size(send.dtype());
    char* rp = static_cast<char*>(recv.data());
    const int64_t mine = counts[rank_];
    int64_t at = 0;
    for (int i = 0; i < rank_; ++i) at += counts[i];
    if (mine > 0)
      ZI_CUDA_TRY(cudaMemcpyAsync(rp + at * es, send.data(), mine * es, cudaMemcpyDeviceToDevice,
                                  stream()));
    ZI_NCCL_TRY(ncclGroupStart());
    Status st;
    int64_t ro = 0;
    for (int j = 0; j < size() && st.ok(); ++j) {
      if (j != rank_ && mine > 0)
        st = nccl_status(ncclSend(send.data(), mine * es, ncclUint8, j, comm(), stream()),
                         "ncclSend");
      if (st.ok() && j != rank_ && counts[j] > 0)
        st = nccl_status(ncclRecv(rp + ro * es, counts[j] * es, ncclUint8, j, comm(), stream()),
                         "ncclRecv");
      ro += counts[j];
    }
    const Status end = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    return st.ok() ? end : st;
  }

  Status barrier() override {
    if (s_->aborted) return s_->status();
    if (!one_.defined()) {
      ZI_ASSIGN_OR_RETURN(one_, be_->alloc(DType::kF32, {1}));
      ZI_TRY(be_->fill(one_, 1.0f));
    }
    ZI_NCCL_TRY(ncclAllReduce(one_.data(), one_.data(), 1, ncclFloat32, ncclSum, comm(), stream()));
    ZI_CUDA_TRY(cudaStreamSynchronize(stream()));
    return Status::Ok();
  }

  bool recordable() const override { return true; }

  void abort(const Status& why) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->aborted) return;
    s_->abort_status = why.ok() ? InternalError("nccl communicator aborted") : why;
    s_->aborted = true;
  }

 private:
  ncclComm_t comm() const { return s_->comms[rank_]; }
  cudaStream_t stream() const { return be_->stream(); }

  std::shared_ptr<NcclShared> s_;
  int rank_;
  cuda::CudaBackend* be_;
  Tensor one_;  // barrier's all-reduce operand
};

}  // namespace

bool nccl_available() {
  return true;
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(
    const std::vector<Backend*>& backends) {
  if (backends.empty()) return InvalidArgument("nccl: no ranks");
  std::vector<cuda::CudaBackend*> cb;
  std::vector<int> devs;
  for (Backend* b : backends) {
    auto* c = dynamic_cast<cuda::CudaBackend*>(b);
    if (c == nullptr)
      return InvalidArgument("nccl: rank " + std::to_string(cb.size()) + " is on " +
                             (b ? b->name() : std::string("no backend")) + ", not a CUDA backend");
    for (int d : devs)
      if (d == c->device_index())
        return InvalidArgument("nccl: two ranks on cuda:" + std::to_string(d) +
                               " (NCCL takes one rank per GPU; the local communicator runs "
                               "several ranks on one GPU)");
    cb.push_back(c);
    devs.push_back(c->device_index());
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);  // NVLink multicast stays off, always
  auto shared = std::make_shared<NcclShared>();
  shared->comms.assign(devs.size(), nullptr);
  int current = 0;
  ZI_CUDA_TRY(cudaGetDevice(&current));
  Status st =
      nccl_status(ncclCommInitAll(shared->comms.data(), static_cast<int>(devs.size()), devs.data()),
                  "ncclCommInitAll");
  const Status back = cuda::cuda_status(cudaSetDevice(current), "cudaSetDevice");
  if (!st.ok()) {
    shared->comms.clear();  // nothing to free
    return st;
  }
  ZI_TRY(back);
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < cb.size(); ++r)
    out.push_back(std::make_unique<NcclComm>(shared, static_cast<int>(r), cb[r]));
  return out;
}

}  // namespace zimage
