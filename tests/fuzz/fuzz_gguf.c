/* fuzz_gguf.c — libFuzzer target: the GGUF reader (gguf/gguf.h) on arbitrary bytes. A buffer that
 * opens is walked completely (every key, every tensor) and handed to the tokenizer constructor,
 * which reads tokenizer.* metadata from it. Built by `make fuzz` (clang -fsanitize=fuzzer,...). */
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvt_gguf *g = NULL;
    char err[256];
    if (kvt_gguf_open_buffer(data, size, &g, err, sizeof err) != KVT_OK) return 0;
    for (int64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
        const char *k = kvt_gguf_key_name(g, i);
        kvt_gguf_vtype et;
        uint64_t n;
        const char *s;
        uint64_t len;
        uint32_t u;
        (void)kvt_gguf_key_type(g, i);
        (void)kvt_gguf_get_u32(g, k, &u);
        (void)kvt_gguf_get_str(g, k, &s, &len);
        if (kvt_gguf_get_arr(g, k, &et, &n, NULL) && et == KVT_GGUF_STRING && n)
            (void)kvt_gguf_get_arr_str(g, k, n - 1, &s, &len);
    }
    kvt_tokenizer *t = NULL;
    if (kvt_tokenizer_create(g, &t, err, sizeof err) == KVT_OK) {
        int32_t ids[64];
        (void)kvt_tokenize_ex(t, "Hello world <|endoftext|> 123", 29, KVT_TOK_ADD_SPECIAL | KVT_TOK_PARSE_SPECIAL, ids, 64);
        kvt_tokenizer_free(t);
    }
    kvt_gguf_free(g);
    return 0;
}
