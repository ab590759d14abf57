#!/usr/bin/env bash
# bench/spec_restore.sh — what the draft's state in the tiers buys a restored conversation (issue 29,
# docs/speculative.md "The draft's state in the tiers"). A P-token conversation (text of
# data/models/heldout.txt) is computed once by a server with the draft (--ssd-cache A: the target's
# and the draft's directories) and once by a server without it (B: the target's directory only),
# both flushed. Then R rounds, alternating: a fresh server with the draft starts on a copy of A
# (draft restored from SSD) or of B (the target restored, the draft recomputed) and continues the
# conversation: the same P tokens + Q new ones, G tokens generated, greedy. Reports, medians of R:
# TTFT (the target's restore + Q-token prefill; the draft is not needed for the first token), the
# request's total time, and the draft's reused/recomputed tokens (/stats). Writes
# OUT_DIR/spec_restore.json.
#   TARGET, DRAFT (the trained pair), P (7000) Q (64) G (32) R (3) THREADS (2) OUT_DIR KVTIER
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
TARGET=${TARGET:-data/models/kjv-target-q8_0.gguf}
DRAFT=${DRAFT:-data/models/kjv-draft-q8_0.gguf}
P=${P:-7000}
Q=${Q:-64}
G=${G:-32}
R=${R:-3}
THREADS=${THREADS:-2}
OUT_DIR=${OUT_DIR:-bench/results}
W=$(mktemp -d /tmp/kvtier-spec-restore.XXXXXX)
mkdir -p "$OUT_DIR"
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"' EXIT
"$KVTIER" tokenize -m "$TARGET" --ids --file data/models/heldout.txt >"$W/ids.txt"

python3 - "$KVTIER" "$TARGET" "$DRAFT" "$P" "$Q" "$G" "$R" "$THREADS" "$W" "$OUT_DIR" <<'PY'
import json, os, random, shutil, statistics, subprocess, sys, time, urllib.request
kv, target, draft, P, Q, G, R, threads, w, out = sys.argv[1:11]
P, Q, G, R = int(P), int(Q), int(G), int(R)
ids = json.loads(open(w + "/ids.txt").read())
assert len(ids) >= P + Q, f"heldout.txt has {len(ids)} tokens, need {P + Q}"
first, cont = ids[:P], ids[:P + Q]

def serve(ssd, with_draft):
    port = random.randrange(30000, 50000)
    args = [kv, "serve", "-m", target, "--port", str(port), "-t", threads, "-c", str(P + Q + G + 64),
            "--ssd-cache", ssd, "--parallel", "1"]
    if with_draft: args += ["--draft-model", draft, "--draft-max", "4"]
    log = open(w + "/server.log", "w")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if "listening on" in open(w + "/server.log").read(): return p, f"http://127.0.0.1:{port}"
        if p.poll() is not None: break
        time.sleep(0.1)
    sys.exit("server did not start:\n" + open(w + "/server.log").read()[-2000:])

def post(url, path, body=None):
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())

def stop(p):
    p.terminate()
    p.wait(120)

for name, with_draft in (("A", True), ("B", False)):
    p, url = serve(f"{w}/{name}", with_draft)
    post(url, "/v1/completions", {"prompt": first, "max_tokens": G, "temperature": 0})  # the draft catches up in decode
    assert post(url, "/admin/cache/flush")["durable"]
    stop(p)

rows = {"restored": [], "recomputed": []}
for r in range(R):
    for case, src in (("restored", "A"), ("recomputed", "B")) if r % 2 == 0 else (("recomputed", "B"), ("restored", "A")):
        ssd = f"{w}/run"
        shutil.rmtree(ssd, ignore_errors=True)
        shutil.copytree(f"{w}/{src}", ssd)
        p, url = serve(ssd, True)
        t0 = time.time()
        j = post(url, "/v1/completions", {"prompt": cont, "max_tokens": G, "temperature": 0})
        total = (time.time() - t0) * 1000
        st = json.loads(urllib.request.urlopen(url + "/stats", timeout=30).read())["speculative"]
        stop(p)
        ds = st["draft_state"]
        rows[case].append({"ttft_ms": j["kvtier"]["ttft_ms"], "total_ms": total, "cached": j["usage"]["prompt_tokens_details"]["cached_tokens"],
                           "draft_reused_ssd": ds["reused_ssd_tokens"], "draft_recomputed": ds["recomputed_tokens"],
                           "draft_ms": st["draft_ms"], "gen": j["usage"]["completion_tokens"]})
        print(case, rows[case][-1], flush=True)

res = {"target": target, "draft": draft, "P": P, "Q": Q, "G": G, "R": R, "threads": int(threads), "runs": rows}
for case in rows:
    m = lambda k: statistics.median(x[k] for x in rows[case])
    res[case] = {"ttft_ms": m("ttft_ms"), "total_ms": m("total_ms"), "draft_ms": m("draft_ms"), "cached": m("cached"),
                 "draft_reused_ssd": m("draft_reused_ssd"), "draft_recomputed": m("draft_recomputed")}
    print(f"{case:10s}: TTFT {res[case]['ttft_ms']:.1f} ms, {G} tokens in {res[case]['total_ms']:.0f} ms "
          f"(draft {res[case]['draft_ms']:.0f} ms), target cached {res[case]['cached']:.0f}, "
          f"draft from SSD {res[case]['draft_reused_ssd']:.0f}, draft recomputed {res[case]['draft_recomputed']:.0f}")
json.dump(res, open(os.path.join(out, "spec_restore.json"), "w"), indent=1)
PY
