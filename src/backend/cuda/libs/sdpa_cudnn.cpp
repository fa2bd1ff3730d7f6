// cuDNN fused attention through the graph API (see sdpa_cudnn.h).
#include "backend/cuda/libs/sdpa_cudnn.h"

#include <cstring>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/libs/cudnn_fe.h"
#include "backend/cuda/kernels/kernels.h"
#include "core/log.h"

#if ZIMAGE_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#include <dlfcn.h>

// Built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (see CMakeLists.txt), the frontend calls cuDNN
// through this handle, which the program defines and opens. zimage links libcudnn for its
// convolutions, so dlopen finds the copy already loaded.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace zimage::cuda {

#if ZIMAGE_WITH_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

bool cudnn_frontend_ready() {
  static const bool ready = [] {
    if (cudnnGetVersion() < 90000) {
      ZI_WARN("cuda: cuDNN %zu is older than 9.0; no cuDNN graphs (fused attention, fused conv)",
              cudnnGetVersion());
      return false;
    }
    if (!cudnn_frontend::cudnn_dlhandle)
      cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!cudnn_frontend::cudnn_dlhandle) {
      ZI_WARN("cuda: cannot dlopen libcudnn.so.9 (%s); no cuDNN graphs", dlerror());
      return false;
    }
    return true;
  }();
  return ready;
}

namespace {

// Tensor ids in the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKV };

Status fe_status(fe::error_t e, const char* step) {
  if (e.is_good()) return Status::Ok();
  return Unsupported(std::string("cuDNN attention: ") + step + ": " + e.get_message());
}

// Our [B, S, H, D] layout as cuDNN's [B, H, S, D] dims with strides.
fe::graph::Tensor_attributes bshd(const char* name, int64_t uid, int64_t b, int64_t s, int64_t h,
                                  int64_t d) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({b, h, s, d})
      .set_stride({s * h * d, d, h * d, 1});
}

}  // namespace

struct CudnnSdpa::Impl {
  struct Plan {
    bool supported = false;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
    std::shared_ptr<Storage> seq_lens;  // int32 [2, B]: query lengths, then key lengths
  };
  using Key =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, int, uint32_t>;

  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> plans;

  Status build(const SdpaRequest& r, bool masked, CachingAllocator& alloc, Plan& p) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(r.dt == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = g->tensor(bshd("Q", kQ, r.batch, r.seq_q, r.heads_q, r.head_dim));
    auto k = g->tensor(bshd("K", kK, r.batch, r.seq_k, r.heads_kv, r.head_dim));
    auto v = g->tensor(bshd("V", kV, r.batch, r.seq_k, r.heads_kv, r.head_dim));
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention")
                    .set_generate_stats(false)
                    .set_attn_scale(r.scale);
    if (r.causal) {  // query i sees keys j <= i (top-left aligned, as the CPU oracle)
      opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
          .set_diagonal_band_right_bound(0);
    }
    if (masked) {
      auto lens = [&](const char* name, int64_t uid) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({r.batch, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
      };
      opts.set_padding_mask(true)
          .set_seq_len_q(lens("seq_q", kSeqQ))
          .set_seq_len_kv(lens("seq_kv", kSeqKV));
      ZI_ASSIGN_OR_RETURN(p.seq_lens,
                          alloc.allocate(static_cast<size_t>(2 * r.batch) * sizeof(int32_t)));
    }
    auto [o, stats] = g->sdpa(q, k, v, opts);
    (void)stats;
    o->set_output(true)
        .set_uid(kO)
        .set_dim({r.batch, r.heads_q, r.seq_q, r.head_dim})
        .set_stride({r.seq_q * r.heads_q * r.head_dim, r.head_dim, r.heads_q * r.head_dim, 1});
    ZI_TRY(fe_status(g->validate(), "validate"));
    ZI_TRY(fe_status(g->build_operation_graph(handle), "build_operation_graph"));
    ZI_TRY(fe_status(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
    ZI_TRY(fe_status(g->check_support(handle), "check_support"));
    ZI_TRY(
        fe_status(g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans"));
    ZI_TRY(fe_status(g->get_workspace_size(p.workspace), "get_workspace_size"));
    p.graph = std::move(g);
    p.supported = true;
    return Status::Ok();
  }
};

CudnnSdpa::CudnnSdpa(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
}

CudnnSdpa::~CudnnSdpa() {
  if (impl_ && impl_->handle) {
    impl_->plans.clear();
    cudnnDestroy(impl_->handle);
  }
}

cudnnHandle_t cudnn_graph_handle(cudaStream_t stream) {
  if (!cudnn_frontend_ready()) return nullptr;
  cudnnHandle_t h = nullptr;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) return nullptr;
  if (cudnnSetStream(h, stream) != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(h);
    return nullptr;
  }
  return h;
}

std::unique_ptr<CudnnSdpa> CudnnSdpa::create(cudaStream_t stream) {
  std::unique_ptr<CudnnSdpa> s(new CudnnSdpa(stream));
  s->impl_->handle = cudnn_graph_handle(stream);
  return s;
}

bool CudnnSdpa::available() const {
  return impl_->handle != nullptr;
}

Status CudnnSdpa::run(const SdpaRequest& r, CachingAllocator& alloc) {
  if (!available()) return Unsupported("cuDNN attention unavailable");
  if (r.dt != DType::kBF16 && r.dt != DType::kF16)
    return Unsupported("cuDNN attention: bf16/f16 only");
  const bool masked = !r.key_len.empty();
  if (masked &&
      (static_cast<int64_t>(r.key_len.size()) != r.batch || 2 * r.batch > I32Values::kMax))
    return Unsupported("cuDNN attention: key lengths for at most 32 batch items");
  for (int32_t kl : r.key_len)
    if (kl < 1) return Unsupported("cuDNN attention: a batch item with no valid key");
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &r.scale, sizeof scale_bits);
  const Impl::Key key{r.batch,   r.seq_q,    r.seq_k,
                      r.heads_q, r.heads_kv, r.head_dim,
                      r.causal,  masked,     static_cast<int>(r.dt),
                      scale_bits};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    Impl::Plan p;
    const Status s = impl_->build(r, masked, alloc, p);
    if (!s.ok()) {
      ZI_DEBUG("%s; using the own flash kernel for this shape", s.message().c_str());
      p = Impl::Plan{};  // remembered as unsupported
    }
    it = impl_->plans.emplace(key, std::move(p)).first;
  }
  Impl::Plan& p = it->second;
  if (!p.supported) return Unsupported("cuDNN attention: no engine for this shape");

  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(r.q)},
                                          {kK, const_cast<void*>(r.k)},
                                          {kV, const_cast<void*>(r.v)},
                                          {kO, r.out}};
  if (masked) {
    I32Values lens;
    lens.n = static_cast<int>(2 * r.batch);
    for (int64_t b = 0; b < r.batch; ++b) {
      lens.v[b] = static_cast<int32_t>(r.seq_q);
      lens.v[r.batch + b] = r.key_len[static_cast<size_t>(b)];
    }
    int32_t* dev = static_cast<int32_t*>(p.seq_lens->data());
    ZI_LAUNCH_TRY("attention sequence lengths", launch_write_i32(dev, lens, impl_->stream));
    pack.emplace(kSeqQ, dev);
    pack.emplace(kSeqKV, dev + r.batch);
  }
  std::shared_ptr<Storage> ws;
  if (p.workspace > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc.allocate(static_cast<size_t>(p.workspace)));
  }
  fe::error_t e = p.graph->execute(impl_->handle, pack, ws ? ws->data() : nullptr);
  if (!e.is_good()) return DeviceError(std::string("cuDNN attention: execute: ") + e.get_message());
  return Status::Ok();
}

#else  // built without the cudnn-frontend headers

bool cudnn_frontend_ready() {
  return false;
}
cudnnHandle_t cudnn_graph_handle(cudaStream_t) {
  return nullptr;
}

struct CudnnSdpa::Impl {};
CudnnSdpa::CudnnSdpa(cudaStream_t) : impl_(std::make_unique<Impl>()) {}
CudnnSdpa::~CudnnSdpa() = default;
std::unique_ptr<CudnnSdpa> CudnnSdpa::create(cudaStream_t stream) {
  return std::unique_ptr<CudnnSdpa>(new CudnnSdpa(stream));
}
bool CudnnSdpa::available() const {
  return false;
}
Status CudnnSdpa::run(const SdpaRequest&, CachingAllocator&) {
  return Unsupported("built without cuDNN attention (no cudnn-frontend headers)");
}

#endif

}  // namespace zimage::cuda
