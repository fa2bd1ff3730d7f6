#!/usr/bin/env python3
"""Integration test of `zimage worker` / `zimage submit` against a real redis-server.

One machine, one throw-away redis-server on a free port, three worker processes on the tiny model
(CPU). Jobs with distinct seeds are submitted; the worker running the long job is SIGKILLed while
it holds it (seen through the job's progress key). Asserted:
  * every job has exactly one result and exactly one notification;
  * every image equals, byte for byte, the PNG `zimage generate` writes alone for that seed;
  * the killed job was redelivered (delivery count >= 2) and finished by another worker;
  * a poison job (delivered more than --max-deliveries times) and invalid jobs get error
    results naming why, without crashing or looping;
  * `submit --wait` writes the image and shows the worker's progress;
  * SIGTERM during a job: the job is finished, stored and acked, the worker exits 0;
  * nothing is left pending;
  * after a Redis restart the surviving worker reconnects and runs a new job.
Exit 77 (ctest SKIP_RETURN_CODE) with a visible SKIP line when redis-server is not installed.
Every child process is killed at exit, whatever happens.
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CHILDREN = []
TMP_PREFIX = "zimage-broker-test-"


def die_with_parent():
    """Children get SIGKILL when this script dies, even by SIGKILL (Linux prctl)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def remove_stale_dirs():
    """Temp dirs of earlier runs that were killed before cleaning up (older than an hour)."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            if name.startswith(TMP_PREFIX) and time.time() - os.path.getmtime(path) > 3600:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def kill_children():
    for p in CHILDREN:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in CHILDREN:
        try:
            p.wait(timeout=5)
        except Exception:
            pass


def on_signal(signum, _frame):
    kill_children()
    sys.exit(128 + signum)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok: " + msg, flush=True)


class Redis:
    def __init__(self, cli, port):
        self.cli, self.port = cli, port

    def raw(self, *args):
        out = subprocess.run([self.cli, "-p", str(self.port), "--raw", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10,
                             check=True).stdout
        return out[:-1] if out.endswith(b"\n") else out

    def text(self, *args):
        return self.raw(*args).decode("utf-8", "replace")

    def hgetall(self, key):
        # field names are ASCII; values fetched one by one so binary images stay intact
        names = self.text("HKEYS", key).split("\n") if self.text("EXISTS", key) == "1" else []
        return {n: self.raw("HGET", key, n) for n in names if n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        print("SKIP: redis-server / redis-cli not installed (scripts/setup.sh installs "
              "redis-server); the broker integration test did not run", flush=True)
        return 77
    atexit.register(kill_children)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    remove_stale_dirs()
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX)
    atexit.register(shutil.rmtree, tmp, True)
    t0 = time.time()

    port = free_port()
    redis_log = open(os.path.join(tmp, "redis.log"), "wb")
    CHILDREN.append(subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tmp], stdout=redis_log, stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent))
    r = Redis(cli, port)
    for _ in range(100):
        try:
            if r.text("PING") == "PONG":
                break
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.05)
    else:
        fail("redis-server did not start")
    url = "redis://127.0.0.1:%d" % port
    Z, M = args.zimage, args.model
    prompt = "a lighthouse at dusk"
    common = ["--width", "64", "--height", "64"]

    # Jobs that must not run normally, queued before any worker exists.
    r.text("XGROUP", "CREATE", "zimage:jobs", "zimage", "0", "MKSTREAM")
    poison = r.text("XADD", "zimage:jobs", "*", "request",
                    json.dumps({"prompt": "poison", "size": "64x64", "seed": 1}))
    # A ghost consumer took it and "died" five times (delivery count 6 > --max-deliveries 3).
    r.text("XREADGROUP", "GROUP", "zimage", "ghost", "COUNT", "1", "STREAMS", "zimage:jobs", ">")
    r.text("XCLAIM", "zimage:jobs", "zimage", "ghost", "0", poison, "RETRYCOUNT", "5")
    bad_type = r.text("XADD", "zimage:jobs", "*", "request", '{"prompt": 5}')
    bad_json = r.text("XADD", "zimage:jobs", "*", "request", '{"prompt": "x", ')
    no_field = r.text("XADD", "zimage:jobs", "*", "prompt", "x")
    bad_steps = r.text("XADD", "zimage:jobs", "*", "request",
                      json.dumps({"prompt": "x", "num_inference_steps": 0}))

    # References: what `zimage generate` writes alone for each seed.
    jobs = [(1000 + i, 8) for i in range(7)]  # (seed, steps)
    # Long enough to be caught mid-job by a poll every 20 ms even on a loaded machine (~5 ms a
    # step on an idle core: 160 steps gave a 0.4 s window, which a 2-core CI running other tests
    # beside this one missed once).
    long_job = (4242, 600)  # long enough to be killed mid-job
    term_job = (777, 400)  # for the SIGTERM check
    refs, gens = {}, []
    for seed, steps in jobs + [long_job, term_job]:  # all at once: mostly model loading
        path = os.path.join(tmp, "ref_%d.png" % seed)
        gens.append((seed, path, subprocess.Popen(
            [Z, "generate", "--model", M, "--device", "cpu", "--threads", "1", "-q", "-p", prompt,
             *common, "--steps", str(steps), "--seed", str(seed), "-o", path],
            preexec_fn=die_with_parent)))
        CHILDREN.append(gens[-1][2])
    for seed, path, p in gens:
        if p.wait(timeout=120) != 0:
            fail("zimage generate --seed %d failed" % seed)
        refs[seed] = open(path, "rb").read()
    print("references made in %.1f s" % (time.time() - t0), flush=True)

    workers = {}

    def start_worker(name):
        log = open(os.path.join(tmp, name + ".log"), "wb")
        p = subprocess.Popen([Z, "worker", "--broker", url, "--model", M, "--device", "cpu",
                              "--threads", "1", "--consumer", name, "--claim-idle-ms", "1500",
                              "--max-deliveries", "3", "-q"], stdout=log, stderr=subprocess.STDOUT,
                             preexec_fn=die_with_parent)
        CHILDREN.append(p)
        workers[name] = p

    def submit(seed, steps, *extra):
        out = subprocess.run([Z, "submit", "--broker", url, "-q", "-p", prompt, *common,
                              "--steps", str(steps), "--seed", str(seed), *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if out.returncode != 0:
            fail("submit: " + out.stderr.decode())
        return out.stdout.decode().strip(), out.stderr.decode()

    ids = {}
    ids[long_job[0]], _ = submit(*long_job)
    for name in ("w0", "w1", "w2"):
        start_worker(name)
    for seed, steps in jobs[:-1]:
        ids[seed], _ = submit(seed, steps)

    # Kill the worker that runs the long job while it holds it.
    pkey = "zimage:progress:" + ids[long_job[0]]
    victim = None
    deadline = time.time() + 40
    while time.time() < deadline and victim is None:
        text = r.text("GET", pkey)
        if text:
            p = json.loads(text)
            if p["phase"] == "denoise" and 1 <= p["step"] < p["total"] - 20:
                victim = p["worker"]
                pending = r.text("XPENDING", "zimage:jobs", "zimage", ids[long_job[0]],
                                 ids[long_job[0]], "1").split("\n")
                check(pending[1] == victim, "the long job is pending with its runner %s (XPENDING "
                      "says %s) at step %d/%d" % (victim, pending[1], p["step"], p["total"]))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=10)
        time.sleep(0.02)
    check(victim is not None, "a worker was seen mid-job on the long job and SIGKILLed")

    # One more job through submit --wait (progress shown, file written).
    seed, steps = jobs[-1]
    wait_png = os.path.join(tmp, "waited.png")
    ids[seed], err = submit(seed, steps, "--wait", "--progress", "--timeout", "60", "-o", wait_png)
    check(open(wait_png, "rb").read() == refs[seed],
          "submit --wait wrote the same PNG as zimage generate (seed %d)" % seed)

    # Everything finishes.
    expected = list(ids.values()) + [poison, bad_type, bad_json, no_field, bad_steps]
    deadline = time.time() + 45
    while time.time() < deadline:
        if all(r.text("EXISTS", "zimage:result:" + i) == "1" for i in expected):
            break
        time.sleep(0.1)
    missing = [i for i in expected if r.text("EXISTS", "zimage:result:" + i) != "1"]
    check(not missing, "every job has a result (missing: %s)" % missing)

    # SIGTERM mid-job: the job is finished and acked by the same worker, which exits 0.
    ids[term_job[0]], _ = submit(*term_job)
    tkey = "zimage:progress:" + ids[term_job[0]]
    termed = None
    deadline = time.time() + 30
    while time.time() < deadline and termed is None:
        text = r.text("GET", tkey)
        if text:
            p = json.loads(text)
            if p["phase"] == "denoise" and p["step"] >= 1:
                termed = p["worker"]
                workers[termed].send_signal(signal.SIGTERM)
        time.sleep(0.02)
    check(termed is not None, "a worker was seen running the SIGTERM job")
    rc = workers[termed].wait(timeout=30)
    check(rc == 0, "the SIGTERMed worker %s exited 0 (got %d)" % (termed, rc))
    res = r.hgetall("zimage:result:" + ids[term_job[0]])
    check(res.get("status") == b"ok" and
          res.get("worker") == termed.encode() and res.get("deliveries") == b"1",
          "the job running at SIGTERM was finished by that worker on its first delivery")
    check(res.get("image:0") == refs[term_job[0]], "its image equals zimage generate's")
    expected.append(ids[term_job[0]])

    # Every image equals generate's, bit for bit; one result and one notification per job.
    for seed, job_id in ids.items():
        res = r.hgetall("zimage:result:" + job_id)
        if res.get("status") != b"ok":
            fail("job %s (seed %d) failed: %s" % (job_id, seed, res.get("error")))
        if res.get("images") != b"1" or res.get("seed") != str(seed).encode():
            fail("job %s: images %s seed %s" % (job_id, res.get("images"), res.get("seed")))
        if res["image:0"] != refs[seed]:
            fail("job %s (seed %d): PNG differs from zimage generate's (%d vs %d bytes)" %
                 (job_id, seed, len(res["image:0"]), len(refs[seed])))
    check(True, "all %d images equal zimage generate's PNG byte for byte" % len(ids))
    notes = r.text("XRANGE", "zimage:results", "-", "+").split("\n")
    # each entry: entry-id, "id", job-id, "status", ok|error
    noted = [notes[k + 2] for k in range(0, len(notes), 5) if notes[k + 1] == "id"]
    check(sorted(noted) == sorted(expected),
          "exactly one notification per job (%d notifications, %d jobs)" % (len(noted),
                                                                           len(expected)))
    results = [k for k in r.text("KEYS", "zimage:result:*").split("\n") if k]
    check(len(results) == len(expected), "exactly one result key per job (%d)" % len(results))

    killed = r.hgetall("zimage:result:" + ids[long_job[0]])
    check(int(killed["deliveries"]) >= 2 and killed["worker"].decode() != victim,
          "the killed job was redelivered (deliveries %s) and finished by %s, not %s" %
          (killed["deliveries"].decode(), killed["worker"].decode(), victim))
    # The heartbeat: jobs that ran longer than --claim-idle-ms were never taken from a live
    # worker. Only the killed job and the poison job (held by a ghost) were ever claimed.
    claimed = set()
    for name in workers:
        for line in open(os.path.join(tmp, name + ".log"), encoding="utf-8", errors="replace"):
            if ": claimed job " in line:
                claimed.add(line.split(": claimed job ")[1].split()[0])
            if "was claimed by" in line:
                fail("a live worker was robbed: " + line.strip())
    rerun_s = json.loads(killed["timings"])["total_s"]
    term_s = json.loads(r.hgetall("zimage:result:" + ids[term_job[0]])["timings"])["total_s"]
    check(claimed == {ids[long_job[0]], poison} and killed["deliveries"] == b"2",
          "only the killed and the poison job were claimed; the rerun (%.2f s) and the SIGTERM "
          "job (%.2f s), both held past --claim-idle-ms 1.5 s, were not taken (claimed: %s)" %
          (rerun_s, term_s, sorted(claimed)))

    res = r.hgetall("zimage:result:" + poison)
    check(res.get("status") == b"error" and res.get("error_code") == b"poison" and
          b"--max-deliveries 3" in res.get("error", b""),
          "poison job: error result naming --max-deliveries (%s)" % res.get("error"))
    for job_id, needle in ((bad_type, b"prompt"), (bad_json, b"JSON"), (no_field, b"request"),
                           (bad_steps, b"num_inference_steps")):
        res = r.hgetall("zimage:result:" + job_id)
        check(res.get("status") == b"error" and res.get("error_code") == b"invalid_argument" and
              needle in res.get("error", b""),
              "invalid job %s: error result (%s)" % (job_id, {k: v[:200] for k, v in res.items()}))

    check(r.text("XPENDING", "zimage:jobs", "zimage").split("\n")[0] == "0",
          "nothing pending at the end")
    check(not [k for k in r.text("KEYS", "zimage:progress:*").split("\n") if k],
          "no progress key left")

    # Redis restarts (empty: no persistence here): the remaining worker reconnects, re-creates
    # its group and runs the next job.
    alive = [n for n, p in workers.items() if p.poll() is None]
    check(len(alive) == 1, "one worker still running (%s)" % alive)
    try:
        r.text("SHUTDOWN", "NOSAVE")
    except subprocess.CalledProcessError:
        pass  # redis-cli may report the closed connection
    CHILDREN[0].wait(timeout=10)
    time.sleep(1.0)  # the worker sees the connection drop and starts retrying
    CHILDREN.append(subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tmp], stdout=redis_log, stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent))
    for _ in range(100):
        try:
            if r.text("PING") == "PONG":
                break
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.05)
    seed, steps = jobs[0]
    again_png = os.path.join(tmp, "after_restart.png")
    submit(seed, steps, "--wait", "--timeout", "40", "-o", again_png)
    check(open(again_png, "rb").read() == refs[seed],
          "after a Redis restart worker %s reconnected and ran a new job (same PNG)" % alive[0])
    log = open(os.path.join(tmp, alive[0] + ".log"), encoding="utf-8", errors="replace").read()
    check("lost" in log and "retrying" in log, "the worker logged the lost connection")

    for name, p in workers.items():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, p in workers.items():
        rc = p.wait(timeout=15)
        if name != victim:
            check(rc == 0, "worker %s stopped on SIGTERM with exit 0" % name)
    print("broker integration test passed in %.1f s" % (time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
