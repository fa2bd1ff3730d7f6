#include "model/common/weight_streamer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/log.h"

namespace zimage {

StreamSource StreamSource::of(const Tensor& host) {
  StreamSource s;
  if (!host.defined()) return s;
  s.dtype = host.dtype();
  s.shape = host.shape();
  s.parts.push_back(host);
  return s;
}

uint64_t StreamSource::device_bytes() const {
  const int64_t n = shape_numel(shape);
  return defined() && n > 0 ? static_cast<uint64_t>(n) * dtype_size(dtype) : 0;
}

uint64_t StreamSource::host_bytes() const {
  uint64_t b = 0;
  for (const Tensor& t : parts) b += t.nbytes();
  return b;
}

Status copy_to_host(Backend& be, StreamSource& src, bool pinned) {
  if (!src.defined()) return Status::Ok();
  bool one_dtype = true;
  for (const Tensor& t : src.parts) one_dtype = one_dtype && t.dtype() == src.parts[0].dtype();
  std::vector<Tensor> copies;
  if (one_dtype) {
    ZI_ASSIGN_OR_RETURN(Tensor c, be.host_copy(src.parts, pinned));
    copies.push_back(std::move(c));
  } else {
    for (const Tensor& t : src.parts) {
      ZI_ASSIGN_OR_RETURN(Tensor c, be.host_copy({t}, pinned));
      copies.push_back(std::move(c));
    }
  }
  src.parts = std::move(copies);
  src.from_file = false;
  return Status::Ok();
}

Result<std::unique_ptr<WeightStreamer>> WeightStreamer::create(
    Backend& be, std::vector<std::vector<StreamSource>> units, int first_slot, int slots) {
  if (units.empty()) return InvalidArgument("weight streamer: no units");
  slots = std::min<int>(slots, static_cast<int>(units.size()));
  if (slots < 1 || first_slot < 0 || first_slot + slots > Backend::kStreamSlots)
    return InvalidArgument("weight streamer: slots [" + std::to_string(first_slot) + ", " +
                           std::to_string(first_slot + slots) + ") outside the backend's " +
                           std::to_string(Backend::kStreamSlots));
  const size_t positions = units[0].size();
  std::vector<uint64_t> max_bytes(positions, 0);
  std::unique_ptr<WeightStreamer> s(new WeightStreamer(be));
  for (const auto& u : units) {
    if (u.size() != positions)
      return InternalError("weight streamer: units with different numbers of tensors");
    bool all_files = true;
    for (size_t p = 0; p < positions; ++p) {
      const StreamSource& src = u[p];
      if (!src.defined()) continue;
      int64_t elems = 0;
      for (const Tensor& t : src.parts) {
        if (!t.defined() || t.device() != Device::kCPU)
          return InternalError("weight streamer: unit tensor " + t.describe() +
                               " is not in host memory");
        if (!be.can_stream(t.dtype(), src.dtype))
          return InternalError("weight streamer: " + be.name() + " cannot stream " + t.describe() +
                               " into " + dtype_name(src.dtype));
        elems += t.numel();
      }
      if (elems != shape_numel(src.shape))
        return InternalError("weight streamer: parts of " + std::to_string(elems) +
                             " elements for a tensor of shape " + shape_string(src.shape));
      all_files = all_files && src.from_file;
      max_bytes[p] = std::max(max_bytes[p], src.device_bytes());
      s->stream_bytes_ += src.device_bytes();
    }
    if (all_files) ++s->from_files_;
  }
  s->units_ = std::move(units);
  s->first_slot_ = first_slot;
  s->slots_ = slots;
  s->buffers_.resize(slots);
  s->in_slot_.assign(slots, -1);
  for (int k = 0; k < slots; ++k) {
    s->buffers_[k].resize(positions);
    for (size_t p = 0; p < positions; ++p) {
      if (max_bytes[p] == 0) continue;
      auto buf = be.alloc(DType::kU8, {static_cast<int64_t>(max_bytes[p])});
      if (!buf.ok()) return buf.status().with_context("allocating weight streaming slots");
      s->buffers_[k][p] = std::move(buf).value();
      s->slot_bytes_ += max_bytes[p];
    }
  }
  return s;
}

void WeightStreamer::prepare_staging() noexcept {
  try {
    uint64_t staged = 0;
    std::vector<Tensor> parts;
    for (const auto& u : units_) {
      parts.clear();
      for (const StreamSource& src : u)
        if (src.defined()) parts.insert(parts.end(), src.parts.begin(), src.parts.end());
      staged = std::max(staged, be_.staged_stream_bytes(parts));
    }
    if (staged > 0)
      for (int k = 0; k < slots_; ++k) be_.prepare_stream_staging(first_slot_ + k, staged);
  } catch (...) {  // no memory for the hint: the staging is allocated at the first stream
  }
}

uint64_t WeightStreamer::lock_file_pages(const std::vector<bool>& lock) {
  const long ps = ::sysconf(_SC_PAGESIZE);
  const uintptr_t page = ps > 0 ? static_cast<uintptr_t>(ps) : 4096;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end), whole pages
  for (size_t u = 0; u < units_.size() && u < lock.size(); ++u) {
    if (!lock[u]) continue;
    for (const StreamSource& src : units_[u]) {
      if (!src.from_file) continue;
      for (const Tensor& t : src.parts) {
        if (t.nbytes() == 0) continue;
        const auto b = reinterpret_cast<uintptr_t>(t.data());
        ranges.emplace_back(b / page * page, (b + t.nbytes() + page - 1) / page * page);
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  for (const auto& [b, e] : merged) {
    auto h = be_.lock_host_range(reinterpret_cast<const void*>(b), e - b);
    if (!h.ok()) {
      ZI_WARN("weight streaming: %s; the rest streams through staging",
              h.status().message().c_str());
      break;
    }
    if (!*h) break;  // nothing to lock on this backend
    locks_.push_back(std::move(h).value());
    locked_bytes_ += e - b;
  }
  return locked_bytes_;
}

std::vector<Tensor> WeightStreamer::views(int slot, int unit) const {
  const auto& u = units_[unit];
  std::vector<Tensor> out(u.size());
  for (size_t p = 0; p < u.size(); ++p) {
    if (!u[p].defined()) continue;
    const Tensor& buf = buffers_[slot][p];
    out[p] = Tensor(buf.storage(), buf.byte_offset(), u[p].dtype, u[p].shape);
  }
  return out;
}

Status WeightStreamer::load(int slot, int unit) {
  const auto& u = units_[unit];
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (size_t p = 0; p < u.size(); ++p) {
    if (!u[p].defined()) continue;
    // Each part lands on the elements after the previous one's, viewed flat in the slot.
    const Tensor& buf = buffers_[slot][p];
    const size_t es = dtype_size(u[p].dtype);
    size_t offset = buf.byte_offset();
    for (const Tensor& part : u[p].parts) {
      const int64_t n = part.numel();
      copies.emplace_back(part.view({n}), Tensor(buf.storage(), offset, u[p].dtype, {n}));
      offset += static_cast<size_t>(n) * es;
    }
  }
  ZI_TRY(be_.stream_in(first_slot_ + slot, copies));
  in_slot_[slot] = unit;
  ++loads_;
  return Status::Ok();
}

Status WeightStreamer::set_skipped(std::vector<bool> skipped) {
  if (!skipped.empty() && static_cast<int>(skipped.size()) != units())
    return InternalError("weight streamer: " + std::to_string(skipped.size()) + " skip flags for " +
                         std::to_string(units()) + " units");
  skipped_ = std::move(skipped);
  return Status::Ok();
}

Result<std::vector<Tensor>> WeightStreamer::acquire(int unit) {
  if (unit < 0 || unit >= units())
    return InternalError("weight streamer: unit " + std::to_string(unit) + " out of range");
  const int slot = unit % slots_;
  if (in_slot_[slot] != unit) {
    ZI_TRY(load(slot, unit));
    ++late_loads_;
  }
  ZI_TRY(be_.wait_slot(first_slot_ + slot));
  return views(slot, unit);
}

Status WeightStreamer::release(int unit, bool queue_next) {
  if (unit < 0 || unit >= units())
    return InternalError("weight streamer: unit " + std::to_string(unit) + " out of range");
  const int slot = unit % slots_;
  ZI_TRY(be_.release_slot(first_slot_ + slot));
  if (!queue_next) return Status::Ok();
  // The unit that uses this slot next: a multiple of `slots` later in this pass, else the first
  // of the slot's units in the next pass (units use slot unit % slots, and slots <= units),
  // passing over skipped units.
  auto used = [&](int u) { return skipped_.empty() || !skipped_[u]; };
  int next = -1;
  for (int u = unit + slots_; u < units() && next < 0; u += slots_)
    if (used(u)) next = u;
  for (int u = slot; u <= unit && next < 0; u += slots_)
    if (used(u)) next = u;
  // None (every unit of the slot skipped), or the same unit (no more used units than slots): it
  // stays where it is.
  if (next < 0 || next == unit) return Status::Ok();
  return load(slot, next);
}

}  // namespace zimage
