// All jobs the server knows, by id. Why bounded: a server runs for weeks; finished jobs (and their
// images) are kept only for the last `max_finished` jobs, `max_age` and `max_bytes` of what they
// hold (Job::kept_bytes: the encoded images and the request's texts; a final job has released
// its decoded input images), whichever is smallest, so memory does not grow with traffic. Ids are
// 128-bit random hex, made here: a client can neither choose nor guess one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/job.h"

namespace zimage::serve {

struct RetentionLimits {
  size_t max_finished = 256;
  std::chrono::seconds max_age{30 * 60};
  size_t max_bytes = size_t{512} << 20;
};

// 32 lowercase hex digits from the OS's random source.
std::string random_job_id();
// A random seed in 0..2^53-1 (exact in JavaScript, so the web page can reuse it).
uint64_t random_seed();
// True when `id` has the shape random_job_id() makes (so it cannot be a path).
bool well_formed_job_id(const std::string& id);

class JobTable {
 public:
  explicit JobTable(RetentionLimits limits = {}) : limits_(limits) {}

  // A new job with a fresh id, in the table (prunes old finished jobs first).
  std::shared_ptr<Job> create(JobSpec spec);
  std::shared_ptr<Job> find(const std::string& id) const;
  void remove(const std::string& id);
  std::vector<std::shared_ptr<Job>> all() const;
  size_t size() const;
  // Job::kept_bytes summed over the finished jobs: what max_bytes bounds.
  size_t finished_bytes() const;
  // Drops finished jobs past the retention limits (oldest first).
  void prune();

 private:
  void prune_locked();

  RetentionLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
};

}  // namespace zimage::serve
