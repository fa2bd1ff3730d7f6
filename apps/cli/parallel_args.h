// --devices / --parallel / --parallel-comm (docs/PARALLEL.md), shared by `zimage generate` and
// `zimage bench`: a device list such as "cuda:0,cuda:1" (or "cuda:0-3"), and the parallelism that
// uses it. Only sequence parallelism lives here; other modes name themselves in the error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace zimage::cli {

struct ParallelArgs {
  std::string devices;        // "--devices": comma-separated, "cuda:A-B" ranges
  std::string parallel;       // "--parallel": "sequence" (or empty)
  std::string comm = "auto";  // "--parallel-comm": auto, local, nccl
};

// Adds --devices, --parallel and --parallel-comm to `cmd`.
void add_parallel_options(CLI::App* cmd, ParallelArgs& a);

// "cuda:0,cuda:1" -> {"cuda:0", "cuda:1"}; "cuda:0-2" -> cuda:0, cuda:1, cuda:2; "cpu,cpu" stays.
// false with *error naming the flag and the bad item (empty items, reversed ranges, > 64 ranks).
bool parse_device_list(const std::string& text, std::vector<std::string>* out, std::string* error);

// The sequence-parallel devices for EngineOptions::sequence_parallel_devices, or an error (a
// usage error: exit 2) when the flags do not fit together. No --parallel and no --devices: empty.
bool sequence_parallel_devices(const ParallelArgs& a, std::vector<std::string>* out,
                               std::string* error);

}  // namespace zimage::cli
