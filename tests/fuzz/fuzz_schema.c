/* fuzz_schema.c — libFuzzer target: the JSON-schema compiler and byte matcher (text/json_schema.h)
 * and the tool-call output parser (text/toolcall.h). The input is split at its first 0x00 byte:
 * the part before is parsed as a JSON schema and compiled (refusals are fine; crashes, leaks and
 * unbounded work are not), the part after is run through the matcher (every prefix checked) and
 * through the tool-call parser of every format, fed in pieces whose sizes come from the text's own
 * bytes. Built by `make fuzz`. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_schema.h"
#include "text/toolcall.h"

static void sink(void *ctx, const kvt_tc_event *ev) {
    size_t *n = ctx;
    *n += ev->kind == KVT_TC_CALL ? strlen(ev->arguments) + strlen(ev->name) : ev->len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *z = memchr(data, 0, size);
    size_t sn = z ? (size_t)(z - data) : size;
    const char *text = z ? (const char *)z + 1 : "";
    size_t tn = z ? size - sn - 1 : 0;
    char *st = malloc(sn + 1);
    if (!st) return 0;
    memcpy(st, data, sn);
    st[sn] = 0;
    cJSON *j = cJSON_Parse(st);
    free(st);
    kvt_json_schema *s = NULL;
    char err[256];
    if (j && kvt_json_schema_get(j, tn & 1 ? "<tool_call>\n" : NULL, tn & 2 ? "\n</tool_call>" : NULL, &s, err,
                                 sizeof err) == KVT_OK) {
        bool ok = kvt_json_schema_accepts(s, text, tn);
        /* every prefix of an accepted text is a valid prefix */
        for (size_t k = 0; ok && k <= tn; k += 1 + tn / 16)
            if (!kvt_json_schema_prefix_ok(s, text, k)) abort();
        kvt_json_schema_release(s);
    }
    cJSON_Delete(j);
    for (int f = 0; f <= KVT_TOOL_FMT_DEEPSEEK; f++) {
        kvt_tc_opts o = {.format = (kvt_tool_format)f, .reasoning = (tn & 4) != 0, .in_think = (tn & 8) != 0, .id_seed = 1};
        kvt_toolcall *p;
        if (kvt_toolcall_create(&o, &p) != KVT_OK) continue;
        size_t out = 0, at = 0;
        while (at < tn) {
            size_t piece = 1 + (unsigned char)text[at] % 7;
            if (piece > tn - at) piece = tn - at;
            kvt_toolcall_feed(p, text + at, piece, sink, &out);
            at += piece;
        }
        kvt_toolcall_finish(p, sink, &out);
        kvt_toolcall_free(p);
    }
    return 0;
}
