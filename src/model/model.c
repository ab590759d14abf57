/*
 * model.c — weight loading/validation and the CPU forward pass (see model.h).
 *
 * Architectures: model.c reads the architecture's kvt_arch_ops table (model_int.h; one arch_*.c
 * each, registered in arch_list.h) and never its name: the shared hparams keys plus the table's
 * hook, the dense layer's tensors plus the optional ones the table names, the layers' cache kinds,
 * and the flags of the dense layer loop below. Per layer, an MLA attention (mla.c) or MoE FFN
 * (moe.c) set by the table's load_layer hook replaces the dense sub-block; an architecture with
 * its own pass (kvt_arch_pass) replaces the loop.
 *
 * Forward pass structure: one kvt_threadpool_run per ubatch chunk; inside it every thread walks all
 * layers and ops, each op splitting its own work by (ith, nth), with a barrier between ops:
 *   row ops (norms, residuals, RoPE, activation quantization): rows split across threads;
 *   matmuls: output columns split in contiguous ranges aligned to 16, all rows at once, sharing one
 *            quantized copy of the input;
 *   attention: KV heads split across threads, each thread with private scratch; a decode row whose
 *            KV heads do not divide among the threads runs split-K (kvt_attention_split: keys,
 *            then heads, then V columns split across threads) past KVT_ATT_SPLIT_MIN_KEYS keys,
 *            else splits its query heads; a prefill chunk splits its rows then.
 * Every per-row computation depends only on that row (and the KV of earlier positions), so results
 * are bit-identical whatever the chunking or thread count (kernels/quant.h batch invariance).
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/quant.h"
#include "../kernels/vec.h"
#include "../util/threadpool.h"
#include "deltanet.h"
#include "model_int.h"

/* ------------------------------------------------------------------ model */

struct kvt_model {
    kvt_hparams hp;
    kvt_wmat tok_embd, output;
    const float *output_norm;
    const kvt_arch_ops *ops; /* the architecture (arch_*.c), from the registry */
    kvt_layer_w *layers;
    uint8_t kind[KVT_MAX_LAYERS]; /* kvt_layer_kind of each layer (ops->layer_kinds) */
    float *vecs;          /* owned f32 copies of every 1-D tensor (norms, biases, rope_freqs) */
    size_t vecs_used, vecs_cap;
    double *inv_freq[2];  /* [0] global / default layers, [1] window layers (ops->window_rope): n_rot/2 each */
    const float *rope_freqs; /* rope_freqs.weight (llama3 factors) or NULL, in vecs */
    bool latent;          /* some layer is KVT_KIND_MLA (its chunks are set up by mla.c) */
    uint64_t weight_bytes;
    void *arch_state;     /* ops->pass only: its state (pass->load), owned */
    uint32_t n_bf16x;     /* matrices packed as KVT_TYPE_BF16X (kvt_wmat_prepare) */
    uint32_t n_f16x;      /* matrices packed as KVT_TYPE_F16X or BF16G (kvt_wmat_prepare) */
    uint64_t copy_bytes;  /* bytes of the packed / bf16x copies kvt_wmat_prepare made */
};

/* ------------------------------------------------------------------ registry (arch_list.h) */

static const struct {
    kvt_arch arch;
    const kvt_arch_ops *ops;
} arch_registry[] = {
#define KVT_ARCH_ENTRY(id, value, ops) {KVT_ARCH_##id, &ops},
#include "arch_list.h"
};

/* The registry index of the architecture named s, or -1. */
static int arch_find(const char *s) {
    for (size_t i = 0; i < KVT_ARRAY_LEN(arch_registry); i++)
        if (!strcmp(s, arch_registry[i].ops->name)) return (int)i;
    return -1;
}

const char *kvt_arch_name(kvt_arch a) {
    for (size_t i = 0; i < KVT_ARRAY_LEN(arch_registry); i++)
        if (arch_registry[i].arch == a) return arch_registry[i].ops->name;
    return "?";
}

/* ------------------------------------------------------------------ hparams */

/* Read a u32 hparam that may be stored as a scalar or as a per-layer array (all equal required). */
static kvt_status get_u32_layered(const kvt_gguf *g, const char *key, uint32_t n_layer, uint32_t *out,
                                  bool *found, char *err, size_t errlen) {
    *found = false;
    if (kvt_gguf_get_u32(g, key, out)) {
        *found = true;
        return KVT_OK;
    }
    kvt_gguf_vtype et;
    uint64_t n;
    const void *data;
    if (kvt_gguf_find_key(g, key) < 0) return KVT_OK;
    if (!kvt_gguf_get_arr(g, key, &et, &n, &data) || n == 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: expected an integer or integer array", key);
    if (n != n_layer)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: array has %llu entries, expected %u", key,
                        (unsigned long long)n, n_layer);
    int64_t v0 = 0;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        if (!kvt_gguf_get_arr_i64(g, key, i, &v))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: expected an integer array", key);
        if (i == 0) v0 = v;
        else if (v != v0)
            return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "key %s: per-layer values differ (not supported)", key);
    }
    if (v0 < 0 || v0 > UINT32_MAX) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: value out of range", key);
    *out = (uint32_t)v0;
    *found = true;
    return KVT_OK;
}

static const float *vec_alloc(kvt_model *m, size_t n) {
    if (m->vecs_used + n > m->vecs_cap) return NULL;
    float *p = m->vecs + m->vecs_used;
    m->vecs_used += n;
    return p;
}

/* Find a 1-D tensor of n elements, dequantize it into model-owned f32 storage. */
kvt_status kvt_load_vec(kvt_model *m, const kvt_gguf *g, const char *name, uint64_t n, bool required,
                        const float **out, char *err, size_t errlen) {
    *out = NULL;
    const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
    if (!t) {
        if (!required) return KVT_OK;
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->ne[0] != (int64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': shape [%lld,%lld], expected [%llu]", name,
                        (long long)t->ne[0], (long long)t->ne[1], (unsigned long long)n);
    if (t->type != KVT_TYPE_F32 && t->type != KVT_TYPE_F16 && t->type != KVT_TYPE_BF16)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "tensor '%s': type %s not supported for a vector (f32/f16/bf16)",
                        name, kvt_type_name(t->type));
    if (kvt_type_row_bytes(t->type, n) != t->nbytes)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': size mismatch", name);
    float *dst = (float *)vec_alloc(m, n);
    if (!dst) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': internal vector budget exceeded", name);
    kvt_dequant_ref(t->type, t->data, dst, (int64_t)n);
    m->weight_bytes += t->nbytes;
    *out = dst;
    return KVT_OK;
}

/* Find a weight matrix [n_in, n_out] of a supported type, or (n_mat > 1) a 3-D tensor of n_mat such
 * matrices stacked along ne[2] (MoE experts), returned as out[0..n_mat). */
kvt_status kvt_load_mat(kvt_model *m, const kvt_gguf *g, const char *name, uint32_t n_in, uint32_t n_out,
                        uint32_t n_mat, bool required, kvt_wmat *out, char *err, size_t errlen) {
    memset(out, 0, sizeof(*out) * n_mat);
    const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
    if (!t) {
        if (!required) return KVT_OK;
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->ne[0] != (int64_t)n_in || t->ne[1] != (int64_t)n_out || t->ne[2] != (int64_t)n_mat || t->ne[3] != 1)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': shape [%lld,%lld,%lld], expected [%u,%u,%u]", name,
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], n_in, n_out, n_mat);
    if (!kvt_type_supported(t->type))
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "tensor '%s': unsupported type %s (%u)", name,
                        kvt_type_name(t->type), t->type);
    uint64_t rb = kvt_type_row_bytes(t->type, n_in);
    if (rb == 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': row of %u not a multiple of the %s block size",
                        name, n_in, kvt_type_name(t->type));
    uint64_t mat_bytes, total;
    if (!kvt_mul_ok(rb, n_out, &mat_bytes) || !kvt_mul_ok(mat_bytes, n_mat, &total) || total != t->nbytes)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "tensor '%s': size mismatch", name);
    for (uint32_t e = 0; e < n_mat; e++) {
        out[e].data = (const uint8_t *)t->data + (uint64_t)e * mat_bytes;
        out[e].type = t->type;
        out[e].n_in = n_in;
        out[e].n_out = n_out;
        out[e].row_bytes = rb;
    }
    m->weight_bytes += t->nbytes;
    return KVT_OK;
}

static kvt_status load_mat(kvt_model *m, const kvt_gguf *g, const char *name, uint32_t n_in, uint32_t n_out,
                           bool required, kvt_wmat *out, char *err, size_t errlen) {
    return kvt_load_mat(m, g, name, n_in, n_out, 1, required, out, err, errlen);
}

#define HKEY(buf, fmt_suffix) snprintf(buf, sizeof(buf), "%s." fmt_suffix, an)

/* The shared keys of every architecture, then the architecture's own (ops->hparams). */
static kvt_status load_hparams(const kvt_gguf *g, kvt_hparams *hp, const kvt_arch_ops **ops, char *err,
                               size_t errlen) {
    const char *s;
    uint64_t slen;
    if (!kvt_gguf_get_str(g, "general.architecture", &s, &slen))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key general.architecture");
    char arch[64];
    size_t cl = slen < sizeof(arch) - 1 ? (size_t)slen : sizeof(arch) - 1;
    memcpy(arch, s, cl);
    arch[cl] = 0;
    for (size_t i = 0; i < cl; i++)
        if ((unsigned char)arch[i] < 32 || (unsigned char)arch[i] > 126) arch[i] = '?';
    int a = arch_find(arch);
    if (a < 0 || slen != cl) return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "unsupported architecture '%s'", arch);
    memset(hp, 0, sizeof(*hp));
    hp->arch = arch_registry[a].arch;
    const kvt_arch_ops *o = *ops = arch_registry[a].ops;
    const char *an = o->name;
    if (kvt_gguf_get_str(g, "general.name", &s, &slen)) {
        size_t nl = slen < sizeof(hp->name) - 1 ? (size_t)slen : sizeof(hp->name) - 1;
        memcpy(hp->name, s, nl);
        hp->name[nl] = 0;
    }

    char key[160];
    bool found;
    kvt_status st;
    HKEY(key, "context_length");
    if (!kvt_gguf_get_u32(g, key, &hp->n_ctx_train)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    HKEY(key, "embedding_length");
    if (!kvt_gguf_get_u32(g, key, &hp->n_embd)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    HKEY(key, "block_count");
    if (!kvt_gguf_get_u32(g, key, &hp->n_layer)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    if (hp->n_layer == 0 || hp->n_layer > KVT_MAX_LAYERS)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "n_layer %u out of range [1, %d]", hp->n_layer, KVT_MAX_LAYERS);
    if (hp->n_embd == 0 || hp->n_embd > 65536)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "n_embd %u out of range", hp->n_embd);
    if (hp->n_ctx_train == 0) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "context_length is 0");

    HKEY(key, "feed_forward_length");
    if ((st = get_u32_layered(g, key, hp->n_layer, &hp->n_ff, &found, err, errlen)) != KVT_OK) return st;
    if (!found) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    HKEY(key, "attention.head_count");
    if ((st = get_u32_layered(g, key, hp->n_layer, &hp->n_head, &found, err, errlen)) != KVT_OK) return st;
    if (!found) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    HKEY(key, "attention.head_count_kv");
    if ((st = get_u32_layered(g, key, hp->n_layer, &hp->n_head_kv, &found, err, errlen)) != KVT_OK) return st;
    if (!found) hp->n_head_kv = hp->n_head;
    if (hp->n_ff == 0 || hp->n_ff > (1u << 20)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "n_ff %u out of range", hp->n_ff);
    if (hp->n_head == 0 || hp->n_head > 1024) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "n_head %u out of range", hp->n_head);
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "n_head_kv %u does not divide n_head %u", hp->n_head_kv, hp->n_head);

    uint32_t hd_k = hp->n_embd / hp->n_head, hd_v;
    HKEY(key, "attention.key_length");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &hd_k))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    hd_v = hd_k;
    HKEY(key, "attention.value_length");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &hd_v))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    if (hd_k == 0 || hd_k > 1024 || (hd_k & 1)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "head_dim %u out of range", hd_k);
    if (hd_v != hd_k && !o->kv_dims_differ) /* else the hparams hook checks its dims */
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "key_length %u != value_length %u not supported", hd_k, hd_v);
    hp->head_dim = hd_k;
    if ((uint64_t)hp->head_dim * hp->n_head > (1u << 20))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "n_head*head_dim too large");

    hp->n_rot = hp->head_dim;
    HKEY(key, "rope.dimension_count");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_u32(g, key, &hp->n_rot))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    if (hp->n_rot == 0 || hp->n_rot > hp->head_dim || (hp->n_rot & 1))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "rope dimension %u invalid for head_dim %u", hp->n_rot, hp->head_dim);

    hp->rope_base = 10000.0f;
    HKEY(key, "rope.freq_base");
    if (kvt_gguf_find_key(g, key) >= 0 && !kvt_gguf_get_f32(g, key, &hp->rope_base))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "key %s: bad value", key);
    if (!(hp->rope_base > 1.0f) || !isfinite(hp->rope_base))
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "rope freq_base %g invalid", (double)hp->rope_base);
    hp->rope_base_swa = 10000.0f;

    HKEY(key, "rope.scaling.type");
    if (kvt_gguf_get_str(g, key, &s, &slen)) {
        bool ok = (slen == 4 && !memcmp(s, "none", 4)) || (slen == 6 && !memcmp(s, "linear", 6)) ||
                  (slen == 4 && !memcmp(s, "yarn", 4) && o->rope_yarn);
        if (!ok) return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "rope scaling type '%.*s' not supported",
                                 (int)(slen > 32 ? 32 : slen), s);
    }
    float factor = 0.0f;
    HKEY(key, "rope.scaling.factor");
    if (!kvt_gguf_get_f32(g, key, &factor)) {
        HKEY(key, "rope.scale_linear");
        if (!kvt_gguf_get_f32(g, key, &factor)) factor = 0.0f;
    }
    if (!isfinite(factor) || factor < 0.0f) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "rope scaling factor invalid");
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;

    HKEY(key, "attention.layer_norm_rms_epsilon");
    if (!kvt_gguf_get_f32(g, key, &hp->norm_eps)) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing key %s", key);
    if (!(hp->norm_eps >= 0.0f) || hp->norm_eps > 1.0f) return kvt_errf(err, errlen, KVT_ERR_FORMAT, "norm eps invalid");

    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->rope_neox = o->rope_neox;
    return o->hparams ? o->hparams(g, hp, hd_v, err, errlen) : KVT_OK;
}

static kvt_status make_inv_freq(kvt_model *m, const float *rope_freqs) {
    const kvt_hparams *hp = &m->hp;
    uint32_t half = hp->n_rot / 2;
    for (int c = 0; c < 2; c++) {
        m->inv_freq[c] = calloc(half, sizeof(double));
        if (!m->inv_freq[c]) return KVT_ERR_NOMEM;
        bool local = c == 1;
        double base = local ? hp->rope_base_swa : hp->rope_base;
        for (uint32_t i = 0; i < half; i++) {
            double f = pow(base, -2.0 * (double)i / (double)hp->n_rot);
            if (!local) {
                if (rope_freqs) f /= (double)rope_freqs[i];
                f *= hp->mla.yarn ? kvt_mla_yarn_freq_factor(hp, i) : (double)hp->rope_freq_scale;
            }
            m->inv_freq[c][i] = f;
        }
    }
    return KVT_OK;
}

/* The cache kind of every layer (ops->layer_kinds; default FULL). */
static kvt_status load_kinds(kvt_model *m, const kvt_gguf *g, char *err, size_t errlen) {
    memset(m->kind, KVT_KIND_FULL, sizeof(m->kind));
    kvt_status st = m->ops->layer_kinds ? m->ops->layer_kinds(m, g, m->kind, err, errlen) : KVT_OK;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) m->latent |= m->kind[il] == KVT_KIND_MLA;
    return st;
}

/* After every layer's matrices: the output matrix's load-time copy (a batched decode step multiplies
 * it with one row per sequence, docs/batching.md, and decode streams it from the copy as from any
 * other), then what the loader packed. m->output may be a struct copy of tok_embd (tied); only output
 * owns this copy (embedding lookups read the original rows). Best effort, as kvt_wmat_prepare. */
static void prepare_output(kvt_model *m) {
    kvt_wmat_prepare(m, &m->output);
    if (m->n_bf16x)
        KVT_INFO("bf16 pair dot: %u F16/BF16 matrices packed (activations rounded to bf16; KVT_BF16X=0 keeps f32)",
                 m->n_bf16x);
    if (m->n_f16x)
        KVT_INFO("16-bit output groups: %u F16/BF16 matrices packed (f32 activations; KVT_F16X=0 keeps the row-major path)",
                 m->n_f16x);
}

kvt_status kvt_model_load(const kvt_gguf *g, kvt_model **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    kvt_model *m = calloc(1, sizeof(*m));
    if (!m) return KVT_ERR_NOMEM;
    kvt_status st = load_hparams(g, &m->hp, &m->ops, err, errlen);
    if (st != KVT_OK) goto fail;
    kvt_hparams *hp = &m->hp;
    const kvt_arch_ops *o = m->ops;
    const uint32_t L = hp->n_layer, E = hp->n_embd, HD = hp->head_dim;
    const uint32_t QD = hp->n_head * HD, KD = hp->n_head_kv * HD;

    const kvt_gguf_tensor *te = kvt_gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "missing tensor 'token_embd.weight'");
        goto fail;
    }
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "token_embd.weight: vocabulary size %lld out of range",
                      (long long)te->ne[1]);
        goto fail;
    }
    hp->n_vocab = (uint32_t)te->ne[1];

    /* vector storage: per layer at most 2 norms + 2 qk norms + 2 post norms + 3 biases, or the MLA
     * norms and the expert selection bias */
    m->vecs_cap = (size_t)L * (6 * (size_t)E + 2 * HD + QD + 2 * KD) + E + hp->n_rot / 2 + 64 +
                  (size_t)L * ((size_t)hp->mla.q_lora_rank + hp->mla.kv_lora_rank + hp->moe.n_expert);
    m->vecs = calloc(m->vecs_cap, sizeof(float));
    m->layers = calloc(L, sizeof(kvt_layer_w));
    if (!m->vecs || !m->layers) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    if ((st = load_mat(m, g, "token_embd.weight", E, hp->n_vocab, true, &m->tok_embd, err, errlen)) != KVT_OK) goto fail;
    if ((st = load_mat(m, g, "output.weight", E, hp->n_vocab, false, &m->output, err, errlen)) != KVT_OK) goto fail;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    if ((st = kvt_load_vec(m, g, "output_norm.weight", E, true, &m->output_norm, err, errlen)) != KVT_OK) goto fail;
    const float *rope_freqs = NULL;
    if (o->rope_freqs) {
        if ((st = kvt_load_vec(m, g, "rope_freqs.weight", hp->n_rot / 2, false, &rope_freqs, err, errlen)) != KVT_OK) goto fail;
        if (rope_freqs)
            for (uint32_t i = 0; i < hp->n_rot / 2; i++)
                if (!(rope_freqs[i] > 0.0f) || !isfinite(rope_freqs[i])) {
                    st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "rope_freqs.weight: non-positive factor");
                    goto fail;
                }
    }
    if (o->pass) { /* its own layer tables and forward pass */
        if ((st = o->pass->load(m, g, &m->arch_state, err, errlen)) != KVT_OK) goto fail;
        prepare_output(m);
        if ((st = load_kinds(m, g, err, errlen)) != KVT_OK) goto fail;
        if ((st = make_inv_freq(m, NULL)) != KVT_OK) goto fail;
        *out = m;
        return KVT_OK;
    }
    const unsigned lt = o->layer_tensors;
    for (uint32_t il = 0; il < L; il++) {
        kvt_layer_w *w = &m->layers[il];
        char nm[96];
#define NM(suffix) (snprintf(nm, sizeof(nm), "blk.%u." suffix, il), nm)
        if ((st = kvt_load_vec(m, g, NM("attn_norm.weight"), E, true, &w->attn_norm, err, errlen))) goto fail;
        if ((st = kvt_load_vec(m, g, NM("ffn_norm.weight"), E, true, &w->ffn_norm, err, errlen))) goto fail;
        if (o->load_layer && (st = o->load_layer(m, g, il, w, err, errlen))) goto fail; /* MLA / MoE sub-blocks */
        if (!w->mla) {
            if ((st = load_mat(m, g, NM("attn_q.weight"), E, QD, true, &w->wq, err, errlen))) goto fail;
            if ((st = load_mat(m, g, NM("attn_k.weight"), E, KD, true, &w->wk, err, errlen))) goto fail;
            if ((st = load_mat(m, g, NM("attn_v.weight"), E, KD, true, &w->wv, err, errlen))) goto fail;
            if ((st = load_mat(m, g, NM("attn_output.weight"), QD, E, true, &w->wo, err, errlen))) goto fail;
        }
        if (!w->moe) {
            if ((st = load_mat(m, g, NM("ffn_gate.weight"), E, hp->n_ff, true, &w->gate, err, errlen))) goto fail;
            if ((st = load_mat(m, g, NM("ffn_up.weight"), E, hp->n_ff, true, &w->up, err, errlen))) goto fail;
            if ((st = load_mat(m, g, NM("ffn_down.weight"), hp->n_ff, E, true, &w->down, err, errlen))) goto fail;
        }
        if (lt & KVT_LT_QKV_BIAS) {
            if ((st = kvt_load_vec(m, g, NM("attn_q.bias"), QD, true, &w->bq, err, errlen))) goto fail;
            if ((st = kvt_load_vec(m, g, NM("attn_k.bias"), KD, true, &w->bk, err, errlen))) goto fail;
            if ((st = kvt_load_vec(m, g, NM("attn_v.bias"), KD, true, &w->bv, err, errlen))) goto fail;
        }
        if (lt & KVT_LT_QK_NORM) {
            if ((st = kvt_load_vec(m, g, NM("attn_q_norm.weight"), HD, true, &w->q_norm, err, errlen))) goto fail;
            if ((st = kvt_load_vec(m, g, NM("attn_k_norm.weight"), HD, true, &w->k_norm, err, errlen))) goto fail;
        }
        if (lt & KVT_LT_POST_NORMS) {
            if ((st = kvt_load_vec(m, g, NM("post_attention_norm.weight"), E, true, &w->post_attn_norm, err, errlen))) goto fail;
            if ((st = kvt_load_vec(m, g, NM("post_ffw_norm.weight"), E, true, &w->post_ffw_norm, err, errlen))) goto fail;
        }
#undef NM
        /* Load-time repack for the GEMM of prefill chunks and batched decode steps
         * (kernels/quant.h). Best effort: without memory for the copy the row-major kernels are
         * used, with the same results. */
        kvt_wmat *pw[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) kvt_wmat_prepare(m, pw[i]);
    }
    prepare_output(m);
    if ((st = load_kinds(m, g, err, errlen)) != KVT_OK) goto fail;
    m->rope_freqs = rope_freqs;
    if ((st = make_inv_freq(m, rope_freqs)) != KVT_OK) goto fail;
    *out = m;
    return KVT_OK;
fail:
    if (st == KVT_ERR_NOMEM && err && errlen && !err[0]) kvt_errf(err, errlen, st, "out of memory loading model");
    kvt_model_free(m);
    return st;
}

void kvt_wmat_prepare(kvt_model *m, kvt_wmat *w) {
    if (!w->data) return;
    const kvt_bf16x_mode bx = kvt_bf16x_policy();
    if (bx != KVT_BF16X_OFF) {
        size_t bytes;
        uint8_t *b = kvt_bf16x_pack(w->type, w->data, w->n_in, w->n_out, bx == KVT_BF16X_ROUND, &bytes);
        if (b) {
            m->copy_bytes += bytes;
            w->own = b;
            w->data = b;
            w->type = KVT_TYPE_BF16X;
            w->row_bytes = kvt_type_row_bytes(KVT_TYPE_BF16X, w->n_in);
            m->n_bf16x++;
            return;
        }
    }
    if ((w->type == KVT_TYPE_F16 || w->type == KVT_TYPE_BF16) && kvt_f16x_enabled()) {
        size_t bytes;
        uint8_t *b = kvt_f16x_pack(w->type, w->data, w->n_in, w->n_out, &bytes);
        if (b) {
            m->copy_bytes += bytes;
            w->own = b;
            w->data = b;
            w->type = w->type == KVT_TYPE_F16 ? KVT_TYPE_F16X : KVT_TYPE_BF16G;
            w->row_bytes = kvt_type_row_bytes(w->type, w->n_in);
            m->n_f16x++;
            return;
        }
    }
    w->packed = kvt_packed_create(w->type, w->data, w->n_in, w->n_out);
    if (w->packed) m->copy_bytes += kvt_packed_bytes(w->packed);
}

uint64_t kvt_model_private_bytes(const kvt_model *m) {
    uint64_t b = m->copy_bytes + (uint64_t)m->vecs_cap * sizeof(float);
    const kvt_mla_hparams *ml = &m->hp.mla;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) /* mla.c's absorbed f32 W_UK^T and W_UV */
        if (m->kind[il] == KVT_KIND_MLA)
            b += (uint64_t)m->hp.n_head * ml->kv_lora_rank * (ml->d_nope + ml->d_v) * sizeof(float);
    return b;
}

void kvt_wmat_release(kvt_wmat *w) {
    kvt_packed_free(w->packed);
    w->packed = NULL;
    free(w->own);
    w->own = NULL;
}

const char *kvt_model_numerics_tag(const kvt_model *m) {
    if (!m) return "";
    return m->n_bf16x ? (m->n_f16x ? "+bf16x+f16x" : "+bf16x") : m->n_f16x ? "+f16x" : "";
}

void kvt_model_free(kvt_model *m) {
    if (!m) return;
    for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++) {
        kvt_wmat *ws[7] = {&m->layers[il].wq, &m->layers[il].wk, &m->layers[il].wv, &m->layers[il].wo,
                           &m->layers[il].gate, &m->layers[il].up, &m->layers[il].down};
        for (int i = 0; i < 7; i++) kvt_wmat_release(ws[i]);
    }
    kvt_wmat_release(&m->output);
    for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++) {
        kvt_layer_w *w = &m->layers[il];
        if (w->mla) kvt_mla_free(w->mla);
        if (w->moe) kvt_moe_free(w->moe);
        free(w->mla);
        free(w->moe);
    }
    if (m->arch_state) m->ops->pass->free(m->arch_state);
    free(m->layers);
    free(m->vecs);
    free(m->inv_freq[0]);
    free(m->inv_freq[1]);
    free(m);
}

const kvt_hparams *kvt_model_hparams(const kvt_model *m) { return &m->hp; }

bool kvt_model_layer_is_swa(const kvt_model *m, uint32_t il) {
    return il < m->hp.n_layer && m->kind[il] == KVT_KIND_WINDOW;
}

/* The cache declaration of layer il (codec c). */
static void layer_desc(const kvt_model *m, uint32_t il, kvt_codec c, kvt_layer_desc *d) {
    memset(d, 0, sizeof(*d));
    bool swa = kvt_model_layer_is_swa(m, il);
    d->kind = swa ? KVT_KIND_WINDOW : KVT_KIND_FULL;
    d->window = swa ? m->hp.n_swa : 0;
    d->n_kv_heads = m->hp.n_head_kv;
    d->head_dim_k = m->hp.head_dim;
    d->head_dim_v = m->hp.head_dim;
    d->codec = c;
    if (m->kind[il] == KVT_KIND_MLA) { /* the cached latent row [c | k_pe] */
        d->kind = KVT_KIND_MLA;
        d->n_kv_heads = 1;
        d->head_dim_k = m->hp.mla.kv_lora_rank + m->hp.mla.d_rope;
        d->head_dim_v = m->hp.mla.kv_lora_rank;
    }
}

void kvt_model_layer_descs(const kvt_model *m, const kvt_codec *codecs, kvt_layer_desc *out) {
    if (m->ops->pass) { /* its own layer tables (qwen35: DeltaNet layers are RECURRENT) */
        m->ops->pass->layer_descs(m->arch_state, &m->hp, codecs, out);
        return;
    }
    for (uint32_t il = 0; il < m->hp.n_layer; il++) layer_desc(m, il, codecs[il], &out[il]);
}

uint64_t kvt_model_weight_bytes(const kvt_model *m) { return m->weight_bytes; }

const void *kvt_model_arch_state(const kvt_model *m) { return m->arch_state; }
const kvt_wmat *kvt_model_tok_embd(const kvt_model *m) { return &m->tok_embd; }
const kvt_wmat *kvt_model_output(const kvt_model *m) { return &m->output; }
const float *kvt_model_output_norm(const kvt_model *m) { return m->output_norm; }

/* ------------------------------------------------------------------ context */

/* Chunks up to this many rows run in replicated mode (see forward_chunk): decode steps of up to 16
 * batched rows; the rows' norms and activation quantization are cheap next to a barrier. */
#define KVT_REPL_ROWS 16

/* Per-thread private buffers for replicated mode: KVT_REPL_ROWS rows each. */
typedef struct kvt_thread_buf {
    float *x, *xn, *t;
    float *rope_cs; /* this thread's RoPE tables of the chunk's rows (as kvt_ctx's) */
    void *act[KVT_N_ACT];
} kvt_thread_buf;

/* One sequence's rows inside a forward chunk. */
typedef struct kvt_seg {
    kvt_seq *seq;
    uint32_t off, n, pos0;
} kvt_seg;

struct kvt_ctx {
    const kvt_model *m;
    kvt_threadpool *tp;
    int nth;
    uint32_t ubatch;
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up, *logits;
    float *rope_cs;          /* [ubatch][2 cfg][n_rot/2][cos, sin] */
    void *act[KVT_N_ACT];    /* quantized activations, act_bytes each */
    size_t act_bytes;
    float **att_scratch;     /* per thread */
    float *att_shared;       /* split-K's buffer shared by the threads (kvt_attention_split), or NULL */
    uint32_t att_shared_ctx; /* contexts att_shared covers */
    int splitk;              /* SPLITK_* from KVT_SPLITK (see use_split) */
    kvt_thread_buf *tbuf;    /* per thread */
    size_t att_scratch_floats;
    uint32_t logits_rows;    /* rows the logits buffer holds */
    kvt_ext_scratch *ext;    /* MLA / MoE scratch (model_int.h), NULL for dense models */
    void *arch_ctx;          /* ops->pass only: its scratch (pass->ctx_create), owned */
    kvt_mla_prefill mla_prefill; /* deepseek2 prefill mode (model.h), default absorbed */

    /* batched forward (kvt_model_forward_batch): its logits rows and staging */
    float *blogits;          /* [blogits_rows][n_vocab] */
    uint32_t blogits_rows;
    int32_t *btokens;        /* [ubatch] the items' tokens, concatenated */

    /* per-chunk state read by the workers: n rows in n_segs segments, segment s = rows
     * [segs[s].off, +segs[s].n) of sequence segs[s].seq at positions segs[s].pos0.. (one segment
     * for kvt_model_forward; one per item for kvt_model_forward_batch); row r at row_pos[r] */
    kvt_seq *seq;            /* segs[0].seq (the MLA hook's sequence: MLA models never batch) */
    const int32_t *tokens;
    uint32_t n, pos0;        /* pos0 = segs[0].pos0 */
    bool all_logits;         /* one segment only: logits of every row, else of each segment's last */
    kvt_seg *segs;           /* [ubatch] */
    uint32_t n_segs;
    uint32_t *row_pos;       /* [ubatch] */
    float *out_logits;       /* logits or blogits */
};

/* KVT_SPLITK: "0" never runs split-K (A/B measurements), "1" runs it for every single-row attention
 * it can compute (tests reach it at short contexts); unset or anything else: where it pays. */
enum { SPLITK_OFF, SPLITK_ON, SPLITK_AUTO };

static size_t max_act(size_t cur, const kvt_wmat *w, uint32_t rows) {
    size_t b = kvt_act_bytes(w->type, w->n_in, rows);
    return b > cur ? b : cur;
}

/* Activation buffers: 64-byte aligned and NOT zeroed (every element is written before it is read;
 * the logits buffer alone can be ~100 MB, and untouched pages then cost nothing). */
/* Largest activation buffer any matmul input of the model needs for `rows` rows. */
static size_t model_act_bytes(const kvt_model *m, uint32_t rows) {
    size_t ab = kvt_act_bytes(m->output.type, m->output.n_in, rows);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const kvt_layer_w *w = &m->layers[il];
        const kvt_wmat *ws[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) ab = max_act(ab, ws[i], rows);
        ab = kvt_ext_act_bytes(w->mla, w->moe, rows, ab);
    }
    return ab;
}

static void *falloc(size_t n_floats) {
    void *p = NULL;
    if (posix_memalign(&p, 64, (n_floats ? n_floats : 16) * sizeof(float)) != 0) return NULL;
    return p;
}

kvt_status kvt_ctx_create(const kvt_model *m, int n_threads, uint32_t ubatch, kvt_ctx **out) {
    *out = NULL;
    kvt_kernels_init();
    kvt_f16_table_init();
    if (n_threads <= 0) n_threads = kvt_n_cpus();
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    if (ubatch == 0) ubatch = 512;
    if (ubatch > 65536) return KVT_ERR_INVALID_ARG;
    const kvt_hparams *hp = &m->hp;
    kvt_ctx *c = calloc(1, sizeof(*c));
    if (!c) return KVT_ERR_NOMEM;
    c->m = m;
    c->nth = n_threads;
    c->ubatch = ubatch;
    const char *sk = getenv("KVT_SPLITK");
    c->splitk = !sk ? SPLITK_AUTO : !strcmp(sk, "0") ? SPLITK_OFF : !strcmp(sk, "1") ? SPLITK_ON : SPLITK_AUTO;
    size_t U = ubatch, E = hp->n_embd, QD = (size_t)hp->n_head * hp->head_dim;
    size_t KD = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    c->x = falloc(U * E);
    c->xn = falloc(U * (E > QD ? E : QD));
    c->q = falloc(U * QD);
    c->k = falloc(U * KD);
    c->v = falloc(U * KD);
    c->att = falloc(U * QD);
    c->tmp = falloc(U * E);
    c->gate = falloc(U * F);
    c->up = falloc(U * F);
    c->logits = falloc(hp->n_vocab); /* one row; all_logits calls grow it (see forward) */
    c->logits_rows = 1;
    c->rope_cs = falloc(U * 2 * hp->n_rot);
    c->segs = calloc(U, sizeof *c->segs);
    c->row_pos = calloc(U, sizeof *c->row_pos);
    c->btokens = calloc(U, sizeof *c->btokens);
    size_t ab = model_act_bytes(m, ubatch);
    c->act_bytes = ab;
    bool ok = c->x && c->xn && c->q && c->k && c->v && c->att && c->tmp && c->gate && c->up && c->logits && c->rope_cs && c->segs &&
              c->row_pos && c->btokens;
    for (int i = 0; i < KVT_N_ACT; i++) {
        c->act[i] = falloc(ab / sizeof(float) + 16);
        ok = ok && c->act[i];
    }
    c->att_scratch = calloc((size_t)n_threads, sizeof(float *));
    c->tbuf = calloc((size_t)n_threads, sizeof(kvt_thread_buf));
    ok = ok && c->att_scratch && c->tbuf;
    if (ok && n_threads > 1) {
        size_t abs = model_act_bytes(m, KVT_REPL_ROWS), RW = (size_t)KVT_REPL_ROWS * E;
        for (int t = 0; t < n_threads && ok; t++) {
            kvt_thread_buf *tb = &c->tbuf[t];
            tb->x = falloc(RW);
            tb->xn = falloc(RW);
            tb->t = falloc(E);
            tb->rope_cs = falloc((size_t)KVT_REPL_ROWS * 2 * hp->n_rot);
            ok = tb->x && tb->xn && tb->t && tb->rope_cs;
            for (int i = 0; i < KVT_N_ACT; i++) {
                tb->act[i] = falloc(abs / sizeof(float) + 16);
                ok = ok && tb->act[i];
            }
        }
    }
    if (ok && (hp->moe.n_expert || hp->mla.kv_lora_rank)) ok = (c->ext = kvt_ext_scratch_create(hp, ubatch)) != NULL;
    if (ok && m->ops->pass) ok = m->ops->pass->ctx_create(m, m->arch_state, n_threads, ubatch, &c->arch_ctx) == KVT_OK;
    c->tp = ok ? kvt_threadpool_create(n_threads) : NULL;
    if (!c->tp) {
        kvt_ctx_free(c);
        return KVT_ERR_NOMEM;
    }
    *out = c;
    return KVT_OK;
}

void kvt_ctx_free(kvt_ctx *c) {
    if (!c) return;
    kvt_threadpool_free(c->tp);
    if (c->arch_ctx) c->m->ops->pass->ctx_free(c->arch_ctx);
    float **bufs[] = {&c->x, &c->xn, &c->q, &c->k, &c->v, &c->att, &c->tmp, &c->gate, &c->up, &c->logits, &c->rope_cs};
    for (size_t i = 0; i < KVT_ARRAY_LEN(bufs); i++) free(*bufs[i]);
    free(c->blogits);
    free(c->segs);
    free(c->row_pos);
    free(c->btokens);
    for (int i = 0; i < KVT_N_ACT; i++) free(c->act[i]);
    if (c->att_scratch)
        for (int i = 0; i < c->nth; i++) free(c->att_scratch[i]);
    free(c->att_scratch);
    free(c->att_shared);
    if (c->tbuf)
        for (int t = 0; t < c->nth; t++) {
            free(c->tbuf[t].x);
            free(c->tbuf[t].xn);
            free(c->tbuf[t].t);
            free(c->tbuf[t].rope_cs);
            for (int i = 0; i < KVT_N_ACT; i++) free(c->tbuf[t].act[i]);
        }
    free(c->tbuf);
    kvt_ext_scratch_free(c->ext);
    free(c);
}

int kvt_ctx_n_threads(const kvt_ctx *c) { return c->nth; }

uint64_t kvt_ctx_bytes(const kvt_ctx *c) {
    const kvt_hparams *hp = &c->m->hp;
    const uint64_t U = c->ubatch, E = hp->n_embd, QD = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t KD = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    /* x, xn, q, k, v, att, tmp, gate, up (kvt_ctx_create), rope table, logits rows */
    uint64_t fl = U * (E + (E > QD ? E : QD) + QD + 2 * KD + QD + E + 2 * F) + U * 2 * hp->n_rot +
                  (uint64_t)hp->n_vocab * (c->logits_rows + c->blogits_rows);
    uint64_t b = fl * sizeof(float) + (uint64_t)KVT_N_ACT * (c->act_bytes + 64) +
                 (uint64_t)c->nth * c->att_scratch_floats * sizeof(float);
    if (c->att_shared) b += kvt_attention_split_floats(hp->n_head, c->att_shared_ctx) * sizeof(float);
    if (c->nth > 1) /* per-thread replica rows and activations */
        b += (uint64_t)c->nth * ((2 * (uint64_t)KVT_REPL_ROWS * (E + hp->n_rot) + E) * sizeof(float) +
                                 KVT_N_ACT * (model_act_bytes(c->m, KVT_REPL_ROWS) + 64));
    return b;
}

static kvt_status ensure_scratch(kvt_ctx *c, size_t need) {
    if (need <= c->att_scratch_floats) return KVT_OK;
    for (int i = 0; i < c->nth; i++) {
        free(c->att_scratch[i]);
        c->att_scratch[i] = kvt_aligned_alloc(64, need * sizeof(float));
        if (!c->att_scratch[i]) {
            c->att_scratch_floats = 0;
            for (int j = 0; j <= i; j++) {
                free(c->att_scratch[j]);
                c->att_scratch[j] = NULL;
            }
            return KVT_ERR_NOMEM;
        }
    }
    c->att_scratch_floats = need;
    return KVT_OK;
}

/* Split-K's shared buffer (several threads, the dense layer loop, split-K not off) for contexts of
 * end keys, allocated for want >= end of them when it must grow. */
static kvt_status ensure_split(kvt_ctx *c, uint64_t end, uint64_t want) {
    if (c->nth == 1 || c->m->ops->pass || c->splitk == SPLITK_OFF || end <= c->att_shared_ctx) return KVT_OK;
    float *p = kvt_aligned_alloc(64, kvt_attention_split_floats(c->m->hp.n_head, (uint32_t)want) * sizeof(float));
    if (!p) return KVT_ERR_NOMEM;
    free(c->att_shared);
    c->att_shared = p;
    c->att_shared_ctx = (uint32_t)want;
    return KVT_OK;
}

/* Attention buffers for a pass whose keys end at end: grown geometrically (to twice that, at least
 * 1024 keys) here, never inside the chunk loop. */
static kvt_status ensure_attention(kvt_ctx *c, const kvt_kv_layout *l, uint64_t end) {
    const uint64_t target = end * 2 > 1024 ? end * 2 : 1024, want = target < UINT32_MAX / 2 ? target : end;
    const size_t need = kvt_attention_scratch_floats(l, (uint32_t)end);
    if (need > c->att_scratch_floats) {
        const size_t grow = kvt_attention_scratch_floats(l, (uint32_t)want);
        kvt_status st = ensure_scratch(c, grow > need ? grow : need);
        if (st != KVT_OK) return st;
    }
    return ensure_split(c, end, want);
}

kvt_status kvt_ctx_reserve(kvt_ctx *c, const kvt_kv_layout *l, uint32_t n_ctx) {
    kvt_status st = ensure_scratch(c, kvt_attention_scratch_floats(l, n_ctx));
    return st != KVT_OK ? st : ensure_split(c, n_ctx, n_ctx);
}

void kvt_ctx_set_mla_prefill(kvt_ctx *c, kvt_mla_prefill mode) { c->mla_prefill = mode; }

/* ------------------------------------------------------------------ forward: row math */

/* Sum of x[i]^2 in double, in a fixed order on every machine: element i into running sum i % 8, the
 * eight sums then added pairwise. Eight independent chains rather than one: a single chain of
 * dependent double adds (about 3,500 a layer of a qwen3-0.6b decode step: two norms of the hidden
 * row, the Q and K head norms) cost about 1 % of the step (bench/results/zen5-2026-12-06c.md). The
 * products are exact in double; ggml adds them in one chain, and both differ from the exact sum far
 * below a float's last bit. */
#define SQ(i) ((double)x[i] * (double)x[i])
double kvt_sum_squares(const float *x, uint32_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += SQ(i), s1 += SQ(i + 1), s2 += SQ(i + 2), s3 += SQ(i + 3);
        s4 += SQ(i + 4), s5 += SQ(i + 5), s6 += SQ(i + 6), s7 += SQ(i + 7);
    }
    double t[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    for (; i < n; i++) t[i % 8] += SQ(i);
    return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}
#undef SQ

/* y = x * w / sqrt(mean(x^2) + eps); the sum of squares accumulates in double (kvt_sum_squares). */
static void rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps) {
    const double sum = kvt_sum_squares(x, n);
    float mean = (float)(sum / (double)n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (uint32_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}


/* Rotate the first n_rot dims of one head vector by the (cos, sin) table of its position, with the
 * first product of each output fused as in ggml's CPU RoPE compiled by gcc (which contracts
 * x0*cos - x1*sin and x0*sin + x1*cos so): fusing x1*cos instead puts tests/test_ref_llama_q5km.c's
 * 8-token case off the reference at position 9. */
static inline __attribute__((always_inline)) void rope_body(float *x, const float *cs, uint32_t n_rot, bool neox) {
    uint32_t half = n_rot / 2;
    for (uint32_t i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = fmaf(x0, c, -(x1 * s));
        x[b] = fmaf(x0, s, x1 * c);
    }
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same loop where the CPU has FMA (the vector table's level 1 and up): fmaf becomes one
 * instruction instead of a libm call per product (same single rounding, same bits). */
__attribute__((target("fma"))) static void rope_fma(float *x, const float *cs, uint32_t n_rot, bool neox) {
    rope_body(x, cs, n_rot, neox);
}
#define KVT_ROPE_FMA 1
#endif
static void rope_apply(float *x, const float *cs, uint32_t n_rot, bool neox) {
#ifdef KVT_ROPE_FMA
    if (kvt_vec_level() >= 1) {
        rope_fma(x, cs, n_rot, neox);
        return;
    }
#endif
    rope_body(x, cs, n_rot, neox);
}

static void split_range(uint32_t n, int ith, int nth, uint32_t *r0, uint32_t *r1) {
    uint32_t per = (n + (uint32_t)nth - 1) / (uint32_t)nth;
    uint32_t a = (uint32_t)ith * per;
    *r0 = a < n ? a : n;
    *r1 = a + per < n ? a + per : n;
}

/* First query row of part t of n rows split into nth parts of about equal attention work (row r of a
 * chunk at pos0 attends to pos0 + r + 1 keys). att_row_split(.., 0, ..) = 0, (.., nth, ..) = n. */
static uint32_t att_row_split(uint32_t n, uint32_t pos0, uint32_t t, uint32_t nth) {
    if (t >= nth) return n;
    const double tot = (double)n * pos0 + (double)n * (n + 1) / 2, goal = tot * t / nth;
    uint32_t r = 0;
    while (r < n && (double)r * pos0 + (double)r * (r + 1) / 2 < goal) r++;
    return r;
}

/* Output-column split: contiguous ranges aligned to 16 columns. */
static void col_range(uint32_t n_out, int ith, int nth, int64_t *o0, int64_t *o1) {
    uint32_t per = (n_out + (uint32_t)nth - 1) / (uint32_t)nth;
    per = (per + 15u) & ~15u;
    uint64_t a = (uint64_t)ith * per, b = a + per;
    *o0 = (int64_t)(a < n_out ? a : n_out);
    *o1 = (int64_t)(b < n_out ? b : n_out);
}

/* Activation slot for each matrix of a group sharing one input: matrices with the same activation
 * format (vec_dot type) share a slot. */
static void act_slots(const kvt_wmat *const *ws, int nw, int *slot, uint32_t *slot_type, int *n_slots) {
    int ns = 0;
    for (int i = 0; i < nw; i++) {
        uint32_t vt = kvt_vec_dot_type(ws[i]->type);
        int s = -1;
        for (int j = 0; j < ns; j++)
            if (kvt_vec_dot_type(slot_type[j]) == vt) s = j;
        if (s < 0) {
            s = ns++;
            slot_type[s] = ws[i]->type;
        }
        slot[i] = s;
    }
    *n_slots = ns;
}

/* Quantize rows [r0, r1) of x (n_in wide) for every slot of the group. */
static void quantize_rows(void *const *act, const kvt_wmat *const *ws, int nw, const float *x, uint32_t r0, uint32_t r1) {
    if (r0 >= r1) return;
    int slot[KVT_MAX_GROUP], ns;
    uint32_t st[KVT_MAX_GROUP];
    act_slots(ws, nw, slot, st, &ns);
    for (int s = 0; s < ns; s++) kvt_act_quantize(st[s], x, ws[0]->n_in, r0, r1, act[s]);
}

/* This thread's output columns of every matrix of the group, all n_rows rows. */
static void matmul_group(void *const *act, const kvt_wmat *const *ws, float *const *ys, int nw, uint32_t n_rows,
                         int ith, int nth) {
    int slot[KVT_MAX_GROUP], ns;
    uint32_t st[KVT_MAX_GROUP];
    act_slots(ws, nw, slot, st, &ns);
    for (int i = 0; i < nw; i++) {
        int64_t o0, o1;
        col_range(ws[i]->n_out, ith, nth, &o0, &o1);
        if (o0 >= o1) continue;
        /* repacked weights (bit-identical results): prefill chunks and batched decode steps the
         * GEMM tiles, a single-row decode GEMV the interleaved copy (kvt_matmul_packed) */
        if (ws[i]->packed)
            kvt_matmul_packed(ws[i]->packed, act[slot[i]], n_rows, ys[i], ws[i]->n_out, o0, o1);
        else
            kvt_matmul_rows(ws[i]->type, ws[i]->data, ws[i]->n_in, act[slot[i]], n_rows, ys[i], ws[i]->n_out, o0, o1);
    }
}

/* Exported to the architecture files (model_int.h). */
void kvt_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps) { rmsnorm(y, x, w, n, eps); }
void kvt_rope_apply(float *x, const float *cs, uint32_t n_rot, bool neox) { rope_apply(x, cs, n_rot, neox); }
void kvt_split_range(uint32_t n, int ith, int nth, uint32_t *r0, uint32_t *r1) { split_range(n, ith, nth, r0, r1); }
uint32_t kvt_att_row_split(uint32_t n, uint32_t pos0, uint32_t t, uint32_t nth) { return att_row_split(n, pos0, t, nth); }
void kvt_col_range(uint32_t n_out, int ith, int nth, int64_t *o0, int64_t *o1) { col_range(n_out, ith, nth, o0, o1); }
void kvt_quantize_rows(void *const *act, const kvt_wmat *const *ws, int nw, const float *x, uint32_t r0, uint32_t r1) {
    quantize_rows(act, ws, nw, x, r0, r1);
}
void kvt_matmul_group(void *const *act, const kvt_wmat *const *ws, float *const *ys, int nw, uint32_t n_rows, int ith,
                      int nth) {
    matmul_group(act, ws, ys, nw, n_rows, ith, nth);
}
size_t kvt_act_row_bytes(const kvt_wmat *const *ws, int nw, int slot) {
    int sl[KVT_MAX_GROUP], ns;
    uint32_t st[KVT_MAX_GROUP];
    act_slots(ws, nw, sl, st, &ns);
    return slot < ns ? kvt_act_bytes(st[slot], ws[0]->n_in, 1) : 0;
}

/* ------------------------------------------------------------------ forward: the chunk */

/* Whether segment sg's attention in layer il runs split-K (kvt_attention_split): a single row, several
 * threads, a layer it can compute, and (KVT_SPLITK unset) where it pays: the KV heads do not divide
 * among the threads (else each thread reads its own KV heads once anyway) and the row sees at least
 * KVT_ATT_SPLIT_MIN_KEYS keys. The same on every thread, so they all reach its barriers. */
static bool use_split(const kvt_ctx *c, const kvt_seg *sg, uint32_t il, int nth) {
    if (sg->n != 1 || nth == 1 || !c->att_shared) return false;
    const kvt_kv_layout *l = kvt_block_pool_layout(kvt_seq_pool(sg->seq));
    if (!kvt_attention_split_ok(l, il, c->m->hp.n_head)) return false;
    if (c->splitk == SPLITK_ON) return true;
    const kvt_layer_desc *d = kvt_kv_layout_layer(l, il);
    const uint32_t seen = d->kind == KVT_KIND_WINDOW && d->window < sg->pos0 + 1 ? d->window : sg->pos0 + 1;
    return d->n_kv_heads % (uint32_t)nth != 0 && seen >= KVT_ATT_SPLIT_MIN_KEYS;
}

/* Whether a small chunk's steps 2-5 can run without a barrier: each thread's Q/K/V output columns
 * (col_range) are exactly the query heads and KV heads it attends with (the KV heads split evenly,
 * a GQA group's query heads beside them), so it computes, rotates and writes its own KV heads'
 * rows and reads only those. The same answer on every thread (a function of the shape). */
static bool heads_own_columns(const kvt_hparams *hp, int nth) {
    const uint32_t NKV = hp->n_head_kv, HD = hp->head_dim, rep = NKV ? hp->n_head / NKV : 0;
    if (nth < 2 || NKV == 0 || NKV % (uint32_t)nth != 0 || rep == 0) return false;
    for (int t = 0; t < nth; t++) {
        uint32_t h0, h1;
        int64_t q0, q1, k0, k1;
        split_range(NKV, t, nth, &h0, &h1);
        col_range(hp->n_head * HD, t, nth, &q0, &q1);
        col_range(NKV * HD, t, nth, &k0, &k1);
        if (q0 != (int64_t)h0 * rep * HD || q1 != (int64_t)h1 * rep * HD || k0 != (int64_t)h0 * HD ||
            k1 != (int64_t)h1 * HD)
            return false;
    }
    return true;
}

/* Steps 1-6 of a dense layer: attention norm, Q/K/V, bias / QK-norm / RoPE, K/V written to the
 * chunk's sequences, attention, output projection into c->tmp (every thread; ends on a barrier). */
static void dense_attention(kvt_ctx *c, const kvt_fwd *fw, const kvt_layer_w *w, uint32_t il) {
    const kvt_model *m = c->m;
    const kvt_arch_ops *o = m->ops;
    const kvt_hparams *hp = fw->hp;
    kvt_threadpool *tp = fw->tp;
    const int ith = fw->ith, nth = fw->nth;
    const bool repl = fw->repl;
    const uint32_t n = fw->n, r0 = fw->r0, r1 = fw->r1;
    const uint32_t E = hp->n_embd, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const uint32_t QD = NH * HD, KD = NKV * HD, half = hp->n_rot / 2;
    const float eps = hp->norm_eps;
    float *X = fw->X, *XN = fw->XN;
    void *const *ACT = fw->ACT;
    const kvt_wmat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    const kvt_wmat *wo[1] = {&w->wo};
    float *tmp_out[1] = {c->tmp};
    const int cfg = o->window_rope && m->kind[il] == KVT_KIND_WINDOW ? 1 : 0; /* RoPE table */

    /* 1. attention norm + quantize (rows) */
    for (uint32_t r = r0; r < r1; r++) rmsnorm(XN + (size_t)r * E, X + (size_t)r * E, w->attn_norm, E, eps);
    quantize_rows(ACT, qkv, 3, XN, r0, r1);
    if (!repl) kvt_threadpool_barrier(tp);
    /* Own heads (small chunks, heads_own_columns, no split-K segment): this thread's Q/K/V columns
     * are the heads it attends with, so steps 2-5 need no barrier between them. */
    const bool solo = n <= KVT_REPL_ROWS;
    bool own = solo && heads_own_columns(hp, nth);
    for (uint32_t s = 0; s < c->n_segs && own; s++) own = !use_split(c, &c->segs[s], il, nth);
    uint32_t kh0 = 0, kh1 = NKV;
    if (own) split_range(NKV, ith, nth, &kh0, &kh1);
    /* 2. Q, K, V projections (columns) */
    matmul_group(ACT, qkv, qkv_out, 3, n, ith, nth);
    if (!own) kvt_threadpool_barrier(tp);
    /* 3. bias, QK-norm, RoPE, query pre-scale (rows), then 4. write K/V of the chunk into the
     *    sequence. Own heads: each thread its query heads and KV heads [kh0, kh1), written by
     *    itself (kv.h: concurrent writes of distinct heads). Otherwise write_kv runs on thread 0
     *    only; for small chunks thread 0 also does the K/V side of the row work and the other
     *    threads the query heads, saving a barrier. */
    {
        /* Rows [a0, a1): query heads [qa, qb) and, when kv, the K/V side of KV heads [kh0, kh1). A
         * split chunk gives each thread its rows, all heads. Small chunks (decode) keep every row.
         * Every element sees the same operations in the same order whoever runs them. */
        uint32_t a0 = solo ? 0 : r0, a1 = solo ? n : r1, qa = 0, qb = NH;
        bool kv = true;
        if (own) {
            qa = kh0 * (NH / NKV), qb = kh1 * (NH / NKV);
        } else if (solo && nth > 1) {
            kv = ith == 0;
            if (kv) qb = 0;
            else split_range(NH, ith - 1, nth - 1, &qa, &qb);
        }
        for (uint32_t r = a0; r < a1; r++) {
            float *qr = c->q + (size_t)r * QD, *kr = c->k + (size_t)r * KD, *vr = c->v + (size_t)r * KD;
            const float *cs = fw->rope_cs + ((size_t)r * 2 + cfg) * 2 * half;
            for (uint32_t h = qa; h < qb; h++) {
                float *qh = qr + h * HD;
                if (w->bq)
                    for (uint32_t i = 0; i < HD; i++) qh[i] += w->bq[h * HD + i];
                if (w->q_norm) rmsnorm(qh, qh, w->q_norm, HD, eps);
                rope_apply(qh, cs, hp->n_rot, hp->rope_neox);
                if (o->q_prescale)
                    for (uint32_t i = 0; i < HD; i++) qh[i] *= hp->attn_scale;
            }
            if (!kv) continue;
            if (w->bq) {
                for (uint32_t i = kh0 * HD; i < kh1 * HD; i++) kr[i] += w->bk[i];
                for (uint32_t i = kh0 * HD; i < kh1 * HD; i++) vr[i] += w->bv[i];
            }
            for (uint32_t h = kh0; h < kh1; h++) {
                if (w->q_norm) rmsnorm(kr + h * HD, kr + h * HD, w->k_norm, HD, eps);
                rope_apply(kr + h * HD, cs, hp->n_rot, hp->rope_neox);
            }
        }
        if (!solo) kvt_threadpool_barrier(tp);
        if (ith == 0 || own)
            for (uint32_t s = 0; s < c->n_segs; s++) {
                const kvt_seg *sg = &c->segs[s];
                for (uint32_t r = sg->off; r < sg->off + sg->n; r++)
                    kvt_seq_write_kv_heads(sg->seq, il, sg->pos0 + (r - sg->off), c->k + (size_t)r * KD,
                                           c->v + (size_t)r * KD, kh0, kh1);
            }
        if (!own) kvt_threadpool_barrier(tp);
    }
    /* 5. attention, per segment over its own sequence. Threads split on KV-head boundaries so
     *    no KV row is read by two threads; when the KV heads do not divide evenly, a long enough
     *    single-row segment (decode) runs split-K (use_split: the threads share every KV head's
     *    keys, then its V columns), a prefill segment is split by query rows (each thread all
     *    heads), and a short single-row segment falls back to a query-head split. Every
     *    (row, head) output is computed the same way under any split (kvt_attention_split
     *    included). Own heads rely on the KV-head split below giving each thread the heads it
     *    wrote (heads_own_columns implies NKV % nth == 0 and no split-K segment). */
    {
        const float sc = o->q_prescale ? 1.0f : hp->attn_scale;
        for (uint32_t s = 0; s < c->n_segs; s++) {
            const kvt_seg *sg = &c->segs[s];
            const float *q = c->q + (size_t)sg->off * QD;
            float *att = c->att + (size_t)sg->off * QD;
            if (use_split(c, sg, il, nth)) {
                kvt_attention_split(sg->seq, il, q, sg->pos0, NH, sc, att, c->att_shared, c->att_scratch[ith], tp, ith, nth);
                if (s + 1 < c->n_segs) kvt_threadpool_barrier(tp); /* a later split reuses att_shared */
            } else if (NKV % nth == 0 || sg->n == 1) {
                uint32_t h0, h1;
                if (NKV % nth == 0) {
                    split_range(NKV, ith, nth, &h0, &h1);
                    h0 *= NH / NKV, h1 *= NH / NKV;
                } else {
                    split_range(NH, ith, nth, &h0, &h1);
                }
                if (h0 < h1) kvt_attention(sg->seq, il, q, sg->n, QD, sg->pos0, NH, sc, h0, h1, att, QD, c->att_scratch[ith]);
            } else {
                /* rows balanced by visible keys: row r sees about pos0 + r + 1 of them */
                const uint32_t q0 = att_row_split(sg->n, sg->pos0, ith, nth), q1 = att_row_split(sg->n, sg->pos0, ith + 1, nth);
                if (q0 < q1)
                    kvt_attention(sg->seq, il, q + (size_t)q0 * QD, q1 - q0, QD, sg->pos0 + q0, NH, sc, 0, NH,
                                  att + (size_t)q0 * QD, QD, c->att_scratch[ith]);
            }
        }
    }
    kvt_threadpool_barrier(tp);
    /* 6. output projection */
    quantize_rows(ACT, wo, 1, c->att, r0, r1);
    if (!repl) kvt_threadpool_barrier(tp);
    matmul_group(ACT, wo, tmp_out, 1, n, ith, nth);
    kvt_threadpool_barrier(tp);
}

/* Steps 8-9 of a dense layer: gate and up projections, the gated activation, down projection into
 * c->tmp, from the FFN-normed rows in fw->XN (every thread; ends on a barrier). */
static void dense_ffn(kvt_ctx *c, const kvt_fwd *fw, const kvt_layer_w *w) {
    const kvt_arch_ops *o = c->m->ops;
    kvt_threadpool *tp = fw->tp;
    const int ith = fw->ith, nth = fw->nth;
    const bool repl = fw->repl;
    const uint32_t n = fw->n, r0 = fw->r0, r1 = fw->r1;
    const uint32_t F = fw->hp->n_ff;
    float *XN = fw->XN;
    void *const *ACT = fw->ACT;
    const kvt_wmat *gu[2] = {&w->gate, &w->up};
    float *gu_out[2] = {c->gate, c->up};
    const kvt_wmat *dn[1] = {&w->down};
    float *tmp_out[1] = {c->tmp};

    /* 8. quantize the normed rows; gate, up and the gated activation on this thread's own columns */
    quantize_rows(ACT, gu, 2, XN, r0, r1);
    if (!repl) kvt_threadpool_barrier(tp);
    matmul_group(ACT, gu, gu_out, 2, n, ith, nth);
    {
        int64_t o0, o1;
        col_range(F, ith, nth, &o0, &o1);
        for (uint32_t r = 0; r < n; r++) {
            float *g = c->gate + (size_t)r * F, *u = c->up + (size_t)r * F;
            /* the vector GELU / SiLU (kernels/vec.h: their exp has a scalar twin, same bits on every
             * split) */
            if (o->ffn_act == KVT_FFN_GELU_TANH) kvt_vec_gelu_mul(g + o0, g + o0, u + o0, (uint32_t)(o1 - o0));
            else kvt_vec_silu_mul(g + o0, g + o0, u + o0, (uint32_t)(o1 - o0));
        }
    }
    kvt_threadpool_barrier(tp);
    /* 9. down projection */
    quantize_rows(ACT, dn, 1, c->gate, r0, r1);
    if (!repl) kvt_threadpool_barrier(tp);
    matmul_group(ACT, dn, tmp_out, 1, n, ith, nth);
    kvt_threadpool_barrier(tp);
}

/*
 * Two modes, identical per-row math (so identical bits):
 *  - split (large chunks): row ops take rows [r0, r1) of the shared x/xn and quantize them into the
 *    shared activation buffers; a barrier precedes every matmul.
 *  - replicated (chunks of <= KVT_REPL_ROWS rows with several threads, i.e. decode): every thread
 *    keeps its own copy of the residual stream and does the (tiny) row ops and activation
 *    quantization itself into private buffers, so a matmul can start right after the previous
 *    one's barrier: 6 barriers per layer instead of 10, and 4 where each thread owns its KV heads
 *    (heads_own_columns: no barrier between the Q/K/V projections, the K/V writes and attention).
 * Shared buffers written by a matmul (q/k/v, tmp, gate/up, logits) are only read after the barrier
 * that follows it (own heads: q/k/v columns are read only by the thread that wrote them), and are
 * next overwritten only after a later barrier.
 */
static void forward_chunk(void *arg, int ith, int nth) {
    kvt_ctx *c = arg;
    const kvt_model *m = c->m;
    const kvt_hparams *hp = &m->hp;
    kvt_threadpool *tp = c->tp;
    const kvt_arch_ops *o = m->ops;
    const uint32_t n = c->n, E = hp->n_embd, half = hp->n_rot / 2;
    const float eps = hp->norm_eps;
    const bool repl = nth > 1 && n <= KVT_REPL_ROWS;
    kvt_thread_buf *tb = &c->tbuf[ith];
    float *X = repl ? tb->x : c->x, *XN = repl ? tb->xn : c->xn;
    void *const *ACT = repl ? tb->act : c->act;
    uint32_t r0, r1; /* rows of this thread's row ops */
    if (repl) {
        r0 = 0;
        r1 = n;
    } else {
        split_range(n, ith, nth, &r0, &r1);
    }

    /* embeddings; RoPE tables (read by the thread doing step 3 of a row; in replicated mode every
     * thread rotates some heads of every row with no barrier before, so each computes all rows'
     * tables into its own buffer) */
    float *const rope_cs = repl ? tb->rope_cs : c->rope_cs;
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (uint64_t)c->tokens[r] * m->tok_embd.row_bytes;
        float *xr = X + (size_t)r * E;
        kvt_dequant_row(m->tok_embd.type, row, xr, E);
        if (o->embd_scale) {
            const float sc = sqrtf((float)E);
            for (uint32_t i = 0; i < E; i++) xr[i] *= sc;
        }
        double pos = (double)c->row_pos[r];
        for (int cfg = 0; cfg < (o->window_rope ? 2 : 1); cfg++) { /* cfg 1: window layers */
            float *cs = rope_cs + ((size_t)r * 2 + cfg) * 2 * half;
            if (hp->mla.yarn) { /* YaRN's per-dimension factors (mla.c), in double */
                for (uint32_t i = 0; i < half; i++) {
                    double th = pos * m->inv_freq[cfg][i];
                    cs[2 * i] = (float)cos(th);
                    cs[2 * i + 1] = (float)sin(th);
                }
                continue;
            }
            /* ggml's angles: theta_i = p * theta_scale^i as float products (theta *= theta_scale),
             * divided by rope_freqs' factor and times the linear scale (global layers), cosf/sinf */
            const float ts = powf(cfg ? hp->rope_base_swa : hp->rope_base, -2.0f / (float)hp->n_rot);
            float th = (float)c->row_pos[r];
            for (uint32_t i = 0; i < half; i++, th *= ts) {
                float ang = th;
                if (cfg == 0) ang = hp->rope_freq_scale * (m->rope_freqs ? ang / m->rope_freqs[i] : ang);
                cs[2 * i] = cosf(ang);
                cs[2 * i + 1] = sinf(ang);
            }
        }
    }

    /* this thread's view of the chunk for the MLA / MoE hooks (model_int.h) */
    const kvt_fwd fw = {hp, tp, ith, nth, repl, n, c->pos0, r0, r1, c->seq, X, XN, ACT, c->act, c->tmp,
                        c->att_scratch[ith], rope_cs, 2 * (size_t)hp->n_rot, c->ext};

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const kvt_layer_w *w = &m->layers[il];
        /* steps 1-6: attention, output in tmp (latent layers: in latent space, mla.c) */
        if (w->mla)
            kvt_mla_attention(&fw, w->mla, w->attn_norm, il);
        else
            dense_attention(c, &fw, w, il);
        /* 7. (post-attention norm,) residual, FFN norm (rows) */
        for (uint32_t r = r0; r < r1; r++) {
            float *xr = X + (size_t)r * E, *tr = c->tmp + (size_t)r * E;
            if (w->post_attn_norm) {
                float *dst = repl ? tb->t : tr; /* tmp is shared: replicated threads norm privately */
                rmsnorm(dst, tr, w->post_attn_norm, E, eps);
                tr = dst;
            }
            for (uint32_t i = 0; i < E; i++) xr[i] += tr[i];
            rmsnorm(XN + (size_t)r * E, xr, w->ffn_norm, E, eps);
        }
        /* steps 8-9: FFN, output in tmp (mixture-of-experts layers: routed and shared experts, moe.c) */
        if (w->moe)
            kvt_moe_ffn(&fw, w->moe, il);
        else
            dense_ffn(c, &fw, w);
        /* 10. (post-FFN norm,) residual (rows; the next layer continues on the same rows) */
        for (uint32_t r = r0; r < r1; r++) {
            float *xr = X + (size_t)r * E, *tr = c->tmp + (size_t)r * E;
            if (w->post_ffw_norm) {
                float *dst = repl ? tb->t : tr;
                rmsnorm(dst, tr, w->post_ffw_norm, E, eps);
                tr = dst;
            }
            for (uint32_t i = 0; i < E; i++) xr[i] += tr[i];
        }
    }

    /* final norm + logits: all rows, or only each segment's last row (normed into XN row s) */
    const kvt_wmat *ow[1] = {&m->output};
    float *lo[1] = {c->out_logits};
    uint32_t n_out_rows = c->all_logits ? n : c->n_segs;
    if (c->all_logits) {
        for (uint32_t r = r0; r < r1; r++) rmsnorm(XN + (size_t)r * E, X + (size_t)r * E, m->output_norm, E, eps);
        quantize_rows(ACT, ow, 1, XN, r0, r1);
    } else {
        for (uint32_t s = 0; s < c->n_segs; s++) {
            const uint32_t last = c->segs[s].off + c->segs[s].n - 1;
            if (last >= r0 && last < r1) { /* the thread(s) holding the segment's last row */
                rmsnorm(XN + (size_t)s * E, X + (size_t)last * E, m->output_norm, E, eps);
                quantize_rows(ACT, ow, 1, XN, s, s + 1);
            }
        }
    }
    if (!repl) kvt_threadpool_barrier(tp);
    matmul_group(ACT, ow, lo, 1, n_out_rows, ith, nth);
}

/* ------------------------------------------------------------------ forward: driver */

static kvt_status check_layout(const kvt_model *m, const kvt_kv_layout *l) {
    if (kvt_kv_layout_n_layers(l) != m->hp.n_layer) return KVT_ERR_INVALID_ARG;
    if (m->ops->pass) return m->ops->pass->check_layout(m->arch_state, &m->hp, l);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const kvt_layer_desc *d = kvt_kv_layout_layer(l, il);
        kvt_layer_desc want;
        layer_desc(m, il, d->codec, &want);
        if (d->kind != want.kind || d->n_kv_heads != want.n_kv_heads || d->head_dim_k != want.head_dim_k ||
            d->head_dim_v != want.head_dim_v)
            return KVT_ERR_INVALID_ARG;
        bool swa = kvt_model_layer_is_swa(m, il);
        if (swa != (d->kind == KVT_KIND_WINDOW) || (swa && d->window != m->hp.n_swa)) return KVT_ERR_INVALID_ARG;
    }
    return KVT_OK;
}

kvt_status kvt_model_forward(kvt_ctx *c, kvt_seq *seq, const int32_t *tokens, uint32_t n, bool all_logits,
                             const volatile int *cancel, float **logits) {
    if (logits) *logits = NULL;
    if (!c || !seq || !tokens || n == 0) return KVT_ERR_INVALID_ARG;
    if (all_logits && n > c->ubatch) return KVT_ERR_INVALID_ARG;
    const kvt_model *m = c->m;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab) return KVT_ERR_INVALID_ARG;
    const kvt_kv_layout *l = kvt_block_pool_layout(kvt_seq_pool(seq));
    kvt_status st = check_layout(m, l);
    if (st != KVT_OK) return st;
    uint64_t end = (uint64_t)kvt_seq_len(seq) + n;
    if (end > UINT32_MAX / 2) return KVT_ERR_RANGE;
    if ((st = ensure_attention(c, l, end)) != KVT_OK) return st;
    if (all_logits && n > c->logits_rows) { /* grown here, never inside the chunk loop */
        float *nl = falloc((size_t)n * m->hp.n_vocab);
        if (!nl) return KVT_ERR_NOMEM;
        free(c->logits);
        c->logits = nl;
        c->logits_rows = n;
    }
    if (m->ops->pass) {
        st = m->ops->pass->forward(c->arch_ctx, c->tp, c->att_scratch, seq, tokens, n, all_logits, cancel, c->logits);
        if (st == KVT_OK && logits) *logits = c->logits;
        return st;
    }
    for (uint32_t off = 0; off < n; off += c->ubatch) {
        if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) return KVT_ERR_CANCELLED; /* set by another thread */
        uint32_t nc = n - off < c->ubatch ? n - off : c->ubatch;
        if ((st = kvt_seq_prepare(seq, nc)) != KVT_OK) return st;
        if (m->latent && (st = kvt_mla_prefill_setup(c->ext, &m->hp, c->mla_prefill, nc, kvt_seq_len(seq), c->nth)))
            return st; /* expanded or absorbed for this chunk (mla.c) */
        if (m->latent && c->ext->exp_on && /* its temporary K/V's attention scratch (no-op at real shapes) */
            (st = ensure_scratch(c, kvt_attention_scratch_floats(c->ext->exp_layout, kvt_seq_len(seq) + nc))))
            return st;
        c->seq = seq;
        c->tokens = tokens + off;
        c->n = nc;
        c->pos0 = kvt_seq_len(seq);
        c->all_logits = all_logits;
        c->segs[0] = (kvt_seg){seq, 0, nc, c->pos0};
        c->n_segs = 1;
        for (uint32_t r = 0; r < nc; r++) c->row_pos[r] = c->pos0 + r;
        c->out_logits = c->logits;
        kvt_threadpool_run(c->tp, forward_chunk, c);
        c->seq = NULL;
        if ((st = kvt_seq_commit(seq, tokens + off, nc)) != KVT_OK) return st;
    }
    if (logits) *logits = c->logits;
    return KVT_OK;
}

/* ------------------------------------------------------------------ forward: batch of sequences */

bool kvt_model_batches(const kvt_model *m) { return m->ops->batches; }

kvt_status kvt_model_forward_batch(kvt_ctx *c, kvt_batch_item *items, uint32_t n_items, float **logits) {
    if (logits) *logits = NULL;
    if (!c || !items || n_items == 0 || n_items > c->ubatch) return KVT_ERR_INVALID_ARG;
    const kvt_model *m = c->m;
    const uint32_t V = m->hp.n_vocab;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        if (!items[i].seq || !items[i].tokens || items[i].n == 0) return KVT_ERR_INVALID_ARG;
        for (uint32_t j = 0; j < i; j++)
            if (items[j].seq == items[i].seq) return KVT_ERR_INVALID_ARG; /* one segment per sequence */
        total += items[i].n;
    }
    if (total > c->ubatch) return KVT_ERR_INVALID_ARG;
    if (n_items > c->blogits_rows) { /* grown here, never inside a pass */
        float *nl = falloc((size_t)n_items * V);
        if (!nl) return KVT_ERR_NOMEM;
        free(c->blogits);
        c->blogits = nl;
        c->blogits_rows = n_items;
    }
    if (n_items == 1 || !kvt_model_batches(m)) { /* per item, same step (documented in model.h) */
        for (uint32_t i = 0; i < n_items; i++) {
            float *lg = NULL;
            items[i].st = kvt_model_forward(c, items[i].seq, items[i].tokens, items[i].n, false, NULL, &lg);
            if (items[i].st == KVT_OK) memcpy(c->blogits + (size_t)i * V, lg, sizeof(float) * V);
        }
        if (logits) *logits = c->blogits;
        return KVT_OK;
    }
    /* validate every item before anything is prepared */
    for (uint32_t i = 0; i < n_items; i++) {
        kvt_batch_item *it = &items[i];
        it->st = KVT_OK;
        for (uint32_t k = 0; k < it->n && it->st == KVT_OK; k++)
            if (it->tokens[k] < 0 || (uint32_t)it->tokens[k] >= V) it->st = KVT_ERR_INVALID_ARG;
        const kvt_kv_layout *l = kvt_block_pool_layout(kvt_seq_pool(it->seq));
        if (it->st == KVT_OK) it->st = check_layout(m, l);
        uint64_t end = (uint64_t)kvt_seq_len(it->seq) + it->n;
        if (it->st == KVT_OK && end > UINT32_MAX / 2) it->st = KVT_ERR_RANGE;
        if (it->st == KVT_OK) {
            kvt_status st = ensure_attention(c, l, end);
            if (st != KVT_OK) return st;
        }
    }
    /* prepare (blocks from the pool); an item the pool cannot hold fails alone */
    uint32_t n_segs = 0, n = 0;
    uint32_t item_of_seg[KVT_MAX_BATCH_ITEMS];
    for (uint32_t i = 0; i < n_items; i++) {
        kvt_batch_item *it = &items[i];
        if (it->st == KVT_OK) it->st = kvt_seq_prepare(it->seq, it->n);
        if (it->st != KVT_OK) continue;
        if (n_segs >= KVT_MAX_BATCH_ITEMS) {
            it->st = KVT_ERR_INVALID_ARG;
            continue;
        }
        c->segs[n_segs] = (kvt_seg){it->seq, n, it->n, kvt_seq_len(it->seq)};
        memcpy(c->btokens + n, it->tokens, sizeof(int32_t) * it->n);
        item_of_seg[n_segs++] = i;
        n += it->n;
    }
    if (n_segs) {
        for (uint32_t s = 0; s < n_segs; s++)
            for (uint32_t r = 0; r < c->segs[s].n; r++) c->row_pos[c->segs[s].off + r] = c->segs[s].pos0 + r;
        c->seq = c->segs[0].seq;
        c->tokens = c->btokens;
        c->n = n;
        c->pos0 = c->segs[0].pos0;
        c->all_logits = false;
        c->n_segs = n_segs;
        c->out_logits = c->blogits;
        kvt_threadpool_run(c->tp, forward_chunk, c);
        c->seq = NULL;
        /* logits row s belongs to item item_of_seg[s] >= s: move from the back */
        for (uint32_t s = n_segs; s-- > 0;)
            if (item_of_seg[s] != s)
                memmove(c->blogits + (size_t)item_of_seg[s] * V, c->blogits + (size_t)s * V, sizeof(float) * V);
        for (uint32_t s = 0; s < n_segs; s++) {
            kvt_batch_item *it = &items[item_of_seg[s]];
            it->st = kvt_seq_commit(it->seq, it->tokens, it->n);
        }
    }
    if (logits) *logits = c->blogits;
    return KVT_OK;
}
