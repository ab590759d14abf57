// bench/turbo_decode.c — per-row cost of the TURBO row decode at each SIMD level the CPU has
// (1 = AVX2, 2 = AVX-512 VBMI; kv_int.h KVT_TURBO_*), 8-, 4- and 3-bit rows of d = 64, decoded
// 32 rows per kvt_turbo_decode_rows call as attention does. Thread CPU time, best of 7.
// Built by hand (not part of `make`), after `make all`:
//   gcc -std=c11 -O2 -D_GNU_SOURCE -pthread -Isrc bench/turbo_decode.c build/libkvtier.a -lxxhash -lm -o /tmp/btd
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kv/kv.h"
#include "kv/kv_int.h"

static double cpu_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    kvt_kv_cpu_init();
    const uint32_t d = 64, n = 32, bits[3] = {8, 4, 3};
    for (int bi = 0; bi < 3; bi++) {
        const uint32_t b = bits[bi];
        const kvt_codec c = {.kind = KVT_CODEC_TURBO, .bits = (uint8_t)b, .vbits = (uint8_t)b};
        const size_t rb = kvt_codec_row_bytes(c, d);
        uint8_t *src = malloc(rb * n);
        float y[64], *dst = malloc(sizeof(float) * d * n);
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t i = 0; i < d; i++) y[i] = (float)rand() / RAND_MAX - 0.5f;
            kvt_codec_encode_row(c, y, d, src + r * rb);
        }
        for (int lv = 1; lv <= kvt_kv_turbo_level(); lv++) {
            double best = 1e9;
            for (int rep = 0; rep < 7; rep++) {
                const double t0 = cpu_sec();
                for (int it = 0; it < 20000; it++) kvt_turbo_decode_rows(b, src, rb, d, n, dst, lv);
                const double t = (cpu_sec() - t0) / 20000 / n * 1e9;
                best = t < best ? t : best;
            }
            printf("bits %u level %d: %.2f ns/row (d=64, 32-row calls)\n", b, lv, best);
        }
        free(src), free(dst);
    }
    return 0;
}
