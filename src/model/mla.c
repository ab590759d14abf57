/*
 * mla.c — multi-head latent attention (deepseek2): hyperparameters (incl. YaRN), weights, and the
 * attention sub-block of the forward pass in latent space.
 *
 * Math (x = normed input row at position p; H heads, r = kv_lora_rank, d_n/d_r/d_v per head):
 *   q = attn_q_b · RMSNorm(attn_q_a · x)   (or attn_q · x),  per head [q_nope (d_n) | q_pe (d_r)]
 *   [c | k_pe] = attn_kv_a_mqa · x;  c = RMSNorm(c);  RoPE(q_pe), RoPE(k_pe)  (GPT-J pairs, YaRN)
 *   score_h(p, j) = kq_scale (q_nope,h · W_UK,h c_j + q_pe,h · k_pe,j),  o_h = W_UV,h Σ_j softmax c_j
 * The cache holds exactly [c_j | k_pe,j] per token (kv.h KVT_KIND_MLA). Attention is absorbed:
 * q_lat,h = [W_UK,hᵀ q_nope,h | q_pe,h] is a query of r + d_r values against that row, the
 * weighted sum runs over the c prefix of the rows (latent output, r values), and W_UV,h maps it
 * to the head's value space. That is the same quantity as expanding K/V per head
 * ((W_UKᵀ q)·c = q·(W_UK c), W_UV Σ a c = Σ a W_UV c), computed without ever materializing K/V:
 * per key and head it costs r + d_r + r multiply-adds instead of d_n + d_r + d_v plus the
 * expansion of every cached latent (H·(d_n + d_v)·r per key per chunk). Decode and prefill both
 * use this form (docs/models.md: an expanded prefill path is not implemented).
 *
 * Threading (every thread calls kvt_mla_attention; barriers between stages):
 *   1 norm + activations (rows of X/XN/ACT)   2 q / kv down-projections (columns)
 *   3 q-latent norm, latent norm, RoPE(k_pe) (rows)   4 latent rows -> cache (thread 0) || q_b (columns)
 *   5 RoPE(q_pe) + absorption ((row, head) pairs)   6 attention (heads for decode, rows for prefill)
 *   7 latent -> value space ((row, head) pairs), activations   8 attn_output (columns) -> fw->tmp
 * Every (row, head) result is computed by the same instruction sequence whatever the split, so
 * chunking and thread count do not change the bits (model.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/quant.h"
#include "model_int.h"

#define HKEY(buf, suffix) snprintf(buf, sizeof(buf), "%s." suffix, kvt_arch_name(hp->arch))

kvt_status kvt_mla_hparams_load(const kvt_gguf *g, kvt_hparams *hp, uint32_t hd_v, char *err, size_t errlen) {
    kvt_mla_hparams *ml = &hp->mla;
    char key[160];
    HKEY(key, "attention.kv_lora_rank");
    if (!kvt_gguf_get_u32(g, key, &ml->kv_lora_rank)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    HKEY(key, "attention.q_lora_rank");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &ml->q_lora_rank))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    /* the low-rank q is used when its tensors are there (DeepSeek-V2-Lite has a plain attn_q) */
    if (!kvt_gguf_find_tensor(g, "blk.0.attn_q_a.weight")) ml->q_lora_rank = 0;
    if (ml->kv_lora_rank == 0 || ml->kv_lora_rank > 16384 || ml->q_lora_rank > 16384)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "MLA ranks (q %u, kv %u) out of range", ml->q_lora_rank,
                        ml->kv_lora_rank);
    if (hp->n_head_kv != hp->n_head)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                        "deepseek2: head_count_kv %u != head_count %u (split attn_k_b/attn_v_b layout) not supported",
                        hp->n_head_kv, hp->n_head);
    ml->d_rope = hp->n_rot;
    if (ml->d_rope >= hp->head_dim || hd_v == 0 || hd_v > 1024)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "deepseek2: rope dims %u / key_length %u / value_length %u invalid",
                        ml->d_rope, hp->head_dim, hd_v);
    ml->d_nope = hp->head_dim - ml->d_rope;
    ml->d_v = hd_v;

    const char *s;
    uint64_t slen;
    HKEY(key, "rope.scaling.type");
    ml->yarn = kvt_gguf_get_str(g, key, &s, &slen) && slen == 4 && !memcmp(s, "yarn", 4);
    float attn_factor = 1.0f, log_mul = 0.0f;
    HKEY(key, "rope.scaling.attn_factor");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_f32(g, key, &attn_factor))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    if (ml->yarn) {
        uint32_t orig = hp->n_ctx_train;
        HKEY(key, "rope.scaling.original_context_length");
        if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &orig))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
        HKEY(key, "rope.scaling.yarn_log_multiplier");
        if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_f32(g, key, &log_mul))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
        if (orig == 0 || !(hp->rope_freq_scale > 0.0f) || hp->rope_freq_scale > 1.0f || !isfinite(log_mul) ||
            fabsf(log_mul) > 10.0f)
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "deepseek2: YaRN parameters invalid");
        ml->yarn_orig_ctx = (float)orig;
        ml->yarn_log_mul = log_mul;
    }
    if (!isfinite(attn_factor) || !(attn_factor > 0.0f) || attn_factor > 100.0f)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "deepseek2: rope.scaling.attn_factor invalid");
    /* YaRN's mscale enters the softmax scale squared; the rotation itself keeps magnitude 1 */
    const double msc = attn_factor * (1.0 + (double)log_mul * log(1.0 / (double)hp->rope_freq_scale));
    ml->kq_scale = (float)(msc * msc / sqrt((double)hp->head_dim));
    return KVT_OK;
}

/* YaRN ramp (β_fast 32, β_slow 1): pairs below `lo` keep their frequency, pairs at or above `hi`
 * are interpolated by rope_freq_scale, the ones between blend linearly. */
static double yarn_corr_dim(const kvt_hparams *hp, double beta) {
    return (double)hp->n_rot * log((double)hp->mla.yarn_orig_ctx / (2.0 * M_PI * beta)) / (2.0 * log((double)hp->rope_base));
}

double kvt_mla_yarn_freq_factor(const kvt_hparams *hp, uint32_t i) {
    const double lo = fmax(0.0, floor(yarn_corr_dim(hp, 32.0)));
    const double hi = fmin((double)hp->n_rot - 1.0, ceil(yarn_corr_dim(hp, 1.0)));
    double y = ((double)i - lo) / fmax(0.001, hi - lo);
    const double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
    const double s = hp->rope_freq_scale;
    return (1.0 - ramp) * s + ramp;
}

kvt_status kvt_mla_load(kvt_model *m, const kvt_gguf *g, uint32_t il, kvt_mla_w *w, char *err, size_t errlen) {
    const kvt_hparams *hp = kvt_model_hparams(m);
    const kvt_mla_hparams *ml = &hp->mla;
    const uint32_t E = hp->n_embd, H = hp->n_head, R = ml->kv_lora_rank, DN = ml->d_nope, DR = ml->d_rope,
                   DV = ml->d_v, QL = ml->q_lora_rank;
    memset(w, 0, sizeof(*w));
    char nm[96];
    kvt_status st;
#define NM(suffix) (snprintf(nm, sizeof(nm), "blk.%u." suffix, il), nm)
    if (QL) {
        if ((st = kvt_load_mat(m, g, NM("attn_q_a.weight"), E, QL, 1, true, &w->wq_a, err, errlen))) return st;
        if ((st = kvt_load_vec(m, g, NM("attn_q_a_norm.weight"), QL, true, &w->q_a_norm, err, errlen))) return st;
        if ((st = kvt_load_mat(m, g, NM("attn_q_b.weight"), QL, H * (DN + DR), 1, true, &w->wq_b, err, errlen))) return st;
    } else {
        if ((st = kvt_load_mat(m, g, NM("attn_q.weight"), E, H * (DN + DR), 1, true, &w->wq, err, errlen))) return st;
    }
    if ((st = kvt_load_mat(m, g, NM("attn_kv_a_mqa.weight"), E, R + DR, 1, true, &w->wkv_a, err, errlen))) return st;
    if ((st = kvt_load_vec(m, g, NM("attn_kv_a_norm.weight"), R, true, &w->kv_a_norm, err, errlen))) return st;
    if ((st = kvt_load_mat(m, g, NM("attn_kv_b.weight"), R, H * (DN + DV), 1, true, &w->wkv_b, err, errlen))) return st;
    if ((st = kvt_load_mat(m, g, NM("attn_output.weight"), H * DV, E, 1, true, &w->wo, err, errlen))) return st;
#undef NM
    /* absorbed matrices, f32: W_UK,h transposed and W_UV,h, from attn_kv_b's per-head row blocks */
    const size_t nkvb = (size_t)R * H * (DN + DV);
    float *kvb = malloc(nkvb * sizeof(float));
    w->uk_t = malloc((size_t)H * R * DN * sizeof(float));
    w->uv = malloc((size_t)H * DV * R * sizeof(float));
    if (!kvb || !w->uk_t || !w->uv) {
        free(kvb);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory for the absorbed MLA matrices");
    }
    kvt_dequant_ref(w->wkv_b.type, w->wkv_b.data, kvb, (int64_t)nkvb);
    for (uint32_t h = 0; h < H; h++) {
        const float *blk = kvb + (size_t)h * (DN + DV) * R; /* rows [h(DN+DV), (h+1)(DN+DV)) */
        for (uint32_t i = 0; i < DN; i++)
            for (uint32_t c = 0; c < R; c++) w->uk_t[((size_t)h * R + c) * DN + i] = blk[(size_t)i * R + c];
        memcpy(w->uv + (size_t)h * DV * R, blk + (size_t)DN * R, (size_t)DV * R * sizeof(float));
    }
    free(kvb);
    return KVT_OK;
}

void kvt_mla_free(kvt_mla_w *w) {
    free(w->uk_t);
    free(w->uv);
    w->uk_t = w->uv = NULL;
}

void kvt_mla_attention(const kvt_fwd *fw, const kvt_mla_w *w, const float *attn_norm, uint32_t il) {
    const kvt_hparams *hp = fw->hp;
    const kvt_mla_hparams *ml = &hp->mla;
    kvt_ext_scratch *xs = fw->ext;
    kvt_threadpool *tp = fw->tp;
    const int ith = fw->ith, nth = fw->nth;
    const uint32_t n = fw->n, E = hp->n_embd, H = hp->n_head, R = ml->kv_lora_rank, DR = ml->d_rope;
    const uint32_t DN = ml->d_nope, DV = ml->d_v, DQ = DN + DR, QL = ml->q_lora_rank, LR = R + DR;
    const float eps = hp->norm_eps;
    uint32_t s0, s1; /* this thread's rows of the shared buffers */
    kvt_split_range(n, ith, nth, &s0, &s1);

    /* 1. attention norm, activations of the down-projections */
    for (uint32_t r = fw->r0; r < fw->r1; r++) kvt_rmsnorm(fw->XN + (size_t)r * E, fw->X + (size_t)r * E, attn_norm, E, eps);
    const kvt_wmat *down[2] = {QL ? &w->wq_a : &w->wq, &w->wkv_a};
    float *down_out[2] = {QL ? xs->qa : xs->q, xs->kva};
    kvt_quantize_rows(fw->ACT, down, 2, fw->XN, fw->r0, fw->r1);
    if (!fw->repl) kvt_threadpool_barrier(tp);
    /* 2. q (or q latent) and [c | k_pe] */
    kvt_matmul_group(fw->ACT, down, down_out, 2, n, ith, nth);
    kvt_threadpool_barrier(tp);
    /* 3. q-latent norm and its activations; latent norm; RoPE of the shared key */
    const kvt_wmat *qb[1] = {&w->wq_b};
    for (uint32_t r = s0; r < s1; r++) {
        if (QL) kvt_rmsnorm(xs->qa + (size_t)r * QL, xs->qa + (size_t)r * QL, w->q_a_norm, QL, eps);
        float *lat = xs->kva + (size_t)r * LR;
        kvt_rmsnorm(lat, lat, w->kv_a_norm, R, eps);
        kvt_rope_apply(lat + R, fw->rope_cs + (size_t)r * fw->rope_stride, DR, hp->rope_neox);
    }
    if (QL) kvt_quantize_rows(fw->act, qb, 1, xs->qa, s0, s1);
    kvt_threadpool_barrier(tp);
    /* 4. the latent rows go to the cache (thread 0 only: kv.h allows one writer per sequence) while
     *    every thread takes its columns of the q up-projection */
    if (ith == 0)
        for (uint32_t r = 0; r < n; r++) kvt_seq_write_kv(fw->seq, il, fw->pos0 + r, xs->kva + (size_t)r * LR, NULL);
    if (QL) {
        float *qo[1] = {xs->q};
        kvt_matmul_group(fw->act, qb, qo, 1, n, ith, nth);
    }
    kvt_threadpool_barrier(tp);
    /* 5. per (row, head): RoPE of q_pe, absorption of q_nope into latent space */
    uint32_t p0, p1;
    kvt_split_range(n * H, ith, nth, &p0, &p1);
    for (uint32_t pr = p0; pr < p1; pr++) {
        const uint32_t r = pr / H, h = pr % H;
        float *qh = xs->q + (size_t)r * H * DQ + (size_t)h * DQ;
        float *qa = xs->qabs + (size_t)r * H * LR + (size_t)h * LR;
        kvt_rope_apply(qh + DN, fw->rope_cs + (size_t)r * fw->rope_stride, DR, hp->rope_neox);
        const float *ukt = w->uk_t + (size_t)h * R * DN;
        for (uint32_t c = 0; c < R; c++) qa[c] = kvt_dot_f32(ukt + (size_t)c * DN, qh, DN);
        memcpy(qa + R, qh + DN, (size_t)DR * sizeof(float));
    }
    kvt_threadpool_barrier(tp);
    /* 6. attention over the latent rows (one KV head shared by all H query heads): a decode row
     *    splits its heads, a prefill chunk its rows (balanced by visible keys) */
    if (n == 1) {
        uint32_t h0, h1;
        kvt_split_range(H, ith, nth, &h0, &h1);
        if (h0 < h1)
            kvt_attention(fw->seq, il, xs->qabs, 1, H * LR, fw->pos0, H, ml->kq_scale, h0, h1, xs->olat, H * R,
                          fw->att_scratch);
    } else {
        const uint32_t q0 = kvt_att_row_split(n, fw->pos0, (uint32_t)ith, (uint32_t)nth);
        const uint32_t q1 = kvt_att_row_split(n, fw->pos0, (uint32_t)ith + 1, (uint32_t)nth);
        if (q0 < q1)
            kvt_attention(fw->seq, il, xs->qabs + (size_t)q0 * H * LR, q1 - q0, H * LR, fw->pos0 + q0, H, ml->kq_scale,
                          0, H, xs->olat + (size_t)q0 * H * R, H * R, fw->att_scratch);
    }
    kvt_threadpool_barrier(tp);
    /* 7. per (row, head): latent output -> value space; then the output projection's activations */
    for (uint32_t pr = p0; pr < p1; pr++) {
        const uint32_t r = pr / H, h = pr % H;
        const float *ol = xs->olat + (size_t)r * H * R + (size_t)h * R;
        float *o = xs->att + (size_t)r * H * DV + (size_t)h * DV;
        const float *uv = w->uv + (size_t)h * DV * R;
        for (uint32_t i = 0; i < DV; i++) o[i] = kvt_dot_f32(uv + (size_t)i * R, ol, R);
    }
    kvt_threadpool_barrier(tp);
    const kvt_wmat *wo[1] = {&w->wo};
    float *wo_out[1] = {fw->tmp};
    kvt_quantize_rows(fw->act, wo, 1, xs->att, s0, s1);
    kvt_threadpool_barrier(tp);
    /* 8. output projection */
    kvt_matmul_group(fw->act, wo, wo_out, 1, n, ith, nth);
    kvt_threadpool_barrier(tp);
}
