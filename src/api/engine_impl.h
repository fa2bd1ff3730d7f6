// The Engine's state (include/zimage/zimage.h), shared by engine.cpp (load, generate) and
// engine_batch.cpp (continuous batching). Internal: nothing outside src/api includes it.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "api/guarded.h"
#include "zimage/request_check.h"
#include "backend/backend.h"
#include "io/lora/lora_cache.h"
#include "model/common/debug.h"
#include "model/adapters/lora_runtime.h"
#include "pipeline/text_to_image.h"
#include "zimage/zimage.h"

namespace zimage {

// One request in the shared denoising batch.
struct BatchEntry {
  std::unique_ptr<DebugSink> sink;  // when the request asked for dumps
  std::unique_ptr<DenoiseState> state;
  std::vector<RuntimeLora> loras;  // the request's LoRAs, parsed (requests of one set batch)
  std::string lora_key;
};

struct Engine::Impl {
  EngineOptions options;
  std::string precision;
  std::unique_ptr<Backend> backend;
  // Ranks 1..P-1 of a sequence-parallel DiT (EngineOptions::sequence_parallel_devices); declared
  // before the pipeline, which holds transformers on them, so they outlive it.
  std::vector<std::unique_ptr<Backend>> rank_backends;
  std::unique_ptr<TextToImage> pipeline;
  RequestLimits limits;
  std::mutex mu;  // one call at a time: the backend's buffers are shared
  // Continuous batching: requests by id (ids grow with arrival, so the map is in arrival order).
  std::map<uint64_t, BatchEntry> batch;
  uint64_t next_batch_id = 1;
  // Per-request LoRAs (engine_lora.cpp).
  std::unique_ptr<LoraCache> lora_cache;
  LoraMethod lora_method = LoraMethod::kAuto;
  // The request's LoRA files, parsed (through the cache); errors name the file. No lock needed.
  Result<std::vector<RuntimeLora>> resolve_loras(const std::vector<LoraSpec>& specs);
  // Makes `loras` the transformer's set (under mu).
  Status use_loras(const std::vector<RuntimeLora>& loras);
};

// --dump DIR: made if missing, and refused up front when it is not a folder (rather than one
// warning per tensor and a success).
inline Status prepare_dump_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir, ec)) {
    return InvalidArgument("dump_dir: '" + dir + "' is not a folder" +
                           (std::filesystem::exists(dir, ec) ? "" : " and cannot be created"));
  }
  return Status::Ok();
}

}  // namespace zimage
