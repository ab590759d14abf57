/* common.c — see common.h. */
#include "common.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

const char *kvt_status_str(kvt_status s) {
    switch (s) {
    case KVT_OK: return "ok";
    case KVT_ERR_NOMEM: return "out of memory";
    case KVT_ERR_IO: return "I/O error";
    case KVT_ERR_FORMAT: return "malformed input";
    case KVT_ERR_UNSUPPORTED: return "unsupported";
    case KVT_ERR_INVALID_ARG: return "invalid argument";
    case KVT_ERR_POOL_EXHAUSTED: return "out of KV memory";
    case KVT_ERR_CORRUPT: return "checksum mismatch";
    case KVT_ERR_NOT_FOUND: return "not found";
    case KVT_ERR_CANCELLED: return "cancelled";
    case KVT_ERR_RANGE: return "out of range";
    case KVT_ERR_UNTRIMMABLE: return "cache cannot be trimmed to that position";
    case KVT_ERR_STALE: return "compatibility key mismatch";
    }
    return "unknown status";
}

static kvt_log_level g_level = KVT_LOG_INFO;
static int g_level_init = 0;

void kvt_log_set_level(kvt_log_level lvl) { g_level = lvl; g_level_init = 1; }

kvt_log_level kvt_log_get_level(void) {
    if (!g_level_init) {
        const char *e = getenv("KVT_LOG");
        if (e) {
            if (!strcmp(e, "debug")) g_level = KVT_LOG_DEBUG;
            else if (!strcmp(e, "warn")) g_level = KVT_LOG_WARN;
            else if (!strcmp(e, "error")) g_level = KVT_LOG_ERROR;
        }
        g_level_init = 1;
    }
    return g_level;
}

void kvt_log(kvt_log_level lvl, const char *fmt, ...) {
    if (lvl < kvt_log_get_level()) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvtier %s: %s\n", names[lvl], buf);
}

kvt_status kvt_errf(char *err, size_t errlen, kvt_status st, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

uint64_t kvt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kvt_now_ms(void) { return (double)kvt_now_ns() / 1e6; }

const char *kvt_fmt_bytes(double bytes, char *buf, size_t n) {
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 999.5 && u < 4) {
        bytes /= 1000.0;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%.0f B", bytes);
    else snprintf(buf, n, bytes < 9.995 ? "%.2f %s" : bytes < 99.95 ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

float kvt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kvt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absu >= 0x47800000u) {                                  /* >= 65536: overflow to inf */
        /* values in [65520, 65536) round to inf too; handled by the general path below */
        return (uint16_t)(sign | 0x7c00);
    }
    if (absu < 0x38800000u) { /* below smallest normal half (2^-14): subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 - (e - 127) + 13 - 1 ... */
        /* value = m * 2^(e-150); half subnormal unit = 2^-24 -> q = m * 2^(e-150+24) = m >> (126-e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal */
    uint32_t r = absu - 0x38000000u; /* rebias exponent 127 -> 15 (in the f32 exponent field) */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    if (q >= 0x7c00) return (uint16_t)(sign | 0x7c00);
    return (uint16_t)(sign | q);
}

float kvt_f16_table[65536];
static pthread_once_t g_f16_once = PTHREAD_ONCE_INIT;
static void f16_table_build(void) {
    for (uint32_t i = 0; i < 65536; i++) kvt_f16_table[i] = kvt_f16_to_f32((uint16_t)i);
}
void kvt_f16_table_init(void) { pthread_once(&g_f16_once, f16_table_build); }

void *kvt_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    if (size == 0) size = align;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    memset(p, 0, size);
    return p;
}

int kvt_n_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
