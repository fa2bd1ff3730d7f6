// What host memory costs on this machine, for the loader's choices (issue 24): page-locking by
// cudaHostAlloc against registering existing memory (anonymous, or a read-only file mapping in
// place), the host -> device rate from each, the pageable rate, the parallel copy from the page
// cache, and the CUDA / cuBLASLt / cuDNN start-up. Prints one JSON object.
//
//   g++ -O2 -std=c++20 tools/host_transfer_probe.cpp -I/usr/local/cuda/include \
//       -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lcudnn -lpthread -o build/host_transfer_probe
//   build/host_transfer_probe FILE [GiB]   (FILE: a large file, read into the page cache first)
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<std::pair<std::string, double>> g_out;
void put(const std::string& k, double v) {
  g_out.emplace_back(k, v);
  std::fprintf(stderr, "%-44s %10.4f\n", k.c_str(), v);
}

// Host -> device in 256 MiB pieces on one stream; GB/s.
double h2d_rate(void* dev, const void* src, size_t n) {
  const size_t piece = size_t{256} << 20;
  check(cudaDeviceSynchronize(), "sync");
  const double t = now();
  for (size_t o = 0; o < n; o += piece)
    check(cudaMemcpyAsync(static_cast<char*>(dev) + (o % (size_t{1} << 30)),
                          static_cast<const char*>(src) + o, std::min(piece, n - o),
                          cudaMemcpyHostToDevice, nullptr),
          "h2d");
  check(cudaDeviceSynchronize(), "sync");
  return n / (now() - t) / 1e9;
}

double parallel_copy(char* dst, const char* src, size_t n, int threads) {
  const double t = now();
  std::vector<std::thread> ts;
  const size_t per = (n + threads - 1) / threads;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([=] {
      const size_t a = std::min(n, per * i), b = std::min(n, per * (i + 1));
      std::memcpy(dst + a, src + a, b - a);
    });
  for (auto& th : ts) th.join();
  return n / (now() - t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [GiB]\n", argv[0]);
    return 2;
  }
  const double gib = argc > 2 ? std::atof(argv[2]) : 4.0;
  const size_t n = static_cast<size_t>(gib * (1 << 30)) & ~size_t{(1 << 20) - 1};
  double t = now();
  check(cudaFree(nullptr), "cudaFree(0)");
  put("cuda_context_s", now() - t);
  t = now();
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  put("cublaslt_create_s", now() - t);
  t = now();
  cudnnHandle_t dnn;
  cudnnCreate(&dnn);
  put("cudnn_create_s", now() - t);
  int ro = 0;
  cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0);
  put("host_register_read_only_supported", ro);
  void* dev = nullptr;
  check(cudaMalloc(&dev, size_t{1} << 30), "cudaMalloc");

  // 1. cudaHostAlloc + free.
  t = now();
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, n, cudaHostAllocDefault), "cudaHostAlloc");
  put("host_alloc_s_per_gib", (now() - t) / gib);
  put("h2d_pinned_gbps", h2d_rate(dev, pinned, n));

  // 2. The file, mapped read-only (as the loader maps it).
  const int fd = ::open(argv[1], O_RDONLY);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < n) {
    std::fprintf(stderr, "%s: cannot open, or smaller than %.1f GiB\n", argv[1], gib);
    return 1;
  }
  t = now();
  {
    std::vector<char> buf(size_t{16} << 20);
    size_t left = n;
    while (left > 0) {
      const ssize_t r = ::read(fd, buf.data(), std::min(buf.size(), left));
      if (r <= 0) break;
      left -= static_cast<size_t>(r);
    }
    lseek(fd, 0, SEEK_SET);
  }
  put("read_syscall_gbps", n / (now() - t) / 1e9);
  for (int threads : {1, 4, 8, 16}) {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    put("mmap_to_pinned_copy_gbps_threads_" + std::to_string(threads),
        parallel_copy(static_cast<char*>(pinned), static_cast<const char*>(m), n, threads));
    ::munmap(m, n);
  }
  {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    put("h2d_pageable_mmap_gbps", h2d_rate(dev, m, std::min(n, size_t{2} << 30)));
    ::munmap(m, n);
  }
  for (int flags : {MAP_PRIVATE, MAP_SHARED}) {
    const std::string kind = flags == MAP_SHARED ? "shared" : "private";
    void* m = ::mmap(nullptr, n, PROT_READ, flags, fd, 0);
    t = now();
    const cudaError_t e = cudaHostRegister(m, n, cudaHostRegisterReadOnly);
    const double reg = now() - t;
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::fprintf(stderr, "register %s mapping: %s\n", kind.c_str(), cudaGetErrorString(e));
      put("register_file_" + kind + "_ok", 0);
    } else {
      put("register_file_" + kind + "_ok", 1);
      put("register_file_" + kind + "_s_per_gib", reg / gib);
      put("h2d_registered_file_" + kind + "_gbps", h2d_rate(dev, m, n));
      t = now();
      cudaHostUnregister(m);
      put("unregister_file_" + kind + "_s_per_gib", (now() - t) / gib);
    }
    ::munmap(m, n);
  }
  // Registered in 256 MiB pieces on 4 threads (is registration parallel?).
  {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    const size_t piece = size_t{256} << 20;
    t = now();
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([=] {
        for (size_t o = piece * i; o < n; o += piece * 4)
          cudaHostRegister(static_cast<char*>(m) + o, std::min(piece, n - o),
                           cudaHostRegisterReadOnly);
      });
    for (auto& th : ts) th.join();
    put("register_file_4threads_s_per_gib", (now() - t) / gib);
    for (size_t o = 0; o < n; o += piece) cudaHostUnregister(static_cast<char*>(m) + o);
    cudaGetLastError();
    ::munmap(m, n);
  }
  // 3. Anonymous memory, touched, then registered.
  {
    void* m = std::malloc(n);
    t = now();
    std::memset(m, 1, n);
    put("malloc_touch_s_per_gib", (now() - t) / gib);
    t = now();
    check(cudaHostRegister(m, n, cudaHostRegisterDefault), "register anon");
    put("register_anon_s_per_gib", (now() - t) / gib);
    t = now();
    cudaHostUnregister(m);
    put("unregister_anon_s_per_gib", (now() - t) / gib);
    std::free(m);
  }
  // 4. What host_copy does with ZIMAGE_HOST_PIN=register: the file copied on 16 threads into
  //    fresh (untouched) memory, whose page faults then run in parallel, then registered; against
  //    cudaHostAlloc on 4 threads at once (is the driver's zeroing and locking parallel?).
  {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    void* fresh = std::aligned_alloc(size_t{2} << 20, n);
    put("file_to_fresh_anon_copy_gbps_threads_16",
        parallel_copy(static_cast<char*>(fresh), static_cast<const char*>(m), n, 16));
    t = now();
    const cudaError_t e = cudaHostRegister(fresh, n, cudaHostRegisterDefault);
    put("register_fresh_copy_s_per_gib", e == cudaSuccess ? (now() - t) / gib : -1);
    if (e == cudaSuccess) cudaHostUnregister(fresh);
    cudaGetLastError();
    std::free(fresh);
    ::munmap(m, n);
  }
  {
    std::vector<void*> ps(4, nullptr);
    t = now();
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&ps, i, n] { cudaHostAlloc(&ps[i], n / 4, cudaHostAllocDefault); });
    for (auto& th : ts) th.join();
    put("host_alloc_4threads_s_per_gib", (now() - t) / gib);
    for (void* p : ps)
      if (p) cudaFreeHost(p);
    cudaGetLastError();
  }
  t = now();
  cudaFreeHost(pinned);
  put("free_host_s_per_gib", (now() - t) / gib);
  // D2H into pinned (today's budgeted load moves streamed blocks back this way).
  {
    void* p2 = nullptr;
    check(cudaHostAlloc(&p2, size_t{1} << 30, 0), "alloc");
    t = now();
    check(cudaMemcpy(p2, dev, size_t{1} << 30, cudaMemcpyDeviceToHost), "d2h");
    put("d2h_pinned_gbps", (size_t{1} << 30) / (now() - t) / 1e9);
    cudaFreeHost(p2);
  }
  std::printf("{");
  for (size_t i = 0; i < g_out.size(); ++i)
    std::printf("%s\"%s\": %.5g", i ? ", " : "", g_out[i].first.c_str(), g_out[i].second);
  std::printf("}\n");
  cudnnDestroy(dnn);
  cublasLtDestroy(lt);
  return 0;
}
