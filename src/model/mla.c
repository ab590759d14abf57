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
 * expansion of every cached latent (H·(d_n + d_v)·r per key per chunk). Decode always uses this
 * form, and so does prefill by default (kvt_mla_prefill ABSORBED: every row the same arithmetic
 * whatever the chunking, so a cache hit equals a cold run bit for bit).
 *
 * Expanded prefill (opt-in, --mla-prefill expanded|auto; model.h kvt_mla_prefill): a chunk of
 * n > 1 rows expands the cached latents of keys 0 .. pos0+n-1 into a temporary per-head f16 K/V
 * with attn_kv_b and the normal matmul and attention kernels (mla_expanded_attention), which pays
 * off for long chunks over short contexts (docs/models.md "MLA prefill"). AUTO picks per chunk by
 * the cost model at kvt_mla_prefill_expands.
 *
 * Threading (every thread calls kvt_mla_attention; barriers between stages):
 *   1 norm + activations (rows of X/XN/ACT)   2 q / kv down-projections (columns)
 *   3 q-latent norm, latent norm, RoPE(k_pe) (rows)   4 latent rows -> cache (thread 0) || q_b (columns)
 *   5 RoPE(q_pe) + absorption ((row, head) pairs)   6 attention (heads for decode, rows for prefill)
 *   7 latent -> value space ((row, head) pairs), activations   8 attn_output (columns) -> fw->tmp
 * (expanded: 5 is RoPE only; 6-7 are mla_expanded_attention, which writes value space directly)
 * Every (row, head) result is computed by the same instruction sequence whatever the split, so
 * chunking and thread count do not change the bits (model.h). Expanded chunks keep that among
 * themselves (a key expands to the same K/V in any chunk; thread count and head grouping do not
 * matter), but not against absorbed ones: hence the non-default modes' own cache key.
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
    /* repacked attn_kv_b for the expanded prefill's expansion GEMM (bit-identical to the row-major
     * kernel; best effort, as for the dense matrices in model.c) */
    w->wkv_b.packed = kvt_packed_create(w->wkv_b.type, w->wkv_b.data, w->wkv_b.n_in, w->wkv_b.n_out);
    return KVT_OK;
}

void kvt_mla_free(kvt_mla_w *w) {
    free(w->uk_t);
    free(w->uv);
    kvt_packed_free(w->wkv_b.packed);
    w->wkv_b.packed = NULL;
    w->uk_t = w->uv = NULL;
}

/* ------------------------------------------------------------------ prefill mode */

int kvt_mla_prefill_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "absorbed")) return KVT_MLA_PREFILL_ABSORBED;
    if (!strcmp(s, "expanded")) return KVT_MLA_PREFILL_EXPANDED;
    if (!strcmp(s, "auto")) return KVT_MLA_PREFILL_AUTO;
    return -1;
}

const char *kvt_mla_prefill_name(kvt_mla_prefill mode) {
    switch (mode) {
    case KVT_MLA_PREFILL_EXPANDED: return "expanded";
    case KVT_MLA_PREFILL_AUTO: return "auto";
    default: return "absorbed";
    }
}

const char *kvt_mla_prefill_numerics_tag(const kvt_hparams *hp, kvt_mla_prefill mode) {
    if (!hp->mla.kv_lora_rank) return "";
    switch (mode) {
    case KVT_MLA_PREFILL_EXPANDED: return "+mla-expanded";
    case KVT_MLA_PREFILL_AUTO: return "+mla-auto";
    default: return "";
    }
}

/* AUTO's cost model, in units of one multiply-add of the attention kernel. For a chunk of n rows at
 * pos0 over T = pos0 + n keys (pairs = n·pos0 + n(n+1)/2 causal (query, key) pairs per head),
 * with X = H·(d_nope + d_v)·r:
 *   absorbed = ABSORB_COST · n·X       (W_UK,hᵀ q_nope and W_UV,h o_lat per row and head, f32 dots)
 *            + pairs·H·(2r + d_rope)   (latent scores and latent weighted sum)
 *   expanded = EXPAND_COST · T·X       (attn_kv_b over every cached latent, the model's matmul)
 *            + pairs·H·(d_nope + d_rope + d_v)
 * and the chunk runs expanded iff expanded < absorbed. The two weights are measured, not derived:
 * the absorption's f32 dot products stream the f32 W_UK/W_UV copies (4 MB at V2-Lite's shape) once
 * per row and run ~4.5x slower per multiply-add than the attention kernel, while the expansion
 * GEMM on the quantized attn_kv_b runs at ~1.8x (bench/mla_prefill.c, docs/models.md). At V2-Lite's
 * shape the per-pair saving is H·768 and the crossover is pairs·768 = 131072·(1.8·T - 4.5·n): a
 * 512-token chunk from position 0 expands (2.7x cheaper), 64 tokens over 4096 keys do not. */
#define KVT_MLA_EXPAND_COST 1.8
#define KVT_MLA_ABSORB_COST 4.5

bool kvt_mla_prefill_expands(const kvt_hparams *hp, kvt_mla_prefill mode, uint32_t n, uint32_t pos0) {
    const kvt_mla_hparams *ml = &hp->mla;
    if (n <= 1 || !ml->kv_lora_rank || mode == KVT_MLA_PREFILL_ABSORBED) return false;
    if (mode == KVT_MLA_PREFILL_EXPANDED) return true;
    const double H = hp->n_head, R = ml->kv_lora_rank, T = (double)pos0 + n;
    const double pairs = (double)n * pos0 + (double)n * (n + 1) / 2, X = H * (ml->d_nope + ml->d_v) * R;
    const double absorbed = KVT_MLA_ABSORB_COST * n * X + pairs * H * (2 * R + ml->d_rope);
    const double expanded = KVT_MLA_EXPAND_COST * T * X + pairs * H * (ml->d_nope + ml->d_rope + ml->d_v);
    return expanded < absorbed;
}

/* ------------------------------------------------------------------ expanded prefill: scratch */

#define KVT_MLA_EXP_TILE 256            /* keys expanded per GEMM */
#define KVT_MLA_EXP_BYTES (64u << 20)   /* target bytes of the temporary K/V (head grouping) */

void kvt_mla_expand_free(kvt_ext_scratch *xs) {
    kvt_seq_free(xs->exp_seq);
    kvt_block_pool_free(xs->exp_pool);
    kvt_kv_layout_free(xs->exp_layout);
    xs->exp_seq = NULL;
    xs->exp_pool = NULL;
    xs->exp_layout = NULL;
    free(xs->exp_lat);
    free(xs->exp_c);
    free(xs->exp_act);
    free(xs->exp_y);
    free(xs->exp_kv);
    xs->exp_lat = xs->exp_c = xs->exp_y = xs->exp_kv = NULL;
    xs->exp_act = NULL;
    xs->exp_g = 0;
    xs->exp_nth = 0;
    xs->exp_on = false;
}

kvt_status kvt_mla_prefill_setup(kvt_ext_scratch *xs, const kvt_hparams *hp, kvt_mla_prefill mode, uint32_t n,
                                 uint32_t pos0, int nth) {
    xs->exp_on = false;
    if (!kvt_mla_prefill_expands(hp, mode, n, pos0)) return KVT_OK;
    const kvt_mla_hparams *ml = &hp->mla;
    const uint32_t H = hp->n_head, R = ml->kv_lora_rank, DQ = ml->d_nope + ml->d_rope, DV = ml->d_v;
    const uint32_t T = pos0 + n, KT = KVT_MLA_EXP_TILE;
    /* Heads per group: the largest divisor of H whose f16 K/V for T keys fits KVT_MLA_EXP_BYTES
     * (at least 1 head). The attention of a (query, head) pair does not depend on which heads share
     * its pass (kv/attention.c), so the grouping never changes results. */
    const double head_bytes = (double)T * (DQ + DV) * 2;
    uint32_t G = 1;
    for (uint32_t g = H; g > 1; g--)
        if (H % g == 0 && g * head_bytes <= KVT_MLA_EXP_BYTES) {
            G = g;
            break;
        }
    if (!xs->exp_y) {
        size_t ab = 0; /* the activation format of whatever type attn_kv_b has in this layer */
        for (uint32_t t = 0; t < KVT_TYPE_COUNT; t++)
            if (kvt_type_supported(t) && kvt_act_bytes(t, R, KT) > ab) ab = kvt_act_bytes(t, R, KT);
        xs->exp_lat = kvt_aligned_alloc(64, sizeof(float) * KT * (R + ml->d_rope));
        xs->exp_c = kvt_aligned_alloc(64, sizeof(float) * KT * R);
        xs->exp_act = kvt_aligned_alloc(64, ab + 64);
        xs->exp_y = kvt_aligned_alloc(64, sizeof(float) * KT * H * (ml->d_nope + DV));
        if (!xs->exp_lat || !xs->exp_c || !xs->exp_act || !xs->exp_y) goto nomem;
    }
    if (xs->exp_nth < nth) {
        free(xs->exp_kv);
        xs->exp_kv = kvt_aligned_alloc(64, sizeof(float) * (size_t)nth * H * (DQ + DV));
        if (!xs->exp_kv) goto nomem;
        xs->exp_nth = nth;
    }
    if (xs->exp_g != G || !xs->exp_seq) {
        kvt_seq_free(xs->exp_seq);
        kvt_block_pool_free(xs->exp_pool);
        kvt_kv_layout_free(xs->exp_layout);
        xs->exp_seq = NULL;
        xs->exp_pool = NULL;
        xs->exp_layout = NULL;
        const kvt_codec f16 = {.kind = KVT_CODEC_F16};
        const kvt_layer_desc d = {.kind = KVT_KIND_FULL, .n_kv_heads = G, .head_dim_k = DQ, .head_dim_v = DV, .codec = f16};
        char err[160];
        if (kvt_kv_layout_create(&d, 1, KVT_DEFAULT_BLOCK_TOKENS, f16, 0, &xs->exp_layout, err, sizeof err) != KVT_OK ||
            !(xs->exp_pool = kvt_block_pool_create(xs->exp_layout, 0)) ||
            kvt_seq_create(xs->exp_pool, 0, &xs->exp_seq) != KVT_OK)
            goto nomem;
        xs->exp_g = G;
    }
    /* the sequence is never committed (len 0): this makes [0, T) writable, keeping its blocks */
    if (kvt_seq_prepare(xs->exp_seq, T) != KVT_OK) goto nomem;
    xs->exp_on = true;
    return KVT_OK;
nomem:
    kvt_mla_expand_free(xs);
    return KVT_ERR_NOMEM;
}

/* ------------------------------------------------------------------ expanded prefill: attention */

/* The chunk's attention over K/V expanded from every cached latent (xs->exp_on), heads in groups
 * of G = xs->exp_g. Per group, in tiles of KVT_MLA_EXP_TILE keys: (a) the tile's latent rows are
 * decoded from the cache (the f16 rows absorbed attention reads: a key expands to the same K/V
 * whichever chunk computed it) and quantized for attn_kv_b (rows split over threads); (b) the
 * group's attn_kv_b columns, [k_nope | v] per head, over the tile (columns split, packed GEMM);
 * (c) per key, K = [k_nope,h | k_pe] and V = v_h of the group's heads go to the temporary f16
 * sequence (rows split: kvt_seq_write_kv of distinct prepared positions touches disjoint bytes of
 * this private sequence). Then kvtier's attention kernel runs over it for the chunk's rows (split
 * by visible keys), writing each head's value-space output straight into xs->att. */
static void mla_expanded_attention(const kvt_fwd *fw, const kvt_mla_w *w, uint32_t il) {
    const kvt_hparams *hp = fw->hp;
    const kvt_mla_hparams *ml = &hp->mla;
    kvt_ext_scratch *xs = fw->ext;
    kvt_threadpool *tp = fw->tp;
    const int ith = fw->ith, nth = fw->nth;
    const uint32_t n = fw->n, H = hp->n_head, R = ml->kv_lora_rank, DR = ml->d_rope, DN = ml->d_nope, DV = ml->d_v;
    const uint32_t DQ = DN + DR, LR = R + DR, KB = DN + DV, W = H * KB, T = fw->pos0 + n, G = xs->exp_g;
    const kvt_wmat *kvb = &w->wkv_b;
    float *krow = xs->exp_kv + (size_t)ith * H * (DQ + DV), *vrow = krow + (size_t)H * DQ;
    const uint32_t q0 = kvt_att_row_split(n, fw->pos0, (uint32_t)ith, (uint32_t)nth);
    const uint32_t q1 = kvt_att_row_split(n, fw->pos0, (uint32_t)ith + 1, (uint32_t)nth);
    for (uint32_t g0 = 0; g0 < H; g0 += G) {
        for (uint32_t t0 = 0; t0 < T; t0 += KVT_MLA_EXP_TILE) {
            const uint32_t m = T - t0 < KVT_MLA_EXP_TILE ? T - t0 : KVT_MLA_EXP_TILE;
            uint32_t a, b;
            kvt_split_range(m, ith, nth, &a, &b);
            if (a < b) { /* (a) */
                kvt_seq_read_rows(fw->seq, il, 0, 0, t0 + a, t0 + b, xs->exp_lat + (size_t)a * LR, LR);
                for (uint32_t r = a; r < b; r++)
                    memcpy(xs->exp_c + (size_t)r * R, xs->exp_lat + (size_t)r * LR, (size_t)R * sizeof(float));
                kvt_act_quantize(kvb->type, xs->exp_c, R, a, b, xs->exp_act);
            }
            kvt_threadpool_barrier(tp);
            int64_t o0, o1; /* (b) */
            kvt_col_range(G * KB, ith, nth, &o0, &o1);
            if (o0 < o1) {
                o0 += (int64_t)g0 * KB, o1 += (int64_t)g0 * KB;
                if (kvb->packed)
                    kvt_matmul_packed(kvb->packed, xs->exp_act, m, xs->exp_y, W, o0, o1);
                else
                    kvt_matmul_rows(kvb->type, kvb->data, R, xs->exp_act, m, xs->exp_y, W, o0, o1);
            }
            kvt_threadpool_barrier(tp);
            for (uint32_t r = a; r < b; r++) { /* (c) */
                const float *y = xs->exp_y + (size_t)r * W, *kpe = xs->exp_lat + (size_t)r * LR + R;
                for (uint32_t hh = 0; hh < G; hh++) {
                    const float *yh = y + (size_t)(g0 + hh) * KB;
                    memcpy(krow + (size_t)hh * DQ, yh, (size_t)DN * sizeof(float));
                    memcpy(krow + (size_t)hh * DQ + DN, kpe, (size_t)DR * sizeof(float));
                    memcpy(vrow + (size_t)hh * DV, yh + DN, (size_t)DV * sizeof(float));
                }
                kvt_seq_write_kv(xs->exp_seq, 0, t0 + r, krow, vrow);
            }
            kvt_threadpool_barrier(tp);
        }
        /* fw->att_scratch covers kvt_attention_scratch_floats(exp_layout, T) (model.c ensures it) */
        if (q0 < q1)
            kvt_attention(xs->exp_seq, 0, xs->q + (size_t)q0 * H * DQ + (size_t)g0 * DQ, q1 - q0, H * DQ, fw->pos0 + q0,
                          G, ml->kq_scale, 0, G, xs->att + (size_t)q0 * H * DV + (size_t)g0 * DV, H * DV, fw->att_scratch);
        if (g0 + G < H) kvt_threadpool_barrier(tp); /* the next group rewrites the temporary K/V */
    }
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
    /* 4. the latent rows go to the cache (thread 0 only, as in model.c) while
     *    every thread takes its columns of the q up-projection */
    if (ith == 0)
        for (uint32_t r = 0; r < n; r++) kvt_seq_write_kv(fw->seq, il, fw->pos0 + r, xs->kva + (size_t)r * LR, NULL);
    if (QL) {
        float *qo[1] = {xs->q};
        kvt_matmul_group(fw->act, qb, qo, 1, n, ith, nth);
    }
    kvt_threadpool_barrier(tp);
    /* 5. per (row, head): RoPE of q_pe, absorption of q_nope into latent space (expanded: RoPE only) */
    const bool expand = xs->exp_on && n > 1;
    uint32_t p0, p1;
    kvt_split_range(n * H, ith, nth, &p0, &p1);
    for (uint32_t pr = p0; pr < p1; pr++) {
        const uint32_t r = pr / H, h = pr % H;
        float *qh = xs->q + (size_t)r * H * DQ + (size_t)h * DQ;
        float *qa = xs->qabs + (size_t)r * H * LR + (size_t)h * LR;
        kvt_rope_apply(qh + DN, fw->rope_cs + (size_t)r * fw->rope_stride, DR, hp->rope_neox);
        if (expand) continue;
        const float *ukt = w->uk_t + (size_t)h * R * DN;
        for (uint32_t c = 0; c < R; c++) qa[c] = kvt_dot_f32(ukt + (size_t)c * DN, qh, DN);
        memcpy(qa + R, qh + DN, (size_t)DR * sizeof(float));
    }
    kvt_threadpool_barrier(tp);
    if (expand) {
        /* 6-7 expanded: attention over the expanded K/V, output already in value space */
        mla_expanded_attention(fw, w, il);
        goto out_proj;
    }
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
out_proj:
    kvt_threadpool_barrier(tp);
    const kvt_wmat *wo[1] = {&w->wo};
    float *wo_out[1] = {fw->tmp};
    kvt_quantize_rows(fw->act, wo, 1, xs->att, s0, s1);
    kvt_threadpool_barrier(tp);
    /* 8. output projection */
    kvt_matmul_group(fw->act, wo, wo_out, 1, n, ith, nth);
    kvt_threadpool_barrier(tp);
}
