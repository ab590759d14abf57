/*
 * repack.c — load-time repacking of quantized weights into the interleaved prefill layout
 * (kernels_internal.h, "repacked weights"), the dispatched packed GEMM entry point and its scalar
 * reference.
 *
 * Why: the row-major GGUF layout makes a 4-row micro-kernel gather from 4 streams and unpack
 * nibbles / high bits / 6-bit scales once per weight tile and block. Repacking does that work once
 * at load: a tile's weights are one contiguous run of bytes, one byte per weight, scales widened.
 *
 * Exactness: the packed kernels compute the same integers per 4-weight lane group and the same
 * float operations, in the same order, as the row-major kernels of the same ISA (kernels_x86_tmpl.h),
 * so kvt_matmul_packed == kvt_matmul_rows bit for bit; tests/test_kernels.c checks every type, ISA,
 * row count and column range. kvt_matmul_packed_ref emulates that lane order in scalar C.
 *
 * Ownership: kvt_packed owns its data (64-byte aligned); the original W is borrowed.
 */
#include "kernels_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* F16/BF16 rows of at most this many bytes get the single-row GEMV copy. On an AVX2 Zen 3
 * (build/bench/gemv, 2 threads, 256 MiB of 3072-row matrices, GB/s of weights, rows → interleaved):
 * BF16 n_in 512 27.2 → 29.9, 1024 16.6–26.0 → 27.7–27.9 (F16 23.6 → 33.8), 1536 28.2 → 30.3, but 2048
 * 36.9 → 31.6 and 4096 39.2 → 30.9: long rows stream well as they are, and the copy doubles their
 * memory. */
#define KQ_F_ILV_MAX_ROW 2048u

static int pack_kind(uint32_t t) {
    switch (t) {
    case KVT_TYPE_Q8_0: case KVT_TYPE_Q4_0: case KVT_TYPE_Q5_0: return KQP_SMALL_S;
    case KVT_TYPE_Q4_1: case KVT_TYPE_Q5_1: return KQP_SMALL_U;
    case KVT_TYPE_Q4_K: case KVT_TYPE_Q5_K: return KQP_KM;
    case KVT_TYPE_Q6_K: return KQP_K6;
    case KVT_TYPE_F16: case KVT_TYPE_BF16: return KQP_F;
    default: return -1;
    }
}

/* One small block (32 weights) of type t at p → q[32] (signed or unsigned values), d, m. */
void kq_unpack_small(uint32_t t, const uint8_t *p, int8_t *q, float *d, float *m) {
    *d = kq_h2f(kq_rd16(p));
    *m = 0.0f;
    switch (t) {
    case KVT_TYPE_Q8_0: memcpy(q, p + 2, 32); return;
    case KVT_TYPE_Q4_0:
        for (int j = 0; j < 16; j++) q[j] = (int8_t)((p[2 + j] & 0xF) - 8), q[j + 16] = (int8_t)((p[2 + j] >> 4) - 8);
        return;
    case KVT_TYPE_Q4_1:
        *m = kq_h2f(kq_rd16(p + 2));
        for (int j = 0; j < 16; j++) q[j] = (int8_t)(p[4 + j] & 0xF), q[j + 16] = (int8_t)(p[4 + j] >> 4);
        return;
    case KVT_TYPE_Q5_0: {
        const uint32_t qh = rd32(p + 2);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((p[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
            q[j + 16] = (int8_t)(((p[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        return;
    }
    default: { /* Q5_1 */
        *m = kq_h2f(kq_rd16(p + 2));
        const uint32_t qh = rd32(p + 4);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((p[8 + j] & 0xF) | (((qh >> j) & 1) << 4));
            q[j + 16] = (int8_t)((p[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        return;
    }
    }
}

/* One K super-block at p → q[256] (unsigned), d, dmin, half-scales sc2[8][2], mv[16]. */
void kq_unpack_k(uint32_t t, const uint8_t *p, uint8_t *q, float *d, float *dmin, int16_t sc2[8][2],
                 int16_t mv[16]) {
    if (t == KVT_TYPE_Q6_K) {
        *d = kq_h2f(kq_rd16(p + 208));
        *dmin = 0.0f;
        for (int g = 0; g < 8; g++) {
            const int h = g / 4, k = g % 4;
            const uint8_t *ql = p + 64 * h + 32 * (k & 1), *qh = p + 128 + 32 * h;
            for (int e = 0; e < 32; e++) {
                const int lo = k < 2 ? (ql[e] & 0xF) : (ql[e] >> 4);
                q[32 * g + e] = (uint8_t)(lo | (((qh[e] >> (2 * k)) & 3) << 4));
            }
            sc2[g][0] = (int8_t)p[192 + 2 * g];
            sc2[g][1] = (int8_t)p[192 + 2 * g + 1];
        }
        for (int k = 0; k < 16; k++) mv[k] = (int8_t)p[192 + k];
        return;
    }
    *d = kq_h2f(kq_rd16(p));
    *dmin = kq_h2f(kq_rd16(p + 2));
    const uint8_t *qs = p + (t == KVT_TYPE_Q4_K ? 16 : 48), *qh = p + 16;
    for (int g = 0; g < 8; g++) {
        uint8_t sc, mn;
        kq_scale_min_k4(g, p + 4, &sc, &mn);
        sc2[g][0] = sc2[g][1] = sc;
        mv[2 * g] = mv[2 * g + 1] = mn;
        for (int e = 0; e < 32; e++) {
            int v = (qs[32 * (g / 2) + e] >> (4 * (g & 1))) & 0xF;
            if (t == KVT_TYPE_Q5_K) v |= ((qh[e] >> g) & 1) << 4;
            q[32 * g + e] = (uint8_t)v;
        }
    }
}

bool kq_hugepages(void) {
    static _Atomic int on = -1; /* every thread that races here stores the same value */
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("KVT_HUGEPAGES");
        v = !(e && !strcmp(e, "0"));
        atomic_store_explicit(&on, v, memory_order_relaxed);
    }
    return v;
}

void *kq_group_alloc(size_t bytes) {
    const size_t huge = (size_t)1 << 21;
    void *p = NULL;
    if (posix_memalign(&p, bytes >= huge ? huge : 64, bytes ? bytes : 64) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= huge && kq_hugepages()) (void)madvise(p, bytes, MADV_HUGEPAGE); /* before the first touch: the faults take huge pages */
#endif
    return p;
}

void *kq_packed_alloc(size_t bytes) {
    void *p = kq_group_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* The handle and (gemm) the GEMM layout for the ISA in use. */
static kvt_packed *packed_create(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out, bool gemm) {
    const int kind = pack_kind(wtype);
    const uint64_t wrb = kvt_type_row_bytes(wtype, (uint64_t)(n_in > 0 ? n_in : 0));
    if (kind < 0 || !W || n_in <= 0 || n_out <= 0 || wrb == 0 || n_out > (1ll << 30)) return NULL;
    kvt_packed *P = calloc(1, sizeof *P);
    if (!P) return NULL;
    P->type = wtype;
    P->kind = kind;
    P->n_in = n_in;
    P->n_out = n_out;
    P->nb = n_in / (int64_t)kvt_type_block_elems(wtype);
    P->ngroups = (n_out + KQP_ROWS - 1) / KQP_ROWS;
    P->gbb = kind == KQP_SMALL_S ? KQP_SMALL_S_BYTES : kind == KQP_SMALL_U ? KQP_SMALL_U_BYTES : KQP_K_BYTES;
    P->W = W;
    if (kind == KQP_F) { /* the GEMV copy only, in blocks of 8 elements (no tail: rows of 8k), of
                          * rows up to KQ_F_ILV_MAX_ROW bytes */
        P->nb = n_in / 8;
        P->gbb = 0;
        if (n_in % 8 || wrb > KQ_F_ILV_MAX_ROW) {
            free(P);
            return NULL;
        }
        return P;
    }
    /* AVX-512 VNNI (not AMX): the signed small types take the 16-row layout of gemm_s16.c instead of
     * the 4-row groups (one copy, about the same bytes); Q8_0's serves decode too, so it is also
     * its GEMV copy (made without gemm) */
    if (kind == KQP_SMALL_S && kvt_kernels_isa() == KVT_ISA_AVX512 && kq_has_vnni() &&
        (gemm || wtype == KVT_TYPE_Q8_0)) {
        if (kq_s16_build(P)) return P;
        free(P);
        return NULL;
    }
    if (!gemm) return P;
    /* likewise the K-quants: the 16-row layout of gemm_k16.c, under AMX too (the AMX table keeps the
     * AVX-512 VNNI kernels for K-quants, and this one gives their bits) */
    if (kind >= KQP_KM && ((kvt_kernels_isa() == KVT_ISA_AVX512 && kq_has_vnni()) || kvt_kernels_isa() == KVT_ISA_AMX)) {
        if (!(P->k16 = kq_k16_pack(P))) {
            free(P);
            return NULL;
        }
        return P;
    }
    uint64_t bytes;
    if (!kvt_mul_ok((uint64_t)P->ngroups * (uint64_t)P->nb, P->gbb, &bytes) || bytes > SIZE_MAX / 2 ||
        !(P->data = kq_packed_alloc((size_t)bytes))) { /* zeroed: padding rows are 0 */
        free(P);
        return NULL;
    }
    const uint8_t *w8 = W;
    const size_t wbb = kvt_type_block_bytes(wtype);
    for (int64_t g = 0; g < P->ngroups; g++)
        for (int64_t b = 0; b < P->nb; b++) {
            uint8_t *o = P->data + ((size_t)g * (size_t)P->nb + (size_t)b) * P->gbb;
            for (int i = 0; i < KQP_ROWS; i++) {
                const int64_t row = g * KQP_ROWS + i;
                if (row >= n_out) break;
                const uint8_t *p = w8 + (size_t)row * wrb + (size_t)b * wbb;
                if (kind <= KQP_SMALL_U) {
                    float d, m;
                    kq_unpack_small(wtype, p, (int8_t *)(o + (kind == KQP_SMALL_S ? 16 : 32) + 32 * i), &d, &m);
                    memcpy(o + 4 * i, &d, 4);
                    if (kind == KQP_SMALL_U) memcpy(o + 16 + 4 * i, &m, 4);
                } else {
                    uint8_t q[256];
                    float d, dm;
                    int16_t sc2[8][2], mv[16];
                    kq_unpack_k(wtype, p, q, &d, &dm, sc2, mv);
                    memcpy(o + 4 * i, &d, 4);
                    memcpy(o + 16 + 4 * i, &dm, 4);
                    for (int gg = 0; gg < 8; gg++) {
                        memcpy(o + KQP_K_SC + 16 * gg + 4 * i, sc2[gg], 4);
                        memcpy(o + KQP_K_Q + 128 * gg + 32 * i, q + 32 * gg, 32);
                    }
                    memcpy(o + KQP_K_MV + 32 * i, mv, 32);
                }
            }
        }
    /* AMX layout, derived from the 4-row groups: only while AMX is the ISA in use (memory: about as
     * much again as the packed Q8_0 bytes); padded outputs stay zero (kvt_aligned_alloc zeroes) */
    if (kind == KQP_SMALL_S && kvt_kernels_isa() == KVT_ISA_AMX) {
        const int64_t ng = (n_out + KQA_N - 1) / KQA_N;
        uint64_t ab;
        if (kvt_mul_ok((uint64_t)ng * (uint64_t)P->nb, KQA_GBB, &ab) && ab <= SIZE_MAX / 2 &&
            (P->amx = kq_packed_alloc((size_t)ab))) {
            for (int64_t o = 0; o < n_out; o++)
                for (int64_t b = 0; b < P->nb; b++) {
                    const uint8_t *src = P->data + ((size_t)(o / KQP_ROWS) * (size_t)P->nb + (size_t)b) * P->gbb;
                    const int i = (int)(o % KQP_ROWS), n = (int)(o % KQA_N);
                    uint8_t *dst = P->amx + ((size_t)(o / KQA_N) * (size_t)P->nb + (size_t)b) * KQA_GBB;
                    memcpy(dst + 4 * n, src + 4 * i, 4);
                    for (int k4 = 0; k4 < 8; k4++) memcpy(dst + 64 + 64 * k4 + 4 * n, src + 16 + 32 * i + 4 * k4, 4);
                }
        } /* else: no AMX layout, the AVX-512 packed kernels run (same results as without AMX) */
    }
    return P;
}

bool kvt_packed_has_amx(const kvt_packed *p) { return p && p->amx; }

/* Whether single-row products of P get the interleaved copy: the ISA in use has a kernel for it with
 * the row-major product's bits (kq_ilv_fits), and it is not turned off (KVT_GEMV_ILV=0, for
 * measuring its effect). */
static bool ilv_wanted(const kvt_packed *P) {
    const char *e = getenv("KVT_GEMV_ILV");
    if (e && !strcmp(e, "0")) return false;
    return kq_ilv_fits(P->kind);
}

/* Whether P (Q4_K/Q5_K/Q6_K; Q4_0/Q5_0/Q4_1/Q5_1 of an even block count) gets the 16-row nibble decode
 * layout: the ISA in use has its kernel (AVX-512 VNNI, or AMX, whose table keeps the AVX-512 VNNI
 * K-quant and Q4_1/Q5_1 kernels and whose Q4_0/Q5_0 products have the same arithmetic), and the GEMV
 * copy is not off. */
static bool n16_wanted(const kvt_packed *P) {
    const char *e = getenv("KVT_GEMV_ILV");
    if (e && !strcmp(e, "0")) return false;
    const kvt_isa isa = kvt_kernels_isa();
    return (P->kind == KQP_KM || P->kind == KQP_K6 || (kq_n16_pairs(P) && P->nb % 2 == 0)) && ((isa == KVT_ISA_AVX512 && kq_has_vnni()) || isa == KVT_ISA_AMX);
}

bool kvt_packed_has_ilv(const kvt_packed *p) { return p && p->ilv; }

const char *kvt_packed_gemv_layout(const kvt_packed *p) {
    if (!p) return NULL;
    if (p->ilv) return "interleaved";
    if (p->n16 || (p->s16 && p->type == KVT_TYPE_Q8_0)) return "16-row";
    return NULL;
}

size_t kq_ilv_block_bytes(const kvt_packed *P) {
    return P->kind == KQP_F ? 8 * (size_t)kvt_type_row_bytes(P->type, 1) : kvt_type_block_bytes(P->type);
}

size_t kq_ilv_bytes(const kvt_packed *P) {
    return P->ilv ? (size_t)(P->n_out / 4) * 4 * (size_t)kvt_type_row_bytes(P->type, (uint64_t)P->n_in) : 0;
}

bool kq_ilv_build(kvt_packed *P) {
    const size_t wbb = kq_ilv_block_bytes(P), wrb = (size_t)P->nb * wbb;
    const int64_t groups = P->n_out / 4;
    uint64_t bytes;
    if (groups == 0 || !kvt_mul_ok((uint64_t)groups * 4, wrb, &bytes) || bytes > SIZE_MAX / 2) return false;
    if (!(P->ilv = kq_packed_alloc((size_t)bytes))) return false;
    const uint8_t *w8 = P->W;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < P->nb; b++)
            for (int i = 0; i < 4; i++)
                memcpy(P->ilv + (((size_t)g * (size_t)P->nb + (size_t)b) * 4 + (size_t)i) * wbb,
                       w8 + (size_t)(g * 4 + i) * wrb + (size_t)b * wbb, wbb);
    return true;
}

kvt_packed *kvt_packed_create(uint32_t wtype, const void *W, int64_t n_in, int64_t n_out) {
    kvt_kernels_init();
    const char *e = getenv("KVT_REPACK");
    if (e && !strcmp(e, "0")) return NULL;
    /* KVT_REPACK=gemv: only the single-row GEMV copy (decode benchmarks load in seconds; chunks of
     * 2+ rows then take the row-major kernels, same results) */
    const bool gemm = !(e && !strcmp(e, "gemv"));
    kvt_packed *P = packed_create(wtype, W, n_in, n_out, gemm);
    /* best effort: without memory for it, single rows keep reading W (same results). Q4_K/Q5_K/Q6_K/
     * Q4_0/Q5_0/Q4_1/Q5_1 under AVX-512 VNNI or AMX: a 16-row nibble layout (kernels_internal.h)
     * instead of the 4-row copy */
    if (P && n16_wanted(P)) (void)kq_n16_build(P);
    else if (P && ilv_wanted(P)) (void)kq_ilv_build(P);
    if (P && (!gemm || P->kind == KQP_F) && !P->ilv && !P->s16 && !P->n16) { /* nothing made */
        free(P);
        return NULL;
    }
    return P;
}

void kvt_packed_free(kvt_packed *p) {
    if (!p) return;
    free(p->ilv);
    free(p->n16);
    free(p->amx);
    free(p->s16);
    free(p->k16);
    free(p->data);
    free(p);
}

size_t kvt_packed_bytes(const kvt_packed *p) {
    if (!p) return 0;
    const size_t amx = p->amx ? (size_t)((p->n_out + KQA_N - 1) / KQA_N) * (size_t)p->nb * KQA_GBB : 0;
    const size_t data = p->data ? (size_t)p->ngroups * (size_t)p->nb * p->gbb : 0;
    const size_t k16 = p->k16 ? kq_k16_bytes(p) : 0;
    return data + amx + kq_s16_bytes(p) + k16 + kq_n16_bytes(p) + kq_ilv_bytes(p);
}

/* Per-thread scratch for the packed kernels' converted activation rows (grown, never shrunk; freed
 * at thread exit by the key's destructor). */
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static bool g_scratch_ok;
typedef struct { uint8_t *p; size_t cap; } kq_scratch;
static void scratch_free(void *v) {
    kq_scratch *s = v;
    if (s) free(s->p);
    free(s);
}
static void scratch_init(void) { g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0; }
uint8_t *kq_tls_scratch(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_init);
    if (!g_scratch_ok) return NULL;
    kq_scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        uint8_t *n = kvt_aligned_alloc(64, bytes);
        if (!n) return NULL;
        free(s->p);
        s->p = n;
        s->cap = bytes;
    }
    return s->p;
}

void kvt_matmul_packed_ref(const kvt_packed *P, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                           int64_t o1) {
    kvt_f16_table_init();
    if (!P || o1 <= o0 || n_rows <= 0 || o0 < 0 || o1 > P->n_out) return;
    if (!P->data) { /* F16/BF16 (a GEMV copy alone: the row-major arithmetic), or a 16-row VNNI layout:
                     * its own arithmetic (gemm_s16.c, gemm_k16.c; same results) */
        if (P->kind == KQP_F) kvt_matmul_rows_ref(P->type, P->W, P->n_in, act, n_rows, y, ldy, o0, o1);
        if (P->s16) kq_s16_ref(P, act, n_rows, y, ldy, o0, o1);
        else if (P->k16) kq_k16_ref(P, act, n_rows, y, ldy, o0, o1);
        else if (P->n16) /* the decode layout alone (KVT_REPACK=gemv) */
            for (int64_t r = 0; r < n_rows; r++)
                kq_n16_ref(P, (const uint8_t *)act + (size_t)r * kvt_act_bytes(P->type, P->n_in, 1), y + r * ldy, o0, o1);
        return;
    }
    const uint32_t vt = kvt_vec_dot_type(P->type);
    const size_t arb = (size_t)kvt_type_row_bytes(vt, (uint64_t)P->n_in);
    const uint8_t *A = act;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t o = o0; o < o1; o++) {
            const int64_t g = o / KQP_ROWS;
            const int i = (int)(o % KQP_ROWS);
            const uint8_t *G = P->data + (size_t)g * (size_t)P->nb * P->gbb, *a = A + (size_t)r * arb;
            if (P->kind <= KQP_SMALL_U) {
                const bool sgn = P->kind == KQP_SMALL_S;
                const size_t abb = sgn ? 34 : 36, aqo = sgn ? 2 : 4, qo = sgn ? 16 : 32;
                float lane[8] = {0}, macc = 0.0f;
                for (int64_t b = 0; b < P->nb; b++) {
                    const uint8_t *p = G + (size_t)b * P->gbb, *pa = a + (size_t)b * abb;
                    const int8_t *q = (const int8_t *)(p + qo + 32 * i), *x = (const int8_t *)(pa + aqo);
                    float dw, mw = 0.0f;
                    memcpy(&dw, p + 4 * i, 4);
                    if (!sgn) memcpy(&mw, p + 16 + 4 * i, 4);
                    const float dx = kq_h2f(kq_rd16(pa)), sx = sgn ? 0.0f : kq_h2f(kq_rd16(pa + 2));
                    const float s = dw * dx;
                    for (int l = 0; l < 8; l++) {
                        int32_t d = 0;
                        for (int k = 4 * l; k < 4 * l + 4; k++) d += (int32_t)q[k] * x[k];
                        lane[l] = fmaf((float)d, s, lane[l]); /* the SIMD path's fused multiply-add */
                    }
                    if (!sgn) macc += mw * sx;
                }
                y[r * ldy + o] = kq_hsum8(lane) + macc;
            } else {
                float sumf = 0.0f;
                for (int64_t b = 0; b < P->nb; b++) {
                    const uint8_t *p = G + (size_t)b * P->gbb;
                    const blk_q8_K *xa = (const blk_q8_K *)(a + (size_t)b * sizeof(blk_q8_K));
                    float dw, dm, dx;
                    memcpy(&dw, p + 4 * i, 4);
                    memcpy(&dm, p + 16 + 4 * i, 4);
                    memcpy(&dx, &xa->d, 4);
                    int32_t isum = 0, msum = 0;
                    for (int gg = 0; gg < 8; gg++) {
                        int16_t sc2[2];
                        memcpy(sc2, p + KQP_K_SC + 16 * gg + 4 * i, 4);
                        const uint8_t *q = p + KQP_K_Q + 128 * gg + 32 * i;
                        for (int e = 0; e < 32; e++) isum += sc2[e / 16] * (int32_t)q[e] * xa->qs[32 * gg + e];
                    }
                    int16_t mv[16], bs[16];
                    memcpy(mv, p + KQP_K_MV + 32 * i, 32);
                    memcpy(bs, xa->bsums, 32);
                    for (int k = 0; k < 16; k++) msum += (int32_t)bs[k] * mv[k];
                    if (P->kind == KQP_K6) sumf += (dw * dx) * (float)(isum - 32 * msum);
                    else sumf += (dw * dx) * (float)isum - (dm * dx) * (float)msum;
                }
                y[r * ldy + o] = sumf;
            }
        }
}
