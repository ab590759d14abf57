#!/usr/bin/env python3
"""crash.py — kill -9 a real `kvtier serve` at random points and check the cache directory after
every crash (issue 10, "Crash at random points"). Used by tests/e2e/crash.sh (CI, >= 20 trials)
and bench/crash.sh (>= 200 trials).

usage: crash.py KVTIER MODEL WORKDIR TRIALS SEED [SERVER_ARG...]

Extra SERVER_ARGs go to every server (e.g. --parallel 4). With --parallel N > 1 the checks after a
crash run their jobs concurrently and the write-behind crash hits 1..N concurrent prefills, so a
crash lands while batched rows are mid-step.

Each trial restarts the server on the same cache directory (with --generation-checkpoint 16 and a
random --ssd-demote-idle of 0 or 1) and checks, before crashing it again:
  - the restart succeeds and `kvtier cache verify` (block, tail, snapshot and checkpoint files)
    reports nothing bad;
  - a random job (one of 4 prompts; greedy or seeded sampling; streamed or not) returns exactly the
    text of an uncached reference server — also when a checkpoint of it resumes;
  - every prompt acknowledged by a 200 /admin/cache/flush in an earlier trial is reused (cached
    tokens >= its full blocks).
Then it crashes the server with SIGKILL in one of four situations, picked at random: during
write-behind (a new prompt being prefilled/decoded), during checkpointing (a long streamed
generation, after k tokens), during a flush, during idle demotion."""
import json, os, random, signal, subprocess, sys, threading, time, http.client

KV, MODEL, WORK, TRIALS, SEED = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
EXTRA = sys.argv[6:]
PAR = int(EXTRA[EXTRA.index("--parallel") + 1]) if "--parallel" in EXTRA else 1
rng = random.Random(SEED)
CACHE = os.path.join(WORK, "cache")
BT = 16
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
wr = random.Random(99)
PROMPTS = [" ".join(wr.choice(WORDS) for _ in range(n)) for n in (90, 150, 60, 200)]
SAMPLING = [{"temperature": 0}, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 7}]
MAXT = 300


def fail(msg, log=None):
    print("FAIL:", msg)
    if log and os.path.exists(log):
        print("--- server log (tail)")
        print("".join(open(log, errors="replace").readlines()[-20:]))
    sys.exit(1)


class Server:
    n = 0

    def __init__(self, extra):
        Server.n += 1
        self.log = os.path.join(WORK, "server.%d.log" % Server.n)
        for _ in range(10):
            self.port = rng.randrange(20000, 40000)
            self.p = subprocess.Popen([KV, "serve", "-m", MODEL, "--port", str(self.port), "-t", "1",
                                       "--block-tokens", str(BT)] + EXTRA + extra,
                                      stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
            t0 = time.time()
            while time.time() - t0 < 60:
                if self.p.poll() is not None:
                    break
                if "listening on" in open(self.log, errors="replace").read():
                    return
                time.sleep(0.05)
            if self.p.poll() is None:
                fail("server not ready in 60 s", self.log)
            if "cannot listen" not in open(self.log, errors="replace").read():
                fail("server exited during start-up (restart after a crash must succeed)", self.log)
        fail("no free port")

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def post(self, path, body, timeout=120):
        c = self.conn(timeout)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def get(self, path):
        c = self.conn()
        c.request("GET", path)
        r = c.getresponse()
        d = json.loads(r.read())
        c.close()
        return d

    def complete(self, prompt, samp, stream, max_tokens=MAXT, stop_after=None):
        """Returns (text, usage). stop_after: SIGKILL the server after that many streamed chunks."""
        body = dict(samp, prompt=prompt, max_tokens=max_tokens, stream=stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        c = self.conn()
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            fail("completion answered %d: %s" % (r.status, r.read()[:300]), self.log)
        if not stream:
            j = json.loads(r.read())
            c.close()
            return j["choices"][0]["text"], j.get("usage", {})
        text, usage, chunks = "", {}, 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            d = line[6:]
            if d == b"[DONE]":
                break
            j = json.loads(d)
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                if ch.get("text"):
                    text += ch["text"]
                    chunks += 1
            if stop_after is not None and chunks >= stop_after:
                self.kill()
                break
        c.close()
        return text, usage

    def kill(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(120)
        except subprocess.TimeoutExpired:
            fail("server did not stop", self.log)
        if rc != 0:
            fail("server exit status %d after SIGTERM" % rc, self.log)


def verify():
    r = subprocess.run([KV, "cache", "verify", CACHE], capture_output=True, text=True)
    if r.returncode != 0 or " 0 bad" not in r.stdout:
        fail("kvtier cache verify after a crash:\n" + r.stdout[-2000:] + r.stderr[-500:])
    return r.stdout.strip().splitlines()[-1]


# 1. references: a server without any cache tier
os.makedirs(WORK, exist_ok=True)
ref = {}
s = Server(["--prompt-cache", "0"])
for pi, p in enumerate(PROMPTS):
    for si, sp in enumerate(SAMPLING):
        ref[(pi, si)] = s.complete(p, sp, False)[0]
        if len(ref[(pi, si)]) == 0:
            fail("empty reference output")
s.stop()

acked = {}  # prompt -> minimum cached tokens owed by a 200 flush
pending_ckpt = None
stats = {"trials": 0, "resumed": 0, "acked_checks": 0, "flush_200": 0, "scen": {}}
for t in range(TRIALS):
    if t > 0:
        verify()
    demote = rng.choice(["0", "1"])
    s = Server(["--ssd-cache", CACHE, "--generation-checkpoint", "16", "--ssd-demote-idle", demote])
    # checks after the crash
    jobs = [rng.choice(list(ref)) for _ in range(rng.randint(1, PAR))]
    if pending_ckpt:
        jobs.insert(0, pending_ckpt)
    outs = [None] * len(jobs)
    def run_job(i, pi, si, stream):
        try:
            outs[i] = s.complete(PROMPTS[pi], SAMPLING[si], stream)[0]
        except Exception as e:
            outs[i] = e
    ths = [threading.Thread(target=run_job, args=(i, pi, si, rng.random() < 0.5), daemon=True)
           for i, (pi, si) in enumerate(jobs)]
    for th in ths:
        th.start()
        if PAR == 1:
            th.join()
    for th in ths:
        th.join(600)
    for (pi, si), got in zip(jobs, outs):
        if isinstance(got, Exception) or got is None:
            fail("trial %d: job %s failed: %r" % (t, (pi, si), got), s.log)
        if got != ref[(pi, si)]:
            fail("trial %d: output of job %s differs from the uncached run:\n got %r\nwant %r" % (t, (pi, si), got[:200],
                                                                                               ref[(pi, si)][:200]), s.log)
    pending_ckpt = None
    if acked:
        p = rng.choice(list(acked))
        _, u = s.complete(p, SAMPLING[0], False, max_tokens=1)
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if cached < acked[p]:
            fail("trial %d: a prompt acknowledged by a 200 flush reused %d tokens, expected >= %d" % (t, cached, acked[p]),
                 s.log)
        stats["acked_checks"] += 1
    st = s.get("/stats")
    stats["resumed"] += (st.get("generation_checkpoints") or {}).get("resumed", 0)
    # the crash
    scen = rng.choice(["write-behind", "checkpoint", "flush", "demotion"])
    stats["scen"][scen] = stats["scen"].get(scen, 0) + 1
    if scen == "write-behind":
        def bg(p):
            try:
                s.complete(p, SAMPLING[0], False)
            except Exception:
                pass
        ths = []
        for _ in range(rng.randint(1, PAR)):
            p = PROMPTS[rng.randrange(len(PROMPTS))] + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 80)))
            ths.append(threading.Thread(target=bg, args=(p,), daemon=True))
            ths[-1].start()
        time.sleep(rng.uniform(0, 0.6))
        s.kill()
        for th in ths:
            th.join(5)
    elif scen == "checkpoint":
        pending_ckpt = (rng.randrange(len(PROMPTS)), rng.randrange(len(SAMPLING)))
        k = rng.randrange(1, MAXT)
        try:
            s.complete(PROMPTS[pending_ckpt[0]], SAMPLING[pending_ckpt[1]], True, stop_after=k)
        except Exception:
            pass
        s.kill()
    elif scen == "flush":
        pi = rng.randrange(len(PROMPTS))
        p = PROMPTS[pi] + " " + rng.choice(WORDS) + " " + str(t)
        _, u = s.complete(p, SAMPLING[0], False, max_tokens=rng.randrange(1, 40))
        n = u.get("prompt_tokens", 0)
        res = {}
        def fl():
            try:
                res["code"] = s.post("/admin/cache/flush", {}, timeout=30)[0]
            except Exception:
                pass
        th = threading.Thread(target=fl, daemon=True)
        th.start()
        time.sleep(rng.uniform(0, 0.4))
        th.join(0)
        done = not th.is_alive()
        s.kill()
        th.join(5)
        if done and res.get("code") == 200:
            acked[p] = (n - 1) // BT * BT
            stats["flush_200"] += 1
    else:  # demotion: RAM entries idle 1 s move to SSD while we wait
        try:
            s.complete(PROMPTS[rng.randrange(len(PROMPTS))] + " idle " + str(t), SAMPLING[0], False, max_tokens=8)
        except Exception:
            pass
        time.sleep(rng.uniform(0.3, 2.5))
        s.kill()
    stats["trials"] += 1

# final round: restart, verify, every acknowledged prompt reused, every job identical
verify()
s = Server(["--ssd-cache", CACHE, "--generation-checkpoint", "16"])
for (pi, si), want in ref.items():
    got, _ = s.complete(PROMPTS[pi], SAMPLING[si], False)
    if got != want:
        fail("final: job %s differs from the uncached run" % ((pi, si),), s.log)
for p, m in acked.items():
    _, u = s.complete(p, SAMPLING[0], False, max_tokens=1)
    if (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) < m:
        fail("final: an acknowledged prompt was not reused", s.log)
s.stop()
print("ok: %d crash trials %s; %d checkpoint resumes seen; %d flushes acknowledged, %d reuse checks; verify: %s" %
      (stats["trials"], json.dumps(stats["scen"]), stats["resumed"], stats["flush_200"], stats["acked_checks"] + len(acked),
       verify()))
