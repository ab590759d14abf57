/* fuzz_chat.c — libFuzzer target: chat-template rendering (text/chat.h) for every family. The
 * GPT-2 vocabulary (data/vocab, kvt_vocab_dir) is loaded once and a template is created per family
 * name (kvt_chat_template_create_text) plus one detected from the vocabulary file itself
 * (kvt_chat_template_create). The input after its first byte is split on 0x00 into up to 8
 * messages; each message's first byte picks its role (system/user/assistant/unknown), the rest
 * is its content. Input byte 0 picks add_generation_prompt. Every template renders
 * (kvt_chat_render) and tokenizes (kvt_chat_tokenize) the messages. Built by `make fuzz`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/gen_model.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define N_NAMES 7
static const char *const g_names[N_NAMES] = {"chatml", "qwen35", "llama3", "gemma", "mistral", "llama2", "phi3"};
static kvt_gguf *g_g;
static kvt_tokenizer *g_t;
static kvt_chat_template *g_c[N_NAMES + 2];
static int g_nc;

static void load(void) {
    char dir[4096], path[4400], err[256];
    if (!kvt_vocab_dir(dir, sizeof dir)) {
        fprintf(stderr, "fuzz_chat: data/vocab not found (set KVT_VOCAB_DIR)\n");
        abort();
    }
    snprintf(path, sizeof path, "%s/ggml-vocab-gpt-2.gguf", dir);
    if (kvt_gguf_open(path, &g_g, err, sizeof err) != KVT_OK ||
        kvt_tokenizer_create(g_g, &g_t, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "fuzz_chat: %s: %s\n", path, err);
        abort();
    }
    for (int i = 0; i < N_NAMES; i++)
        if (kvt_chat_template_create_text(NULL, 0, g_t, g_names[i], &g_c[g_nc], err, sizeof err) == KVT_OK) g_nc++;
        else {
            fprintf(stderr, "fuzz_chat: template %s: %s\n", g_names[i], err);
            abort();
        }
    if (kvt_chat_template_create(g_g, g_t, NULL, &g_c[g_nc], err, sizeof err) == KVT_OK) g_nc++;
    /* a template text that detects nothing known falls back to ChatML */
    if (kvt_chat_template_create_text("{{ x }}", 7, g_t, NULL, &g_c[g_nc], err, sizeof err) == KVT_OK) g_nc++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const roles[4] = {"system", "user", "assistant", "tool"};
    if (!g_t) load();
    if (size < 1) return 0;
    const bool add_gen = data[0] & 1;
    kvt_chat_msg msgs[8] = {0};
    size_t n = 0, i = 1;
    while (i < size && n < 8) {
        size_t j = i;
        while (j < size && data[j] != 0) j++;
        /* message = [role byte][content...] up to the separator */
        msgs[n].role = roles[data[i] & 3];
        msgs[n].content = (const char *)data + i + 1;
        msgs[n].content_len = j > i ? j - i - 1 : 0;
        if (j == i) msgs[n].content = (const char *)data + i;
        n++;
        i = j + 1;
    }
    char err[256];
    for (int k = 0; k < g_nc; k++) {
        char *out = NULL;
        size_t out_len = 0;
        if (kvt_chat_render(g_c[k], msgs, n, add_gen, &out, &out_len, err, sizeof err) == KVT_OK) {
            if (!out || strlen(out) > out_len) abort();
            free(out);
        }
        int32_t *ids = NULL;
        int64_t n_ids = 0;
        if (kvt_chat_tokenize(g_c[k], g_t, msgs, n, add_gen, &ids, &n_ids, err, sizeof err) == KVT_OK) {
            if (n_ids < 0) abort();
            free(ids);
        }
        (void)kvt_chat_end_of_turn(g_c[k]);
        (void)kvt_chat_family_name(kvt_chat_family_of(g_c[k]));
    }
    return 0;
}
