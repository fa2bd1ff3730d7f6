#!/usr/bin/env python3
"""Fault cases of `zimage worker` / `zimage submit` against a real redis-server (loopback only,
a private server on a free port, every wait bounded). One case per run (--case), each its own
ctest test:

  wrongtype  keys of the wrong type (docs/BROKER.md, "Failures"): with `SET zimage:results x`
             the worker stores results without notifications and goes on with further jobs, and
             `submit --wait` polls the result; a result key holding a string gets no result, its
             job is acked with an error notification; a jobs key replaced by a string at run time
             is logged and retried until it is fixed, then the worker runs the next job.
  restart    Redis restarted (2 s, data kept) while `submit --wait` waits on a running job: submit
             reconnects and writes the image the worker finished.
  secrets    --broker-password-file (worker, submit) against a server with requirepass, and
             `zimage serve --api-key-file`: the secret never on the command line; missing, empty
             and conflicting sources are usage errors naming the flag.

Exit 77 (ctest SKIP_RETURN_CODE) when redis-server is not installed.
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_broker as tb  # noqa: E402  (helpers: Redis, check, fail, children)

check, fail, Redis = tb.check, tb.fail, tb.Redis


def start_redis(server, cli, port, tmp, log, *extra):
    p = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", tmp, *extra], stdout=log,
                         stderr=subprocess.STDOUT, preexec_fn=tb.die_with_parent)
    tb.CHILDREN.append(p)
    r = Redis(cli, port)
    password = None
    if "--requirepass" in extra:
        password = extra[extra.index("--requirepass") + 1]
    for _ in range(200):
        try:
            args = ["-a", password, "--no-auth-warning"] if password else []
            out = subprocess.run([cli, "-p", str(port), *args, "PING"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, timeout=5).stdout
            if out.strip() == b"PONG":
                return p, r
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.05)
    fail("redis-server did not start")


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    fail("timed out after %g s waiting for: %s" % (timeout, what))


class Ctx:
    def __init__(self, args, tmp):
        self.Z, self.M, self.tmp = args.zimage, args.model, tmp
        self.server, self.cli = shutil.which("redis-server"), shutil.which("redis-cli")
        self.port = tb.free_port()
        self.url = "redis://127.0.0.1:%d" % self.port
        self.redis_log = open(os.path.join(tmp, "redis.log"), "ab")

    def worker(self, name, *extra):
        log = open(os.path.join(self.tmp, name + ".log"), "wb")
        if "--broker" not in extra:
            extra = ("--broker", self.url) + extra
        p = subprocess.Popen([self.Z, "worker", "--model", self.M, "--device", "cpu",
                              "--threads", "1", "--consumer", name, "--claim-idle-ms", "1500",
                              "--block-ms", "200", "-q", *extra], stdout=log,
                             stderr=subprocess.STDOUT, preexec_fn=tb.die_with_parent)
        tb.CHILDREN.append(p)
        return p

    def log(self, name):
        return open(os.path.join(self.tmp, name + ".log"), encoding="utf-8",
                    errors="replace").read()

    def run(self, *args, timeout=120):
        return subprocess.run([self.Z, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)

    def request(self, seed, steps=2):
        return json.dumps({"prompt": "a fox", "size": "64x64", "num_inference_steps": steps,
                           "seed": seed})


def case_wrongtype(c):
    _, r = start_redis(c.server, c.cli, c.port, c.tmp, c.redis_log)
    r.text("XGROUP", "CREATE", "zimage:jobs", "zimage", "0", "MKSTREAM")
    r.text("SET", "zimage:results", "not a stream")
    # A job whose result key is taken by a string, then an ordinary one.
    taken = r.text("XADD", "zimage:jobs", "1-1", "request", c.request(5))
    r.text("SET", "zimage:result:" + taken, "not a hash")
    first = r.text("XADD", "zimage:jobs", "*", "request", c.request(6))
    w = c.worker("w")
    wait_until(lambda: r.text("EXISTS", "zimage:result:" + first) == "1" or w.poll() is not None,
               90, "the first job's result")
    check(r.text("HGET", "zimage:result:" + first, "status") == "ok",
          "a job is stored although zimage:results holds a string")
    time.sleep(0.5)
    check(w.poll() is None, "the worker is still running after that job (exit code %s)" %
          w.poll())
    check(r.text("GET", "zimage:result:" + taken) == "not a hash",
          "the string at the taken result key is left alone")
    log = c.log("w")
    check("holds a string, not a result hash" in log,
          "the job with the taken result key is reported in the log")
    check("no notification: zimage:results holds a string" in log,
          "the missing notification is reported in the log")
    # submit --wait cannot read notifications from a string: it polls the result instead.
    png = os.path.join(c.tmp, "polled.png")
    out = c.run("submit", "--broker", c.url, "-q", "-p", "a fox", "--width", "64", "--height",
                "64", "--steps", "2", "--seed", "7", "--wait", "--timeout", "60", "-o", png)
    check(out.returncode == 0 and os.path.exists(png),
          "submit --wait with zimage:results of the wrong type still gets the image (%d: %s)" %
          (out.returncode, out.stderr.decode(errors="replace").strip()))
    check(r.text("XPENDING", "zimage:jobs", "zimage").split("\n")[0] == "0",
          "nothing is left pending (the taken job was acknowledged)")
    # The jobs key replaced by a string while the worker runs: logged and retried, not fatal.
    r.text("DEL", "zimage:jobs")
    r.text("SET", "zimage:jobs", "not a stream")
    wait_until(lambda: "WRONGTYPE" in c.log("w"), 20, "the worker logging WRONGTYPE")
    time.sleep(1.0)
    check(w.poll() is None, "the worker survives a jobs key of the wrong type")
    r.text("DEL", "zimage:jobs", "zimage:results")
    # The worker re-creates the group (NOGROUP); a new job runs, with its notification.
    wait_until(lambda: r.text("EXISTS", "zimage:jobs") == "1", 20, "the group made again")
    again = r.text("XADD", "zimage:jobs", "*", "request", c.request(8))
    wait_until(lambda: r.text("EXISTS", "zimage:result:" + again) == "1", 60,
               "the job after the fix")
    check(r.text("HGET", "zimage:result:" + again, "status") == "ok" and
          again in r.text("XRANGE", "zimage:results", "-", "+"),
          "once the key is fixed the worker runs the next job and notifies it")
    w.send_signal(signal.SIGTERM)
    rc = w.wait(timeout=30)
    check(rc == 0, "the worker stops on SIGTERM with exit 0 (got %d)" % rc)


def case_restart(c):
    redis, r = start_redis(c.server, c.cli, c.port, c.tmp, c.redis_log)
    w = c.worker("w")
    png = os.path.join(c.tmp, "restart.png")
    sub = subprocess.Popen([c.Z, "submit", "--broker", c.url, "-p", "a fox", "--width", "64",
                            "--height", "64", "--steps", "1000", "--seed", "11", "--wait",
                            "--timeout", "150", "-o", png], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, preexec_fn=tb.die_with_parent)
    tb.CHILDREN.append(sub)

    def running():
        keys = [k for k in r.text("KEYS", "zimage:progress:*").split("\n") if k]
        if not keys:
            return False
        p = json.loads(r.text("GET", keys[0]) or "{}")
        # early in the job, so that it is still running when Redis goes down
        return p.get("phase") == "denoise" and 1 <= p.get("step", 0) < p.get("total", 0) // 4
    wait_until(running, 90, "the job running on the worker")
    try:
        r.text("SHUTDOWN", "SAVE")  # keeps the stream, the group and its pending entry
    except subprocess.CalledProcessError:
        pass
    redis.wait(timeout=20)
    time.sleep(2.0)  # Redis is down for 2 s
    start_redis(c.server, c.cli, c.port, c.tmp, c.redis_log)
    try:
        out, err = sub.communicate(timeout=170)
    except subprocess.TimeoutExpired:
        sub.kill()
        fail("submit --wait did not finish")
    err = err.decode(errors="replace")
    check(sub.returncode == 0, "submit --wait rode out the Redis restart (exit %d: %s)" %
          (sub.returncode, err.strip()[-400:]))
    job = out.decode().strip()
    stored = r.raw("HGET", "zimage:result:" + job, "image:0")
    check(os.path.exists(png) and open(png, "rb").read() == stored,
          "it wrote the image the worker stored for job %s" % job)
    check("reconnect" in err, "submit said it was reconnecting")
    check(w.poll() is None, "the worker is still running")
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)


def case_secrets(c):
    _, r = start_redis(c.server, c.cli, c.port, c.tmp, c.redis_log, "--requirepass", "s3cret")
    pw = os.path.join(c.tmp, "redis.pw")
    open(pw, "w").write("s3cret\n")
    os.chmod(pw, 0o600)
    w = c.worker("w", "--broker", c.url, "--broker-password-file", pw)
    wait_until(lambda: "ready on" in c.log("w") or w.poll() is not None, 60, "the worker ready")
    check(w.poll() is None, "the worker authenticated with --broker-password-file")
    png = os.path.join(c.tmp, "pw.png")
    out = c.run("submit", "--broker", c.url, "--broker-password-file", pw, "-q", "-p", "a fox",
                "--width", "64", "--height", "64", "--steps", "2", "--seed", "3", "--wait",
                "--timeout", "90", "-o", png)
    check(out.returncode == 0 and os.path.exists(png),
          "worker and submit authenticate with --broker-password-file (%d: %s)" %
          (out.returncode, out.stderr.decode(errors="replace").strip()))
    with open("/proc/%d/cmdline" % w.pid, "rb") as f:
        check(b"s3cret" not in f.read(), "the password is not in the worker's command line")
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)
    empty = os.path.join(c.tmp, "empty.pw")
    open(empty, "w").write("\n")
    for args, needle in (
            (["--broker-password-file", os.path.join(c.tmp, "missing.pw")], "no such file"),
            (["--broker-password-file", empty], "empty"),
            (["--broker", "redis://:x@127.0.0.1:%d" % c.port, "--broker-password-file", pw],
             "holds a password already")):
        for cmd in (["submit", "-p", "a"], ["worker"]):
            base = [] if "--broker" in args else ["--broker", c.url]
            res = c.run(*cmd, *base, *args, timeout=60)
            err = res.stderr.decode(errors="replace")
            check(res.returncode == 2 and "--broker-password-file" in err and needle in err,
                  "%s %s: usage error naming the flag (%d: %s)" %
                  (cmd[0], args[-1], res.returncode, err.strip()))

    key = os.path.join(c.tmp, "api.key")
    open(key, "w").write("k3y-from-file\n")
    serve = subprocess.Popen([c.Z, "serve", "--port", "0", "--device", "cpu", "--threads", "1",
                              "-q", "--api-key-file", key], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=tb.die_with_parent)
    tb.CHILDREN.append(serve)
    line = serve.stdout.readline().decode()
    check("listening on http://" in line, "serve --api-key-file starts (%s)" % line.strip())
    base = line.strip().split("listening on ")[1]
    serve.stdout.readline()  # "ready"

    def get(auth):
        req = urllib.request.Request(base + "/v1/models")
        if auth:
            req.add_header("Authorization", "Bearer " + auth)
        try:
            return urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code
    check(get(None) == 401 and get("wrong") == 401 and get("k3y-from-file") == 200,
          "the key from the file (newline dropped) is required")
    with open("/proc/%d/cmdline" % serve.pid, "rb") as f:
        check(b"k3y-from-file" not in f.read(), "the key is not in serve's command line")
    serve.send_signal(signal.SIGTERM)
    serve.wait(timeout=30)
    for args, needle in ((["--api-key-file", os.path.join(c.tmp, "none.key")], "no such file"),
                         (["--api-key-file", empty], "empty"),
                         (["--api-key-file", key, "--api-key", "x"], "--api-key")):
        res = c.run("serve", "--port", "0", "--device", "cpu", *args, timeout=60)
        err = res.stderr.decode(errors="replace")
        check(res.returncode == 2 and "--api-key-file" in err and needle in err,
              "serve %s: usage error naming the flag (%d: %s)" % (args[-1], res.returncode,
                                                                  err.strip()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", required=True, choices=["wrongtype", "restart", "secrets"])
    args = ap.parse_args()
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        print("SKIP: redis-server / redis-cli not installed (scripts/setup.sh installs "
              "redis-server); the broker fault test did not run", flush=True)
        return 77
    atexit.register(tb.kill_children)
    signal.signal(signal.SIGTERM, tb.on_signal)
    signal.signal(signal.SIGINT, tb.on_signal)
    tb.remove_stale_dirs()
    tmp = tempfile.mkdtemp(prefix=tb.TMP_PREFIX)
    atexit.register(shutil.rmtree, tmp, True)
    t0 = time.time()
    {"wrongtype": case_wrongtype, "restart": case_restart, "secrets": case_secrets}[args.case](
        Ctx(args, tmp))
    print("broker fault case %s passed in %.1f s" % (args.case, time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
