/*
 * quant_ref.c — type table, scalar reference dequantization / quantization, activation quantization
 * and the scalar reference dot products (kvt_matmul_rows_ref).
 *
 * Numerics of the reference dots (the SIMD kernels follow the same per-block structure):
 *   small-block types: per block an exact integer dot isum, then sumf += (dw*dx)*(float)isum
 *   (Q4_1/Q5_1 add mw*sx), blocks in order.
 *   K-quants: per super-block an exact integer sum over sub-blocks (scales applied in integer), then
 *   sumf += (dw*dx)*(float)isum - (dmin*dx)*(float)msum, super-blocks in order. The SIMD K-quant
 *   kernels compute the same integers and the same float expression, so they match the reference
 *   bit for bit.
 *   F32/F16/BF16: plain sequential float sum (the SIMD versions use lane-parallel sums).
 */
#include "kernels_internal.h"

#include <math.h>
#include <stdlib.h>

/* No FMA contraction: the SIMD K-quant kernels reproduce these float expressions exactly (gcc in
 * -std=c11 mode does not contract; clang needs the pragma). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

typedef struct {
    const char *name;
    uint32_t blck;
    uint32_t bytes;
} type_info;

static const type_info g_types[KVT_TYPE_COUNT] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    [KVT_TYPE_BF16X] = {"bf16x", 2, 4}, /* internal: a pair is the unit (gemm_bf16.c) */
    [KVT_TYPE_F16X] = {"f16x", 1, 2},   /* internal: 16-output groups (gemm_f16x.c) */
    [KVT_TYPE_BF16G] = {"bf16g", 1, 2}, /* internal: 16-output groups (gemm_f16x.c) */
};

/* has a table entry (ggml's ids and the internal BF16X, F16X, BF16G) */
static bool type_has_info(uint32_t t) { return t < KVT_TYPE_COUNT && g_types[t].name != NULL; }
bool kvt_type_known(uint32_t t) {
    return type_has_info(t) && t != KVT_TYPE_BF16X && t != KVT_TYPE_F16X && t != KVT_TYPE_BF16G;
}

bool kvt_type_supported(uint32_t t) {
    switch (t) {
    case KVT_TYPE_F32: case KVT_TYPE_F16: case KVT_TYPE_BF16: case KVT_TYPE_Q8_0: case KVT_TYPE_Q4_0:
    case KVT_TYPE_Q4_1: case KVT_TYPE_Q5_0: case KVT_TYPE_Q5_1: case KVT_TYPE_Q4_K: case KVT_TYPE_Q5_K:
    case KVT_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

const char *kvt_type_name(uint32_t t) { return type_has_info(t) ? g_types[t].name : "?"; }

int kvt_type_from_name(const char *name) {
    if (!name) return -1;
    for (uint32_t t = 0; t < KVT_TYPE_COUNT; t++) {
        if (!kvt_type_known(t)) continue;
        /* K-quant names are matched case-insensitively on the suffix ("q4_k" == "q4_K") */
        const char *a = g_types[t].name, *b = name;
        while (*a && *b) {
            char ca = *a, cb = *b;
            if (ca >= 'A' && ca <= 'Z') ca = (char)(ca - 'A' + 'a');
            if (cb >= 'A' && cb <= 'Z') cb = (char)(cb - 'A' + 'a');
            if (ca != cb) break;
            a++, b++;
        }
        if (!*a && !*b) return (int)t;
    }
    return -1;
}

uint32_t kvt_type_block_elems(uint32_t t) { return type_has_info(t) ? g_types[t].blck : 0; }
uint32_t kvt_type_block_bytes(uint32_t t) { return type_has_info(t) ? g_types[t].bytes : 0; }

uint64_t kvt_type_row_bytes(uint32_t t, uint64_t n) {
    if (!type_has_info(t)) return 0;
    uint64_t b = g_types[t].blck;
    if (n % b) return 0;
    uint64_t out;
    if (!kvt_mul_ok(n / b, g_types[t].bytes, &out)) return 0;
    return out;
}

/* ======================= dequantization ======================= */

static void deq_q8_0(const blk_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d);
        for (int j = 0; j < 32; j++) y[i * 32 + j] = d * (float)x[i].qs[j];
    }
}
static void deq_q4_0(const blk_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[i * 32 + j] = d * (float)((x[i].qs[j] & 0xF) - 8);
            y[i * 32 + j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}
static void deq_q4_1(const blk_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d), m = kq_h2f(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[i * 32 + j] = d * (float)(x[i].qs[j] & 0xF) + m;
            y[i * 32 + j + 16] = d * (float)(x[i].qs[j] >> 4) + m;
        }
    }
}
static inline uint32_t rd_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void deq_q5_0(const blk_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d);
        const uint32_t qh = rd_u32le(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (x[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[i * 32 + j] = d * (float)(q0 - 16);
            y[i * 32 + j + 16] = d * (float)(q1 - 16);
        }
    }
}
static void deq_q5_1(const blk_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d), m = kq_h2f(x[i].m);
        const uint32_t qh = rd_u32le(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (x[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int q1 = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[i * 32 + j] = d * (float)q0 + m;
            y[i * 32 + j + 16] = d * (float)q1 + m;
        }
    }
}
static void deq_q4_K(const blk_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d), dmin = kq_h2f(x[i].dmin);
        const uint8_t *q = x[i].qs;
        float *out = y + i * QK_K;
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            kq_scale_min_k4(2 * c, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kq_scale_min_k4(2 * c + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) out[64 * c + l] = d1 * (float)(q[32 * c + l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) out[64 * c + 32 + l] = d2 * (float)(q[32 * c + l] >> 4) - m2;
        }
    }
}
static void deq_q5_K(const blk_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d), dmin = kq_h2f(x[i].dmin);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        float *out = y + i * QK_K;
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            kq_scale_min_k4(2 * c, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kq_scale_min_k4(2 * c + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q0 = (q[32 * c + l] & 0xF) + (((qh[l] >> (2 * c)) & 1) ? 16 : 0);
                int q1 = (q[32 * c + l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) ? 16 : 0);
                out[64 * c + l] = d1 * (float)q0 - m1;
                out[64 * c + 32 + l] = d2 * (float)q1 - m2;
            }
        }
    }
}
static void deq_q6_K(const blk_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = kq_h2f(x[i].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sc = x[i].scales + 8 * h;
            float *out = y + i * QK_K + 128 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * (float)sc[is + 0] * (float)q1;
                out[l + 32] = d * (float)sc[is + 2] * (float)q2;
                out[l + 64] = d * (float)sc[is + 4] * (float)q3;
                out[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void kvt_dequant_ref(uint32_t t, const void *src, float *dst, int64_t n) {
    kvt_f16_table_init();
    const uint32_t be = kvt_type_block_elems(t);
    if (be == 0 || n <= 0 || n % be) return;
    const int64_t nb = n / be;
    switch (t) {
    case KVT_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KVT_TYPE_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = kq_h2f(h[i]);
        break;
    }
    case KVT_TYPE_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = kvt_bf16_to_f32(h[i]);
        break;
    }
    case KVT_TYPE_Q8_0: deq_q8_0(src, dst, nb); break;
    case KVT_TYPE_Q4_0: deq_q4_0(src, dst, nb); break;
    case KVT_TYPE_Q4_1: deq_q4_1(src, dst, nb); break;
    case KVT_TYPE_Q5_0: deq_q5_0(src, dst, nb); break;
    case KVT_TYPE_Q5_1: deq_q5_1(src, dst, nb); break;
    case KVT_TYPE_Q4_K: deq_q4_K(src, dst, nb); break;
    case KVT_TYPE_Q5_K: deq_q5_K(src, dst, nb); break;
    case KVT_TYPE_Q6_K: deq_q6_K(src, dst, nb); break;
    case KVT_TYPE_Q8_K: {
        const blk_q8_K *x = src;
        for (int64_t i = 0; i < nb; i++)
            for (int j = 0; j < QK_K; j++) dst[i * QK_K + j] = x[i].d * (float)x[i].qs[j];
        break;
    }
    case KVT_TYPE_Q8_1: {
        const blk_q8_1 *x = src;
        for (int64_t i = 0; i < nb; i++) {
            const float d = kq_h2f(x[i].d);
            for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)x[i].qs[j];
        }
        break;
    }
    default: memset(dst, 0, (size_t)n * sizeof(float)); break; /* unsupported: callers check first */
    }
}

/* ======================= quantization (reference) ======================= */

static inline int nearest_int(float f) { return (int)lrintf(f); }

static void quant_q8_0(const float *x, blk_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i * 32 + j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kvt_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[i * 32 + j] * id);
    }
}
static void quant_q8_1(const float *x, blk_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i * 32 + j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t)roundf(x[i * 32 + j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = kvt_f32_to_f16(d);
        y[i].s = kvt_f32_to_f16((float)sum * d);
    }
}
/* signed value of largest magnitude, and min/max */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}
static void quant_q4_0(const float *x, blk_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * 32;
        const float max = signed_absmax(v, 32), d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kvt_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)(v[j] * id + 8.5f), q1 = (int)(int8_t)(v[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
static void quant_q4_1(const float *x, blk_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * 32;
        float mn = v[0], mx = v[0];
        for (int j = 1; j < 32; j++) mn = fminf(mn, v[j]), mx = fmaxf(mx, v[j]);
        const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kvt_f32_to_f16(d);
        y[i].m = kvt_f32_to_f16(mn);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)((v[j] - mn) * id + 0.5f), q1 = (int)(int8_t)((v[j + 16] - mn) * id + 0.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
static void quant_q5_0(const float *x, blk_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * 32;
        const float max = signed_absmax(v, 32), d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kvt_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)(v[j] * id + 16.5f), q1 = (int)(int8_t)(v[j + 16] * id + 16.5f);
            q0 = q0 > 31 ? 31 : q0;
            q1 = q1 > 31 ? 31 : q1;
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}
static void quant_q5_1(const float *x, blk_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * 32;
        float mn = v[0], mx = v[0];
        for (int j = 1; j < 32; j++) mn = fminf(mn, v[j]), mx = fmaxf(mx, v[j]);
        const float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kvt_f32_to_f16(d);
        y[i].m = kvt_f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)((v[j] - mn) * id + 0.5f), q1 = (int)(int8_t)((v[j + 16] - mn) * id + 0.5f);
            q0 = q0 > 31 ? 31 : q0;
            q1 = q1 > 31 ? 31 : q1;
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Q4_K / Q5_K: per 32-value sub-block an affine map x ≈ s*q - mn with mn = -min(0, min x) ≥ 0 and
 * s = (max - min)/qmax; the 8 scales and mins are then quantized to 6 bits against d and dmin
 * (stored f16), and q is recomputed with the quantized (d*sc, dmin*m). Simple, not ggml's
 * error-minimizing search, but always produces valid blocks. */
static void quant_k_affine(const float *v, int qmax, uint16_t *d_out, uint16_t *dmin_out,
                           uint8_t scales[12], uint8_t q[256]) {
    float sub_max[8], sub_min[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float mn = 0.0f, mx = 0.0f;
        for (int l = 0; l < 32; l++) mn = fminf(mn, v[32 * j + l]), mx = fmaxf(mx, v[32 * j + l]);
        sub_max[j] = mx;
        sub_min[j] = -mn;
        max_scale = fmaxf(max_scale, (mx - mn) / (float)qmax);
        max_min = fmaxf(max_min, -mn);
    }
    const uint16_t dh = kvt_f32_to_f16(max_scale / 63.0f), mh = kvt_f32_to_f16(max_min / 63.0f);
    const float d = kvt_f16_to_f32(dh), dmin = kvt_f16_to_f32(mh);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        /* round the min up (so x + dmin*m >= 0), then the scale up so the top value fits */
        int mm = dmin > 0.0f ? (int)ceilf(sub_min[j] / dmin) : 0;
        mm = mm < 0 ? 0 : mm > 63 ? 63 : mm;
        const float top = (sub_max[j] + dmin * (float)mm) / (float)qmax;
        int s = d > 0.0f ? (int)ceilf(top / d) : 0;
        sc[j] = (uint8_t)(s < 0 ? 0 : s > 63 ? 63 : s);
        m[j] = (uint8_t)mm;
    }
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scales[j] |= sc[j] & 63;
            scales[j + 4] |= m[j] & 63;
        } else {
            scales[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            scales[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {
        const float ds = d * (float)sc[j], dm = dmin * (float)m[j];
        for (int l = 0; l < 32; l++) {
            int qq = ds > 0.0f ? nearest_int((v[32 * j + l] + dm) / ds) : 0;
            q[32 * j + l] = (uint8_t)(qq < 0 ? 0 : qq > qmax ? qmax : qq);
        }
    }
    *d_out = dh;
    *dmin_out = mh;
}
static void quant_q4_K(const float *x, blk_q4_K *y, int64_t nb) {
    uint8_t q[256];
    for (int64_t i = 0; i < nb; i++) {
        quant_k_affine(x + i * QK_K, 15, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}
static void quant_q5_K(const float *x, blk_q5_K *y, int64_t nb) {
    uint8_t q[256];
    for (int64_t i = 0; i < nb; i++) {
        quant_k_affine(x + i * QK_K, 31, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((q0 >> 4) & 1) << (2 * c));
                y[i].qh[l] |= (uint8_t)(((q1 >> 4) & 1) << (2 * c + 1));
            }
        }
    }
}
/* Q6_K: per 16-value sub-block scale = max/-32 (q in [-32, 31]), scales quantized to int8 against
 * d = max|scale|/127, then q recomputed with the quantized d*sc. */
static void quant_q6_K(const float *x, blk_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * QK_K;
        float sub[16], amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            sub[j] = signed_absmax(v + 16 * j, 16) / -32.0f;
            amax = fmaxf(amax, fabsf(sub[j]));
        }
        const uint16_t dh = kvt_f32_to_f16(amax / 127.0f);
        const float d = kvt_f16_to_f32(dh);
        uint8_t q[256];
        for (int j = 0; j < 16; j++) {
            int s = d > 0.0f ? nearest_int(sub[j] / d) : 0;
            s = s < -127 ? -127 : s > 127 ? 127 : s;
            y[i].scales[j] = (int8_t)s;
            const float ds = d * (float)s;
            for (int l = 0; l < 16; l++) {
                int qq = ds != 0.0f ? nearest_int(v[16 * j + l] / ds) : 0;
                qq = qq < -32 ? -32 : qq > 31 ? 31 : qq;
                q[16 * j + l] = (uint8_t)(qq + 32);
            }
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
                y[i].ql[64 * h + l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                y[i].ql[64 * h + l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                y[i].qh[32 * h + l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
        y[i].d = dh;
    }
}
/* Q8_K (activations): d = max/-127 with max the signed value of largest magnitude, f32 d. */
static void quant_q8_K(const float *x, blk_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float *v = x + i * QK_K;
        const float max = signed_absmax(v, QK_K);
        if (max == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int q = nearest_int(iscale * v[j]);
            y[i].qs[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

void kvt_quantize_ref(uint32_t t, const float *src, void *dst, int64_t n) {
    kvt_f16_table_init();
    const uint32_t be = kvt_type_block_elems(t);
    if (be == 0 || n <= 0 || n % be) return;
    const int64_t nb = n / be;
    switch (t) {
    case KVT_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KVT_TYPE_F16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = kvt_f32_to_f16(src[i]);
        break;
    }
    case KVT_TYPE_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = kvt_f32_to_bf16(src[i]);
        break;
    }
    case KVT_TYPE_Q8_0: quant_q8_0(src, dst, nb); break;
    case KVT_TYPE_Q8_1: quant_q8_1(src, dst, nb); break;
    case KVT_TYPE_Q4_0: quant_q4_0(src, dst, nb); break;
    case KVT_TYPE_Q4_1: quant_q4_1(src, dst, nb); break;
    case KVT_TYPE_Q5_0: quant_q5_0(src, dst, nb); break;
    case KVT_TYPE_Q5_1: quant_q5_1(src, dst, nb); break;
    case KVT_TYPE_Q4_K: quant_q4_K(src, dst, nb); break;
    case KVT_TYPE_Q5_K: quant_q5_K(src, dst, nb); break;
    case KVT_TYPE_Q6_K: quant_q6_K(src, dst, nb); break;
    case KVT_TYPE_Q8_K: quant_q8_K(src, dst, nb); break;
    default: memset(dst, 0, (size_t)kvt_type_row_bytes(t, (uint64_t)n)); break;
    }
}

/* ======================= activations ======================= */

uint32_t kvt_vec_dot_type(uint32_t wtype) {
    switch (wtype) {
    case KVT_TYPE_Q4_0: case KVT_TYPE_Q5_0: case KVT_TYPE_Q8_0: return KVT_TYPE_Q8_0;
    case KVT_TYPE_Q4_1: case KVT_TYPE_Q5_1: return KVT_TYPE_Q8_1;
    case KVT_TYPE_Q4_K: case KVT_TYPE_Q5_K: case KVT_TYPE_Q6_K: return KVT_TYPE_Q8_K;
    case KVT_TYPE_BF16X: return KVT_TYPE_BF16; /* activations rounded to bf16 (gemm_bf16.c) */
    default: return KVT_TYPE_F32; /* F32, F16, BF16, F16X and BF16G (activations stay f32) */
    }
}

size_t kvt_act_bytes(uint32_t wtype, int64_t n_in, int64_t n_rows) {
    if (n_in <= 0 || n_rows <= 0) return 0;
    return (size_t)kvt_type_row_bytes(kvt_vec_dot_type(wtype), (uint64_t)n_in) * (size_t)n_rows;
}

/* Activation quantization (kvt_act_quantize; its SIMD versions write the same bytes). Q8_0/Q8_1 round
 * as ggml's CPU quantizer does at run time (quantize_row_q8_0/q8_1, not their _ref twins, which
 * kvt_quantize_ref keeps for weight files): id = 127/amax rather than 1/d, and x·id rounded to the
 * nearest integer with ties to even rather than away from zero. d = amax/127 and s = d·Σq as before.
 * An id that is not finite (amax below ~3.7e-37) is taken as 0. Other types: kvt_quantize_ref. */
static void act_q8(const float *x, uint8_t *out, int64_t nb, bool with_sum) {
    const size_t bb = with_sum ? 36 : 34, qo = with_sum ? 4 : 2;
    for (int64_t i = 0; i < nb; i++, x += 32, out += bb) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        if (!isfinite(id)) id = 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            const int q = (int)lrintf(x[j] * id); /* |x·id| <= 127 (to within an ulp) */
            out[qo + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        const uint16_t dh = kvt_f32_to_f16(d);
        memcpy(out, &dh, 2);
        if (with_sum) {
            const uint16_t sh = kvt_f32_to_f16((float)sum * d);
            memcpy(out + 2, &sh, 2);
        }
    }
}

void kvt_act_quantize_ref(uint32_t t, const float *src, void *dst, int64_t n) {
    kvt_f16_table_init();
    if ((t == KVT_TYPE_Q8_0 || t == KVT_TYPE_Q8_1) && n > 0 && n % 32 == 0) {
        act_q8(src, dst, n / 32, t == KVT_TYPE_Q8_1);
        return;
    }
    kvt_quantize_ref(t, src, dst, n);
}

/* ======================= scalar reference dots ======================= */

float kq_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
void kq_axpy_f32_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static float vdot_ref(uint32_t t, const void *w, const void *a, int64_t n) {
    switch (t) {
    case KVT_TYPE_F32: return kq_dot_f32_ref(w, a, n);
    case KVT_TYPE_F16: {
        const uint16_t *h = w;
        const float *x = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += kq_h2f(h[i]) * x[i];
        return s;
    }
    case KVT_TYPE_BF16: {
        const uint16_t *h = w;
        const float *x = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += kvt_bf16_to_f32(h[i]) * x[i];
        return s;
    }
    case KVT_TYPE_Q8_0: {
        const blk_q8_0 *x = w, *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            int isum = 0;
            for (int j = 0; j < 32; j++) isum += x[i].qs[j] * y[i].qs[j];
            s += (kq_h2f(x[i].d) * kq_h2f(y[i].d)) * (float)isum;
        }
        return s;
    }
    case KVT_TYPE_Q4_0: {
        const blk_q4_0 *x = w;
        const blk_q8_0 *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
            s += (kq_h2f(x[i].d) * kq_h2f(y[i].d)) * (float)isum;
        }
        return s;
    }
    case KVT_TYPE_Q5_0: {
        const blk_q5_0 *x = w;
        const blk_q8_0 *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            const uint32_t qh = rd_u32le(x[i].qh);
            int isum = 0;
            for (int j = 0; j < 16; j++) {
                int q0 = ((x[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
                int q1 = ((x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
                isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
            }
            s += (kq_h2f(x[i].d) * kq_h2f(y[i].d)) * (float)isum;
        }
        return s;
    }
    case KVT_TYPE_Q4_1: {
        const blk_q4_1 *x = w;
        const blk_q8_1 *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
            s += (kq_h2f(x[i].d) * kq_h2f(y[i].d)) * (float)isum + kq_h2f(x[i].m) * kq_h2f(y[i].s);
        }
        return s;
    }
    case KVT_TYPE_Q5_1: {
        const blk_q5_1 *x = w;
        const blk_q8_1 *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            const uint32_t qh = rd_u32le(x[i].qh);
            int isum = 0;
            for (int j = 0; j < 16; j++) {
                int q0 = (x[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
                int q1 = (x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
            }
            s += (kq_h2f(x[i].d) * kq_h2f(y[i].d)) * (float)isum + kq_h2f(x[i].m) * kq_h2f(y[i].s);
        }
        return s;
    }
    case KVT_TYPE_Q4_K:
    case KVT_TYPE_Q5_K: {
        const blk_q8_K *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / QK_K; i++) {
            const uint8_t *scales, *qs, *qh = NULL;
            uint16_t dh, mh;
            if (t == KVT_TYPE_Q4_K) {
                const blk_q4_K *x = (const blk_q4_K *)w + i;
                scales = x->scales, qs = x->qs, dh = x->d, mh = x->dmin;
            } else {
                const blk_q5_K *x = (const blk_q5_K *)w + i;
                scales = x->scales, qs = x->qs, qh = x->qh, dh = x->d, mh = x->dmin;
            }
            int32_t isum = 0, msum = 0;
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                kq_scale_min_k4(j, scales, &sc, &m);
                const int c = j / 2, hi = j & 1;
                int32_t dot = 0;
                for (int l = 0; l < 32; l++) {
                    int q = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
                    if (qh) q |= ((qh[l] >> j) & 1) << 4;
                    dot += q * y[i].qs[32 * j + l];
                }
                isum += (int32_t)sc * dot;
                msum += (int32_t)m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
            }
            s += (kq_h2f(dh) * y[i].d) * (float)isum - (kq_h2f(mh) * y[i].d) * (float)msum;
        }
        return s;
    }
    case KVT_TYPE_Q6_K: {
        const blk_q6_K *x = w;
        const blk_q8_K *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n / QK_K; i++) {
            int8_t q[QK_K];
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
                for (int l = 0; l < 32; l++) {
                    q[128 * h + l] = (int8_t)((int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    q[128 * h + l + 32] = (int8_t)((int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    q[128 * h + l + 64] = (int8_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    q[128 * h + l + 96] = (int8_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
            int32_t isum = 0;
            for (int j = 0; j < 16; j++) {
                int32_t dot = 0;
                for (int l = 0; l < 16; l++) dot += q[16 * j + l] * y[i].qs[16 * j + l];
                isum += (int32_t)x[i].scales[j] * dot;
            }
            s += (kq_h2f(x[i].d) * y[i].d) * (float)isum;
        }
        return s;
    }
    default: return 0.0f;
    }
}

void kvt_matmul_rows_ref(uint32_t wtype, const void *W, int64_t n_in, const void *act, int64_t n_rows,
                         float *y, int64_t ldy, int64_t o0, int64_t o1) {
    kvt_f16_table_init();
    if (wtype == KVT_TYPE_BF16X) { /* interleaved rows: not a per-row dot */
        kq_bf16x_ref(W, n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    if (wtype == KVT_TYPE_F16X || wtype == KVT_TYPE_BF16G) { /* 16-output groups: not a per-row dot */
        kq_f16x_ref(wtype, W, n_in, act, n_rows, y, ldy, o0, o1);
        return;
    }
    const size_t wrb = (size_t)kvt_type_row_bytes(wtype, (uint64_t)n_in);
    const size_t arb = (size_t)kvt_type_row_bytes(kvt_vec_dot_type(wtype), (uint64_t)n_in);
    if (wrb == 0 || arb == 0) return;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t o = o0; o < o1; o++)
            y[r * ldy + o] = vdot_ref(wtype, (const uint8_t *)W + (size_t)o * wrb,
                                      (const uint8_t *)act + (size_t)r * arb, n_in);
}
