// The GPU's SM clock and board power while a measurement runs, read from the driver's management
// library (NVML). An H100 or H200 runs the DiT at its 700 W limit, where the SM clock drops from
// 1980 to ~1575 MHz (docs/BENCHMARKS.md, session 12): a timing says more beside the clock and
// power it ran at, and a change that moves fewer bytes can win by letting the clock rise.
//
// NVML (libnvidia-ml.so.1) ships with the driver, not with the CUDA toolkit, and has no Debian
// -dev package here; it is opened at run time (dlopen) through the few functions of its stable C
// ABI declared in gpu_sampler.cpp, so the program builds and runs where there is no driver
// (a CPU machine): the sampler is then inert and says so.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zimage::bench {

class GpuSampler {
 public:
  struct Reading {
    int samples = 0;           // clock samples; 0: none (no NVML, no such device, not started)
    double sm_mhz_median = 0;  // SM clock, median of the samples
    double sm_mhz_min = 0;
    int power_samples = 0;     // power samples (a driver may read clocks but not power)
    double power_w_mean = 0;   // board power draw as NVML reports it: on Hopper a running
    double power_w_max = 0;    // average over the last second, so a short window reads late
    double power_limit_w = 0;  // the enforced limit
    // The board's energy counter between start() and stop() (NVML's total energy, exact to the
    // millijoule where the power readings are averages), and the seconds it covers; 0 where the
    // driver has no counter. energy_j / energy_seconds is the mean power of the window.
    double energy_j = 0;
    double energy_seconds = 0;
    // The counter itself moves in steps (about every 100 ms on an H100, so the two reads above can
    // be a step off at either end: +-20 % over a 0.45 s window). The sampler polls it every
    // kEnergyPollMs and keeps when it moved; the mean power between its first and last step
    // inside the window does not depend on where the window's ends fall. 0 with fewer than two
    // steps in the window.
    int energy_steps = 0;
    double step_power_w = 0;
    double step_seconds = 0;  // the time between those two steps
  };
  // A reading of the energy counter when it moved: seconds since start(), joules.
  struct EnergyStep {
    double seconds = 0;
    double joules = 0;
  };
  static constexpr int kEnergyPollMs = 2;
  // The mean power between the first and the last step (false, and nothing written, with fewer
  // than two steps or no time between them).
  static bool power_between_steps(const std::vector<EnergyStep>& steps, double* watts,
                                  double* seconds);

  // The device with this PCI bus id ("0000:18:00.0", as cudaDeviceGetPCIBusId writes it); an
  // empty id or a machine without NVML gives an inert sampler (why() says which).
  static std::unique_ptr<GpuSampler> open(const std::string& pci_bus_id);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  bool active() const { return device_ != nullptr; }
  const std::string& why() const { return why_; }
  // Samples every `period_ms` on a thread of its own until stop(), the first sample one period
  // after the start (not the idle moment before the work), and polls the energy counter every
  // kEnergyPollMs; a second start() restarts.
  void start(int period_ms = 20);
  Reading stop();

 private:
  GpuSampler() = default;
  void sample();
  bool read_energy(double* joules) const;

  void* device_ = nullptr;  // nvmlDevice_t
  std::string why_;
  double limit_w_ = 0;
  bool energy_ok_ = false;
  double energy_start_j_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::mutex mu_;
  std::vector<double> mhz_, watts_;
  std::vector<EnergyStep> steps_;
};

}  // namespace zimage::bench
