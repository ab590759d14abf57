/* fuzz_jinja.c — libFuzzer target: the Jinja interpreter (text/jinja.h). The input is a template,
 * optionally followed by a 0x00 byte and a JSON context. The template is parsed; when it parses it
 * renders twice: with the input's context (which exercises the JSON reader, and may be invalid)
 * and with a fixed chat context (messages with tool calls, tools, add_generation_prompt). Small
 * caps keep each run fast; any crash, leak or sanitizer report is a bug. Built by `make fuzz`;
 * seeds in tests/fuzz/corpus/jinja/ (some of tests/fixtures/templates). */
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static const char k_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi <b>\"},"
    " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"hm\", \"tool_calls\": [{\"id\": \"c1\","
    " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"a\": {\"type\": \"integer\"}}}}}], \"add_generation_prompt\": true,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    const uint8_t *z = memchr(data, 0, size);
    size_t tl = z ? (size_t)(z - data) : size;
    const char *ctx = z ? (const char *)z + 1 : NULL;
    size_t cl = z ? size - tl - 1 : 0;
    kvt_jinja_template *t = NULL;
    char err[256];
    if (kvt_jinja_template_create(src, tl, &t, err, sizeof err) != KVT_OK) return 0;
    kvt_jinja_limits lim = {.max_depth = 200, .max_steps = 20000, .max_output = 1 << 16, .max_memory = 8 << 20};
    kvt_jinja_render_opts o = {.limits = &lim};
    char *out = NULL;
    size_t len;
    if (kvt_jinja_render(t, ctx, cl, &o, &out, &len, err, sizeof err) == KVT_OK) free(out);
    out = NULL;
    if (kvt_jinja_render(t, k_ctx, sizeof k_ctx - 1, &o, &out, &len, err, sizeof err) == KVT_OK) free(out);
    kvt_jinja_template_free(t);
    return 0;
}
