/*
 * dispatch.c — run-time ISA selection (CPUID via __builtin_cpu_supports, env KVT_ISA) and the
 * dispatched entry points. Types without a SIMD kernel for the chosen ISA use the scalar reference.
 */
#include "kernels_internal.h"
#include "vec.h"

#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#if KVT_X86
#include <cpuid.h>
#endif

static kq_table g_tab;          /* active table */
static kvt_isa g_isa = KVT_ISA_SCALAR;
static kvt_isa g_best = KVT_ISA_SCALAR;
static bool g_vnni = false; /* AVX-512 VNNI present (selects the VNNI AVX-512 table) */
static bool g_bf16 = false; /* AVX-512 BF16 present (the KVT_TYPE_BF16X kernel, gemm_bf16.c) */
static bool g_vbmi = false; /* AVX-512 VBMI present (the KV cache's 8-bit TURBO codebook lookup) */
static kvt_bf16x_mode g_bf16x_env = KVT_BF16X_LOSSLESS; /* KVT_BF16X: 0 | 1 (default) | round */
static bool g_f16x_env = true;                            /* KVT_F16X: 0 | 1 (default) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if KVT_X86
    __builtin_cpu_init();
    /* F16C via CPUID leaf 1 ECX bit 29 (clang's __builtin_cpu_supports lacks "f16c") */
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    g_vnni = avx512 && __builtin_cpu_supports("avx512vnni");
    g_bf16 = g_vnni && __builtin_cpu_supports("avx512bf16");
    g_vbmi = avx512 && __builtin_cpu_supports("avx512vbmi");
    g_best = avx512 ? KVT_ISA_AVX512 : avx2 ? KVT_ISA_AVX2 : KVT_ISA_SCALAR;
    /* AMX only beside AVX-512 VNNI (its table is the VNNI one) and once the OS granted the tiles */
    if (g_vnni && kq_amx_request()) g_best = KVT_ISA_AMX;
#else
    g_best = KVT_ISA_SCALAR;
    (void)g_vnni;
    (void)g_bf16;
    (void)g_vbmi;
#endif
}

static void fill(kvt_isa isa) {
    memset(&g_tab, 0, sizeof g_tab);
#if KVT_X86
    if (isa == KVT_ISA_AVX2) {
        kq_fill_avx2(&g_tab);
        g_tab.matmul[KVT_TYPE_F16X] = kq_f16x_mm_avx2;
        g_tab.matmul[KVT_TYPE_BF16G] = kq_bf16g_mm_avx2;
    }
    if (isa == KVT_ISA_AVX512 || isa == KVT_ISA_AMX) {
        kq_fill_avx512(&g_tab, g_vnni);
        g_tab.matmul[KVT_TYPE_F16X] = kq_f16x_mm;
        g_tab.matmul[KVT_TYPE_BF16G] = kq_bf16g_mm;
    }
    /* AMX and AVX-512 VNNI: Q8_0/Q4_0/Q5_0 products all take the exact-int32-per-block float order of
     * the AMX and 16-row VNNI GEMMs (decode == full recompute) */
    if (isa == KVT_ISA_AMX || (isa == KVT_ISA_AVX512 && g_vnni)) {
        g_tab.matmul[KVT_TYPE_Q8_0] = kq_amx_mm_q8_0;
        g_tab.matmul[KVT_TYPE_Q4_0] = kq_amx_mm_q4_0;
        g_tab.matmul[KVT_TYPE_Q5_0] = kq_amx_mm_q5_0;
        if (g_bf16) {
            g_tab.matmul[KVT_TYPE_BF16X] = kq_bf16x_mm;
            g_tab.act_quant[KVT_TYPE_BF16] = kq_bf16_act_avx512;
        }
    }
#endif
    g_isa = isa;
    kvt_vec_select(isa); /* the f32 vector ops (vec.c) follow the same ISA */
}

static void init_once(void) {
    kvt_f16_table_init();
    detect();
    const char *bx = getenv("KVT_BF16X");
    if (bx && *bx) {
        if (!strcmp(bx, "0") || !strcasecmp(bx, "off")) g_bf16x_env = KVT_BF16X_OFF;
        else if (!strcasecmp(bx, "round")) g_bf16x_env = KVT_BF16X_ROUND;
        else if (strcmp(bx, "1") != 0) KVT_WARN("KVT_BF16X=%s not recognised (0|1|round); using 1", bx);
    }
    const char *fx = getenv("KVT_F16X");
    if (fx && *fx) {
        if (!strcmp(fx, "0") || !strcasecmp(fx, "off")) g_f16x_env = false;
        else if (strcmp(fx, "1") != 0) KVT_WARN("KVT_F16X=%s not recognised (0|1); using 1", fx);
    }
    kvt_isa isa = g_best;
    const char *e = getenv("KVT_ISA");
    if (e && *e) {
        kvt_isa want = isa;
        if (!strcasecmp(e, "scalar")) want = KVT_ISA_SCALAR;
        else if (!strcasecmp(e, "avx2")) want = KVT_ISA_AVX2;
        else if (!strcasecmp(e, "avx512")) want = KVT_ISA_AVX512;
        else if (!strcasecmp(e, "amx")) want = KVT_ISA_AMX;
        else KVT_WARN("KVT_ISA=%s not recognised (scalar|avx2|avx512|amx); using %s", e, kvt_isa_name(isa));
        if (want > g_best) KVT_WARN("KVT_ISA=%s not supported by this CPU; using %s", e, kvt_isa_name(isa));
        else isa = want;
    }
    fill(isa);
}

void kvt_kernels_init(void) { pthread_once(&g_once, init_once); }

bool kq_has_vnni(void) {
    kvt_kernels_init();
    return g_vnni;
}

bool kq_ilv_fits(int kind) {
    kvt_kernels_init();
    /* AMX and AVX-512 VNNI replace the row-major Q8_0/Q4_0/Q5_0 products with the int8-block order
     * (fill); the GEMV copy's kernel is the template's, so those types keep the row-major path */
    const bool int8_block = g_isa == KVT_ISA_AMX || (g_isa == KVT_ISA_AVX512 && g_vnni);
    /* F16/BF16: the AVX2 tile's 8-lane blocks (512-bit vectors take 16 lanes, another order) */
    if (kind == KQP_F) return g_isa == KVT_ISA_AVX2;
    return g_tab.gemv_ilv != NULL && !(kind == KQP_SMALL_S && int8_block);
}

bool kvt_kernels_has_vbmi(void) {
    kvt_kernels_init();
    return g_vbmi;
}

kvt_bf16x_mode kvt_bf16x_policy(void) {
    kvt_kernels_init();
    return g_tab.matmul[KVT_TYPE_BF16X] != NULL ? g_bf16x_env : KVT_BF16X_OFF;
}

bool kvt_f16x_enabled(void) {
    kvt_kernels_init();
    return g_tab.matmul[KVT_TYPE_F16X] != NULL && g_f16x_env;
}

kvt_isa kvt_kernels_best_isa(void) {
    kvt_kernels_init();
    return g_best;
}
kvt_isa kvt_kernels_isa(void) {
    kvt_kernels_init();
    return g_isa;
}
bool kvt_kernels_force_isa(kvt_isa isa) {
    kvt_kernels_init();
    if (isa > g_best || isa < KVT_ISA_SCALAR) return false;
    fill(isa);
    return true;
}
const char *kvt_isa_name(kvt_isa isa) {
    switch (isa) {
    case KVT_ISA_SCALAR: return "scalar";
    case KVT_ISA_AVX2: return "avx2";
    case KVT_ISA_AVX512: return "avx512";
    case KVT_ISA_AMX: return "amx";
    default: return "?";
    }
}

const char *kvt_kernels_numerics_id(void) {
    kvt_kernels_init();
    switch (g_isa) {
    case KVT_ISA_AVX2: return "avx2";
    /* kq_fill_avx512 falls back to the AVX2 table without VNNI: same results as avx2 */
    /* AVX-512 VNNI and AMX: the same arithmetic (K-quant and Q4_1/Q5_1 kernels shared; every
     * Q8_0/Q4_0/Q5_0 product an exact int32 per block, then fma(isum, dw·dx, acc) in block order) */
    case KVT_ISA_AVX512: return g_vnni ? "int8-block" : "avx2";
    case KVT_ISA_AMX: return "int8-block";
    default: return "scalar";
    }
}

void kvt_dequant_row(uint32_t t, const void *src, float *dst, int64_t n) {
    kvt_kernels_init();
    if (t < KVT_TYPE_COUNT && g_tab.dequant[t]) {
        const uint32_t be = kvt_type_block_elems(t);
        if (be == 0 || n <= 0 || n % be) return;
        g_tab.dequant[t](src, dst, n);
        return;
    }
    kvt_dequant_ref(t, src, dst, n);
}

void kvt_matmul_rows(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows,
                     float *y, int64_t ldy, int64_t o0, int64_t o1) {
    kvt_kernels_init();
    if (o1 <= o0 || n_rows <= 0) return;
    if (wtype < KVT_TYPE_COUNT && g_tab.matmul[wtype] && kvt_type_row_bytes(wtype, (uint64_t)n_in)) {
        g_tab.matmul[wtype](W, n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    kvt_matmul_rows_ref(wtype, W, n_in, act, n_rows, y, ldy, o0, o1);
}

void kvt_matmul_packed(const kvt_packed *p, const void *act, int64_t n_rows, float *y, int64_t ldy, int64_t o0,
                       int64_t o1) {
    kvt_kernels_init();
    if (!p || o1 <= o0 || n_rows <= 0 || o0 < 0 || o1 > p->n_out) return;
#if KVT_X86
    if (n_rows == 1 && g_isa == KVT_ISA_AVX512 && g_vnni && p->type == KVT_TYPE_Q8_0 && p->s16) {
        /* decode from the 16-row layout (gemm_s16.c): 1.2-1.5x the row-major kernel's tok/s on a
         * Zen 5 (bench/results/zen5-2026-12-05.md); Q4_0 and Q5_0 have nibble layouts (below) */
        kq_s16_gemv(p, act, y, o0, o1);
        return;
    }
    if (n_rows <= N16_MAX_ROWS && p->n16 && ((g_isa == KVT_ISA_AVX512 && g_vnni) || g_isa == KVT_ISA_AMX)) {
        /* decode and small batched steps from the nibble layouts: the GEMM layouts hold 2.2x
         * (K-quants, gemm_k16.c), 2x (Q4_0) and 1.6x (Q5_0, gemm_s16.c) their bytes, the 4-row
         * tiles of Q4_1/Q5_1 2x and 1.7x */
        if (p->type == KVT_TYPE_Q4_0 || p->type == KVT_TYPE_Q5_0) kq_n16_s_mm(p, act, n_rows, y, ldy, o0, o1);
        else if (p->kind == KQP_SMALL_U) kq_n16_u_mm(p, act, n_rows, y, ldy, o0, o1);
        else kq_n16_mm(p, act, n_rows, y, ldy, o0, o1);
        return;
    }
#endif
    if (n_rows == 1) { /* decode GEMV: whole 4-row groups from the interleaved copy, the rest (and
                        * everything without the copy) from the original rows, not the tiles */
        int64_t e = o0;
        if (p->ilv && o0 % 4 == 0 && kq_ilv_fits(p->kind)) {
            const int64_t end = o1 < (p->n_out & ~(int64_t)3) ? o1 : (p->n_out & ~(int64_t)3);
            e = end > o0 ? o0 + ((end - o0) & ~(int64_t)3) : o0;
            if (e > o0) g_tab.gemv_ilv(p, act, y, o0, e);
        }
        if (e < o1) kvt_matmul_rows(p->type, p->W, p->n_in, act, n_rows, y, ldy, e, o1);
        return;
    }
#if KVT_X86
    if (g_isa == KVT_ISA_AMX && p->kind == KQP_SMALL_S) {
        /* tiles from KVT_AMX_MIN_ROWS rows on; fewer (or no AMX layout): the row-major kernel with the
         * same arithmetic */
        if (p->amx && n_rows >= KVT_AMX_MIN_ROWS) kq_amx_pmm_small_s(p, act, n_rows, y, ldy, o0, o1);
        else kvt_matmul_rows(p->type, p->W, p->n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    if (g_isa == KVT_ISA_AVX512 && g_vnni && p->kind == KQP_SMALL_S) {
        if (p->s16) kq_s16_pmm(p, act, n_rows, y, ldy, o0, o1);
        else kvt_matmul_rows(p->type, p->W, p->n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    if (p->k16 && !p->data) { /* K-quants packed 16 rows a group (gemm_k16.c); another ISA: the row-major kernel */
        if ((g_isa == KVT_ISA_AVX512 && g_vnni) || g_isa == KVT_ISA_AMX) kq_k16_pmm(p, act, n_rows, y, ldy, o0, o1);
        else kvt_matmul_rows(p->type, p->W, p->n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
#endif
    /* a layout built for another ISA (forced after creation): the row-major path, same results */
    if (p->kind < KQP_KINDS && g_tab.pmatmul[p->kind] && p->data) {
        g_tab.pmatmul[p->kind](p, act, n_rows, y, ldy, o0, o1);
        return;
    }
    /* no packed kernel for this ISA (scalar): the row-major path on the original rows */
    kvt_matmul_rows(p->type, p->W, p->n_in, act, n_rows, y, ldy, o0, o1);
}

void kvt_act_quantize(uint32_t wtype, const float *x, int64_t n_in, int64_t r0, int64_t r1, void *buf) {
    kvt_kernels_init();
    const uint32_t vt = kvt_vec_dot_type(wtype);
    const size_t rb = (size_t)kvt_type_row_bytes(vt, (uint64_t)n_in);
    if (rb == 0 || n_in <= 0) return;
    for (int64_t r = r0; r < r1; r++) {
        void *dst = (uint8_t *)buf + (size_t)r * rb;
        if (g_tab.act_quant[vt]) g_tab.act_quant[vt](x + r * n_in, dst, n_in);
        else kvt_act_quantize_ref(vt, x + r * n_in, dst, n_in);
    }
}

float kvt_dot_f32(const float *a, const float *b, int64_t n) {
    kvt_kernels_init();
    return g_tab.dot_f32 ? g_tab.dot_f32(a, b, n) : kq_dot_f32_ref(a, b, n);
}
void kvt_axpy_f32(float *y, float a, const float *x, int64_t n) {
    kvt_kernels_init();
    if (g_tab.axpy_f32) g_tab.axpy_f32(y, a, x, n);
    else kq_axpy_f32_ref(y, a, x, n);
}
