// The drop-in transformer (include/zimage/transformer.h) on CUDA pointers: inputs in device memory
// written on the caller's own stream just before the call (behind a 200 ms host callback, so an
// engine that did not wait for that stream would read the NaN poison underneath), outputs read
// back on the same stream right after the call (an unordered read would see the poison), against
// the CPU forward of the same views: f32 within GoldenGpu's fp32 DiT bound, bf16 views on a bf16
// engine within its relative bound. Also t in device memory, the recorded (CUDA-graph) path on a
// second call, and a stream of the wrong device refused.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/golden_harness.h"
#include "common/npy.h"
#include "core/dtype.h"
#include "zimage/transformer.h"

namespace zimage {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

std::string model_dir() {
  return test::golden_dir("v_turbo") + "/model";
}

std::unique_ptr<Transformer> load(const std::string& device, const std::string& precision) {
  TransformerOptions o;
  o.path = model_dir();
  o.device = device;
  o.precision = precision;
  auto t = Transformer::load(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

TensorView host_view(const Tensor& t, std::vector<int64_t> shape) {
  TensorView v;
  v.data = t.data();
  v.dtype = t.dtype() == DType::kBF16 ? ElementType::kBF16 : ElementType::kF32;
  v.shape = std::move(shape);
  return v;
}

// A device buffer freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

void CUDART_CB sleep_200ms(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

struct Inputs {
  Tensor lat, cap, t;  // host, in `dt` (t f32)
};
Inputs inputs(DType dt) {
  const std::string dir = test::golden_dir("v_turbo");
  const Tensor lat = test::load_reference(dir + "/init_noise.npy");
  const Tensor cap = test::load_reference(dir + "/prompt_embeds_0.npy");
  Inputs in;
  in.lat = Tensor::host(dt, lat.shape());
  in.cap = Tensor::host(dt, cap.shape());
  EXPECT_TRUE(convert_from_f32(dt, lat.data_as<float>(), in.lat.data(), lat.numel()));
  EXPECT_TRUE(convert_from_f32(dt, cap.data_as<float>(), in.cap.data(), cap.numel()));
  in.t = Tensor::host(DType::kF32, {1});
  in.t.data_as<float>()[0] = 0.4375f;
  return in;
}

// The forward on the CPU from the same (rounded) numbers, f32 out.
Tensor cpu_forward(const Inputs& in) {
  auto cpu = load("cpu", "auto");
  if (!cpu) return Tensor();
  Tensor lat = Tensor::host(DType::kF32, in.lat.shape()),
         cap = Tensor::host(DType::kF32, in.cap.shape());
  EXPECT_TRUE(convert_to_f32(in.lat.dtype(), in.lat.data(), lat.data_as<float>(), lat.numel()));
  EXPECT_TRUE(convert_to_f32(in.cap.dtype(), in.cap.data(), cap.data_as<float>(), cap.numel()));
  Tensor out = Tensor::host(DType::kF32, lat.shape());
  const int64_t h = lat.dim(2), w = lat.dim(3);
  TransformerCall c;
  c.x = {host_view(lat, {16, 1, h, w})};
  c.cap_feats = {host_view(cap, cap.shape())};
  c.out = {host_view(out, {16, 1, h, w})};
  c.t = host_view(in.t, {1});
  const Status st = cpu->forward(c);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// The CUDA forward with every input written on `stream` behind a 200 ms host callback and the
// output read back on it right after the call; `t_on_device` puts t in device memory too.
// Returns the output as host f32 (undefined on a failure).
Tensor cuda_forward(Transformer& tr, const Inputs& in, cudaStream_t stream, bool t_on_device) {
  const DType dt = in.lat.dtype();
  const int64_t h = in.lat.dim(2), w = in.lat.dim(3);
  DeviceBuffer x(in.lat.nbytes()), cap(in.cap.nbytes()), out(in.lat.nbytes()), t(sizeof(float));
  EXPECT_TRUE(x.p && cap.p && out.p && t.p);
  if (!(x.p && cap.p && out.p && t.p)) return Tensor();
  // NaN poison everywhere first (0xFF bytes are NaN in f32 and bf16), finished before the test.
  for (DeviceBuffer* b : {&x, &cap, &out, &t})
    EXPECT_EQ(cudaMemset(b->p, 0xFF, b->bytes), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Pinned staging, so the copies are truly asynchronous on `stream`.
  void *hx = nullptr, *hc = nullptr, *ho = nullptr, *ht = nullptr;
  EXPECT_EQ(cudaMallocHost(&hx, x.bytes), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(&hc, cap.bytes), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(&ho, out.bytes), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(&ht, sizeof(float)), cudaSuccess);
  std::memcpy(hx, in.lat.data(), x.bytes);
  std::memcpy(hc, in.cap.data(), cap.bytes);
  std::memcpy(ht, in.t.data(), sizeof(float));
  EXPECT_EQ(cudaLaunchHostFunc(stream, sleep_200ms, nullptr), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(x.p, hx, x.bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(cap.p, hc, cap.bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(t.p, ht, sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);

  const ElementType et = dt == DType::kBF16 ? ElementType::kBF16 : ElementType::kF32;
  const MemoryDevice dev{MemoryDevice::Kind::kCUDA, 0};
  TransformerCall c;
  c.x = {TensorView{x.p, et, {16, 1, h, w}, {}, dev}};
  c.cap_feats = {TensorView{cap.p, et, in.cap.shape(), {}, dev}};
  c.out = {TensorView{out.p, et, {16, 1, h, w}, {}, dev}};
  c.t = t_on_device ? TensorView{t.p, ElementType::kF32, {1}, {}, dev} : host_view(in.t, {1});
  c.cuda_stream = stream;
  const Status st = tr.forward(c);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(cudaMemcpyAsync(ho, out.p, out.bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Tensor r = Tensor::host(DType::kF32, in.lat.shape());
  EXPECT_TRUE(convert_to_f32(dt, ho, r.data_as<float>(), r.numel()));
  for (void* p : {hx, hc, ho, ht}) cudaFreeHost(p);
  return st.ok() ? r : Tensor();
}

void run(DType dt, const std::string& precision, bool t_on_device) {
  auto tr = load("cuda", precision);
  ASSERT_NE(tr, nullptr);
  const Inputs in = inputs(dt);
  const Tensor ref = cpu_forward(in);
  ASSERT_TRUE(ref.defined());
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Twice: the first call records the forward, the second replays the recording.
  for (int k = 0; k < 2; ++k) {
    const Tensor got = cuda_forward(*tr, in, stream, t_on_device);
    ASSERT_TRUE(got.defined());
    const test::Diff d = test::diff(got, ref);
    std::printf("  cuda %s views, %s engine, t on %s, call %d: %s\n", dtype_name(dt),
                precision.c_str(), t_on_device ? "device" : "host", k, d.describe().c_str());
    if (dt == DType::kF32) {
      EXPECT_LT(d.max_abs, 5e-5);  // GoldenGpu.Fp32MatchesDiffusers' DiT bound
    } else {
      EXPECT_LT(d.rel, 4e-2);  // GoldenGpu.Bf16WithinStatedTolerance's DiT bound
    }
  }
  cudaStreamDestroy(stream);
}

TEST(TransformerApiGpu, F32PointersOnAUserStreamMatchTheCpu) {
  if (!test::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  run(DType::kF32, "f32", /*t_on_device=*/false);
}

TEST(TransformerApiGpu, Bf16PointersAndDeviceTimestepMatchTheCpu) {
  if (!test::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  run(DType::kBF16, "bf16", /*t_on_device=*/true);
}

TEST(TransformerApiGpu, LegacyDefaultStream) {
  if (!test::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto tr = load("cuda", "f32");
  ASSERT_NE(tr, nullptr);
  const Inputs in = inputs(DType::kF32);
  const Tensor ref = cpu_forward(in);
  const Tensor got = cuda_forward(*tr, in, nullptr, true);
  ASSERT_TRUE(got.defined());
  EXPECT_LT(test::diff(got, ref).max_abs, 5e-5);
}

TEST(TransformerApiGpu, WrongDevicesAreNamed) {
  if (!test::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto tr = load("cuda", "f32");
  ASSERT_NE(tr, nullptr);
  EXPECT_EQ(tr->info().memory.kind, MemoryDevice::Kind::kCUDA);
  EXPECT_EQ(tr->info().memory.index, 0);
  const Inputs in = inputs(DType::kF32);
  const int64_t h = in.lat.dim(2), w = in.lat.dim(3);
  Tensor out = Tensor::host(DType::kF32, in.lat.shape());
  TransformerCall c;  // host pointers on a CUDA transformer
  c.x = {host_view(in.lat, {16, 1, h, w})};
  c.cap_feats = {host_view(in.cap, in.cap.shape())};
  c.out = {host_view(out, {16, 1, h, w})};
  c.t = host_view(in.t, {1});
  Status st = tr->forward(c);
  EXPECT_EQ(st.field(), "x[0]") << st.to_string();
  EXPECT_NE(st.message().find("is on cpu, the transformer runs on cuda:0"), std::string::npos);
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) return;
  // A stream of another GPU.
  DeviceBuffer x(in.lat.nbytes()), cap(in.cap.nbytes()), o(in.lat.nbytes());
  const MemoryDevice dev{MemoryDevice::Kind::kCUDA, 0};
  c.x = {TensorView{x.p, ElementType::kF32, {16, 1, h, w}, {}, dev}};
  c.cap_feats = {TensorView{cap.p, ElementType::kF32, in.cap.shape(), {}, dev}};
  c.out = {TensorView{o.p, ElementType::kF32, {16, 1, h, w}, {}, dev}};
  CUDA_OK(cudaSetDevice(1));
  cudaStream_t other = nullptr;
  CUDA_OK(cudaStreamCreate(&other));
  CUDA_OK(cudaSetDevice(0));
  c.cuda_stream = other;
  st = tr->forward(c);
  EXPECT_EQ(st.field(), "cuda_stream") << st.to_string();
  cudaStreamDestroy(other);
}

}  // namespace
}  // namespace zimage
