// Server-Sent Events for one job (GET /v1/jobs/{id}/events). Why a class: the stream is a small
// state machine over job snapshots. A client gets the current state first (queued, or started and
// the current step, or the final event), then one `progress` event per denoising step even when
// the worker advanced several steps between two wake-ups, then exactly one final event (`done`,
// `failed` or `cancelled`) and the end of the stream. A job with live previews also gets a
// `preview` event after the progress events whenever a newer preview is there (the latest only:
// a slow client skips previews, never steps). Idle periods send a comment line, which also
// tells the server when a client has gone away (its write fails).
#pragma once

#include <memory>
#include <string>

#include "serve/job.h"

namespace zimage::serve {

class SseStream {
 public:
  // `base` prefixes the image URLs of the final event ("" = relative).
  SseStream(std::shared_ptr<Job> job, std::string base)
      : job_(std::move(job)), base_(std::move(base)) {}

  // The text to send after seeing `snap` (may be empty; finished() tells when the stream is
  // over). `position` is the job's queue position (-1 when not queued).
  std::string next(const JobSnapshot& snap, int position);
  bool finished() const { return finished_; }
  uint64_t seen_version() const { return seen_; }
  bool started() const { return started_; }
  bool first() const { return first_; }

  // One event: "event: NAME\ndata: JSON\n\n".
  static std::string event(const std::string& name, const std::string& data_json);

 private:
  std::shared_ptr<Job> job_;
  std::string base_;
  bool first_ = true;
  bool started_ = false;
  bool finished_ = false;
  int last_step_ = 0;
  int last_position_ = -2;
  int last_preview_ = 0;
  uint64_t seen_ = 0;
};

}  // namespace zimage::serve
