// Job table and ids (see job_table.h).
#include "serve/job_table.h"

#include <algorithm>
#include <random>

namespace zimage::serve {

namespace {
uint64_t random_u64() {
  // std::random_device reads getrandom(2) on Linux. A static one, behind a mutex: it is not
  // thread-safe and opening it per call costs a file descriptor.
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  return (uint64_t{rd()} << 32) ^ rd();
}
}  // namespace

std::string random_job_id() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (int half = 0; half < 2; ++half) {
    uint64_t v = random_u64();
    for (int i = 0; i < 16; ++i, v >>= 4) id += kHex[v & 15];
  }
  return id;
}

uint64_t random_seed() {
  return random_u64() & ((uint64_t{1} << 53) - 1);
}

bool well_formed_job_id(const std::string& id) {
  if (id.size() != 32) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::shared_ptr<Job> JobTable::create(JobSpec spec) {
  std::lock_guard<std::mutex> lock(mu_);
  prune_locked();
  std::string id = random_job_id();
  while (jobs_.count(id) != 0) id = random_job_id();
  auto job = std::make_shared<Job>(id, std::move(spec));
  jobs_.emplace(id, job);
  return job;
}

std::shared_ptr<Job> JobTable::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobTable::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(id);
}

std::vector<std::shared_ptr<Job>> JobTable::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Job>> v;
  for (const auto& [id, job] : jobs_) v.push_back(job);
  return v;
}

size_t JobTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

size_t JobTable::finished_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (const auto& [id, job] : jobs_)
    if (is_final(job->snapshot().state)) bytes += job->kept_bytes();
  return bytes;
}

void JobTable::prune() {
  std::lock_guard<std::mutex> lock(mu_);
  prune_locked();
}

void JobTable::prune_locked() {
  struct Finished {
    Job::Clock::time_point at;
    size_t bytes;
    std::string id;
  };
  std::vector<Finished> done;
  size_t bytes = 0;
  for (const auto& [id, job] : jobs_) {
    if (!is_final(job->snapshot().state)) continue;
    done.push_back({job->finished_at(), job->kept_bytes(), id});
    bytes += done.back().bytes;
  }
  std::sort(done.begin(), done.end(),
            [](const Finished& a, const Finished& b) { return a.at < b.at; });
  const auto now = Job::Clock::now();
  size_t count = done.size();
  for (const Finished& f : done) {
    const bool too_old = now - f.at > limits_.max_age;
    if (!too_old && count <= limits_.max_finished && bytes <= limits_.max_bytes) break;
    jobs_.erase(f.id);
    --count;
    bytes -= f.bytes;
  }
}

}  // namespace zimage::serve
