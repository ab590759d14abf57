#!/usr/bin/env python3
"""bench/summarize.py — markdown summary of the bench/results/*.json written by bench/run-all."""
import json
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
LLAMA_CPP = {"pp": 560.0, "tg": 95.0}  # llama.cpp, Q8_0 smol-135m, this CPU class (reference figures)


def load(name):
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mib(x):
    return "%.1f MiB" % (x / 1048576.0)


out = []
m = load("machine.json") or {}
out.append("# kvtier benchmark summary\n")
out.append("Run %s (git %s) on %s, %s cores; load average %s at start, %s at end; %s s total.\n" % (
    m.get("date", "?"), m.get("git", "?"), m.get("cpu", "?"), m.get("cores", "?"), m.get("loadavg_start", "?"),
    m.get("loadavg_end", "?"), m.get("total_seconds", "?")))

out.append("## 1. Engine core (smol-135m, median of repetitions)\n")
out.append("| weights | pp t/s | tg t/s | pp vs llama.cpp Q8_0 (560) | tg vs llama.cpp Q8_0 (95) |")
out.append("|---|---|---|---|---|")
for t in ("q8_0", "f16", "q4_k"):
    c = load("core-%s.json" % t)
    if not c:
        out.append("| %s | failed | | | |" % t)
        continue
    out.append("| %s | %.1f | %.2f | %.3f | %.3f |" % (t, c["prefill_tps"], c["decode_tps"], c["prefill_tps"] / LLAMA_CPP["pp"],
                                                   c["decode_tps"] / LLAMA_CPP["tg"]))
out.append("")

out.append("## 2. KV codecs at depth (smol-135m Q8_0 weights)\n")
out.append("| KV | bytes/token (layout) | bytes/token (pool peak / tokens) | vs f16 | prefill t/s | decode t/s at depth |")
out.append("|---|---|---|---|---|---|")
base = None
for q in ("off", "8", "4"):
    r = load("depth-kv%s.json" % q)
    if not r:
        out.append("| kv%s | failed | | | | |" % q)
        continue
    if q == "off":
        base = r["kv_bytes_per_token_layout"]
    out.append("| %s (depth %d) | %.0f | %.0f | %s | %.1f | %.2f |" % (
        r["kv"], r["depth"], r["kv_bytes_per_token_layout"], r["kv_bytes_per_token_measured"],
        "%.3f" % (r["kv_bytes_per_token_layout"] / base) if base else "?", r["prefill_tps"], r["decode_tps"]))
out.append("")
a = load("agreement.json")
if a:
    out.append("Top-1 agreement vs %s over %d greedy tokens (teacher-forced):\n" % (a["reference"], a["n"]))
    for r in a["results"]:
        out.append("- %s: %d/%d = %.1f%% (first mismatch at %d)" % (r["scheme"], r["match"], a["n"], 100 * r["rate"], r["first_mismatch"]))
    out.append("")
for s in (load("swa.json"), load("swa-gemma3-1b.json")):
    if not s:
        continue
    full = s["full_cache_bytes_computed"]
    out.append("Sliding window (%s, %d tokens): live KV peak %s vs full cache %s (computed: %.0f bytes/token x tokens; the engine "
               "cannot force full attention) = %.3f of full.\n" % (s["model"], s["depth"] + s["n_gen"] - 1, mib(s["peak_kv_bytes"]),
                                                                   mib(full), s["kv_bytes_per_token_full_attention"],
                                                                   s["peak_kv_bytes"] / full))

out.append("## 3. RAM tier\n")
r = load("ram-ttft.json")
if r:
    out.append("| prompt | cold TTFT | exact repeat | %d shared + %d new |" % (r["n_prompt"] - r["suffix"], r["suffix"]))
    out.append("|---|---|---|---|")
    out.append("| %d | %.0f ms | %.1f ms (%.0fx) | %.1f ms (%.1fx) |\n" % (r["n_prompt"], r["ttft_cold_ms"], r["ttft_repeat_ms"],
                                                                      r["speedup_repeat"], r["ttft_prefix_suffix_ms"], r["speedup_prefix"]))
c = load("clones.json")
if c:
    out.append("Clones of one %d-token donor (f16 KV, %.0f bytes/token; a private copy = %s):\n" % (
        c["donor_tokens"], c["kv_bytes_per_token"], mib(c["private_copy_bytes"])))
    out.append("| sequences | pool bytes | VmRSS |")
    out.append("|---|---|---|")
    out.append("| 1 | %s | %s |" % (mib(c["k1"]["pool_bytes"]), mib(c["k1"]["rss"])))
    out.append("| %d | %s (x%.2f) | %s (x%.2f; private copies would be ~%s) |\n" % (
        c["k"], mib(c["kk"]["pool_bytes"]), c["pool_ratio_k_vs_1"], mib(c["kk"]["rss"]), c["rss_ratio_k_vs_1"],
        mib(c["rss_private_estimate"])))

out.append("## 4. SSD tier (smol-135m Q8_0)\n")
x = load("ssd.json")
if x:
    out.append("| measure | value |")
    out.append("|---|---|")
    out.append("| %d-token prompt: cold TTFT | %.0f ms |" % (x["n_prompt"], x["ttft_cold_ms"]))
    out.append("| new process, same prompt (restore from SSD), median | %.0f ms (%.0fx) |" % (x["ttft_restart_ms"], x["speedup"]))
    out.append("| restore bandwidth (median) | %.1f MB/s |" % x["restore_mb_s"])
    out.append("| disk sequential read, O_DIRECT / buffered | %.1f / %.1f MB/s (page cache drop %s) |" % (
        x["disk_read_direct_mb_s"], x["disk_read_buffered_mb_s"], "write accepted, effect unverified" if x["page_cache_dropped"] else "not permitted"))
    out.append("| restore / O_DIRECT disk read | %.2f |" % x["restore_vs_direct"])
    out.append("| decode t/s write-behind on / off | %.2f / %.2f |" % (x["decode_tps_writeback_on"], x["decode_tps_writeback_off"]))
    t = x["turns"]
    out.append("| %d-turn conversation: bytes on disk vs sum of prompt KV | %s vs %s = %.3f |" % (
        len(t["turns"]), mib(x["turns_disk_bytes"]), mib(t["sum_prompt_kv_bytes"]), x["turns_disk_vs_sum_prompt_kv"]))
    fin = t["final_tokens"] * t["kv_bytes_per_token_layout"]
    out.append("| same: bytes on disk vs the final conversation's KV (%d tokens) | %s vs %s = %.3f |" % (
        t["final_tokens"], mib(x["turns_disk_bytes"]), mib(fin), x["turns_disk_bytes"] / fin))
    out.append("")

x = load("ttft-ctx.json")
if x:
    out.append("## 5. TTFT against prompt length (bench/ttft_ctx.sh, median of %d)\n" % x["rounds"])
    out.append("| prompt | cold | RAM hit | SSD restore | shared fetch |")
    out.append("|---|---|---|---|---|")
    for p in x["points"]:
        out.append("| %d | %.0f ms | %.1f ms | %.1f ms | %.1f ms |" % (p["n_prompt"], p["cold_ms"], p["ram_ms"], p["ssd_ms"],
                                                                     p["shared_ms"]))
    out.append("")

st = []
try:
    with open(os.path.join(d, "status.jsonl")) as f:
        st = [json.loads(l) for l in f if l.strip()]
except OSError:
    pass
if st:
    out.append("Steps: " + ", ".join("%s %ds%s" % (s["step"], s["seconds"], "" if s["rc"] == 0 else " (FAILED rc %d)" % s["rc"]) for s in st))
print("\n".join(out))
