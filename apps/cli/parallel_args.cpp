#include "parallel_args.h"

#include <cstdlib>

namespace zimage::cli {

namespace {

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 4) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

void add_parallel_options(CLI::App* cmd, ParallelArgs& a) {
  cmd->add_option(
      "--devices", a.devices,
      "Devices for --parallel: cuda:0,cuda:1 or cuda:0-3 (the first replaces --device)");
  cmd->add_option("--parallel", a.parallel,
                  "sequence: one image's DiT split over --devices (Ulysses attention; "
                  "docs/PARALLEL.md)");
  cmd->add_option("--parallel-comm", a.comm,
                  "Sequence-parallel transport: auto (NCCL on distinct GPUs, else local), nccl, "
                  "local (in-process copies; several ranks may share a GPU)");
}

bool parse_device_list(const std::string& text, std::vector<std::string>* out, std::string* error) {
  out->clear();
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string item =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) {
      *error = "--devices: '" + text + "' has an empty item (write cuda:0,cuda:1)";
      return false;
    }
    const size_t dash = item.find('-');
    if (item.rfind("cuda:", 0) == 0 && dash != std::string::npos) {  // cuda:A-B
      const std::string a = item.substr(5, dash - 5), b = item.substr(dash + 1);
      if (!all_digits(a) || !all_digits(b) || std::atoi(a.c_str()) > std::atoi(b.c_str())) {
        *error = "--devices: '" + item + "' is not a range cuda:A-B with A <= B";
        return false;
      }
      for (int i = std::atoi(a.c_str()); i <= std::atoi(b.c_str()); ++i)
        out->push_back("cuda:" + std::to_string(i));
    } else {
      out->push_back(item);  // checked by the engine as --device values are
    }
    if (out->size() > 64) {
      *error = "--devices: more than 64 devices";
      return false;
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return true;
}

bool sequence_parallel_devices(const ParallelArgs& a, std::vector<std::string>* out,
                               std::string* error) {
  out->clear();
  if (a.parallel.empty() && a.devices.empty()) return true;
  if (a.parallel != "sequence") {
    *error = a.parallel.empty()
                 ? "--devices: needs --parallel sequence (one image's DiT split over the devices)"
                 : "--parallel: '" + a.parallel + "' is not one of: sequence";
    return false;
  }
  if (a.devices.empty()) {
    *error = "--parallel sequence: needs --devices (e.g. cuda:0,cuda:1)";
    return false;
  }
  if (a.comm != "auto" && a.comm != "local" && a.comm != "nccl") {
    *error = "--parallel-comm: '" + a.comm + "' is not one of auto, local, nccl";
    return false;
  }
  return parse_device_list(a.devices, out, error);
}

}  // namespace zimage::cli
