/* fuzz_http_body.c — libFuzzer target: the HTTP request body parser (server/api.c kvt_api_parse,
 * after the strict RFC 8259 check json_strict.c kvt_json_strict_check, the order the server
 * applies them) for /v1/chat/completions and /v1/completions, every field. The first input byte
 * picks the kind (and the vocabulary size token ids are bounded by); the rest is the body. An
 * accepted request is walked and freed (kvt_api_req_free, then cJSON_Delete); a refused one has
 * its error JSON rendered. Built by `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const kvt_api_kind kind = (data[0] & 1) ? KVT_API_COMPLETION : KVT_API_CHAT;
    const uint32_t n_vocab = (data[0] & 2) ? 256u : 50257u;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    size_t off = 0;
    const char *why = NULL;
    if (kvt_json_strict_check(body, len, &off, &why)) {
        if (off > len) abort();
    } else if (!why || off > len) {
        abort(); /* a refusal names its reason and an offset inside the body */
    }
    cJSON *root = NULL;
    kvt_api_req rq;
    kvt_api_err ae;
    memset(&ae, 0, sizeof ae);
    if (kvt_api_parse(kind, body, len, n_vocab, &root, &rq, &ae)) {
        if (!root) abort();
        volatile size_t sink = 0;
        if (rq.model) sink += strlen(rq.model);
        (void)kvt_api_model_matches(rq.model, "alias", "tiny", "/tmp/model.gguf");
        for (uint32_t i = 0; i < rq.n_stop; i++) sink += strlen(rq.stop[i]);
        for (size_t i = 0; i < rq.n_msgs; i++) {
            sink += strlen(rq.msgs[i].role);
            for (size_t j = 0; j < rq.msgs[i].content_len; j++) sink += (unsigned char)rq.msgs[i].content[j];
        }
        for (size_t j = 0; j < rq.prompt_text_len; j++) sink += (unsigned char)rq.prompt_text[j];
        for (uint32_t i = 0; i < rq.n_prompt_ids; i++)
            if (rq.prompt_ids[i] < 0 || (uint32_t)rq.prompt_ids[i] >= n_vocab) abort();
        (void)sink;
        kvt_api_req_free(&rq);
        cJSON_Delete(root);
    } else {
        if (root) abort(); /* the tree is freed on failure */
        free(kvt_api_error_json(&ae));
    }
    return 0;
}
