// Sequence parallelism for the pipeline (docs/PARALLEL.md): one DiT forward split over P ranks,
// rank 0 being the pipeline's own transformer and backend, ranks 1..P-1 copies of the transformer
// on further backends, each driven by a thread of its own for the length of a forward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/status.h"
#include "model/dit/zimage_dit.h"

namespace zimage {

class SequenceParallelDiT {
 public:
  // backends[0] is rank 0's (the pipeline's); dits[r - 1] is rank r's transformer, loaded on
  // backends[r]; all outlive this. comm: "local" (LocalCommGroup: host rendezvous, any backends,
  // several ranks per GPU allowed), "nccl" (one GPU per rank), "auto" (NCCL when every rank is on
  // its own GPU and this build has NCCL, else local).
  static Result<std::unique_ptr<SequenceParallelDiT>> create(
      std::vector<Backend*> backends, std::vector<std::unique_ptr<ZImageDiT>> dits,
      const std::string& comm);
  ~SequenceParallelDiT();

  int size() const { return static_cast<int>(backends_.size()); }
  const std::string& describe() const { return describe_; }  // "2 ranks over nccl 2.28.9 ..."

  // ZImageDiT::forward's contract for `rank0` (the pipeline's transformer, on backends[0]):
  // latents and caps on rank 0's backend, out allocated there when undefined. The inputs are
  // copied to every rank; every rank computes its share; rank 0's out is the whole output.
  Status forward(ZImageDiT& rank0, const Tensor& latents, const std::vector<float>& t_model,
                 const std::vector<Tensor>& caps, Tensor& out);

 private:
  SequenceParallelDiT() = default;
  std::vector<Backend*> backends_;
  std::vector<std::unique_ptr<ZImageDiT>> dits_;
  std::unique_ptr<LocalCommGroup> local_;
  std::vector<std::unique_ptr<Communicator>> owned_;
  std::vector<Communicator*> comms_;
  std::string describe_;
};

}  // namespace zimage
