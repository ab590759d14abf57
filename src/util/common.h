/*
 * common.h — status codes, logging, clocks and 16-bit float conversion shared by every layer.
 *
 * Ownership: nothing here allocates. kvt_status values are plain enums; kvt_status_str returns a
 * static string. Logging writes one line to stderr and is thread-safe (one fprintf per line).
 */
#ifndef KVT_COMMON_H
#define KVT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum kvt_status {
    KVT_OK = 0,
    KVT_ERR_NOMEM,          /* malloc failed */
    KVT_ERR_IO,             /* read/write/open failed (errno is meaningful) */
    KVT_ERR_FORMAT,         /* untrusted input is malformed (GGUF, cache file, JSON) */
    KVT_ERR_UNSUPPORTED,    /* well-formed but not something we implement (type, arch, version) */
    KVT_ERR_INVALID_ARG,    /* caller passed a bad value (flag, token id out of range, …) */
    KVT_ERR_POOL_EXHAUSTED, /* KV block pool byte budget reached: "out of KV memory" */
    KVT_ERR_CORRUPT,        /* checksum mismatch */
    KVT_ERR_NOT_FOUND,
    KVT_ERR_CANCELLED,
    KVT_ERR_RANGE,          /* e.g. prompt longer than the context */
    KVT_ERR_UNTRIMMABLE,    /* a cache layer cannot be cut at the requested position */
    KVT_ERR_STALE,          /* compatibility key mismatch */
} kvt_status;

const char *kvt_status_str(kvt_status s);

/* ---- logging ---- */
typedef enum { KVT_LOG_DEBUG = 0, KVT_LOG_INFO = 1, KVT_LOG_WARN = 2, KVT_LOG_ERROR = 3 } kvt_log_level;
void kvt_log_set_level(kvt_log_level lvl);
kvt_log_level kvt_log_get_level(void);
void kvt_log(kvt_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define KVT_DEBUG(...) kvt_log(KVT_LOG_DEBUG, __VA_ARGS__)
#define KVT_INFO(...) kvt_log(KVT_LOG_INFO, __VA_ARGS__)
#define KVT_WARN(...) kvt_log(KVT_LOG_WARN, __VA_ARGS__)
#define KVT_ERROR(...) kvt_log(KVT_LOG_ERROR, __VA_ARGS__)

/* Writes a formatted message into err[errlen] (if err != NULL) and returns st. For one-line errors. */
kvt_status kvt_errf(char *err, size_t errlen, kvt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A byte count for messages, in decimal units with 3 significant digits ("512 B", "4.19 kB",
 * "12.6 MB", "1.50 GB"): small sizes never print as 0 MB. Writes buf[n], returns buf. */
const char *kvt_fmt_bytes(double bytes, char *buf, size_t n);

/* ---- clocks ---- */
uint64_t kvt_now_ns(void);    /* CLOCK_MONOTONIC */
double kvt_now_ms(void);

/* ---- overflow-checked arithmetic for untrusted sizes ---- */
static inline bool kvt_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kvt_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* ---- 16-bit floats (IEEE half and bfloat16), exact conversions ---- */
float kvt_f16_to_f32(uint16_t h);
uint16_t kvt_f32_to_f16(float f);            /* round to nearest even, handles inf/nan/subnormal */
static inline float kvt_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t kvt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* Table-driven fast path (65536 entries, built once, thread-safe init). Same results as above. */
void kvt_f16_table_init(void);
extern float kvt_f16_table[65536];
static inline float kvt_f16_to_f32_fast(uint16_t h) { return kvt_f16_table[h]; }

/* ---- misc ---- */
#define KVT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
void *kvt_aligned_alloc(size_t align, size_t size); /* zeroed; free with free() */
int kvt_n_cpus(void);

#endif
