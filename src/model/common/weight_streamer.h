// Streams the weights of blocks kept in host memory into device slots, in the order the model
// runs them, double-buffered: while block u computes out of one slot, the next streamed block's
// weights are copied into another on the backend's copy stream (Backend::stream_in), and the
// compute waits on the device for exactly the copy it needs (Backend::wait_slot). When a block is
// released, its slot is refilled with the streamed block `slots` positions later, wrapping
// around into the next pass, so in a steady state of repeated forwards every copy overlaps
// compute and the model runs at the speed of max(compute, link).
//
// A unit is one block's tensors in fixed positions (undefined where a block has none); a slot
// has, per position, one device buffer as large as the largest unit's tensor there, and a unit
// in the slot sees views of it with its own dtypes and shapes. Each position's host side is one
// or more host tensors whose elements, one after another, make the device tensor: a host copy
// made at load (page-locked or not), or the views of the weight files themselves (the row blocks
// of a fused q|k|v weight are three tensors of the file), so a block streamed from the files
// needs no host copy and no load-time work. The bytes computed on are exactly those of the
// resident model's weights, so a streamed forward equals the resident one bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

// One tensor of a streamed block: the device tensor the model computes with (dtype, shape) and
// the host tensors that make it, in order (their element counts add up to the shape's; each of
// a dtype Backend::can_stream takes into `dtype`). No parts: the block has no such tensor.
struct StreamSource {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<Tensor> parts;
  bool from_file = false;  // parts are views of the weight files, not copies made at load
  bool defined() const { return !parts.empty(); }
  // A host tensor as it is (a copy made at load).
  static StreamSource of(const Tensor& host);
  // Bytes on the device / bytes read from the host parts.
  uint64_t device_bytes() const;
  uint64_t host_bytes() const;
};

// Replaces `src`'s parts (views of the weight files) by a host copy of their bytes, page-locked
// when `pinned` (Backend::host_copy): one copy when the parts share a dtype, else one per part.
// The copy mode of streaming (WeightPlacement::stream_from_files false) for what the files hold
// as it streams: no trip through the device.
Status copy_to_host(Backend& be, StreamSource& src, bool pinned);

class WeightStreamer {
 public:
  // `units`: per streamed block, in execution order, its tensors in fixed positions (the same
  // number for every unit). Uses backend slots [first_slot, first_slot + slots) (at most as many
  // as units).
  static Result<std::unique_ptr<WeightStreamer>> create(
      Backend& be, std::vector<std::vector<StreamSource>> units, int first_slot, int slots);

  // Hints the backend at the staging its copies will go through (Backend::
  // prepare_stream_staging): the largest unit's bytes not streamed directly, per slot, so it is
  // page-locked during the load rather than at the first stream. Call once the file pages that
  // will be locked are (lock_file_pages): those stream directly and need no staging.
  void prepare_staging() noexcept;

  // The device tensors of `unit` (same positions as given), valid until release(unit). Queues
  // its copy first if it is not in its slot yet; compute queued after this waits for the copy.
  Result<std::vector<Tensor>> acquire(int unit);
  // Marks the compute queued so far as the last use of `unit`'s slot and queues the copy of the
  // streamed block that uses the slot next (`queue_next` false: leaves the slot as it is, for a
  // block used out of the passes' order, whose next block would be copied too early).
  Status release(int unit, bool queue_next = true);

  // Units the coming passes do not use (a DiT forward on refined captions skips its context
  // refiner's blocks): release() then queues, for the slot it frees, the next unit that is used,
  // so the copies stay ahead of the compute with none spent on skipped units. Empty: every unit is
  // used. Acquiring a skipped unit still works (its copy is queued then, not ahead).
  Status set_skipped(std::vector<bool> skipped);
  // Copies queued since creation, one per unit put in a slot (what skipping saves, for tests).
  uint64_t loads() const { return loads_; }
  // Of those, the copies queued by acquire() because the unit was not in its slot yet: copies
  // the compute waits for, where release() did not queue them ahead (the passes' first units, a
  // skipped unit acquired).
  uint64_t late_loads() const { return late_loads_; }

  int units() const { return static_cast<int>(units_.size()); }
  int slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }      // device memory of all slots
  uint64_t stream_bytes() const { return stream_bytes_; }  // bytes of one pass over all units
  // Units whose every tensor is read from the weight files (no host copy made at load).
  int units_from_files() const { return from_files_; }

  // Page-locks in place the file pages the units marked in `lock` (unit order) read from
  // (Backend::lock_host_range), so their streams go straight to the DMA engine instead of through
  // the backend's staging, until the streamer goes. The pages shared by neighbouring tensors are
  // locked once (ranges rounded to whole pages and merged). A range the backend cannot lock is
  // reported once as a warning and the rest is left to the staging: the same bytes, copied.
  // Returns the bytes locked.
  uint64_t lock_file_pages(const std::vector<bool>& lock);
  uint64_t locked_bytes() const { return locked_bytes_; }

 private:
  WeightStreamer(Backend& be) : be_(be) {}
  Status load(int slot, int unit);
  std::vector<Tensor> views(int slot, int unit) const;

  Backend& be_;
  std::vector<std::vector<StreamSource>> units_;  // host
  std::vector<std::vector<Tensor>> buffers_;      // per slot, per position: device bytes
  std::vector<int> in_slot_;                      // per slot: unit loaded or being loaded, -1 none
  std::vector<bool> skipped_;                     // per unit (empty: none skipped)
  uint64_t loads_ = 0;
  uint64_t late_loads_ = 0;
  int first_slot_ = 0;
  int slots_ = 0;
  int from_files_ = 0;
  std::vector<std::shared_ptr<void>> locks_;  // page-locked file ranges (lock_file_pages)
  uint64_t locked_bytes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t stream_bytes_ = 0;
};

}  // namespace zimage
