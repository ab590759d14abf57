/* fixture_model.h — tests only: a reference-fixture GGUF (tests/fixtures/) opened as a model with an
 * all-f16 KV layout and a block pool, a whole-file reader for the fixtures' .ref.json, a tiny
 * generated llama, its last position's logits, and the first line a child process prints. Include
 * after testutil.h. Everything opened by tu_fx_open is owned by the tu_fx until tu_fx_close. */
#ifndef KVT_TEST_FIXTURE_MODEL_H
#define KVT_TEST_FIXTURE_MODEL_H

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/gen_model.h"
#include "model/model.h"

typedef struct tu_fx {
    kvt_gguf *g;
    kvt_model *m;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
} tu_fx;

static inline void tu_fx_open(tu_fx *f, const char *path, uint32_t block_tokens) {
    char err[256];
    memset(f, 0, sizeof *f);
    if (kvt_gguf_open(path, &f->g, err, sizeof err) != KVT_OK) fail_msg("open %s: %s", path, err);
    if (kvt_model_load(f->g, &f->m, err, sizeof err) != KVT_OK) fail_msg("load %s: %s", path, err);
    const kvt_hparams *hp = kvt_model_hparams(f->m);
    kvt_codec codecs[KVT_MAX_LAYERS];
    kvt_layer_desc d[KVT_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(f->m, codecs, d);
    if (kvt_kv_layout_create(d, hp->n_layer, block_tokens, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &f->layout, err,
                             sizeof err) != KVT_OK)
        fail_msg("layout: %s", err);
    f->pool = kvt_block_pool_create(f->layout, 0);
    assert_non_null(f->pool);
}

static inline void tu_fx_close(tu_fx *f) {
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
    kvt_model_free(f->m);
    kvt_gguf_free(f->g);
}

/* The whole file, NUL-terminated (caller frees), or NULL. */
static inline char *tu_read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!b) {
        fclose(fp);
        return NULL;
    }
    if (fread(b, 1, (size_t)n, fp) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(fp);
    return b;
}

/* A tiny random-weight llama (byte vocabulary, seed 11) of weight type `type` written to dir/name;
 * the path is malloc'd (caller frees). f16_full: F16 values that are not bf16 values. */
static inline char *tu_gen_tiny(const char *dir, const char *name, const char *type, bool f16_full) {
    char *path = malloc(512);
    assert_non_null(path);
    snprintf(path, 512, "%s/%s", dir, name);
    kvt_gen_model_opts o = {.arch = "llama", .shape = "tiny", .type = type, .seed = 11, .f16_full = f16_full,
                            .byte_vocab = true};
    char err[256];
    if (kvt_gen_model(&o, path, err, sizeof err) != KVT_OK) fail_msg("gen-model: %s", err);
    return path;
}

/* The last position's logits (n_vocab floats into out) of tok[0..n) run through a fresh context and
 * sequence in chunks of `chunk` tokens (1: decode steps; n: one prefill). */
static inline void tu_last_logits(tu_fx *f, const int32_t *tok, uint32_t n, uint32_t chunk, float *out) {
    kvt_ctx *c = NULL;
    kvt_seq *q = NULL;
    assert_int_equal(kvt_ctx_create(f->m, 2, n, &c), KVT_OK);
    assert_int_equal(kvt_seq_create(f->pool, 1, &q), KVT_OK);
    float *lg = NULL;
    for (uint32_t i = 0; i < n; i += chunk) {
        const uint32_t take = n - i < chunk ? n - i : chunk;
        assert_int_equal(kvt_model_forward(c, q, tok + i, take, false, NULL, &lg), KVT_OK);
    }
    memcpy(out, lg, kvt_model_hparams(f->m)->n_vocab * sizeof(float));
    kvt_seq_free(q);
    kvt_ctx_free(c);
}

/* The first line (no newline) the shell command `cmd` prints; the command must exit 0. */
static inline void tu_child_line(const char *cmd, char *out, size_t len) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(out, (int)len, p));
    assert_int_equal(pclose(p), 0);
    out[strcspn(out, "\n")] = 0;
}

#endif
