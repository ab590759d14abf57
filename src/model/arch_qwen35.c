/*
 * arch_qwen35.c — the qwen35 architecture (Qwen3.5 dense): gated DeltaNet layers (recurrent state,
 * deltanet.h) interleaved with gated full-attention layers (block KV, kv.h). Loading, layer
 * descriptors and the CPU forward pass; the math is the reference README's:
 *   every layer  h += Mixer(RMSNorm(h; attn_norm)); h += FFN(RMSNorm(h; post_attention_norm))
 *   attention    [q|gate] per head, q/k RMSNorm per head, NEOX rope on n_rot dims (imrope sections),
 *                causal GQA attention, o *= sigmoid(gate), attn_output
 *   DeltaNet     u = attn_qkv x -> causal conv + silu -> q,k (L2-normalized), v; beta = sigmoid(b),
 *                g = softplus(a + dt) * ssm_a; gated delta rule; RMSNorm(o; ssm_norm) * silu(z); ssm_out
 * Layer il is attention iff (il + 1) % full_attention_interval == 0.
 *
 * Threads: one kvt_threadpool_run per ubatch chunk, ops separated by barriers; row ops split rows,
 * matmuls split output columns, the DeltaNet core (conv, q/k norms, delta rule, gated norm) splits
 * v heads (channels/rows/heads in turn when H_v != H_k) and attention splits query heads. Every
 * token's result depends only on its row and on state/KV of earlier positions (deltanet.h), so any
 * chunking or thread count gives the same bits.
 *
 * Two modes for the residual stream, the same per-row math (so the same bits), as model.c's dense
 * pass:
 *  - split (chunks of more than Q35_REPL_ROWS rows, or one thread): the shared x/xn, row ops on
 *    each thread's rows, activations quantized into the shared buffers; a barrier before every
 *    matmul.
 *  - replicated (decode: up to Q35_REPL_ROWS rows, several threads): every thread keeps its own
 *    x/xn and quantizes every row's activations into its own buffers, so a matmul starts with no
 *    barrier before it, and the FFN's gated activation runs on each thread's own gate/up columns:
 *    5 barriers a DeltaNet layer (H_v == H_k) instead of 12, 6 an attention layer instead of 15.
 * A shared buffer written by a matmul or the DeltaNet core (big, z, bb, ba, o, tmp, ff_g/ff_u) is
 * read by other threads only after the barrier that follows the write, and written again only
 * after a later barrier.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/quant.h"
#include "deltanet.h"
#include "model_int.h"

#define Q35_MAX_MM 4    /* matrices sharing one input */
#define Q35_REPL_ROWS 16 /* chunks up to this many rows run replicated (decode; see the top) */

typedef struct q35_layer {
    bool attn;
    const float *attn_norm, *ffn_norm;
    kvt_wmat gate, up, down;
    /* attention layers */
    kvt_wmat wq, wk, wv, wo; /* wq: [q_h | gate_h] per head */
    const float *q_norm, *k_norm;
    /* DeltaNet layers */
    kvt_wmat wqkv, wz, wbeta, walpha, wout;
    const float *conv_w; /* [K][conv_dim] (tap-major), owned by kvt_q35 */
    const float *dt_bias, *ssm_a, *ssm_norm;
} q35_layer;

typedef struct kvt_q35 {
    kvt_dn_dims dn;
    uint32_t interval;
    q35_layer *layers;
    float *conv_store; /* owned conv weights of every DeltaNet layer */
    double *inv_freq;  /* n_rot/2; 0 for pairs whose imrope section is the (unused) e axis */
    const kvt_model *m;
} kvt_q35;

typedef struct kvt_q35_ctx {
    const kvt_model *m;
    const kvt_q35 *q;
    kvt_dn_impl impl;
    uint32_t ubatch;
    float *x, *xn, *tmp, *big, *conv, *z, *ba, *bb, *o, *qa, *gt, *ff_g, *ff_u, *rope_cs;
    void *act[Q35_MAX_MM];
    /* replicated mode: per thread (n_tb of them, NULL with one thread) its residual stream, normed
     * rows and activations for Q35_REPL_ROWS rows */
    struct q35_tbuf {
        float *x, *xn;
        void *act[Q35_MAX_MM];
    } *tb;
    int n_tb;
    /* per chunk */
    kvt_seq *seq;
    const int32_t *tokens;
    uint32_t n, pos0;
    bool all_logits;
    float *logits;
    float *const *att_scratch;
    kvt_threadpool *tp;
} kvt_q35_ctx;

/* ------------------------------------------------------------------ loading */

static bool layer_is_attn(const kvt_q35 *q, uint32_t il) { return (il + 1) % q->interval == 0; }

/* Every matrix of a layer (each gets a repacked prefill copy). */
static int layer_mats(q35_layer *w, kvt_wmat **out) {
    int n = 0;
    kvt_wmat *all[] = {&w->gate, &w->up, &w->down, &w->wq, &w->wk, &w->wv, &w->wo,
                       &w->wqkv, &w->wz, &w->wbeta, &w->walpha, &w->wout};
    for (size_t i = 0; i < KVT_ARRAY_LEN(all); i++)
        if (all[i]->data) out[n++] = all[i];
    return n;
}

static void q35_free(void *state) {
    kvt_q35 *q = state;
    if (!q) return;
    for (uint32_t il = 0; q->layers && q->m && il < kvt_model_hparams(q->m)->n_layer; il++) {
        kvt_wmat *ws[12];
        const int nw = layer_mats(&q->layers[il], ws);
        for (int i = 0; i < nw; i++) kvt_wmat_release(ws[i]);
    }
    free(q->layers);
    free(q->conv_store);
    free(q->inv_freq);
    free(q);
}

static kvt_status get_key(const kvt_gguf *g, const char *suffix, bool required, uint32_t def, uint32_t lo,
                          uint32_t hi, uint32_t *out, char *err, size_t errlen) {
    char key[96];
    snprintf(key, sizeof key, "qwen35.%s", suffix);
    *out = def;
    if (kvt_gguf_find_key(g, key) < 0) {
        if (required) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    } else if (!kvt_gguf_get_u32(g, key, out)) {
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: expected an unsigned integer", key);
    }
    if (*out < lo || *out > hi)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s = %u not in %u..%u", key, *out, lo, hi);
    return KVT_OK;
}

/* imrope: pair i takes section s = i % sum(sections); t/h/w sections carry the text position p,
 * the e section (and pairs past 3*sect[k]) position 0 = no rotation. */
static kvt_status load_rope(kvt_q35 *q, const kvt_gguf *g, const kvt_hparams *hp, char *err, size_t errlen) {
    kvt_gguf_vtype et;
    uint64_t n;
    const void *data;
    int64_t sect[4] = {0, 0, 0, 0}, tot = 0;
    if (!kvt_gguf_get_arr(g, "qwen35.rope.dimension_sections", &et, &n, &data) || n < 3 || n > 4)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key qwen35.rope.dimension_sections: missing or not 3-4 integers");
    for (uint64_t i = 0; i < n; i++) {
        if (!kvt_gguf_get_arr_i64(g, "qwen35.rope.dimension_sections", i, &sect[i]) || sect[i] < 0 || sect[i] > 4096)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key qwen35.rope.dimension_sections: bad entry");
        tot += sect[i];
    }
    if (tot == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "rope.dimension_sections are all 0");
    const uint32_t half = hp->n_rot / 2;
    q->inv_freq = calloc(half, sizeof(double));
    if (!q->inv_freq) return KVT_ERR_NOMEM;
    for (uint32_t i = 0; i < half; i++) {
        const int64_t s = (int64_t)i % tot;
        const bool text = (s % 3 == 0 && s < 3 * sect[0]) || (s % 3 == 1 && s < 3 * sect[1]) ||
                          (s % 3 == 2 && s < 3 * sect[2]);
        q->inv_freq[i] = text ? pow((double)hp->rope_base, -2.0 * (double)i / (double)hp->n_rot) : 0.0;
    }
    return KVT_OK;
}

/* Reads the qwen35 keys and every per-layer tensor (token_embd/output are loaded by model.c). */
static kvt_status q35_load(kvt_model *m, const kvt_gguf *g, void **out, char *err, size_t errlen) {
    *out = NULL;
    const kvt_hparams *hp = kvt_model_hparams(m);
    kvt_q35 *q = calloc(1, sizeof *q);
    if (!q) return KVT_ERR_NOMEM;
    q->m = m;
    kvt_status st;
    uint32_t inner;
    if ((st = get_key(g, "ssm.conv_kernel", true, 0, 1, 16, &q->dn.conv_k, err, errlen)) ||
        (st = get_key(g, "ssm.state_size", true, 0, 1, 512, &q->dn.d, err, errlen)) ||
        (st = get_key(g, "ssm.group_count", true, 0, 1, 256, &q->dn.n_k_heads, err, errlen)) ||
        (st = get_key(g, "ssm.time_step_rank", true, 0, 1, 256, &q->dn.n_v_heads, err, errlen)) ||
        (st = get_key(g, "ssm.inner_size", true, 0, 1, 1u << 20, &inner, err, errlen)) ||
        (st = get_key(g, "full_attention_interval", false, 4, 1, KVT_MAX_LAYERS, &q->interval, err, errlen)))
        goto fail;
    uint32_t mtp = 0;
    if ((st = get_key(g, "nextn_predict_layers", false, 0, 0, 0, &mtp, err, errlen))) goto fail;
    if (inner != q->dn.n_v_heads * q->dn.d) {
        st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "ssm.inner_size %u != time_step_rank %u * state_size %u", inner,
                      q->dn.n_v_heads, q->dn.d);
        goto fail;
    }
    if (q->dn.n_v_heads % q->dn.n_k_heads != 0) {
        st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "ssm v heads %u not a multiple of k heads %u",
                      q->dn.n_v_heads, q->dn.n_k_heads);
        goto fail;
    }
    if ((st = load_rope(q, g, hp, err, errlen)) != KVT_OK) goto fail;
    const uint32_t L = hp->n_layer, E = hp->n_embd, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const uint32_t d = q->dn.d, HK = q->dn.n_k_heads, HV = q->dn.n_v_heads, K = q->dn.conv_k;
    const uint32_t CD = kvt_dn_conv_dim(&q->dn), VD = HV * d;
    uint32_t n_dn = 0;
    for (uint32_t il = 0; il < L; il++) n_dn += !layer_is_attn(q, il);
    q->layers = calloc(L, sizeof *q->layers);
    q->conv_store = calloc((size_t)n_dn * CD * K + 1, sizeof(float));
    if (!q->layers || !q->conv_store) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    float *cw = q->conv_store;
    for (uint32_t il = 0; il < L; il++) {
        q35_layer *w = &q->layers[il];
        char nm[96];
#define NM(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, il), nm)
#define MAT(name, ni, no, dst) if ((st = kvt_load_mat(m, g, NM(name), ni, no, 1, true, dst, err, errlen))) goto fail
#define VEC(name, len, dst) if ((st = kvt_load_vec(m, g, NM(name), len, true, dst, err, errlen))) goto fail
        w->attn = layer_is_attn(q, il);
        VEC("attn_norm.weight", E, &w->attn_norm);
        VEC("post_attention_norm.weight", E, &w->ffn_norm);
        MAT("ffn_gate.weight", E, hp->n_ff, &w->gate);
        MAT("ffn_up.weight", E, hp->n_ff, &w->up);
        MAT("ffn_down.weight", hp->n_ff, E, &w->down);
        if (w->attn) {
            MAT("attn_q.weight", E, 2 * NH * HD, &w->wq);
            MAT("attn_k.weight", E, NKV * HD, &w->wk);
            MAT("attn_v.weight", E, NKV * HD, &w->wv);
            MAT("attn_output.weight", NH * HD, E, &w->wo);
            VEC("attn_q_norm.weight", HD, &w->q_norm);
            VEC("attn_k_norm.weight", HD, &w->k_norm);
        } else {
            kvt_wmat conv;
            MAT("attn_qkv.weight", E, CD, &w->wqkv);
            MAT("attn_gate.weight", E, VD, &w->wz);
            MAT("ssm_beta.weight", E, HV, &w->wbeta);
            MAT("ssm_alpha.weight", E, HV, &w->walpha);
            MAT("ssm_out.weight", VD, E, &w->wout);
            MAT("ssm_conv1d.weight", K, CD, &conv);
            VEC("ssm_dt.bias", HV, &w->dt_bias);
            VEC("ssm_a", HV, &w->ssm_a);
            VEC("ssm_norm.weight", d, &w->ssm_norm);
            for (uint32_t ch = 0; ch < CD; ch++) { /* stored tap-major [K][CD] (kvt_dn_conv) */
                float taps[16];
                kvt_dequant_row(conv.type, (const uint8_t *)conv.data + (uint64_t)ch * conv.row_bytes, taps, K);
                for (uint32_t j = 0; j < K; j++) cw[(size_t)j * CD + ch] = taps[j];
            }
            w->conv_w = cw;
            cw += (size_t)CD * K;
            for (uint32_t h = 0; h < HV; h++)
                if (!isfinite(w->dt_bias[h]) || !isfinite(w->ssm_a[h]) || w->ssm_a[h] > 0.0f) {
                    st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "blk.%u.ssm_a/ssm_dt: non-finite or positive A", il);
                    goto fail;
                }
        }
#undef NM
#undef MAT
#undef VEC
        /* Load-time preparation for the GEMMs, as model.c does for the dense layers (repacked copy
         * bit-identical to the row-major kernel, or an F16/BF16 matrix as KVT_TYPE_BF16X): decode
         * and prefill still agree. Best effort. */
        kvt_wmat *pw[12];
        const int npw = layer_mats(w, pw);
        for (int i = 0; i < npw; i++) kvt_wmat_prepare(m, pw[i]);
    }
    (void)HK;
    *out = q;
    return KVT_OK;
fail:
    q35_free(q);
    return st;
}

/* Attention layers are FULL, DeltaNet layers RECURRENT (their state in the sequence). */
static kvt_status q35_layer_kinds(const kvt_model *m, const kvt_gguf *g, uint8_t *kind, char *err, size_t errlen) {
    const kvt_q35 *q = kvt_model_arch_state(m);
    for (uint32_t il = 0; il < kvt_model_hparams(m)->n_layer; il++)
        kind[il] = layer_is_attn(q, il) ? KVT_KIND_FULL : KVT_KIND_RECURRENT;
    return KVT_OK;
}

static void q35_layer_descs(const void *state, const kvt_hparams *hp, const kvt_codec *codecs, kvt_layer_desc *out) {
    const kvt_q35 *q = state;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        kvt_layer_desc *d = &out[il];
        memset(d, 0, sizeof *d);
        if (layer_is_attn(q, il)) {
            d->kind = KVT_KIND_FULL;
            d->n_kv_heads = hp->n_head_kv;
            d->head_dim_k = d->head_dim_v = hp->head_dim;
            d->codec = codecs[il];
        } else {
            d->kind = KVT_KIND_RECURRENT;
            d->state_bytes = (uint32_t)kvt_dn_state_bytes(&q->dn);
        }
    }
}

static kvt_status q35_check_layout(const void *state, const kvt_hparams *hp, const kvt_kv_layout *l) {
    const kvt_q35 *q = state;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(l, il);
        if (layer_is_attn(q, il)) {
            if (d->kind != KVT_KIND_FULL || d->n_kv_heads != hp->n_head_kv || d->head_dim_k != hp->head_dim ||
                d->head_dim_v != hp->head_dim)
                return KVT_ERR_INVALID_ARG;
        } else if (d->kind != KVT_KIND_RECURRENT || d->state_bytes != kvt_dn_state_bytes(&q->dn)) {
            return KVT_ERR_INVALID_ARG;
        }
    }
    return KVT_OK;
}

/* ------------------------------------------------------------------ context */

static float *fbuf(size_t n) { return kvt_aligned_alloc(64, (n ? n : 16) * sizeof(float)); }

static void q35_ctx_free(void *ctx_state) {
    kvt_q35_ctx *qc = ctx_state;
    if (!qc) return;
    float *bufs[] = {qc->x, qc->xn, qc->tmp, qc->big, qc->conv, qc->z, qc->ba, qc->bb,
                     qc->o, qc->qa, qc->gt, qc->ff_g, qc->ff_u, qc->rope_cs};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bufs); i++) free(bufs[i]);
    for (int i = 0; i < Q35_MAX_MM; i++) free(qc->act[i]);
    if (qc->tb)
        for (int t = 0; t < qc->n_tb; t++) {
            free(qc->tb[t].x), free(qc->tb[t].xn);
            for (int i = 0; i < Q35_MAX_MM; i++) free(qc->tb[t].act[i]);
        }
    free(qc->tb);
    free(qc);
}

static size_t umax(size_t a, size_t b) { return a > b ? a : b; }

/* The largest activation buffer any matmul input of the model needs for `rows` rows. */
static size_t act_bytes(const kvt_model *m, const kvt_q35 *q, size_t rows) {
    const kvt_hparams *hp = kvt_model_hparams(m);
    size_t ab = kvt_act_bytes(kvt_model_output(m)->type, hp->n_embd, rows);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const q35_layer *w = &q->layers[il];
        const kvt_wmat *ws[] = {&w->gate, &w->up, &w->down, &w->wq, &w->wk, &w->wv, &w->wo,
                                &w->wqkv, &w->wz, &w->wbeta, &w->walpha, &w->wout};
        for (size_t i = 0; i < KVT_ARRAY_LEN(ws); i++)
            if (ws[i]->data) ab = umax(ab, kvt_act_bytes(ws[i]->type, ws[i]->n_in, rows));
    }
    return ab;
}

static kvt_status q35_ctx_create(const kvt_model *m, const void *state, int n_threads, uint32_t ubatch,
                                 void **out) {
    const kvt_q35 *q = state;
    *out = NULL;
    const kvt_hparams *hp = kvt_model_hparams(m);
    kvt_q35_ctx *qc = calloc(1, sizeof *qc);
    if (!qc) return KVT_ERR_NOMEM;
    qc->m = m;
    qc->q = q;
    qc->impl = kvt_dn_best_impl();
    qc->ubatch = ubatch;
    const size_t U = ubatch, E = hp->n_embd, QD = (size_t)hp->n_head * hp->head_dim;
    const size_t CD = kvt_dn_conv_dim(&q->dn), VD = (size_t)q->dn.n_v_heads * q->dn.d, HV = q->dn.n_v_heads;
    const size_t KD = (size_t)hp->n_head_kv * hp->head_dim;
    qc->x = fbuf(U * E);
    qc->xn = fbuf(U * E);
    qc->tmp = fbuf(U * E);
    qc->big = fbuf(U * umax(2 * QD, CD));   /* attn: [q|gate]; DeltaNet: raw u */
    qc->conv = fbuf(U * umax(CD, 2 * KD));  /* DeltaNet: conv output; attn: k then v */
    qc->z = fbuf(U * VD);
    qc->ba = fbuf(U * HV);
    qc->bb = fbuf(U * HV);
    qc->o = fbuf(U * umax(VD, QD));
    qc->qa = fbuf(U * QD);
    qc->gt = fbuf(U * QD);
    qc->ff_g = fbuf(U * hp->n_ff);
    qc->ff_u = fbuf(U * hp->n_ff);
    qc->rope_cs = fbuf(U * hp->n_rot);
    const size_t ab = act_bytes(m, q, U);
    bool ok = qc->x && qc->xn && qc->tmp && qc->big && qc->conv && qc->z && qc->ba && qc->bb && qc->o && qc->qa &&
              qc->gt && qc->ff_g && qc->ff_u && qc->rope_cs;
    for (int i = 0; i < Q35_MAX_MM && ok; i++) ok = (qc->act[i] = kvt_aligned_alloc(64, ab + 64)) != NULL;
    if (ok && n_threads > 1) {
        const size_t R = Q35_REPL_ROWS, abr = act_bytes(m, q, R);
        ok = (qc->tb = calloc((size_t)n_threads, sizeof *qc->tb)) != NULL;
        if (ok) qc->n_tb = n_threads;
        for (int t = 0; t < n_threads && ok; t++) {
            struct q35_tbuf *tb = &qc->tb[t];
            ok = (tb->x = fbuf(R * E)) && (tb->xn = fbuf(R * E));
            for (int i = 0; i < Q35_MAX_MM && ok; i++) ok = (tb->act[i] = kvt_aligned_alloc(64, abr + 64)) != NULL;
        }
    }
    if (!ok) {
        q35_ctx_free(qc);
        return KVT_ERR_NOMEM;
    }
    *out = qc;
    return KVT_OK;
}

/* ------------------------------------------------------------------ forward */


static void l2norm(float *x, uint32_t n, float eps) {
    const double sum = kvt_sum_squares(x, n);
    const float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
    for (uint32_t i = 0; i < n; i++) x[i] *= scale;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* (RMSNorm, NeoX RoPE and the row split are model.c's: kvt_rmsnorm, kvt_rope_apply, kvt_split_range.) */

/* One thread's view of a chunk (see the top): replicated or split, the residual stream, normed rows
 * and activation buffers it works on (its own or the shared ones), and the rows [r0, r1) of its
 * row ops on them (all rows when replicated). */
typedef struct q35_view {
    int ith, nth;
    bool repl;
    float *x, *xn;
    void *const *act;
    uint32_t r0, r1;
} q35_view;

/* y_i = W_i x for nw matrices sharing the input x (n rows of n_in): model.c's group helpers, as for
 * the dense layers (rows quantized once per activation format, then each thread's output columns;
 * repacked weights for chunks, bit-identical to the row-major decode GEMV). Split: the rows are
 * quantized in parallel into the shared buffers, then a barrier; replicated: every thread quantizes
 * every row into its own. No barrier after the products (mm adds it). */
_Static_assert(Q35_MAX_MM <= KVT_MAX_GROUP, "qwen35 groups must fit model.c's group helpers");
static void mm_open(kvt_q35_ctx *c, const q35_view *v, const kvt_wmat *const *ws, float *const *ys, int nw,
                    const float *x, uint32_t n) {
    uint32_t r0 = 0, r1 = n;
    if (!v->repl) kvt_split_range(n, v->ith, v->nth, &r0, &r1);
    kvt_quantize_rows(v->act, ws, nw, x, r0, r1);
    if (!v->repl) kvt_threadpool_barrier(c->tp);
    kvt_matmul_group(v->act, ws, ys, nw, n, v->ith, v->nth);
}

/* mm_open, then a barrier: every thread's columns of ys are written. */
static void mm(kvt_q35_ctx *c, const q35_view *v, const kvt_wmat *const *ws, float *const *ys, int nw,
               const float *x, uint32_t n) {
    mm_open(c, v, ws, ys, nw, x, n);
    kvt_threadpool_barrier(c->tp);
}


/* Query head h of row r: [q|gate] split into qa and gt, q's RMSNorm and rotation. */
static void attn_q_head(kvt_q35_ctx *c, const q35_layer *w, uint32_t r, uint32_t h) {
    const kvt_hparams *hp = kvt_model_hparams(c->m);
    const uint32_t HD = hp->head_dim, QD = hp->n_head * HD;
    const float *qg = c->big + (size_t)r * 2 * QD + (size_t)h * 2 * HD;
    float *qh = c->qa + (size_t)r * QD + h * HD;
    memcpy(qh, qg, HD * sizeof(float));
    memcpy(c->gt + (size_t)r * QD + h * HD, qg + HD, HD * sizeof(float));
    kvt_rmsnorm(qh, qh, w->q_norm, HD, hp->norm_eps);
    kvt_rope_apply(qh, c->rope_cs + (size_t)r * hp->n_rot, hp->n_rot, true);
}

/* KV head h of row r's key: RMSNorm and rotation. */
static void attn_k_head(kvt_q35_ctx *c, const q35_layer *w, float *kb, uint32_t r, uint32_t h) {
    const kvt_hparams *hp = kvt_model_hparams(c->m);
    const uint32_t HD = hp->head_dim;
    float *kh = kb + (size_t)r * hp->n_head_kv * HD + h * HD;
    kvt_rmsnorm(kh, kh, w->k_norm, HD, hp->norm_eps);
    kvt_rope_apply(kh, c->rope_cs + (size_t)r * hp->n_rot, hp->n_rot, true);
}

/* The gated attention mixer from the attention-normed rows in v->xn into c->tmp (ends on a barrier).
 * Replicated, each thread runs its query heads from the projections to the gate and its KV heads'
 * keys and writes (kv.h: distinct heads may be written concurrently): 4 barriers. Split: rows, then
 * the writes on thread 0, then the query heads. Every element gets the same operations either way. */
static void attn_layer(kvt_q35_ctx *c, const q35_view *v, uint32_t il, const q35_layer *w) {
    const kvt_hparams *hp = kvt_model_hparams(c->m);
    const int ith = v->ith, nth = v->nth;
    const uint32_t n = c->n, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const uint32_t QD = NH * HD, KD = NKV * HD;
    float *kb = c->conv, *vb = c->conv + (size_t)c->ubatch * KD;
    const kvt_wmat *ws[3] = {&w->wq, &w->wk, &w->wv};
    float *ys[3] = {c->big, kb, vb};
    mm(c, v, ws, ys, 3, v->xn, n);
    uint32_t h0, h1; /* this thread's query heads (attention and, replicated, their rows' work) */
    kvt_split_range(NH, ith, nth, &h0, &h1);
    uint32_t r0, r1;
    kvt_split_range(n, ith, nth, &r0, &r1);
    if (v->repl) {
        uint32_t k0, k1;
        kvt_split_range(NKV, ith, nth, &k0, &k1);
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t h = h0; h < h1; h++) attn_q_head(c, w, r, h);
            for (uint32_t h = k0; h < k1; h++) attn_k_head(c, w, kb, r, h);
            if (k0 < k1)
                kvt_seq_write_kv_heads(c->seq, il, c->pos0 + r, kb + (size_t)r * KD, vb + (size_t)r * KD, k0, k1);
        }
    } else {
        for (uint32_t r = r0; r < r1; r++) {
            for (uint32_t h = 0; h < NH; h++) attn_q_head(c, w, r, h);
            for (uint32_t h = 0; h < NKV; h++) attn_k_head(c, w, kb, r, h);
        }
        kvt_threadpool_barrier(c->tp);
        if (ith == 0) /* one writer per sequence (kv.h) */
            for (uint32_t r = 0; r < n; r++)
                kvt_seq_write_kv(c->seq, il, c->pos0 + r, kb + (size_t)r * KD, vb + (size_t)r * KD);
    }
    kvt_threadpool_barrier(c->tp);
    if (h0 < h1)
        kvt_attention(c->seq, il, c->qa, n, QD, c->pos0, NH, 1.0f / sqrtf((float)HD), h0, h1, c->o, QD,
                      c->att_scratch[ith]);
    if (v->repl) { /* the gate on this thread's own heads' outputs */
        for (uint32_t r = 0; r < n && h0 < h1; r++) {
            float *o = c->o + (size_t)r * QD + h0 * HD;
            kvt_dn_sigmoid_mul(c->impl, o, c->gt + (size_t)r * QD + h0 * HD, o, (h1 - h0) * HD);
        }
    } else {
        kvt_threadpool_barrier(c->tp);
        for (uint32_t r = r0; r < r1; r++)
            kvt_dn_sigmoid_mul(c->impl, c->o + (size_t)r * QD, c->gt + (size_t)r * QD, c->o + (size_t)r * QD, QD);
    }
    const kvt_wmat *wo[1] = {&w->wo};
    float *to[1] = {c->tmp};
    kvt_threadpool_barrier(c->tp);
    mm(c, v, wo, to, 1, c->o, n);
}

/* The DeltaNet mixer from the attention-normed rows in v->xn into c->tmp (ends on a barrier). */
static void deltanet_layer(kvt_q35_ctx *c, const q35_view *v, uint32_t il, const q35_layer *w) {
    const kvt_hparams *hp = kvt_model_hparams(c->m);
    const int ith = v->ith, nth = v->nth;
    const kvt_dn_dims *dm = &c->q->dn;
    const uint32_t n = c->n, d = dm->d, HK = dm->n_k_heads, HV = dm->n_v_heads, CD = kvt_dn_conv_dim(dm);
    const uint32_t VD = HV * d;
    float *state = (float *)kvt_seq_state(c->seq, il);
    const kvt_wmat *ws[4] = {&w->wqkv, &w->wz, &w->wbeta, &w->walpha};
    float *ys[4] = {c->big, c->z, c->bb, c->ba};
    mm(c, v, ws, ys, 4, v->xn, n);
    uint32_t h0, h1;
    kvt_split_range(HV, ith, nth, &h0, &h1);
    if (HV == HK) {
        /* Every step from the conv to the gated norm reads only head h's channels (q, k and v
         * head h): each thread runs them for its own heads with no barrier in between. The
         * per-element operations are those of the row-split path below (same bits). */
        if (h0 < h1) {
            for (uint32_t part = 0; part < 3; part++) /* q, k, v channels of heads [h0, h1) */
                kvt_dn_conv(dm, c->impl, w->conv_w, state, c->big, n, c->conv, (part * HK + h0) * d,
                            (part * HK + h1) * d);
            for (uint32_t r = 0; r < n; r++) {
                float *row = c->conv + (size_t)r * CD;
                for (uint32_t h = h0; h < h1; h++) {
                    l2norm(row + (size_t)h * d, d, hp->norm_eps);
                    l2norm(row + (size_t)(HK + h) * d, d, hp->norm_eps);
                    float *bt = c->bb + (size_t)r * HV + h, *gt = c->ba + (size_t)r * HV + h;
                    *bt = sigmoid(*bt);
                    *gt = softplus(*gt + w->dt_bias[h]) * w->ssm_a[h];
                }
            }
            kvt_dn_rows(dm, c->impl, state, c->conv, c->bb, c->ba, c->pos0, n, c->o, h0, h1);
            for (uint32_t r = 0; r < n; r++)
                for (uint32_t h = h0; h < h1; h++) {
                    float *o = c->o + (size_t)r * VD + (size_t)h * d;
                    kvt_rmsnorm(o, o, w->ssm_norm, d, hp->norm_eps);
                    kvt_dn_silu_mul(c->impl, o, c->z + (size_t)r * VD + (size_t)h * d, o, d);
                }
        }
        kvt_threadpool_barrier(c->tp);
    } else { /* v heads share k heads across threads: split channels, then rows, then heads */
        uint32_t a, b;
        kvt_split_range(CD, ith, nth, &a, &b);
        if (a < b) kvt_dn_conv(dm, c->impl, w->conv_w, state, c->big, n, c->conv, a, b);
        kvt_threadpool_barrier(c->tp);
        uint32_t r0, r1;
        kvt_split_range(n, ith, nth, &r0, &r1);
        for (uint32_t r = r0; r < r1; r++) {
            float *row = c->conv + (size_t)r * CD;
            for (uint32_t h = 0; h < 2 * HK; h++) l2norm(row + (size_t)h * d, d, hp->norm_eps);
            for (uint32_t h = 0; h < HV; h++) {
                float *bt = c->bb + (size_t)r * HV + h, *gt = c->ba + (size_t)r * HV + h;
                *bt = sigmoid(*bt);
                *gt = softplus(*gt + w->dt_bias[h]) * w->ssm_a[h];
            }
        }
        kvt_threadpool_barrier(c->tp);
        if (h0 < h1) kvt_dn_rows(dm, c->impl, state, c->conv, c->bb, c->ba, c->pos0, n, c->o, h0, h1);
        kvt_threadpool_barrier(c->tp);
        for (uint32_t r = r0; r < r1; r++)
            for (uint32_t h = 0; h < HV; h++) {
                float *o = c->o + (size_t)r * VD + (size_t)h * d;
                kvt_rmsnorm(o, o, w->ssm_norm, d, hp->norm_eps);
                kvt_dn_silu_mul(c->impl, o, c->z + (size_t)r * VD + (size_t)h * d, o, d);
            }
        kvt_threadpool_barrier(c->tp);
    }
    const kvt_wmat *wo[1] = {&w->wout};
    float *to[1] = {c->tmp};
    mm(c, v, wo, to, 1, c->o, n);
}

static void chunk_fn(void *arg, int ith, int nth) {
    kvt_q35_ctx *c = arg;
    const kvt_model *m = c->m;
    const kvt_hparams *hp = kvt_model_hparams(m);
    const kvt_q35 *q = c->q;
    const uint32_t n = c->n, E = hp->n_embd, F = hp->n_ff, half = hp->n_rot / 2;
    const kvt_wmat *emb = kvt_model_tok_embd(m);
    const bool repl = nth > 1 && n <= Q35_REPL_ROWS && nth <= c->n_tb; /* the same on every thread */
    q35_view v = {.ith = ith, .nth = nth, .repl = repl, .x = c->x, .xn = c->xn, .act = c->act, .r0 = 0, .r1 = n};
    if (repl) {
        v.x = c->tb[ith].x, v.xn = c->tb[ith].xn, v.act = c->tb[ith].act;
    } else {
        kvt_split_range(n, ith, nth, &v.r0, &v.r1);
    }
    float *X = v.x, *XN = v.xn;
    const uint32_t r0 = v.r0, r1 = v.r1;
    uint32_t s0, s1; /* the RoPE tables are shared: each row's by one thread */
    kvt_split_range(n, ith, nth, &s0, &s1);
    for (uint32_t r = r0; r < r1; r++)
        kvt_dequant_row(emb->type, (const uint8_t *)emb->data + (uint64_t)c->tokens[r] * emb->row_bytes,
                        X + (size_t)r * E, E);
    for (uint32_t r = s0; r < s1; r++) {
        float *cs = c->rope_cs + (size_t)r * hp->n_rot;
        for (uint32_t i = 0; i < half; i++) {
            const double th = (double)(c->pos0 + r) * q->inv_freq[i];
            cs[2 * i] = (float)cos(th);
            cs[2 * i + 1] = (float)sin(th);
        }
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const q35_layer *w = &q->layers[il];
        for (uint32_t r = r0; r < r1; r++) kvt_rmsnorm(XN + (size_t)r * E, X + (size_t)r * E, w->attn_norm, E, hp->norm_eps);
        /* split: the normed rows are shared (the RoPE tables, written above by row, are read by
         * other threads only after the barrier ending the first Q/K/V products) */
        if (!repl) kvt_threadpool_barrier(c->tp);
        if (w->attn) attn_layer(c, &v, il, w);
        else deltanet_layer(c, &v, il, w);
        for (uint32_t r = r0; r < r1; r++) {
            float *xr = X + (size_t)r * E, *tr = c->tmp + (size_t)r * E;
            for (uint32_t i = 0; i < E; i++) xr[i] += tr[i];
            kvt_rmsnorm(XN + (size_t)r * E, xr, w->ffn_norm, E, hp->norm_eps);
        }
        if (!repl) kvt_threadpool_barrier(c->tp);
        const kvt_wmat *gu[2] = {&w->gate, &w->up};
        float *gu_out[2] = {c->ff_g, c->ff_u};
        if (repl) { /* the gated activation on this thread's own gate/up columns */
            mm_open(c, &v, gu, gu_out, 2, XN, n);
            int64_t o0, o1;
            kvt_col_range(F, ith, nth, &o0, &o1);
            for (uint32_t r = 0; r < n && o0 < o1; r++) {
                float *g = c->ff_g + (size_t)r * F + o0, *u = c->ff_u + (size_t)r * F + o0;
                kvt_dn_silu_mul(c->impl, g, g, u, (uint32_t)(o1 - o0));
            }
        } else {
            mm(c, &v, gu, gu_out, 2, XN, n);
            for (uint32_t r = r0; r < r1; r++) {
                float *g = c->ff_g + (size_t)r * F, *u = c->ff_u + (size_t)r * F;
                kvt_dn_silu_mul(c->impl, g, g, u, F);
            }
        }
        kvt_threadpool_barrier(c->tp);
        const kvt_wmat *dn[1] = {&w->down};
        float *dn_out[1] = {c->tmp};
        mm(c, &v, dn, dn_out, 1, c->ff_g, n);
        for (uint32_t r = r0; r < r1; r++) {
            float *xr = X + (size_t)r * E, *tr = c->tmp + (size_t)r * E;
            for (uint32_t i = 0; i < E; i++) xr[i] += tr[i];
        }
    }
    const uint32_t first = c->all_logits ? 0 : n - 1;
    for (uint32_t r = r0; r < r1; r++)
        if (r >= first) kvt_rmsnorm(XN + (size_t)r * E, X + (size_t)r * E, kvt_model_output_norm(m), E, hp->norm_eps);
    if (!repl) kvt_threadpool_barrier(c->tp);
    const kvt_wmat *ow[1] = {kvt_model_output(m)};
    float *lo[1] = {c->logits};
    mm(c, &v, ow, lo, 1, XN + (size_t)first * E, n - first);
}

static kvt_status q35_forward(void *ctx_state, kvt_threadpool *tp, float *const *att_scratch, kvt_seq *seq,
                              const int32_t *tokens, uint32_t n, bool all_logits, const volatile int *cancel,
                              float *logits) {
    kvt_q35_ctx *qc = ctx_state;
    const kvt_hparams *hp = kvt_model_hparams(qc->m);
    if (kvt_seq_len(seq) == 0) /* a sequence starts from the zero state */
        for (uint32_t il = 0; il < hp->n_layer; il++)
            if (!layer_is_attn(qc->q, il)) memset(kvt_seq_state(seq, il), 0, kvt_dn_state_bytes(&qc->q->dn));
    kvt_status st;
    for (uint32_t off = 0; off < n; off += qc->ubatch) {
        if (cancel && *cancel) return KVT_ERR_CANCELLED;
        const uint32_t nc = n - off < qc->ubatch ? n - off : qc->ubatch;
        if ((st = kvt_seq_prepare(seq, nc)) != KVT_OK) return st;
        qc->seq = seq;
        qc->tokens = tokens + off;
        qc->n = nc;
        qc->pos0 = kvt_seq_len(seq);
        qc->all_logits = all_logits;
        qc->logits = logits;
        qc->att_scratch = att_scratch;
        qc->tp = tp;
        kvt_threadpool_run(tp, chunk_fn, qc);
        qc->seq = NULL;
        if ((st = kvt_seq_commit(seq, tokens + off, nc)) != KVT_OK) return st;
    }
    return KVT_OK;
}

/* ------------------------------------------------------------------ the architecture */

static const kvt_arch_pass q35_pass = {
    .load = q35_load,
    .free = q35_free,
    .layer_descs = q35_layer_descs,
    .check_layout = q35_check_layout,
    .ctx_create = q35_ctx_create,
    .ctx_free = q35_ctx_free,
    .forward = q35_forward,
};

/* Its own forward pass; recurrent state makes every item of a batch its own pass. */
const kvt_arch_ops kvt_arch_qwen35 = {
    .name = "qwen35",
    .rope_neox = true,
    .layer_kinds = q35_layer_kinds,
    .pass = &q35_pass,
    .batches = false,
};
