# bench/ckpt_cpu.py KVTIER MODEL N R — decode cost of --generation-checkpoint 64 in CPU time, robust to a
# shared machine: the process's user+sys CPU (all threads, the writers included) for -p 64 -n N, on and
# off alternated R times with the same prompt seed per pair, minus -n 1 runs (startup + prefill).
# Prints medians, the per-pair median overhead and the wall decode tok/s medians as JSON.
import subprocess, resource, sys, json, statistics, tempfile, os, shutil
kv, model, N, R = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def run(n, ck, seed):
    d = tempfile.mkdtemp(prefix="kvt-ckcpu-")
    args = [kv, "bench", "-m", model, "-t", "2", "--json", "--once", "-p", "64", "-n", str(n),
            "--ssd-cache", d + "/ssd", "--prompt-seed", str(seed)]
    if ck: args += ["--generation-checkpoint", "64"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(d)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return cpu, json.loads(out)
res = {"off": [], "on": [], "off1": [], "on1": []}
tps = {"off": [], "on": []}
for i in range(R):
    for key, n, ck in (("off", N, False), ("on", N, True), ("off1", 1, False), ("on1", 1, True)):
        cpu, j = run(n, ck, i + 1)
        res[key].append(cpu)
        if key in tps: tps[key].append(j["decode_tps"])
med = {k: statistics.median(v) for k, v in res.items()}
dec_off = med["off"] - med["off1"]; dec_on = med["on"] - med["on1"]
# per-pair differences (same prompt seed), median
pair = statistics.median([(res["on"][i] - res["on1"][i]) / (res["off"][i] - res["off1"][i]) - 1 for i in range(R)])
print(json.dumps({"R": R, "N": N, "cpu_med_s": med, "decode_cpu_off_s": dec_off, "decode_cpu_on_s": dec_on,
                  "cpu_per_token_ms_off": 1000 * dec_off / (N - 1), "cpu_per_token_ms_on": 1000 * dec_on / (N - 1),
                  "overhead_pct_of_medians": 100 * (dec_on / dec_off - 1), "overhead_pct_median_pair": 100 * pair,
                  "wall_decode_tps_median_off": statistics.median(tps["off"]), "wall_decode_tps_median_on": statistics.median(tps["on"])}, indent=1))
