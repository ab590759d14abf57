/* fuzz_tokenize.c — libFuzzer target: the BPE (GPT-2) and SPM (LLaMA) tokenizers on arbitrary
 * bytes, with and without special-token parsing, then detokenization of the ids (whole and
 * streamed). Loads the repository's data/vocab once (kvt_vocab_dir). Built by `make fuzz`. */
#include <stdio.h>
#include <stdlib.h>

#include "gguf/gguf.h"
#include "model/gen_model.h"
#include "text/tokenizer.h"

static kvt_gguf *g_g[2];
static kvt_tokenizer *g_t[2];

static void load(void) {
    static const char *const names[2] = {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"};
    char dir[4096], path[4400], err[256];
    if (!kvt_vocab_dir(dir, sizeof dir)) {
        fprintf(stderr, "fuzz_tokenize: data/vocab not found (set KVT_VOCAB_DIR)\n");
        abort();
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (kvt_gguf_open(path, &g_g[i], err, sizeof err) != KVT_OK ||
            kvt_tokenizer_create(g_g[i], &g_t[i], err, sizeof err) != KVT_OK) {
            fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, err);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_t[0]) load();
    if (size < 1) return 0;
    const uint32_t flags = data[0] & 7; /* first byte picks the flags */
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    for (int v = 0; v < 2; v++) {
        int64_t n = kvt_tokenize_ex(g_t[v], text, len, flags, NULL, 0);
        if (n < 0) continue;
        int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
        if (kvt_tokenize_ex(g_t[v], text, len, flags, ids, n) != n) abort(); /* count is stable */
        size_t ol = 0;
        free(kvt_detokenize(g_t[v], ids, n, (flags & 2) != 0, &ol));
        kvt_detok *d = kvt_detok_create(g_t[v], true);
        for (int64_t i = 0; i < n; i++) (void)kvt_detok_push(d, ids[i], &ol);
        (void)kvt_detok_flush(d, &ol);
        kvt_detok_free(d);
        free(ids);
    }
    return 0;
}
