// What page-locking host memory costs on this machine, by method (issue 24: the upload staging,
// the streaming staging and the budgeted loads' copies are page-locked before the first image):
//   host_alloc    cudaHostAlloc (the driver allocates, zeroes and locks on the calling thread)
//   small_pages   ordinary memory in 4 KiB pages (MADV_NOHUGEPAGE), touched on 16 threads, then
//                 cudaHostRegister
//   huge_pages    2 MiB-aligned memory with MADV_HUGEPAGE (transparent huge pages), touched on 16
//                 threads, then cudaHostRegister
//   huge_untouched  the same without the touch: cudaHostRegister faults the pages in itself
//   hugetlb       mmap(MAP_HUGETLB) (reserved huge pages; most machines have none)
// For each: seconds to get locked memory and to release it, the share of it in huge pages (from
// /proc/self/smaps), and the H2D rate from it. Sizes in MiB on the command line (default 256
// 2048).
// `pinning_probe exit GIB`: what a process's exit costs after the CUDA work is done (the ~0.25 s
// a `zimage generate` process takes after its file is written): a child process makes a context,
// holds GIB GiB of device memory in a few large or many small allocations (with and without 256
// MiB of page-locked host memory, freed first or not), stamps the time and calls _Exit; the
// parent, which never touches CUDA, reaps it and reports the time between the two.
// Not part of the build: compiled by hand for a GPU run (docs/BENCHMARKS.md gives the command),
// and prints one JSON object on stdout, a table on stderr.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::pair<std::string, double>> g_out;
void put(const std::string& k, double v) {
  g_out.emplace_back(k, v);
  std::fprintf(stderr, "%-44s %10.4f\n", k.c_str(), v);
}

void touch(char* p, size_t n, int threads) {
  std::vector<std::thread> ts;
  const size_t per = (n + threads - 1) / threads;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([=] {
      const size_t a = per * i, b = std::min(n, a + per);
      if (a < b) std::memset(p + a, 1, b - a);
    });
  for (auto& t : ts) t.join();
}

// Kilobytes of [p, p + n) in huge pages: the smaps entries that overlap the range.
double huge_share(const void* p, size_t n) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  bool in = false;
  double huge_kb = 0;
  while (std::getline(f, line)) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find(':') > 8) {
      in = a < hi && b > lo;
      continue;
    }
    if (in && (line.rfind("AnonHugePages:", 0) == 0 || line.rfind("Private_Hugetlb:", 0) == 0)) {
      std::istringstream s(line.substr(line.find(':') + 1));
      double kb = 0;
      s >> kb;
      huge_kb += kb;
    }
  }
  return huge_kb * 1024.0 / static_cast<double>(n);
}

double h2d_gbps(void* dev, const void* host, size_t n) {
  const size_t piece = std::min(n, size_t{64} << 20);
  cudaMemcpy(dev, host, piece, cudaMemcpyHostToDevice);  // warm
  const double t = now();
  for (size_t o = 0; o + piece <= n; o += piece)
    cudaMemcpyAsync(dev, static_cast<const char*>(host) + o, piece, cudaMemcpyHostToDevice, 0);
  cudaDeviceSynchronize();
  return static_cast<double>(n / piece * piece) / (now() - t) / 1e9;
}

void row(const std::string& name, size_t mib, double lock_s, double free_s, double huge,
         double gbps) {
  const std::string k = name + "_" + std::to_string(mib) + "mib_";
  put(k + "lock_s", lock_s);
  put(k + "release_s", free_s);
  put(k + "huge_share", huge);
  put(k + "h2d_gbps", gbps);
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

double mono() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One child: `chunks` device allocations making up `gib` GiB (each written once), `pinned_mib` of
// page-locked host memory, all freed before the exit when `free_first`. Returns the seconds from
// its last stamp to its reaping (negative when it failed).
double exit_cost(double gib, int chunks, size_t pinned_mib, bool free_first) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    cudaFree(nullptr);
    const size_t each = static_cast<size_t>(gib * (1 << 30)) / static_cast<size_t>(chunks);
    std::vector<void*> ps;
    for (int i = 0; i < chunks; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, each) != cudaSuccess) _Exit(2);
      cudaMemsetAsync(p, 0, each);
      ps.push_back(p);
    }
    void* host = nullptr;
    if (pinned_mib > 0 && cudaHostAlloc(&host, pinned_mib << 20, 0) != cudaSuccess) _Exit(3);
    cudaDeviceSynchronize();
    if (free_first) {
      for (void* p : ps) cudaFree(p);
      if (host) cudaFreeHost(host);
    }
    const double t = mono();
    if (write(fds[1], &t, sizeof t) != sizeof t) _Exit(4);
    _Exit(0);
  }
  close(fds[1]);
  double stamp = 0;
  const bool got = read(fds[0], &stamp, sizeof stamp) == sizeof stamp;
  int status = 0;
  waitpid(pid, &status, 0);
  const double reaped = mono();
  close(fds[0]);
  return got && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? reaped - stamp : -1;
}

int exit_probe(double gib) {
  struct Row {
    const char* name;
    int chunks;
    size_t pinned_mib;
    bool free_first;
  };
  const Row rows[] = {{"context_only", 1, 0, false},       {"large_chunks", 16, 0, false},
                      {"small_chunks", 1024, 0, false},    {"large_pinned", 16, 256, false},
                      {"large_freed_first", 16, 0, true},  {"small_freed_first", 1024, 0, true},
                      {"large_chunks_again", 16, 0, false}};
  for (const Row& r : rows) {
    const double g = std::string(r.name) == "context_only" ? 0.0 : gib;
    put(std::string("exit_") + r.name + "_s", exit_cost(g, r.chunks, r.pinned_mib, r.free_first));
  }
  std::printf("{");
  for (size_t i = 0; i < g_out.size(); ++i)
    std::printf("%s\"%s\": %.5g", i ? ", " : "", g_out[i].first.c_str(), g_out[i].second);
  std::printf("}\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "exit")
    return exit_probe(argc >= 3 ? std::strtod(argv[2], nullptr) : 20.0);
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {256, 2048};
  std::fprintf(stderr, "transparent_hugepage/enabled: %s\n",
               first_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str());
  std::fprintf(stderr, "transparent_hugepage/defrag:  %s\n",
               first_line("/sys/kernel/mm/transparent_hugepage/defrag").c_str());
  double t = now();
  cudaFree(nullptr);
  put("cuda_context_s", now() - t);
  void* dev = nullptr;
  if (cudaMalloc(&dev, size_t{64} << 20) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  constexpr size_t kHuge = size_t{2} << 20;
  for (size_t mib : sizes) {
    const size_t n = mib << 20;
    {  // cudaHostAlloc
      void* p = nullptr;
      t = now();
      const bool ok = cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess;
      const double lock = now() - t;
      const double huge = ok ? huge_share(p, n) : 0, gbps = ok ? h2d_gbps(dev, p, n) : 0;
      t = now();
      if (ok) cudaFreeHost(p);
      row("host_alloc", mib, ok ? lock : -1, now() - t, huge, gbps);
      cudaGetLastError();
    }
    for (int method = 0; method < 3; ++method) {  // small pages, huge pages, huge untouched
      const char* name = method == 0   ? "small_pages"
                         : method == 1 ? "huge_pages"
                                       : "huge_untouched";
      t = now();
      char* p = static_cast<char*>(std::aligned_alloc(kHuge, (n + kHuge - 1) / kHuge * kHuge));
      if (p == nullptr) continue;
      madvise(p, n, method == 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
      if (method < 2) touch(p, n, 16);
      const double touched = now() - t;
      const bool ok = cudaHostRegister(p, n, cudaHostRegisterDefault) == cudaSuccess;
      const double lock = now() - t;
      put(std::string(name) + "_" + std::to_string(mib) + "mib_touch_s", touched);
      const double huge = huge_share(p, n), gbps = ok ? h2d_gbps(dev, p, n) : 0;
      t = now();
      if (ok) cudaHostUnregister(p);
      std::free(p);
      row(name, mib, ok ? lock : -1, now() - t, huge, gbps);
      cudaGetLastError();
    }
    {  // reserved huge pages
      t = now();
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
                     -1, 0);
      if (p == MAP_FAILED) {
        put("hugetlb_" + std::to_string(mib) + "mib_available", 0);
      } else {
        const bool ok = cudaHostRegister(p, n, cudaHostRegisterDefault) == cudaSuccess;
        const double lock = now() - t;
        const double gbps = ok ? h2d_gbps(dev, p, n) : 0;
        t = now();
        if (ok) cudaHostUnregister(p);
        munmap(p, n);
        row("hugetlb", mib, ok ? lock : -1, now() - t, 1.0, gbps);
        cudaGetLastError();
      }
    }
  }
  std::printf("{");
  for (size_t i = 0; i < g_out.size(); ++i)
    std::printf("%s\"%s\": %.5g", i ? ", " : "", g_out[i].first.c_str(), g_out[i].second);
  std::printf("}\n");
  cudaFree(dev);
  return 0;
}
