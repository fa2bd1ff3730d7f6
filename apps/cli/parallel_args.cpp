#include "parallel_args.h"

#include <utility>

#include "zimage/zimage.h"

namespace zimage::cli {

void add_parallel_options(CLI::App* cmd, ParallelArgs& a) {
  cmd->add_option("--devices", a.devices,
                  "Devices, one engine or rank each: cuda:0,cuda:1, cuda:0-3 or all (the first "
                  "replaces --device)");
  cmd->add_option("--parallel", a.parallel,
                  "data: the batch split over one engine per device (generate's default with "
                  "--devices); sequence: one image's DiT split over --devices (Ulysses "
                  "attention; docs/PARALLEL.md)");
  cmd->add_option("--parallel-comm", a.comm,
                  "Sequence-parallel transport: auto (NCCL on distinct GPUs, else local), nccl, "
                  "local (in-process copies; several ranks may share a GPU)");
}

bool sequence_parallel_devices(const ParallelArgs& a, std::vector<std::string>* out,
                               std::string* error) {
  out->clear();
  if (!a.parallel.empty() && a.parallel != "data" && a.parallel != "sequence") {
    *error = "--parallel: '" + a.parallel + "' is not one of: data, sequence";
    return false;
  }
  if (a.parallel != "sequence") return true;
  if (a.devices.empty()) {
    *error = "--parallel sequence: needs --devices (e.g. cuda:0,cuda:1)";
    return false;
  }
  if (a.comm != "auto" && a.comm != "local" && a.comm != "nccl") {
    *error = "--parallel-comm: '" + a.comm + "' is not one of auto, local, nccl";
    return false;
  }
  auto list = zimage::parse_device_list(a.devices);
  if (!list.ok()) {
    *error = "--devices: " + list.status().message();
    return false;
  }
  *out = std::move(list).value();
  return true;
}

}  // namespace zimage::cli
