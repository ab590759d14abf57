// bench/membw.c — the machine's memory bandwidth with a given thread count (STREAM-like read and
// triad over buffers much larger than the last-level cache, median of runs; src/kernels/membw.h).
// `kvtier bench` runs the same measurement (--membw, and beside every decode figure) to report the
// fraction of this bandwidth that decode uses.
//   make build/bench/membw && build/bench/membw [-t THREADS=1] [-m MIB=1024] [-r RUNS=9] [--json]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/membw.h"

int main(int argc, char **argv) {
    int t = 1, runs = 9;
    long mib = 1024;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) t = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: membw [-t THREADS] [-m MIB] [-r RUNS] [--json]\n");
            return 2;
        }
    }
    if (mib < 64 || mib > 16384) {
        fprintf(stderr, "membw: -m 64..16384\n");
        return 2;
    }
    kvt_membw_result r;
    char err[256];
    if (kvt_membw_measure(t, (uint32_t)mib, runs, &r, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (json)
        printf("{\"threads\":%d,\"read_mib\":%ld,\"runs\":%d,\"read_gbs\":%.2f,\"triad_gbs\":%.2f,\"read_best_gbs\":%.2f,"
               "\"triad_best_gbs\":%.2f}\n",
               r.n_threads, mib, r.runs, r.read_gbs, r.triad_gbs, r.read_best_gbs, r.triad_best_gbs);
    else
        printf("membw: %d thread(s), %ld MiB read buffer, %d runs: read %.2f GB/s (best %.2f), triad %.2f GB/s (best %.2f)\n",
               r.n_threads, mib, r.runs, r.read_gbs, r.read_best_gbs, r.triad_gbs, r.triad_best_gbs);
    return 0;
}
