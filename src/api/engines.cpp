// Several engines, one per device (zimage.h: cuda_device_count, parse_device_list,
// load_engines). Why nothing more is needed for data parallelism: an Engine owns its backend
// (device binding, streams, allocator, memory plan) and binds its device at the start of every
// call, so N engines on N threads are N independent GPUs. What this file adds is the device list
// grammar and loading them at once.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "backend/backend.h"
#include "core/log.h"
#include "zimage/zimage.h"

namespace zimage {

namespace {

constexpr size_t kMaxEngines = 64;

// "cpu", "cuda" -> "cuda:0", "cuda:N" (N a decimal of at most 3 digits, no sign or leading
// spaces) -> itself; nullopt otherwise.
std::optional<std::string> canonical_device(const std::string& item) {
  if (item == "cpu") return item;
  if (item == "cuda") return std::string("cuda:0");
  if (item.rfind("cuda:", 0) != 0 || item.size() == 5 || item.size() > 8) return std::nullopt;
  int idx = 0;
  for (size_t i = 5; i < item.size(); ++i) {
    if (item[i] < '0' || item[i] > '9') return std::nullopt;
    idx = idx * 10 + (item[i] - '0');
  }
  return "cuda:" + std::to_string(idx);  // "cuda:007" -> "cuda:7": duplicates compare equal
}

}  // namespace

int cuda_device_count() {
  return cuda_visible_devices();
}

Result<std::vector<std::string>> parse_device_list(const std::string& list) {
  if (list == "all") {
    const int n = cuda_device_count();
    if (n <= 0) return Unsupported("all: no CUDA device is visible to this process");
    std::vector<std::string> out;
    for (int i = 0; i < n && out.size() < kMaxEngines; ++i)
      out.push_back("cuda:" + std::to_string(i));
    return out;
  }
  std::vector<std::string> out;
  size_t start = 0;
  bool any_cpu = false, any_cuda = false;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::string where = "item " + std::to_string(out.size() + 1) + " of '" + list + "'";
    if (item.empty()) return InvalidArgument(where + " is empty");
    if (item == "all") return InvalidArgument(where + ": 'all' must stand alone");
    if (item == "auto")
      return InvalidArgument(where + ": 'auto' is not a device here; name cpu or cuda:N");
    // cuda:A-B: the devices A to B.
    std::vector<std::string> items;
    if (const size_t dash = item.find('-');
        item.rfind("cuda:", 0) == 0 && dash != std::string::npos) {
      const std::optional<std::string> lo = canonical_device(item.substr(0, dash));
      const std::optional<std::string> hi = canonical_device("cuda:" + item.substr(dash + 1));
      const int a = lo ? std::atoi(lo->c_str() + 5) : 0, b = hi ? std::atoi(hi->c_str() + 5) : -1;
      if (!lo || !hi || a > b)
        return InvalidArgument(where + ": '" + item + "' is not a range cuda:A-B with A <= B");
      for (int i = a; i <= b && items.size() <= kMaxEngines; ++i)
        items.push_back("cuda:" + std::to_string(i));
    } else {
      const std::optional<std::string> dev = canonical_device(item);
      if (!dev)
        return InvalidArgument(where + ": '" + item +
                               "' is not one of cpu, cuda, cuda:N, cuda:A-B");
      items.push_back(*dev);
    }
    for (const std::string& dev : items) {
      (dev == "cpu" ? any_cpu : any_cuda) = true;
      if (any_cpu && any_cuda)
        return InvalidArgument(
            "'" + list + "' mixes cpu and cuda engines (their images differ: f32 against bf16)");
      out.push_back(dev);
      if (out.size() > kMaxEngines)
        return InvalidArgument("'" + list + "' names more than " + std::to_string(kMaxEngines) +
                               " engines");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<std::vector<std::unique_ptr<Engine>>> load_engines(const EngineOptions& options,
                                                          const std::vector<std::string>& devices) {
  if (devices.empty()) return InvalidArgument("devices: no device given");
  if (devices.size() > kMaxEngines)
    return InvalidArgument("devices: more than " + std::to_string(kMaxEngines) + " engines");
  const size_t n = devices.size();
  std::vector<Result<std::unique_ptr<Engine>>> loaded;
  loaded.reserve(n);
  for (size_t i = 0; i < n; ++i) loaded.emplace_back(Status(ErrorCode::kInternal, "not loaded"));
  // One loader per distinct device, its engines in list order.
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < n; ++i) by_device[devices[i]].push_back(i);
  auto load_group = [&](const std::vector<size_t>& group) noexcept {
    for (size_t i : group) {
      try {
        EngineOptions o = options;
        o.device = devices[i];
        loaded[i] = Engine::load(o);
      } catch (const std::bad_alloc&) {
        loaded[i] = OutOfMemory("out of host memory while loading");
      } catch (...) {
        loaded[i] = InternalError("unexpected exception while loading");
      }
    }
  };
  if (by_device.size() == 1) {
    load_group(by_device.begin()->second);
  } else {
    std::vector<std::thread> threads;
    try {
      for (const auto& [dev, group] : by_device) threads.emplace_back(load_group, std::cref(group));
    } catch (...) {
      // No thread to be had: the groups not started load here, one after another.
      for (auto& t : threads) t.join();
      size_t started = threads.size();
      threads.clear();
      for (const auto& [dev, group] : by_device)
        if (started > 0) {
          --started;
        } else {
          load_group(group);
        }
    }
    for (auto& t : threads) t.join();
  }
  std::vector<std::unique_ptr<Engine>> engines;
  for (size_t i = 0; i < n; ++i) {
    if (!loaded[i].ok())  // one engine: Engine::load's own words (they name a bad device)
      return n == 1 ? loaded[i].status()
                    : loaded[i].status().with_context("engine " + std::to_string(i) + " on " +
                                                      devices[i]);
    engines.push_back(std::move(loaded[i]).value());
  }
  return engines;
}

std::vector<GenerateRequest> split_batch(const GenerateRequest& req, int parts) {
  const size_t per = static_cast<size_t>(std::max(1, req.images_per_prompt));
  const size_t total = req.prompts.size() * per;
  if (parts <= 1 || total <= 1) return {req};
  const size_t k = std::min(total, static_cast<size_t>(parts));
  std::vector<GenerateRequest> out;
  size_t first = 0;
  for (size_t p = 0; p < k; ++p) {
    const size_t count = total / k + (p < total % k ? 1 : 0);
    const size_t end = first + count;
    GenerateRequest r = req;
    r.first_image = req.first_image + static_cast<int>(first);
    r.prompts.clear();
    if (first % per == 0 && end % per == 0) {  // whole prompts: as the batch lays them out
      r.prompts.assign(req.prompts.begin() + static_cast<std::ptrdiff_t>(first / per),
                       req.prompts.begin() + static_cast<std::ptrdiff_t>(end / per));
      r.images_per_prompt = static_cast<int>(per);
    } else if (first / per == (end - 1) / per) {  // inside one prompt's images
      r.prompts = {req.prompts[first / per]};
      r.images_per_prompt = static_cast<int>(count);
    } else {  // across prompts: one prompt entry per image
      for (size_t i = first; i < end; ++i) r.prompts.push_back(req.prompts[i / per]);
      r.images_per_prompt = 1;
    }
    out.push_back(std::move(r));
    first = end;
  }
  return out;
}

}  // namespace zimage
