// See worker.h. The loop, per job:
//   1. an entry: our own pending ones left from an earlier life (startup), one claimed from a
//      dead or stuck worker (XAUTOCLAIM, entries idle >= claim_idle_ms), or a new one
//      (XREADGROUP ... >);
//   2. its delivery count (XPENDING); the heartbeat thread starts re-claiming it;
//   3. a result already there: ack only. Delivered more than max_deliveries times: an error
//      result ("poison"). Else decode (the server's parser) and run on the engine, with per-step
//      progress written to PREFIX:progress:<id>;
//   4. WATCH the result key; MULTI: HSET result, EXPIRE, DEL progress, XACK, XADD notification;
//      EXEC. A result stored meanwhile by another worker (a slow worker whose job was claimed)
//      trips the WATCH: then only the ack is sent.
// Failures never stop the loop (docs/BROKER.md, "Failures"): a store that fails for a reason
// that may pass (connection, OOM, LOADING, ...) is retried with backoff, then left pending to be
// claimed again; a notification stream of another type is skipped (the result is stored); a
// result key of another type gets no result, the job is acked with an error notification.
#include "broker/worker.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "broker/job_codec.h"
#include "broker/redis_client.h"
#include "serve/image_encode.h"

namespace zimage::broker {

namespace {

constexpr int64_t kResultsStreamMaxLen = 10000;

void log_line(const WorkerOptions& o, const std::string& msg) {
  std::fprintf(stderr, "zimage worker %s: %s\n", o.consumer.c_str(), msg.c_str());
  std::fflush(stderr);
}

// An error reply worth retrying: the server is loading, out of memory, busy with a script, a
// read-only replica, ... ("redis HSET: OOM command not allowed ..."), or the connection.
bool transient(const Status& st) {
  if (st.code() == ErrorCode::kIo) return true;
  if (st.code() != ErrorCode::kInvalidArgument) return false;
  const std::string& m = st.message();
  const size_t colon = m.find(": ");
  if (m.rfind("redis ", 0) != 0 || colon == std::string::npos) return false;
  const std::string word = m.substr(colon + 2, m.find(' ', colon + 2) - (colon + 2));
  for (const char* w : {"OOM", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY",
                        "CLUSTERDOWN", "NOREPLICAS", "EXECABORT"})
    if (word == w) return true;
  return false;
}

struct Entry {
  std::string id;
  bool deleted = false;  // pending, but the stream entry itself was deleted (XDEL / trimming)
  Fields fields;
};

// [id, [field, value, ...] or nil] -> Entry.
Result<Entry> parse_entry(const Reply& r) {
  ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* a, as_array(r, 2, "stream entry"));
  Entry e;
  ZI_ASSIGN_OR_RETURN(e.id, as_string((*a)[0], "stream entry id"));
  if ((*a)[1].is_nil()) {
    e.deleted = true;
    return e;
  }
  ZI_ASSIGN_OR_RETURN(e.fields, as_pairs((*a)[1], "stream entry " + e.id));
  return e;
}

// ---- the heartbeat: keeps the running job's entry ours ----------------------------------------
class Heartbeat {
 public:
  Heartbeat(const WorkerOptions& o, std::unique_ptr<RedisClient> client)
      : o_(o), db_(std::move(client)), thread_([this] { loop(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      exit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void set(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = id;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!exit_) {
      cv_.wait_for(lock, std::chrono::milliseconds(o_.heartbeat_ms));
      if (exit_ || current_.empty()) continue;
      const std::string id = current_;
      lock.unlock();
      const Status st = beat(id);
      if (!st.ok()) log_line(o_, "heartbeat for job " + id + ": " + st.message());
      lock.lock();
    }
  }

  // Resets the entry's idle time (XCLAIM min-idle 0 ... JUSTID: the delivery count stays), but
  // only while it is still ours: an entry another worker claimed is left to it.
  Status beat(const std::string& id) {
    ZI_ASSIGN_OR_RETURN(Reply p, db_->command({"XPENDING", o_.stream, o_.group, id, id, "1"}));
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* rows, as_array(p, 0, "XPENDING"));
    if (rows->empty()) return Status::Ok();  // acked meanwhile (or deleted)
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* row, as_array((*rows)[0], 4, "XPENDING row"));
    ZI_ASSIGN_OR_RETURN(std::string owner, as_string((*row)[1], "XPENDING consumer"));
    if (owner != o_.consumer) {
      set_if(id, "");
      log_line(o_, "job " + id + " was claimed by " + owner +
                       " (this worker looked dead); finishing it anyway, the first result wins");
      return Status::Ok();
    }
    return db_->command({"XCLAIM", o_.stream, o_.group, o_.consumer, "0", id, "JUSTID"}).status();
  }
  void set_if(const std::string& id, const std::string& next) {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ == id) current_ = next;
  }

  const WorkerOptions& o_;
  std::unique_ptr<RedisClient> db_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string current_;
  bool exit_ = false;
  std::thread thread_;  // last: started once the rest is built
};

// ---- the worker ---------------------------------------------------------------------------------
class Worker {
 public:
  Worker(Engine& engine, const WorkerOptions& o, const std::atomic<bool>& stop, WorkerStats* stats)
      : engine_(engine), o_(o), stop_(stop), stats_(stats) {}

  Status run() {
    ClientOptions co;
    co.command_timeout_s = 10 + static_cast<double>(o_.block_ms) / 1000;
    // About 3 s of attempts: a wrong URL fails at start with a message; later, the loop below
    // keeps retrying (with a log line each round), so a worker outlives a Redis restart.
    co.reconnect_attempts = 6;
    co.stop = &stop_;
    co.client_name = client_name("worker");
    ZI_ASSIGN_OR_RETURN(db_, RedisClient::connect(o_.url, co));
    ClientOptions ho = co;
    ho.reconnect_attempts = 1;  // a missed beat is retried at the next one
    ho.client_name = client_name("heartbeat");
    ZI_ASSIGN_OR_RETURN(auto hb_client, RedisClient::connect(o_.url, ho));
    ZI_TRY(ensure_group());
    Heartbeat heartbeat(o_, std::move(hb_client));
    hb_ = &heartbeat;
    log_line(o_, "ready on " + redacted(o_.url) + " stream " + o_.stream + " group " + o_.group);
    bool own_pending = true;  // first: entries this consumer name left pending earlier
    double backoff = 0.1;
    while (!stop_.load() && (o_.max_jobs == 0 || stats_->jobs + stats_->duplicates < o_.max_jobs)) {
      Status st = step(&own_pending);
      if (st.ok()) {
        backoff = 0.1;
        continue;
      }
      if (st.message().find("NOGROUP") != std::string::npos) {  // the stream was deleted
        log_line(o_, "group gone (" + st.message() + "); creating it again");
        st = ensure_group();
      }
      // Nothing a job or a key can do stops the worker: it logs, backs off and goes on (a key of
      // the wrong type, a permission, a malformed reply are the operator's to fix, and a fixed
      // one is picked up without a restart). Only the host running out of memory ends it.
      if (!st.ok() && st.code() == ErrorCode::kOutOfMemory) return st;
      if (!st.ok()) log_line(o_, st.message() + "; retrying");
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 5.0);
    }
    hb_ = nullptr;
    log_line(o_, "stopping after " + std::to_string(stats_->jobs) + " job(s)");
    return Status::Ok();
  }

 private:
  std::string client_name(const std::string& role) const {
    std::string n = "zimage-" + role + "-" + o_.consumer;
    for (char& c : n)
      if (c == ' ') c = '_';
    return n;
  }

  Status ensure_group() {
    auto r = db_->command({"XGROUP", "CREATE", o_.stream, o_.group, "0", "MKSTREAM"});
    if (!r.ok() && r.status().message().find("BUSYGROUP") == std::string::npos) return r.status();
    return Status::Ok();
  }

  // One entry fetched and processed (or a BLOCK timeout).
  Status step(bool* own_pending) {
    Entry e;
    bool got = false;
    if (*own_pending) {
      ZI_ASSIGN_OR_RETURN(got, read_group("0", &e, false));
      if (!got) *own_pending = false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!got && now >= next_autoclaim_) {
      next_autoclaim_ =
          now + std::chrono::milliseconds(std::max<int64_t>(100, o_.claim_idle_ms / 2));
      ZI_ASSIGN_OR_RETURN(got, autoclaim(&e));
    }
    if (!got) {
      ZI_ASSIGN_OR_RETURN(got, read_group(">", &e, true));
    }
    if (!got) return Status::Ok();
    hb_->set(e.id);
    Status st = process(e);
    hb_->set("");
    return st;
  }

  // XREADGROUP from `from` (">" new entries, "0" this consumer's pending ones).
  Result<bool> read_group(const std::string& from, Entry* e, bool block) {
    std::vector<std::string> cmd = {"XREADGROUP", "GROUP", o_.group, o_.consumer, "COUNT", "1"};
    if (block) cmd.insert(cmd.end(), {"BLOCK", std::to_string(o_.block_ms)});
    cmd.insert(cmd.end(), {"STREAMS", o_.stream, from});
    ZI_ASSIGN_OR_RETURN(Reply r, db_->command(cmd));
    if (r.is_nil()) return false;  // BLOCK timed out
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* streams, as_array(r, 1, "XREADGROUP"));
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* s,
                        as_array((*streams)[0], 2, "XREADGROUP stream"));
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* entries,
                        as_array((*s)[1], 0, "XREADGROUP entries"));
    if (entries->empty()) return false;
    ZI_ASSIGN_OR_RETURN(*e, parse_entry((*entries)[0]));
    return true;
  }

  // One entry idle for claim_idle_ms in another consumer's list, now ours.
  Result<bool> autoclaim(Entry* e) {
    ZI_ASSIGN_OR_RETURN(Reply r,
                        db_->command({"XAUTOCLAIM", o_.stream, o_.group, o_.consumer,
                                      std::to_string(o_.claim_idle_ms), cursor_, "COUNT", "1"}));
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* a, as_array(r, 2, "XAUTOCLAIM"));
    ZI_ASSIGN_OR_RETURN(cursor_, as_string((*a)[0], "XAUTOCLAIM cursor"));
    // Redis 7 lists entries deleted from the stream but still pending separately (and drops them
    // from the pending list itself); nothing to run for those.
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* claimed,
                        as_array((*a)[1], 0, "XAUTOCLAIM entries"));
    if (claimed->empty()) return false;
    ZI_ASSIGN_OR_RETURN(*e, parse_entry((*claimed)[0]));
    log_line(o_, "claimed job " + e->id + " (idle >= " + std::to_string(o_.claim_idle_ms) +
                     " ms with another worker)");
    return true;
  }

  // The entry's delivery count; 0 when it is no longer pending (acked by someone else).
  Result<int64_t> deliveries(const std::string& id) {
    ZI_ASSIGN_OR_RETURN(Reply p, db_->command({"XPENDING", o_.stream, o_.group, id, id, "1"}));
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* rows, as_array(p, 0, "XPENDING"));
    if (rows->empty()) return int64_t{0};
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* row, as_array((*rows)[0], 4, "XPENDING row"));
    return as_integer((*row)[3], "XPENDING delivery count");
  }

  Status process(const Entry& e) {
    ZI_ASSIGN_OR_RETURN(int64_t count, deliveries(e.id));
    if (count == 0) return Status::Ok();  // someone else finished it
    ZI_ASSIGN_OR_RETURN(std::string type, key_type(result_key(o_.prefix, e.id)));
    if (type == "hash") {
      log_line(o_, "job " + e.id + " already has a result; acknowledging it");
      ZI_TRY(db_->command({"XACK", o_.stream, o_.group, e.id}).status());
      ++stats_->duplicates;
      return Status::Ok();
    }
    JobResult res;
    res.worker = o_.consumer;
    res.deliveries = count;
    if (type != "none") return report_unstorable(e.id, type);  // not run: nowhere to store it
    if (e.deleted) {
      fail(&res, "not_found", "the job's stream entry was deleted before it ran");
    } else if (count > o_.max_deliveries) {
      fail(&res, "poison",
           "delivered " + std::to_string(count) + " times, more than --max-deliveries " +
               std::to_string(o_.max_deliveries) +
               ": every worker that took it died or lost it before finishing; not run again");
    } else {
      run_job(e, &res);
    }
    reported_ = false;
    const Status stored = store(e.id, res);
    if (reported_) return Status::Ok();  // the result key became another type meanwhile
    if (!stored.ok())
      return stored.with_context("job " + e.id + ": result not stored; the job stays pending and " +
                                 "runs again once claimed (idle >= --claim-idle-ms)");
    ++stats_->jobs;
    if (!res.ok) ++stats_->failed;
    log_line(o_, "job " + e.id + (res.ok ? " done" : " failed: " + res.error) + " (delivery " +
                     std::to_string(count) + ")");
    return Status::Ok();
  }

  static void fail(JobResult* r, const std::string& code, const std::string& msg) {
    r->ok = false;
    r->error_code = code;
    r->error = msg;
    r->images.clear();
  }

  void run_job(const Entry& e, JobResult* res) {
    auto text = job_request(e.fields);
    if (!text.ok()) return fail(res, "invalid_argument", text.status().message());
    auto spec = decode_job(*text, o_.limits, seed_from_id(e.id));
    if (!spec.ok()) return fail(res, "invalid_argument", spec.status().message());
    const GenerateRequest& first = spec->runs.front();
    res->seed = first.seed;
    res->width = first.width;
    res->height = first.height;
    res->format = serve::format_name(spec->output_format);
    const std::string pkey = progress_key(o_.prefix, e.id);
    bool progress_failed = false;
    GenerateHooks hooks;
    hooks.on_progress = [&](const Progress& p) {  // on this thread: db_ is free meanwhile
      if (progress_failed) return;
      auto r = db_->command(
          {"SET", pkey, encode_progress(p, o_.consumer), "EX", std::to_string(o_.result_ttl_s)});
      if (!r.ok()) {
        progress_failed = true;  // one message per job; the job goes on
        log_line(o_, "job " + e.id + ": progress not written: " + r.status().message());
      }
    };
    nlohmann::json t = {{"total_s", 0.0},   {"tokenize_s", 0.0}, {"text_encoder_s", 0.0},
                        {"denoise_s", 0.0}, {"vae_s", 0.0},      {"steps", 0}};
    for (const GenerateRequest& run : spec->runs) {
      auto r = engine_.generate(run, hooks);
      if (!r.ok())
        return fail(res, error_code_slug(r.status().code()),
                    serve::rename_fields(r.status(), spec->dialect).message());
      for (size_t i = 0; i < r->images.size(); ++i) {
        auto bytes = serve::encode_image(r->images[i], spec->output_format, spec->quality,
                                         png_metadata(run, i));
        if (!bytes.ok())
          return fail(res, error_code_slug(bytes.status().code()), bytes.status().message());
        res->images.emplace_back(bytes->begin(), bytes->end());
      }
      const PhaseTimings& pt = r->timings;
      t["total_s"] = t["total_s"].get<double>() + pt.total_s;
      t["tokenize_s"] = t["tokenize_s"].get<double>() + pt.tokenize_s;
      t["text_encoder_s"] = t["text_encoder_s"].get<double>() + pt.text_encoder_s;
      t["denoise_s"] = t["denoise_s"].get<double>() + pt.denoise_s();
      t["vae_s"] = t["vae_s"].get<double>() + pt.vae_s + pt.vae_encode_s;
      t["steps"] = t["steps"].get<int>() + static_cast<int>(pt.dit_s.size());
    }
    res->ok = true;
    res->timings_json = t.dump();
  }

  // The TYPE of `key`: "none", "hash", "stream", "string", ...
  Result<std::string> key_type(const std::string& key) {
    ZI_ASSIGN_OR_RETURN(Reply t, db_->command({"TYPE", key}));
    return as_string(t, "TYPE " + key);
  }

  // The notification stream is usable (a stream, or absent: XADD creates it); logs why not.
  Result<bool> notify_ok(const std::string& id) {
    const std::string notify = results_stream(o_.prefix);
    ZI_ASSIGN_OR_RETURN(std::string t, key_type(notify));
    if (t == "stream" || t == "none") return true;
    log_line(o_, "job " + id + ": no notification: " + notify + " holds a " + t +
                     ", not a stream (clients must poll " + result_key(o_.prefix, id) + ")");
    return false;
  }

  // The result key holds something of another type (`type`): the result cannot be stored where
  // clients look for it, and no retry can change that. The entry is acknowledged (running it
  // again would only end as poison) with an error notification that says why, and logged.
  Status report_unstorable(const std::string& id, const std::string& type) {
    const std::string rkey = result_key(o_.prefix, id);
    const std::string why = rkey + " holds a " + type + ", not a result hash: the job is not run " +
                            "and has no result (delete the key and submit it again)";
    ZI_ASSIGN_OR_RETURN(bool notify, notify_ok(id));
    std::vector<std::vector<std::string>> queued = {{"XACK", o_.stream, o_.group, id}};
    if (notify)
      queued.push_back({"XADD", results_stream(o_.prefix), "MAXLEN", "~",
                        std::to_string(kResultsStreamMaxLen), "*", "id", id, "status", "error",
                        "error", why});
    ZI_TRY(transaction(id, queued).status());  // no WATCH: never nil
    ++stats_->jobs;
    ++stats_->failed;
    reported_ = true;
    log_line(o_, "job " + id + " failed: " + why);
    return Status::Ok();
  }

  // MULTI, `queued`, EXEC. A command refused while queueing aborts it (the error returned); one
  // failing inside EXEC is logged: the others have run (Redis has no rollback), so the outcome
  // is as good as it can be made and retrying would repeat them. Nil: a WATCH tripped.
  Result<bool> transaction(const std::string& id,
                           const std::vector<std::vector<std::string>>& queued) {
    ZI_TRY(db_->command({"MULTI"}).status());
    for (const auto& c : queued) {
      auto r = db_->command(c);
      if (!r.ok()) {
        (void)db_->command({"DISCARD"});
        return r.status();
      }
    }
    ZI_ASSIGN_OR_RETURN(Reply exec, db_->command({"EXEC"}));
    if (exec.is_nil()) return false;
    ZI_ASSIGN_OR_RETURN(const std::vector<Reply>* out, as_array(exec, queued.size(), "EXEC"));
    for (size_t i = 0; i < out->size(); ++i)
      if ((*out)[i].type == Reply::Type::kError)
        log_line(o_, "job " + id + ": redis " + queued[i][0] + " in EXEC failed: " + (*out)[i].str);
    return true;
  }

  // The result, its expiry, the ack and the notification in one transaction, guarded by WATCH so
  // that a second result for the same job (a slow worker racing the one that claimed its job)
  // never replaces the first: it only acks. What may pass (the connection, OOM, LOADING, ...) is
  // retried with backoff, about a minute in all; then the error is returned and the job stays
  // pending.
  Status store(const std::string& id, const JobResult& res) {
    const std::string rkey = result_key(o_.prefix, id);
    const Fields fields = encode_result(res);
    Status last;
    for (int attempt = 0; attempt < 30; ++attempt) {
      if (attempt > 0)
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min(100 << std::min(attempt, 5), 3000)));
      last = store_once(id, rkey, fields, res.ok);
      if (last.ok() || !transient(last)) return last;
      log_line(o_, "storing job " + id + ": " + last.message() + "; retrying");
    }
    return last;
  }

  Status store_once(const std::string& id, const std::string& rkey, const Fields& fields, bool ok) {
    for (int round = 0; round < 10; ++round) {
      ZI_TRY(db_->command({"WATCH", rkey}).status());
      ZI_ASSIGN_OR_RETURN(std::string type, key_type(rkey));
      if (type != "none") {
        ZI_TRY(db_->command({"UNWATCH"}).status());
        if (type != "hash") return report_unstorable(id, type);  // set meanwhile
        // another worker stored it first
        ZI_TRY(db_->command({"XACK", o_.stream, o_.group, id}).status());
        ++stats_->duplicates;
        return Status::Ok();
      }
      ZI_ASSIGN_OR_RETURN(bool notify, notify_ok(id));
      std::vector<std::string> hset = {"HSET", rkey};
      for (const auto& [k, v] : fields) hset.insert(hset.end(), {k, v});
      std::vector<std::vector<std::string>> queued = {
          hset,
          {"EXPIRE", rkey, std::to_string(o_.result_ttl_s)},
          {"DEL", progress_key(o_.prefix, id)},
          {"XACK", o_.stream, o_.group, id}};
      if (notify)
        queued.push_back({"XADD", results_stream(o_.prefix), "MAXLEN", "~",
                          std::to_string(kResultsStreamMaxLen), "*", "id", id, "status",
                          ok ? "ok" : "error"});
      ZI_ASSIGN_OR_RETURN(bool done, transaction(id, queued));
      if (done) return Status::Ok();  // else WATCH tripped: look again
    }
    return InternalError("storing job " + id + ": the result key kept changing under WATCH");
  }

  Engine& engine_;
  const WorkerOptions& o_;
  const std::atomic<bool>& stop_;
  WorkerStats* stats_;
  std::unique_ptr<RedisClient> db_;
  Heartbeat* hb_ = nullptr;
  bool reported_ = false;  // report_unstorable ran for the job being stored
  std::string cursor_ = "0-0";
  std::chrono::steady_clock::time_point next_autoclaim_{};
};

}  // namespace

Status finish_options(WorkerOptions* o) {
  if (o->consumer.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "host");
    o->consumer = std::string(host) + ":" + std::to_string(getpid());
  }
  for (char c : o->consumer)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return InvalidArgument("--consumer: '" + o->consumer + "' has a space or control character");
  if (o->stream.empty()) return InvalidArgument("--stream: must not be empty");
  if (o->group.empty()) return InvalidArgument("--group: must not be empty");
  if (o->prefix.empty()) return InvalidArgument("--prefix: must not be empty");
  if (o->claim_idle_ms < 100 || o->claim_idle_ms > 86'400'000)
    return InvalidArgument("--claim-idle-ms: " + std::to_string(o->claim_idle_ms) +
                           " is outside 100..86400000");
  if (o->max_deliveries < 1 || o->max_deliveries > 1000)
    return InvalidArgument("--max-deliveries: " + std::to_string(o->max_deliveries) +
                           " is outside 1..1000");
  if (o->block_ms < 10 || o->block_ms > 60'000)
    return InvalidArgument("--block-ms: " + std::to_string(o->block_ms) + " is outside 10..60000");
  if (o->heartbeat_ms == 0) o->heartbeat_ms = std::max<int64_t>(50, o->claim_idle_ms / 3);
  if (o->heartbeat_ms < 10 || o->heartbeat_ms >= o->claim_idle_ms)
    return InvalidArgument("--heartbeat-ms: " + std::to_string(o->heartbeat_ms) +
                           " must be at least 10 and below --claim-idle-ms");
  if (o->result_ttl_s < 1 || o->result_ttl_s > 365LL * 86400)
    return InvalidArgument("--result-ttl: " + std::to_string(o->result_ttl_s) +
                           " is outside 1..31536000 seconds");
  if (o->max_jobs < 0) return InvalidArgument("--max-jobs: must not be negative");
  return Status::Ok();
}

Status run_worker(Engine& engine, const WorkerOptions& options, const std::atomic<bool>& stop,
                  WorkerStats* stats) {
  WorkerStats local;
  try {
    Worker w(engine, options, stop, stats != nullptr ? stats : &local);
    return w.run();
  } catch (const std::bad_alloc&) {
    return OutOfMemory("zimage worker: out of memory");
  } catch (const std::exception& e) {
    return InternalError(std::string("zimage worker: ") + e.what());
  }
}

}  // namespace zimage::broker
