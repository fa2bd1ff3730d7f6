// Collectives between the ranks of a parallel forward (sequence parallelism, docs/PARALLEL.md).
// A Communicator is one rank's end of a group of P ranks; each rank drives its own Backend from
// its own thread. Every collective is called by all ranks of the group, in the same order, with
// matching counts; it returns once this rank's part is complete (on a device backend: once it is
// queued on the rank's stream, in stream order with the rank's other work).
//
// Buffers are tensors of the rank's backend. Counts are in elements of the tensors' dtype; the
// blocks for (or from) the peers lie one after another in rank order, starting at element 0.
//
// Errors: a collective whose arguments are inconsistent across ranks fails on every rank with the
// same Status. A rank that fails between collectives calls abort(): every collective pending or
// started later, on every rank, then returns that Status instead of waiting for the lost rank.
//
// Implementations:
//  * LocalCommGroup (here): P ranks as threads of one process, exchanging through host memory
//    (CPU backends) or device-to-device copies (CUDA backends, the same or different GPUs). A
//    collective is a rendezvous of the ranks' threads: host-synchronous, so it cannot be recorded
//    into a CUDA graph. For tests, and for trying P ranks on one GPU.
//  * make_nccl_group (backend/cuda/nccl_comm.cpp): NCCL, one GPU per rank, one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local (3 ranks)", "nccl 2.27.3 (2 ranks)"

  // Personalised exchange: this rank sends send[off_j, off_j + send_counts[j]) to rank j (off_j =
  // the sum of the counts before j) and receives rank i's block for it into recv at the prefix sum
  // of recv_counts before i. send_counts[j] on this rank must equal recv_counts[this] on rank j.
  // send and recv: same dtype, distinct storage.
  virtual Status all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                              Tensor& recv, const std::vector<int64_t>& recv_counts) = 0;
  // Every rank's first counts[rank] elements of `send`, concatenated in rank order into recv on
  // every rank (counts the same on every rank).
  virtual Status all_gather_v(const Tensor& send, Tensor& recv,
                              const std::vector<int64_t>& counts) = 0;
  // Returns when every rank has called it (device work queued before it is complete).
  virtual Status barrier() = 0;
  // This rank failed with `why` (not OK): collectives of every rank pending now or later fail
  // with it (the first abort wins). Safe from any thread.
  virtual void abort(const Status& why) = 0;
  // Whether the collectives only queue device work (no host wait), so that a forward calling
  // them can be recorded into a CUDA graph (Backend::record) and replayed on every rank.
  virtual bool recordable() const { return false; }
};

// The checks every implementation makes on its own arguments (sizes, dtypes, counts).
Status check_all_to_all_args(const Communicator& c, const Tensor& send,
                             const std::vector<int64_t>& send_counts, const Tensor& recv,
                             const std::vector<int64_t>& recv_counts);
Status check_all_gather_args(const Communicator& c, const Tensor& send, const Tensor& recv,
                             const std::vector<int64_t>& counts);

// P ranks in one process. Each rank's thread takes comm(r) and binds its backend with
// attach(r, be) before its first collective (the backend outlives the group's use).
class LocalCommGroup {
 public:
  // `timeout`: the longest a collective waits for the other ranks before failing on every rank
  // with kDevice (a rank that dies without abort() cannot hang the others forever).
  explicit LocalCommGroup(int size,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(600000));
  ~LocalCommGroup();
  LocalCommGroup(const LocalCommGroup&) = delete;
  LocalCommGroup& operator=(const LocalCommGroup&) = delete;

  int size() const;
  // Rank r's communicator (owned by the group); r in [0, size).
  Communicator& comm(int r);
  void attach(int r, Backend* be);

  struct Shared;  // comm.cpp

 private:
  std::unique_ptr<Shared> shared_;
};

// Copies `bytes` bytes from src (a tensor of backend `from`) to dst (a tensor of backend `to`),
// waiting for completion; both backends' earlier work must be complete. CPU to CPU: memcpy; CUDA
// to CUDA: a peer copy (backend/cuda/peer_copy.cpp); other pairs kUnsupported.
Status copy_between_backends(Backend& from, const void* src, Backend& to, void* dst, size_t bytes);

// NCCL: one rank per backend (each a CUDA backend on its own GPU), in one process; ranks are the
// backends' order. Sets NCCL_NVLS_ENABLE=0 (NVLink multicast off, whatever the environment
// said). kUnsupported when zimage was built without NCCL or without CUDA.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(
    const std::vector<Backend*>& backends);
// Whether this build has NCCL (make_nccl_group can succeed).
bool nccl_available();

}  // namespace zimage
