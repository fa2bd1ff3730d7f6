// --devices / --parallel / --parallel-comm (docs/PARALLEL.md), shared by `zimage generate` and
// `zimage bench`: a device list such as "cuda:0,cuda:1", "cuda:0-3" or "all", and the parallelism
// that uses it: data (a batch split over one engine per device; generate's default) or sequence
// (one image's DiT split over the devices).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace zimage::cli {

struct ParallelArgs {
  std::string devices;        // "--devices": zimage::parse_device_list's syntax
  std::string parallel;       // "--parallel": "data" (generate's default), "sequence"
  std::string comm = "auto";  // "--parallel-comm": auto, local, nccl
};

// Adds --devices, --parallel and --parallel-comm to `cmd`.
void add_parallel_options(CLI::App* cmd, ParallelArgs& a);

// The sequence-parallel devices for EngineOptions::sequence_parallel_devices, or an error (a
// usage error: exit 2) when the flags do not fit together. Empty unless --parallel sequence.
bool sequence_parallel_devices(const ParallelArgs& a, std::vector<std::string>* out,
                               std::string* error);

}  // namespace zimage::cli
