/*
 * moe.c — mixture-of-experts FFN (qwen3moe, deepseek2): hyperparameters, weights, routing, and the
 * grouped expert computation of the forward pass; also the MLA/MoE scratch of a kvt_ctx.
 *
 * Routing of one token (kvt_moe_route): router logits l = ffn_gate_inp · x; probabilities
 * π = softmax(l) (gating 1) or σ(l) (gating 2); the k experts with the largest π + exp_probs_b (the
 * bias only selects; ties go to the lower expert id) are chosen, in decreasing score order; their
 * weights are the unbiased π, divided by their sum when norm_topk, times weights_scale. The FFN is
 * Σ_chosen w_e · down_e(silu(gate_e x) ⊙ up_e x) + the shared experts' SwiGLU (weight 1).
 *
 * Grouping: a chunk's (token, expert) pairs are sorted by expert (counting sort, stable in token
 * order) into slots; each expert runs once over its contiguous slots, so its weights are read once
 * per chunk, and a decode token touches only its k experts. Matmuls are batch invariant
 * (kernels/quant.h) and each token sums its experts in its own selection order, so grouped
 * prefill == per-token decode bit for bit.
 *
 * Threading (every thread calls kvt_moe_ffn; barriers between stages):
 *   A activations of XN (rows)   B router logits + shared gate/up (columns)   C routing (rows)
 *   D slot assignment (thread 0)   E gather + activations (rows' pairs)   F experts' gate/up and
 *   shared down (columns)   G hidden activations (slots)   H experts' down (columns)   I combine (rows)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/quant.h"
#include "deltanet.h"
#include "model_int.h"

#define HKEY(buf, suffix) snprintf(buf, sizeof(buf), "%s." suffix, kvt_arch_name(hp->arch))
#define MOE_MAX_USED 64

static kvt_status get_u32_opt(const kvt_gguf *g, const char *key, uint32_t *v, bool required, char *err,
                              size_t errlen) {
    if (kvt_gguf_find_key(g, key) < 0) {
        if (required) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
        return KVT_OK;
    }
    if (!kvt_gguf_get_u32(g, key, v)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    return KVT_OK;
}

kvt_status kvt_moe_hparams_load(const kvt_gguf *g, kvt_hparams *hp, bool norm_topk, char *err, size_t errlen) {
    kvt_moe_hparams *mh = &hp->moe;
    char key[160];
    kvt_status st;
    HKEY(key, "expert_count");
    if ((st = get_u32_opt(g, key, &mh->n_expert, true, err, errlen))) return st;
    HKEY(key, "expert_used_count");
    if ((st = get_u32_opt(g, key, &mh->n_expert_used, true, err, errlen))) return st;
    HKEY(key, "expert_feed_forward_length");
    if ((st = get_u32_opt(g, key, &mh->n_ff_exp, true, err, errlen))) return st;
    HKEY(key, "expert_shared_count");
    if ((st = get_u32_opt(g, key, &mh->n_expert_shared, false, err, errlen))) return st;
    HKEY(key, "leading_dense_block_count");
    if ((st = get_u32_opt(g, key, &mh->n_dense_lead, false, err, errlen))) return st;
    /* defaults as the reference engines: softmax gating; the top-k normalization is the family's */
    mh->gating = 1;
    HKEY(key, "expert_gating_func");
    if ((st = get_u32_opt(g, key, &mh->gating, false, err, errlen))) return st;
    mh->norm_topk = norm_topk;
    HKEY(key, "expert_weights_norm");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_bool(g, key, &mh->norm_topk))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    mh->weights_scale = 1.0f;
    HKEY(key, "expert_weights_scale");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_f32(g, key, &mh->weights_scale))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    if (mh->n_expert == 0 || mh->n_expert > 1024 || mh->n_expert_used == 0 || mh->n_expert_used > mh->n_expert ||
        mh->n_expert_used > MOE_MAX_USED)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "experts: %u used of %u (at most %d of 1024)", mh->n_expert_used,
                        mh->n_expert, MOE_MAX_USED);
    if (mh->n_ff_exp == 0 || mh->n_ff_exp > (1u << 16) || mh->n_expert_shared > 64 || mh->n_dense_lead > hp->n_layer)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "experts: ff %u, shared %u, leading dense %u out of range",
                        mh->n_ff_exp, mh->n_expert_shared, mh->n_dense_lead);
    if (mh->gating != 1 && mh->gating != 2)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "expert_gating_func %u not supported (1 softmax, 2 sigmoid)",
                        mh->gating);
    if (!isfinite(mh->weights_scale) || !(mh->weights_scale > 0.0f) || mh->weights_scale > 1000.0f)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "expert_weights_scale invalid");
    return KVT_OK;
}

static kvt_status moe_load(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_moe_w *w, char *err, size_t errlen) {
    const kvt_hparams *hp = kvt_model_hparams(m);
    const kvt_moe_hparams *mh = &hp->moe;
    const uint32_t E = hp->n_embd, F = mh->n_ff_exp, NE = mh->n_expert, FS = F * mh->n_expert_shared;
    memset(w, 0, sizeof(*w));
    w->gate = calloc(NE, sizeof(kvt_wmat));
    w->up = calloc(NE, sizeof(kvt_wmat));
    w->down = calloc(NE, sizeof(kvt_wmat));
    if (!w->gate || !w->up || !w->down) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory loading experts");
    char nm[96];
    kvt_status st;
#define NM(suffix) (snprintf(nm, sizeof(nm), "blk.%u." suffix, il), nm)
    if ((st = kvt_load_mat(m, g, NM("ffn_gate_inp.weight"), E, NE, 1, true, &w->router, err, errlen))) return st;
    if ((st = kvt_load_vec(m, g, NM("exp_probs_b.bias"), NE, false, &w->bias, err, errlen))) return st;
    if ((st = kvt_load_mat(m, g, NM("ffn_gate_exps.weight"), E, F, NE, true, w->gate, err, errlen))) return st;
    if ((st = kvt_load_mat(m, g, NM("ffn_up_exps.weight"), E, F, NE, true, w->up, err, errlen))) return st;
    if ((st = kvt_load_mat(m, g, NM("ffn_down_exps.weight"), F, E, NE, true, w->down, err, errlen))) return st;
    if (FS) {
        if ((st = kvt_load_mat(m, g, NM("ffn_gate_shexp.weight"), E, FS, 1, true, &w->sh_gate, err, errlen))) return st;
        if ((st = kvt_load_mat(m, g, NM("ffn_up_shexp.weight"), E, FS, 1, true, &w->sh_up, err, errlen))) return st;
        if ((st = kvt_load_mat(m, g, NM("ffn_down_shexp.weight"), FS, E, 1, true, &w->sh_down, err, errlen))) return st;
    }
#undef NM
    return KVT_OK;
}

kvt_status kvt_moe_load_layer(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_layer_w *w, char *err, size_t errlen) {
    const kvt_moe_hparams *mh = &kvt_model_hparams(m)->moe;
    if (mh->n_expert == 0 || il < mh->n_dense_lead) return KVT_OK; /* a dense layer */
    if (!(w->moe = calloc(1, sizeof *w->moe))) return KVT_ERR_NOMEM;
    return moe_load(m, g, il, w->moe, err, errlen);
}

void kvt_moe_free(kvt_moe_w *w) {
    free(w->gate);
    free(w->up);
    free(w->down);
    w->gate = w->up = w->down = NULL;
}

void kvt_moe_route(const kvt_moe_hparams *mh, const float *logits, const float *bias, int32_t *sel, float *wsel) {
    const uint32_t NE = mh->n_expert, K = mh->n_expert_used;
    float pi[1024];
    if (mh->gating == 2) {
        for (uint32_t e = 0; e < NE; e++) pi[e] = 1.0f / (1.0f + expf(-logits[e]));
    } else {
        float mx = logits[0];
        for (uint32_t e = 1; e < NE; e++) mx = logits[e] > mx ? logits[e] : mx;
        double sum = 0;
        for (uint32_t e = 0; e < NE; e++) sum += pi[e] = expf(logits[e] - mx);
        for (uint32_t e = 0; e < NE; e++) pi[e] = (float)(pi[e] / sum);
    }
    uint8_t taken[1024] = {0};
    double wsum = 0;
    for (uint32_t k = 0; k < K; k++) {
        int32_t best = -1;
        float bs = 0;
        for (uint32_t e = 0; e < NE; e++) {
            if (taken[e]) continue;
            const float sc = pi[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || sc > bs) best = (int32_t)e, bs = sc; /* NaN scores never win */
        }
        taken[best] = 1;
        sel[k] = best;
        wsel[k] = pi[best];
        wsum += pi[best];
    }
    const float norm = mh->norm_topk && wsum > 0 ? (float)(1.0 / wsum) : 1.0f;
    for (uint32_t k = 0; k < K; k++) wsel[k] = wsel[k] * norm * mh->weights_scale;
}

void kvt_moe_ffn(const kvt_fwd *fw, const kvt_moe_w *w, uint32_t il) {
    (void)il;
    const kvt_hparams *hp = fw->hp;
    const kvt_moe_hparams *mh = &hp->moe;
    kvt_ext_scratch *xs = fw->ext;
    kvt_threadpool *tp = fw->tp;
    const int ith = fw->ith, nth = fw->nth;
    const uint32_t n = fw->n, E = hp->n_embd, F = mh->n_ff_exp, NE = mh->n_expert, K = mh->n_expert_used;
    const uint32_t FS = F * mh->n_expert_shared;
    const kvt_dn_impl dn_impl = kvt_dn_best_impl(); /* once per call, not per expert */
    const bool shared = w->sh_gate.data != NULL;
    uint32_t s0, s1;
    kvt_split_range(n, ith, nth, &s0, &s1);

    /* A, B: router logits and the shared experts' gate/up share the input activations */
    const kvt_wmat *in[3] = {&w->router, &w->sh_gate, &w->sh_up};
    float *in_out[3] = {xs->logit, xs->sg, xs->su};
    const int n_in = shared ? 3 : 1;
    kvt_quantize_rows(fw->ACT, in, n_in, fw->XN, fw->r0, fw->r1);
    if (!fw->repl) kvt_threadpool_barrier(tp);
    kvt_matmul_group(fw->ACT, in, in_out, n_in, n, ith, nth);
    if (shared) {
        int64_t o0, o1;
        kvt_col_range(FS, ith, nth, &o0, &o1);
        for (uint32_t r = 0; r < n; r++) {
            float *gr = xs->sg + (size_t)r * FS, *ur = xs->su + (size_t)r * FS;
            kvt_dn_silu_mul(dn_impl, gr + o0, gr + o0, ur + o0, (uint32_t)(o1 - o0));
        }
    }
    kvt_threadpool_barrier(tp);
    /* C: routing of this thread's rows */
    for (uint32_t r = s0; r < s1; r++)
        kvt_moe_route(mh, xs->logit + (size_t)r * NE, w->bias, xs->sel + (size_t)r * K, xs->selw + (size_t)r * K);
    kvt_threadpool_barrier(tp);
    /* D: slots grouped by expert, token order inside an expert */
    if (ith == 0) {
        memset(xs->off, 0, (NE + 1) * sizeof(uint32_t));
        for (uint32_t i = 0; i < n * K; i++) xs->off[xs->sel[i] + 1]++;
        for (uint32_t e = 0; e < NE; e++) xs->off[e + 1] += xs->off[e];
        for (uint32_t e = 0; e <= NE; e++) xs->cur[e] = xs->off[e];
        for (uint32_t i = 0; i < n * K; i++) {
            const uint32_t sl = xs->cur[xs->sel[i]]++;
            xs->slot[i] = sl;
            xs->slot_row[sl] = i / K;
        }
    }
    kvt_threadpool_barrier(tp);
    /* E: gather this thread's rows into their slots and convert them; the shared hidden rows */
    const kvt_wmat *gu0[2] = {&w->gate[0], &w->up[0]};
    const kvt_wmat *dn0[1] = {&w->down[0]};
    for (uint32_t r = s0; r < s1; r++)
        for (uint32_t k = 0; k < K; k++) {
            const uint32_t sl = xs->slot[(size_t)r * K + k];
            memcpy(xs->xg + (size_t)sl * E, fw->XN + (size_t)r * E, (size_t)E * sizeof(float));
            kvt_quantize_rows(xs->act_x, gu0, 2, xs->xg, sl, sl + 1);
        }
    const kvt_wmat *shd[1] = {&w->sh_down};
    float *shd_out[1] = {xs->sy};
    if (shared) kvt_quantize_rows(fw->act, shd, 1, xs->sg, s0, s1);
    kvt_threadpool_barrier(tp);
    /* F: each used expert's gate/up over its slots (this thread's columns), SwiGLU; shared down */
    const size_t rbx[2] = {kvt_act_row_bytes(gu0, 2, 0), kvt_act_row_bytes(gu0, 2, 1)};
    int64_t f0, f1;
    kvt_col_range(F, ith, nth, &f0, &f1);
    for (uint32_t e = 0; e < NE; e++) {
        const uint32_t a = xs->off[e], cnt = xs->off[e + 1] - a;
        if (cnt == 0) continue;
        void *act[KVT_N_ACT] = {(uint8_t *)xs->act_x[0] + a * rbx[0], (uint8_t *)xs->act_x[1] + a * rbx[1], NULL};
        const kvt_wmat *gu[2] = {&w->gate[e], &w->up[e]};
        float *gu_out[2] = {xs->hg + (size_t)a * F, xs->hu + (size_t)a * F};
        kvt_matmul_group(act, gu, gu_out, 2, cnt, ith, nth);
        for (uint32_t r = a; r < a + cnt; r++) {
            float *gr = xs->hg + (size_t)r * F, *ur = xs->hu + (size_t)r * F;
            kvt_dn_silu_mul(dn_impl, gr + f0, gr + f0, ur + f0, (uint32_t)(f1 - f0));
        }
    }
    if (shared) kvt_matmul_group(fw->act, shd, shd_out, 1, n, ith, nth);
    kvt_threadpool_barrier(tp);
    /* G: hidden activations, slots split across threads */
    uint32_t g0, g1;
    kvt_split_range(n * K, ith, nth, &g0, &g1);
    kvt_quantize_rows(xs->act_h, dn0, 1, xs->hg, g0, g1);
    kvt_threadpool_barrier(tp);
    /* H: each used expert's down projection */
    const size_t rbh = kvt_act_row_bytes(dn0, 1, 0);
    for (uint32_t e = 0; e < NE; e++) {
        const uint32_t a = xs->off[e], cnt = xs->off[e + 1] - a;
        if (cnt == 0) continue;
        void *act[KVT_N_ACT] = {(uint8_t *)xs->act_h[0] + a * rbh, NULL, NULL};
        const kvt_wmat *dn[1] = {&w->down[e]};
        float *dn_out[1] = {xs->yg + (size_t)a * E};
        kvt_matmul_group(act, dn, dn_out, 1, cnt, ith, nth);
    }
    kvt_threadpool_barrier(tp);
    /* I: each row sums its experts in selection order, then the shared experts */
    for (uint32_t r = s0; r < s1; r++) {
        float *o = fw->tmp + (size_t)r * E;
        memset(o, 0, (size_t)E * sizeof(float));
        for (uint32_t k = 0; k < K; k++) {
            const float wk = xs->selw[(size_t)r * K + k];
            const float *y = xs->yg + (size_t)xs->slot[(size_t)r * K + k] * E;
            for (uint32_t i = 0; i < E; i++) o[i] += wk * y[i];
        }
        if (shared)
            for (uint32_t i = 0; i < E; i++) o[i] += xs->sy[(size_t)r * E + i];
    }
    kvt_threadpool_barrier(tp);
}

/* ------------------------------------------------------------------ scratch */

static float *fa(size_t n) { return kvt_aligned_alloc(64, (n ? n : 1) * sizeof(float)); }

kvt_ext_scratch *kvt_ext_scratch_create(const kvt_hparams *hp, uint32_t ubatch) {
    kvt_ext_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    const size_t U = ubatch, E = hp->n_embd, H = hp->n_head;
    bool ok = true;
    const kvt_mla_hparams *ml = &hp->mla;
    if (ml->kv_lora_rank) {
        const size_t R = ml->kv_lora_rank, DR = ml->d_rope;
        s->qa = fa(U * ml->q_lora_rank);
        s->kva = fa(U * (R + DR));
        s->q = fa(U * H * (ml->d_nope + DR));
        s->qabs = fa(U * H * (R + DR));
        s->olat = fa(U * H * R);
        s->att = fa(U * H * ml->d_v);
        ok = s->qa && s->kva && s->q && s->qabs && s->olat && s->att;
    }
    const kvt_moe_hparams *mh = &hp->moe;
    if (ok && mh->n_expert) {
        const size_t K = mh->n_expert_used, P = U * K, F = mh->n_ff_exp, FS = F * mh->n_expert_shared;
        s->logit = fa(U * mh->n_expert);
        s->sel = calloc(P, sizeof(int32_t));
        s->selw = fa(P);
        s->slot = calloc(P, sizeof(uint32_t));
        s->slot_row = calloc(P, sizeof(uint32_t));
        s->off = calloc(mh->n_expert + 1, sizeof(uint32_t));
        s->cur = calloc(mh->n_expert + 1, sizeof(uint32_t));
        s->xg = fa(P * E);
        s->yg = fa(P * E);
        s->hg = fa(P * F);
        s->hu = fa(P * F);
        s->sg = fa(U * FS);
        s->su = fa(U * FS);
        s->sy = fa(U * E);
        ok = s->logit && s->sel && s->selw && s->slot && s->slot_row && s->off && s->cur && s->xg && s->yg && s->hg &&
             s->hu && s->sg && s->su && s->sy;
        /* activations of xg (E wide) and hg (F wide) in the widest format any weight type needs */
        size_t bx = 0, bh = 0;
        for (uint32_t t = 0; t < KVT_TYPE_COUNT; t++) {
            if (!kvt_type_supported(t)) continue;
            if (kvt_act_bytes(t, (int64_t)E, (int64_t)P) > bx) bx = kvt_act_bytes(t, (int64_t)E, (int64_t)P);
            if (kvt_act_bytes(t, (int64_t)F, (int64_t)P) > bh) bh = kvt_act_bytes(t, (int64_t)F, (int64_t)P);
        }
        for (int i = 0; i < KVT_N_ACT && ok; i++) {
            s->act_x[i] = kvt_aligned_alloc(64, bx + 64);
            s->act_h[i] = kvt_aligned_alloc(64, bh + 64);
            ok = s->act_x[i] && s->act_h[i];
        }
    }
    if (!ok) {
        kvt_ext_scratch_free(s);
        return NULL;
    }
    return s;
}

void kvt_ext_scratch_free(kvt_ext_scratch *s) {
    if (!s) return;
    kvt_mla_expand_free(s);
    void *bufs[] = {s->qa, s->kva, s->q, s->qabs, s->olat, s->att, s->logit, s->sel, s->selw, s->slot, s->slot_row,
                    s->off, s->cur, s->xg, s->yg, s->hg, s->hu, s->sg, s->su, s->sy};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bufs); i++) free(bufs[i]);
    for (int i = 0; i < KVT_N_ACT; i++) {
        free(s->act_x[i]);
        free(s->act_h[i]);
    }
    free(s);
}

static size_t act_max(const kvt_wmat *w, uint32_t rows, size_t cur) {
    if (!w->data) return cur;
    size_t b = kvt_act_bytes(w->type, w->n_in, rows);
    return b > cur ? b : cur;
}

size_t kvt_ext_act_bytes(const kvt_mla_w *mla, const kvt_moe_w *moe, uint32_t rows, size_t cur) {
    if (mla) {
        const kvt_wmat *ws[5] = {&mla->wq, &mla->wq_a, &mla->wq_b, &mla->wkv_a, &mla->wo};
        for (int i = 0; i < 5; i++) cur = act_max(ws[i], rows, cur);
    }
    if (moe) {
        const kvt_wmat *ws[4] = {&moe->router, &moe->sh_gate, &moe->sh_up, &moe->sh_down};
        for (int i = 0; i < 4; i++) cur = act_max(ws[i], rows, cur);
    }
    return cur;
}
