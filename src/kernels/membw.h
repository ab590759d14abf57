/*
 * membw.h — the machine's memory bandwidth, measured the STREAM way: a read pass (sum of every
 * 64-bit word) and a triad pass (a[i] = b[i] + s * c[i]) over buffers much larger than the last-level
 * cache, split in contiguous parts over n_threads threads, each pass timed from a common start to
 * the last thread's end; the median over the runs is reported. `kvtier bench` divides a decode
 * step's bytes by it (the fraction of the physical limit that decode reaches); bench/membw.c is the
 * stand-alone front end.
 *
 * Ownership: kvt_membw_measure allocates its buffers and threads and frees them before returning.
 */
#ifndef KVT_MEMBW_H
#define KVT_MEMBW_H

#include <stddef.h>
#include <stdint.h>

#include "../util/common.h"

typedef struct kvt_membw_result {
    int n_threads;
    uint64_t read_bytes;   /* size of the read buffer */
    uint64_t triad_bytes;  /* size of each of the three triad arrays */
    int runs;
    double read_gbs;       /* median, 1e9 bytes/s */
    double triad_gbs;      /* median, counting 3 arrays (2 read + 1 written) per element, as STREAM */
    double read_best_gbs;  /* best run */
    double triad_best_gbs;
} kvt_membw_result;

/* n_threads 1..256; mib: the read buffer in MiB (each triad array is half of it), 64..16384;
 * runs 1..100. The first (page-faulting) pass of each buffer is not timed. */
kvt_status kvt_membw_measure(int n_threads, uint32_t mib, int runs, kvt_membw_result *out, char *err, size_t errlen);

#endif
