// Several engines for one `zimage generate` (see generate_devices.h).
#include "generate_devices.h"

#include <algorithm>
#include <string>
#include <thread>

namespace zimage::cli {

Result<std::vector<GenerateResult>> generate_parts(const std::vector<Engine*>& engines,
                                                   const std::vector<std::string>& devices,
                                                   const std::vector<GenerateRequest>& parts,
                                                   const GenerateHooks& hooks) {
  if (parts.empty() || parts.size() > engines.size() || devices.size() != engines.size())
    return InternalError("generate_parts: " + std::to_string(parts.size()) + " parts for " +
                         std::to_string(engines.size()) + " engines");
  std::vector<Result<GenerateResult>> results;
  for (size_t k = 0; k < parts.size(); ++k)
    results.emplace_back(Status(ErrorCode::kInternal, "not run"));
  auto run = [&](size_t k) noexcept {
    GenerateHooks h = hooks;
    if (k > 0) h.on_progress = nullptr;
    results[k] = engines[k]->generate(parts[k], h);  // never throws (Engine guards its calls)
  };
  std::vector<std::thread> threads;
  size_t started = 1;
  try {
    for (; started < parts.size(); ++started) threads.emplace_back(run, started);
  } catch (...) {  // no thread to be had: the rest run here, one after another
  }
  run(0);
  for (size_t k = started; k < parts.size(); ++k) run(k);
  for (auto& t : threads) t.join();
  std::vector<GenerateResult> out;
  for (size_t k = 0; k < parts.size(); ++k) {
    if (!results[k].ok())
      return results[k].status().with_context("engine " + std::to_string(k) + " on " + devices[k]);
    out.push_back(std::move(results[k]).value());
  }
  return out;
}

Result<GenerateResult> generate_joined(const std::vector<Engine*>& engines,
                                       const std::vector<std::string>& devices,
                                       const std::vector<GenerateRequest>& parts,
                                       const GenerateHooks& hooks) {
  ZI_ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                      generate_parts(engines, devices, parts, hooks));
  GenerateResult joined = std::move(results[0]);
  for (size_t k = 1; k < results.size(); ++k) {
    for (Image& img : results[k].images) joined.images.push_back(std::move(img));
    joined.timings.total_s = std::max(joined.timings.total_s, results[k].timings.total_s);
    joined.device += "; " + results[k].device;
  }
  return joined;
}

}  // namespace zimage::cli
