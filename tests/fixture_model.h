/* fixture_model.h — tests only: a reference-fixture GGUF (tests/fixtures/) opened as a model with an
 * all-f16 KV layout and a block pool, and a whole-file reader for the fixtures' .ref.json. Include
 * after testutil.h. Everything opened by tu_fx_open is owned by the tu_fx until tu_fx_close. */
#ifndef KVT_TEST_FIXTURE_MODEL_H
#define KVT_TEST_FIXTURE_MODEL_H

#include "gguf/gguf.h"
#include "kv/kv.h"
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

#endif
