// GpuSampler: see gpu_sampler.h.
#include "bench/gpu_sampler.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <numeric>

namespace zimage::bench {
namespace {

// The part of NVML's C ABI used here (nvml.h, stable since the _v2 entry points of 2015):
// functions return an int status, NVML_SUCCESS being 0; a device is an opaque pointer; clock
// type 1 is NVML_CLOCK_SM; power is in milliwatts.
using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char*, void**);
using NvmlClock = int (*)(void*, int, unsigned*);
using NvmlPower = int (*)(void*, unsigned*);
using NvmlEnergy = int (*)(void*, unsigned long long*);  // millijoules since the driver loaded
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;

struct Nvml {
  bool ok = false;
  std::string why;
  NvmlClock clock = nullptr;
  NvmlPower power = nullptr;
  NvmlPower limit = nullptr;
  NvmlEnergy energy = nullptr;  // optional (Volta and later); null where the driver lacks it
  NvmlByPci by_pci = nullptr;
};

// Loaded and initialised once per process; never unloaded (other threads may still sample).
const Nvml& nvml() {
  static const Nvml n = [] {
    Nvml r;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      r.why = "NVML (libnvidia-ml.so.1) not found";
      return r;
    }
    auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
    r.by_pci = reinterpret_cast<NvmlByPci>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    r.clock = reinterpret_cast<NvmlClock>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    r.power = reinterpret_cast<NvmlPower>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    r.limit = reinterpret_cast<NvmlPower>(dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit"));
    r.energy = reinterpret_cast<NvmlEnergy>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    if (!init || !r.by_pci || !r.clock || !r.power || !r.limit) {
      r.why = "NVML lacks the functions used";
      return r;
    }
    if (init() != kNvmlSuccess) {
      r.why = "NVML did not initialise";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return n;
}

}  // namespace

std::unique_ptr<GpuSampler> GpuSampler::open(const std::string& pci_bus_id) {
  std::unique_ptr<GpuSampler> s(new GpuSampler());
  if (pci_bus_id.empty()) {
    s->why_ = "no GPU";
    return s;
  }
  const Nvml& n = nvml();
  if (!n.ok) {
    s->why_ = n.why;
    return s;
  }
  void* dev = nullptr;
  if (n.by_pci(pci_bus_id.c_str(), &dev) != kNvmlSuccess || dev == nullptr) {
    s->why_ = "NVML has no device " + pci_bus_id;
    return s;
  }
  s->device_ = dev;
  unsigned mw = 0;
  if (n.limit(dev, &mw) == kNvmlSuccess) s->limit_w_ = mw / 1000.0;
  return s;
}

GpuSampler::~GpuSampler() {
  (void)stop();
}

void GpuSampler::sample() {
  const Nvml& n = nvml();
  unsigned mhz = 0, mw = 0;
  const bool c = n.clock(device_, kNvmlClockSm, &mhz) == kNvmlSuccess;
  const bool p = n.power(device_, &mw) == kNvmlSuccess;
  std::lock_guard<std::mutex> lock(mu_);
  if (c) mhz_.push_back(mhz);
  if (p) watts_.push_back(mw / 1000.0);
}

bool GpuSampler::read_energy(double* joules) const {
  const Nvml& n = nvml();
  unsigned long long mj = 0;
  if (!n.energy || n.energy(device_, &mj) != kNvmlSuccess) return false;
  *joules = static_cast<double>(mj) / 1000.0;
  return true;
}

void GpuSampler::start(int period_ms) {
  (void)stop();
  if (!active()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mhz_.clear();
    watts_.clear();
    steps_.clear();
  }
  energy_ok_ = read_energy(&energy_start_j_);
  started_ = std::chrono::steady_clock::now();
  running_ = true;
  thread_ = std::thread([this, period_ms] {
    // With a counter: wake every kEnergyPollMs to see it move, sample the clock every period_ms.
    const int tick_ms = energy_ok_ ? kEnergyPollMs : std::max(1, period_ms);
    const int ticks_per_sample = std::max(1, std::max(1, period_ms) / tick_ms);
    double last = energy_start_j_;
    for (int tick = 1; running_; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms));
      if (!running_) break;
      double j = 0;
      if (energy_ok_ && read_energy(&j) && j != last) {
        last = j;
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
        std::lock_guard<std::mutex> lock(mu_);
        steps_.push_back({t, j});
      }
      if (tick % ticks_per_sample == 0) sample();
    }
  });
}

GpuSampler::Reading GpuSampler::stop() {
  Reading r;
  if (!thread_.joinable()) return r;
  running_ = false;
  thread_.join();
  double energy_end = 0;
  if (energy_ok_ && read_energy(&energy_end) && energy_end >= energy_start_j_) {
    r.energy_j = energy_end - energy_start_j_;
    r.energy_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }
  std::lock_guard<std::mutex> lock(mu_);
  r.samples = static_cast<int>(mhz_.size());
  r.power_samples = static_cast<int>(watts_.size());
  r.power_limit_w = limit_w_;
  if (!mhz_.empty()) {
    std::vector<double> m = mhz_;
    std::sort(m.begin(), m.end());
    r.sm_mhz_median = m[m.size() / 2];
    r.sm_mhz_min = m.front();
  }
  if (!watts_.empty()) {
    r.power_w_mean = std::accumulate(watts_.begin(), watts_.end(), 0.0) / watts_.size();
    r.power_w_max = *std::max_element(watts_.begin(), watts_.end());
  }
  r.energy_steps = static_cast<int>(steps_.size());
  if (r.energy_j > 0) (void)power_between_steps(steps_, &r.step_power_w, &r.step_seconds);
  return r;
}

bool GpuSampler::power_between_steps(const std::vector<EnergyStep>& steps, double* watts,
                                     double* seconds) {
  if (steps.size() < 2) return false;
  const double dt = steps.back().seconds - steps.front().seconds;
  const double dj = steps.back().joules - steps.front().joules;
  if (!(dt > 0) || dj < 0) return false;
  *watts = dj / dt;
  *seconds = dt;
  return true;
}

}  // namespace zimage::bench
