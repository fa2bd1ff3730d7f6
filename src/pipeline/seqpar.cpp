#include "pipeline/seqpar.h"

#include <exception>
#include <thread>

#include "core/log.h"
#include "model/common/load_util.h"

namespace zimage {

SequenceParallelDiT::~SequenceParallelDiT() = default;

Result<std::unique_ptr<SequenceParallelDiT>> SequenceParallelDiT::create(
    std::vector<Backend*> backends, std::vector<std::unique_ptr<ZImageDiT>> dits,
    const std::string& comm) {
  const size_t p = backends.size();
  if (p < 2 || dits.size() != p - 1)
    return InvalidArgument("sequence parallel: " + std::to_string(p) + " backends and " +
                           std::to_string(dits.size()) + " rank transformers");
  if (comm != "auto" && comm != "local" && comm != "nccl")
    return InvalidArgument("sequence parallel communicator: '" + comm +
                           "' is not one of auto, local, nccl");
  bool distinct_gpus = true;  // NCCL takes one rank per GPU
  std::vector<std::string> names;
  for (Backend* b : backends) {
    distinct_gpus = distinct_gpus && b->device() == Device::kCUDA;
    for (const std::string& n : names) distinct_gpus = distinct_gpus && n != b->name();
    names.push_back(b->name());
  }
  auto s = std::unique_ptr<SequenceParallelDiT>(new SequenceParallelDiT());
  const bool nccl = comm == "nccl" || (comm == "auto" && distinct_gpus && nccl_available());
  if (nccl) {
    ZI_ASSIGN_OR_RETURN(s->owned_, make_nccl_group(backends));
    for (auto& c : s->owned_) s->comms_.push_back(c.get());
  } else {
    s->local_ = std::make_unique<LocalCommGroup>(static_cast<int>(p));
    for (size_t r = 0; r < p; ++r) {
      s->local_->attach(static_cast<int>(r), backends[r]);
      s->comms_.push_back(&s->local_->comm(static_cast<int>(r)));
    }
  }
  s->backends_ = std::move(backends);
  s->dits_ = std::move(dits);
  s->describe_ = s->comms_[0]->name();
  return s;
}

Status SequenceParallelDiT::forward(ZImageDiT& rank0, const Tensor& latents,
                                    const std::vector<float>& t_model,
                                    const std::vector<Tensor>& caps, Tensor& out) {
  Backend& be0 = *backends_[0];
  // The inputs on the host once (1 MB of latents at 1024², the captions' features), then on
  // every rank's backend.
  Tensor lat_host = Tensor::host(DType::kF32, latents.shape());
  if (!lat_host.defined()) return OutOfMemory("sequence parallel: host latents");
  ZI_TRY(be0.download(latents, lat_host));
  std::vector<Tensor> caps_host;
  for (const Tensor& c : caps) {
    Tensor h = Tensor::host(DType::kF32, c.shape());
    if (!h.defined()) return OutOfMemory("sequence parallel: host captions");
    ZI_TRY(be0.download(c, h));
    caps_host.push_back(h);
  }
  const size_t p = backends_.size();
  std::vector<Status> st(p);
  auto rank_run = [&](size_t r) -> Status {
    Backend& be = *backends_[r];
    ZI_TRY(be.bind_thread());
    ZI_ASSIGN_OR_RETURN(Tensor lat, load::upload_host(be, lat_host, DType::kF32));
    std::vector<Tensor> cs;
    for (const Tensor& h : caps_host) {
      ZI_ASSIGN_OR_RETURN(Tensor d, load::upload_host(be, h, be.act_dtype()));
      cs.push_back(d);
    }
    Tensor o;
    return dits_[r - 1]->forward_parallel(*comms_[r], lat, t_model, cs, o);
  };
  std::vector<std::thread> threads;
  try {
    for (size_t r = 1; r < p; ++r)
      threads.emplace_back([&, r] {
        st[r] = rank_run(r);
        if (!st[r].ok()) comms_[r]->abort(st[r]);  // rank 0 must not wait for it
      });
  } catch (const std::exception& e) {  // the system refused a thread: no rank may wait for it
    st[0] = DeviceError(std::string("sequence parallel: cannot start a rank thread: ") + e.what());
    comms_[0]->abort(st[0]);
  }
  if (st[0].ok()) st[0] = rank0.forward_parallel(*comms_[0], latents, t_model, caps, out);
  for (std::thread& t : threads) t.join();
  ZI_TRY(be0.bind_thread());  // the workers bound their own devices on their threads only
  for (size_t r = 0; r < p; ++r)
    if (!st[r].ok()) return st[r].with_context("sequence parallel rank " + std::to_string(r));
  return Status::Ok();
}

}  // namespace zimage
