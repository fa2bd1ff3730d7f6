// Communicator argument checks and the in-process LocalCommGroup (backend/comm.h).
//
// A LocalCommGroup collective on rank r:
//   1. checks its own arguments and waits for its backend (the send data must be complete);
//   2. posts its buffers and counts, then waits for every rank (rendezvous A);
//   3. checks the counts of every pair (all ranks reach the same verdict), then pulls its blocks
//      from the peers' send buffers into its own recv buffer;
//   4. waits for every rank again (rendezvous B: no send buffer is reused while a peer reads it).
// A rank that fails anywhere aborts the group: the others leave their rendezvous with its Status.
#include "backend/comm.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>

namespace zimage {

#ifdef ZIMAGE_WITH_CUDA
// backend/cuda/peer_copy.cpp
Status cuda_copy_between_backends(Backend& from, const void* src, Backend& to, void* dst,
                                  size_t bytes);
#endif

namespace {

Status check_counts(const Communicator& c, const std::vector<int64_t>& counts, const char* what) {
  if (static_cast<int>(counts.size()) != c.size())
    return InvalidArgument(c.name() + ": " + what + " has " + std::to_string(counts.size()) +
                           " counts for " + std::to_string(c.size()) + " ranks");
  for (int64_t n : counts)
    if (n < 0) return InvalidArgument(c.name() + ": " + what + " has a negative count");
  return Status::Ok();
}

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

}  // namespace

Status check_all_to_all_args(const Communicator& c, const Tensor& send,
                             const std::vector<int64_t>& send_counts, const Tensor& recv,
                             const std::vector<int64_t>& recv_counts) {
  const std::string who = c.name() + " rank " + std::to_string(c.rank()) + ": all_to_all_v: ";
  if (!send.defined() || !recv.defined()) return InvalidArgument(who + "undefined buffer");
  if (send.dtype() != recv.dtype())
    return InvalidArgument(who + "send " + send.describe() + " and recv " + recv.describe() +
                           " differ in dtype");
  ZI_TRY(check_counts(c, send_counts, "send_counts"));
  ZI_TRY(check_counts(c, recv_counts, "recv_counts"));
  if (sum(send_counts) > send.numel())
    return InvalidArgument(who + "send counts total " + std::to_string(sum(send_counts)) +
                           " elements, more than send " + send.describe());
  if (sum(recv_counts) > recv.numel())
    return InvalidArgument(who + "recv counts total " + std::to_string(sum(recv_counts)) +
                           " elements, more than recv " + recv.describe());
  if (send.storage() == recv.storage() && send.numel() > 0)
    return InvalidArgument(who + "send and recv share storage");
  return Status::Ok();
}

Status check_all_gather_args(const Communicator& c, const Tensor& send, const Tensor& recv,
                             const std::vector<int64_t>& counts) {
  const std::string who = c.name() + " rank " + std::to_string(c.rank()) + ": all_gather_v: ";
  if (!send.defined() || !recv.defined()) return InvalidArgument(who + "undefined buffer");
  if (send.dtype() != recv.dtype())
    return InvalidArgument(who + "send " + send.describe() + " and recv " + recv.describe() +
                           " differ in dtype");
  ZI_TRY(check_counts(c, counts, "counts"));
  if (counts[c.rank()] > send.numel())
    return InvalidArgument(who + "count " + std::to_string(counts[c.rank()]) +
                           " elements, more than send " + send.describe());
  if (sum(counts) > recv.numel())
    return InvalidArgument(who + "counts total " + std::to_string(sum(counts)) +
                           " elements, more than recv " + recv.describe());
  if (send.storage() == recv.storage() && send.numel() > 0)
    return InvalidArgument(who + "send and recv share storage");
  return Status::Ok();
}

Status copy_between_backends(Backend& from, const void* src, Backend& to, void* dst, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (from.device() == Device::kCPU && to.device() == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#ifdef ZIMAGE_WITH_CUDA
  if (from.device() == Device::kCUDA && to.device() == Device::kCUDA)
    return cuda_copy_between_backends(from, src, to, dst, bytes);
#endif
  return Unsupported("copy between backends " + from.name() + " and " + to.name());
}

// ---- LocalCommGroup ----

struct LocalCommGroup::Shared {
  enum class Op { kNone, kAllToAll, kAllGather };
  struct Post {
    Op op = Op::kNone;
    Tensor send, recv;
    std::vector<int64_t> send_counts, recv_counts;  // all_gather: send_counts = counts
  };

  int size = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Backend*> backends;
  std::vector<Post> posts;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  Status abort_status;
  std::vector<std::unique_ptr<Communicator>> comms;

  void abort(const Status& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (!aborted) {
      aborted = true;
      abort_status = why.ok() ? InternalError("local communicator aborted") : why;
    }
    cv.notify_all();
  }

  // Waits until every rank has arrived (a reusable barrier), or the group is aborted.
  Status rendezvous(std::unique_lock<std::mutex>& lock, int rank) {
    if (aborted) return abort_status;
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return Status::Ok();
    }
    const bool done = cv.wait_for(lock, timeout, [&] { return generation != gen || aborted; });
    if (generation != gen) return Status::Ok();
    if (!done && !aborted) {
      aborted = true;
      abort_status = DeviceError("local communicator: rank " + std::to_string(rank) + " waited " +
                                 std::to_string(timeout.count()) + " ms for the other ranks");
      cv.notify_all();
    }
    return abort_status;
  }

  // Every pair's counts agree (each rank runs this on the same posts: the same verdict).
  Status check_posts() const {
    const Op op = posts[0].op;
    for (int i = 0; i < size; ++i) {
      if (posts[i].op != op)
        return InvalidArgument("local communicator: ranks 0 and " + std::to_string(i) +
                               " called different collectives");
      if (posts[i].send.dtype() != posts[0].send.dtype())
        return InvalidArgument("local communicator: ranks 0 and " + std::to_string(i) +
                               " exchange different dtypes");
      for (int j = 0; j < size; ++j) {
        const bool ok = op == Op::kAllToAll ? posts[i].send_counts[j] == posts[j].recv_counts[i]
                                            : posts[i].send_counts[j] == posts[0].send_counts[j];
        if (!ok)
          return InvalidArgument(
              "local communicator: " +
              std::string(op == Op::kAllToAll
                              ? "all_to_all_v: rank " + std::to_string(i) + " sends " +
                                    std::to_string(posts[i].send_counts[j]) + " elements to rank " +
                                    std::to_string(j) + ", which expects " +
                                    std::to_string(posts[j].recv_counts[i])
                              : "all_gather_v: ranks 0 and " + std::to_string(i) +
                                    " pass different counts"));
      }
    }
    return Status::Ok();
  }

  // Rank r's share of the exchange: its recv blocks, pulled from the peers.
  Status pull(int r) {
    const Post& me = posts[r];
    const size_t es = dtype_size(me.recv.dtype());
    char* dst = static_cast<char*>(me.recv.data());
    int64_t at = 0;
    for (int i = 0; i < size; ++i) {
      const Post& peer = posts[i];
      int64_t from = 0, n = 0;
      if (me.op == Op::kAllToAll) {
        for (int j = 0; j < r; ++j) from += peer.send_counts[j];
        n = peer.send_counts[r];
      } else {
        n = peer.send_counts[i];
      }
      const char* src = static_cast<const char*>(peer.send.data()) + from * es;
      ZI_TRY(copy_between_backends(*backends[i], src, *backends[r], dst + at * es, n * es));
      at += n;
    }
    return Status::Ok();
  }

  Status collective(int r, Post post) {
    if (backends[r] == nullptr)
      return InvalidArgument("local communicator: rank " + std::to_string(r) +
                             " has no backend attached");
    Status st = backends[r]->synchronize();
    if (!st.ok()) return fail(st);
    std::unique_lock<std::mutex> lock(mu);
    posts[r] = std::move(post);
    ZI_TRY(rendezvous(lock, r));  // A: every rank posted
    lock.unlock();
    st = check_posts();
    if (st.ok()) st = pull(r);
    if (!st.ok()) return fail(st);
    lock.lock();
    return rendezvous(lock, r);  // B: every rank has read what it needs
  }

  Status fail(const Status& st) {
    abort(st);
    std::lock_guard<std::mutex> lock(mu);
    return abort_status;
  }
};

namespace {

class LocalComm final : public Communicator {
 public:
  LocalComm(LocalCommGroup::Shared* s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  std::string name() const override {
    return "local communicator (" + std::to_string(s_->size) + " ranks)";
  }

  Status all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                      const std::vector<int64_t>& recv_counts) override {
    Status st = check_all_to_all_args(*this, send, send_counts, recv, recv_counts);
    if (!st.ok()) return s_->fail(st);
    return s_->collective(
        rank_, {LocalCommGroup::Shared::Op::kAllToAll, send, recv, send_counts, recv_counts});
  }

  Status all_gather_v(const Tensor& send, Tensor& recv,
                      const std::vector<int64_t>& counts) override {
    Status st = check_all_gather_args(*this, send, recv, counts);
    if (!st.ok()) return s_->fail(st);
    return s_->collective(rank_,
                          {LocalCommGroup::Shared::Op::kAllGather, send, recv, counts, counts});
  }

  Status barrier() override {
    if (s_->backends[rank_] != nullptr) {
      Status st = s_->backends[rank_]->synchronize();
      if (!st.ok()) return s_->fail(st);
    }
    std::unique_lock<std::mutex> lock(s_->mu);
    return s_->rendezvous(lock, rank_);
  }

  void abort(const Status& why) override { s_->abort(why); }

 private:
  LocalCommGroup::Shared* s_;
  int rank_;
};

}  // namespace

LocalCommGroup::LocalCommGroup(int size, std::chrono::milliseconds timeout)
    : shared_(std::make_unique<Shared>()) {
  shared_->size = size < 1 ? 1 : size;
  shared_->timeout = timeout;
  shared_->backends.assign(shared_->size, nullptr);
  shared_->posts.resize(shared_->size);
  for (int r = 0; r < shared_->size; ++r)
    shared_->comms.push_back(std::make_unique<LocalComm>(shared_.get(), r));
}

LocalCommGroup::~LocalCommGroup() = default;

int LocalCommGroup::size() const {
  return shared_->size;
}

Communicator& LocalCommGroup::comm(int r) {
  return *shared_->comms.at(r);
}

void LocalCommGroup::attach(int r, Backend* be) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->backends.at(r) = be;
}

#ifndef ZIMAGE_WITH_NCCL
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>&) {
  return Unsupported(
      "sequence parallelism over NCCL: this zimage was built without NCCL (configure with CUDA "
      "and nccl.h / libnccl.so in the CUDA install)");
}

bool nccl_available() {
  return false;
}
#endif

}  // namespace zimage
