/*
 * quantize.c — `kvtier quantize` (quantize.h): one pass over the input's tensors, each converted
 * row by row (dequantize to f32, kvt_quantize_ref to the chosen type) while the writer streams the
 * output file.
 */
#include "quantize.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../gguf/gguf.h"
#include "../kernels/quant.h"
#include "gen_model.h"

/* Same order as kvt_quantize_types. ftype: llama.cpp's general.file_type for the result (a plain
 * k-quant is its _S variant, as llama-quantize names a file mostly of that type). */
static const struct {
    uint32_t type, ftype;
    bool mix; /* llama-quantize's _M rules on top of the base type */
} k_types[] = {
    {KVT_TYPE_F32, 0, false},  {KVT_TYPE_F16, 1, false},   {KVT_TYPE_BF16, 32, false},
    {KVT_TYPE_Q8_0, 7, false}, {KVT_TYPE_Q4_0, 2, false},  {KVT_TYPE_Q4_1, 3, false},
    {KVT_TYPE_Q5_0, 8, false}, {KVT_TYPE_Q5_1, 9, false},  {KVT_TYPE_Q4_K, 14, false},
    {KVT_TYPE_Q5_K, 16, false}, {KVT_TYPE_Q6_K, 18, false}, {KVT_TYPE_Q4_K, 15, true},
    {KVT_TYPE_Q5_K, 17, true},
};
const char *const kvt_quantize_types[] = {"f32",  "f16",  "bf16", "q8_0",   "q4_0",   "q4_1", "q5_0",
                                          "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m", NULL};

static int type_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; kvt_quantize_types[i]; i++)
        if (!strcmp(kvt_quantize_types[i], name)) return i;
    return -1;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !memcmp(s + n - m, suf, m);
}

/* llama-quantize's use_more_bits: the first and last eighth of the layers and every third between */
static bool use_more_bits(uint32_t i, uint32_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2);
}

/* layer index of "blk.N.…", or -1 */
static int64_t layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    int64_t v = 0;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9' && v < 1000000) v = v * 10 + (*p++ - '0');
    return *p == '.' ? v : -1;
}

uint32_t kvt_quantize_tensor_type(const char *want, const char *name, uint32_t n_dims, int64_t n0,
                                  uint32_t n_layer) {
    const int ti = type_index(want);
    if (ti < 0 || n_dims < 2 || n0 <= 0 || !ends_with(name, ".weight")) return UINT32_MAX;
    if (strstr(name, "ffn_gate_inp") || strstr(name, "ssm_") || strstr(name, "rope_freqs")) return UINT32_MAX;
    uint32_t t = k_types[ti].type;
    if (k_types[ti].mix) {
        const int64_t il = layer_of(name);
        if (!strcmp(name, "output.weight")) t = KVT_TYPE_Q6_K;
        else if ((ends_with(name, ".attn_v.weight") || strstr(name, ".ffn_down")) && il >= 0 &&
                 (uint64_t)il < n_layer && use_more_bits((uint32_t)il, n_layer))
            t = KVT_TYPE_Q6_K;
    }
    return kvt_gen_model_pick_type(t, n0);
}

static bool is_float_type(uint32_t t) { return t == KVT_TYPE_F32 || t == KVT_TYPE_F16 || t == KVT_TYPE_BF16; }

typedef struct tensor_job {
    const kvt_gguf_tensor *src; /* borrowed from the open input, which outlives the writer */
    uint32_t out_type;
    uint32_t index, count;
    FILE *progress;
} tensor_job;

static kvt_status fill_tensor(void *ctx, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                              void *dst, uint64_t nbytes) {
    (void)n_dims;
    const tensor_job *j = ctx;
    const kvt_gguf_tensor *s = j->src;
    if (j->progress)
        fprintf(j->progress, "[%3u/%u] %-32s %-5s -> %-5s\n", j->index + 1, j->count, name,
                kvt_type_name(s->type), kvt_type_name(type));
    if (type == s->type) { /* unchanged: the bytes as they are */
        if (nbytes != s->nbytes) return KVT_ERR_FORMAT;
        memcpy(dst, s->data, (size_t)nbytes);
        return KVT_OK;
    }
    const int64_t n0 = ne[0];
    const uint64_t in_rb = kvt_type_row_bytes(s->type, (uint64_t)n0), out_rb = kvt_type_row_bytes(type, (uint64_t)n0);
    if (!in_rb || !out_rb || nbytes % out_rb || s->nbytes != nbytes / out_rb * in_rb) return KVT_ERR_FORMAT;
    const uint64_t rows = nbytes / out_rb;
    float *row = malloc((size_t)n0 * sizeof *row);
    if (!row) return KVT_ERR_NOMEM;
    const uint8_t *in = s->data;
    uint8_t *out = dst;
    for (uint64_t r = 0; r < rows; r++) {
        kvt_dequant_ref(s->type, in + r * in_rb, row, n0);
        kvt_quantize_ref(type, row, out + r * out_rb, n0);
    }
    free(row);
    return KVT_OK;
}

kvt_status kvt_quantize_model(const kvt_quantize_opts *o, const char *in_path, const char *out_path,
                              kvt_quantize_result *res, char *err, size_t errlen) {
    kvt_quantize_result r = {0};
    const int ti = type_index(o->type);
    if (ti < 0) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "unknown type '%s'", o->type ? o->type : "");
    kvt_gguf *g = NULL;
    char gerr[256];
    kvt_status st = kvt_gguf_open(in_path, &g, gerr, sizeof gerr);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "%s: %s", in_path, gerr);

    /* n_layer for the mixes' layer rule: <general.architecture>.block_count */
    uint32_t n_layer = 0;
    const char *arch;
    uint64_t alen;
    if (kvt_gguf_get_str(g, "general.architecture", &arch, &alen) && alen > 0 && alen < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.block_count", (int)alen, arch);
        (void)kvt_gguf_get_u32(g, key, &n_layer);
    }
    if (k_types[ti].mix && n_layer == 0) {
        kvt_gguf_free(g);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: no <arch>.block_count, which the %s rules need", in_path, o->type);
    }

    const int64_t nt = kvt_gguf_n_tensors(g);
    tensor_job *jobs = calloc(nt > 0 ? (size_t)nt : 1, sizeof *jobs);
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    if (!jobs || !w) {
        st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
        const char *key = kvt_gguf_key_name(g, i);
        if (!strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version")) continue;
        if (!kvt_gguf_w_copy_kv(w, g, key)) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: cannot copy metadata key '%s'", in_path, key);
            goto out;
        }
    }
    r.ftype = k_types[ti].ftype;
    kvt_gguf_w_u32(w, "general.file_type", r.ftype);
    kvt_gguf_w_u32(w, "general.quantization_version", 2);

    for (int64_t i = 0; i < nt; i++) {
        const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
        uint32_t out = kvt_quantize_tensor_type(o->type, t->name, t->n_dims, t->ne[0], n_layer);
        if (out == UINT32_MAX || out == t->type) {
            out = t->type;
        } else {
            if (!kvt_type_supported(t->type)) {
                st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which kvtier cannot read",
                              in_path, t->name, kvt_type_name(t->type));
                goto out;
            }
            if (!is_float_type(t->type) && !o->allow_requantize) {
                st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                              "%s: tensor '%s' is already %s; quantizing it again loses more (--allow-requantize)",
                              in_path, t->name, kvt_type_name(t->type));
                goto out;
            }
            r.n_converted++;
            if (out != k_types[ti].type && out != KVT_TYPE_Q6_K) r.n_fallback++;
        }
        jobs[i] = (tensor_job){t, out, (uint32_t)i, (uint32_t)nt, o->progress};
        r.bytes_in += t->nbytes;
        r.bytes_out += kvt_type_row_bytes(out, (uint64_t)t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        st = kvt_gguf_w_tensor_fill(w, t->name, out, t->n_dims, t->ne, fill_tensor, &jobs[i]);
        if (st != KVT_OK) {
            kvt_errf(err, errlen, st, "%s: tensor '%s' cannot be written as %s", in_path, t->name, kvt_type_name(out));
            goto out;
        }
        r.n_tensors++;
    }
    st = kvt_gguf_writer_finish(w, out_path, gerr, sizeof gerr);
    if (st != KVT_OK) kvt_errf(err, errlen, st, "%s", gerr);
out:
    kvt_gguf_writer_free(w);
    free(jobs);
    kvt_gguf_free(g);
    if (res) *res = r;
    return st;
}
