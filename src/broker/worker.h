// The broker worker: takes jobs from a Redis stream through a consumer group, runs each on one
// Engine, stores the result and acknowledges the entry in one MULTI/EXEC. Why this shape: the
// worker keeps no state of its own (everything is in Redis), so any number of workers on any
// number of hosts share one stream, and a worker that dies mid-job loses nothing: its entry stays
// pending and another worker claims it (XAUTOCLAIM) once it has been idle --claim-idle-ms.
// docs/BROKER.md has the protocol.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "broker/redis_url.h"
#include "serve/request_parse.h"
#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage::broker {

struct WorkerOptions {
  RedisUrl url;
  std::string stream = "zimage:jobs";
  std::string group = "zimage";
  std::string consumer;  // unique per worker; empty = "<host>:<pid>"
  std::string prefix = "zimage";
  int64_t claim_idle_ms = 30000;  // entries pending this long with another consumer are claimed
  int max_deliveries = 3;         // a job delivered more often gets an error result instead
  int64_t block_ms = 1000;        // XREADGROUP BLOCK (also how often the stop flag is read)
  int64_t heartbeat_ms = 0;       // the running job's entry re-claimed this often; 0 = idle / 3
  int64_t result_ttl_s = 86400;   // results (and progress) expire after this
  int64_t max_jobs = 0;           // exit after this many jobs; 0 = run until stopped
  serve::ParseLimits limits;      // request checks, as the server's
};

// Fills in the defaults that depend on others (consumer, heartbeat) and checks every option;
// kInvalidArgument names the flag ("--claim-idle-ms: ...").
Status finish_options(WorkerOptions* o);

struct WorkerStats {
  int64_t jobs = 0;        // results stored (ok or error)
  int64_t failed = 0;      // of which errors
  int64_t duplicates = 0;  // entries acked because a result already existed
};

// Runs until `stop` is set (then the current job is finished, stored and acked first) or
// max_jobs are done. An error is returned only at start (Redis unreachable, bad credentials, the
// jobs key of another type) or when the host runs out of memory. Later, whatever Redis answers
// (a lost connection, a key of the wrong type, OOM, a refused command) is logged and retried with
// backoff, and the worker goes on with further jobs; a result that cannot be stored leaves its
// job pending, to be claimed again (docs/BROKER.md, "Failures").
Status run_worker(Engine& engine, const WorkerOptions& options, const std::atomic<bool>& stop,
                  WorkerStats* stats);

}  // namespace zimage::broker
