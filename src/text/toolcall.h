/*
 * toolcall.h — splits a model's chat output into reasoning, content and tool calls, for the tool-call
 * syntax of the model's chat template (docs/server.md, "Tool calls"):
 *   - TAGGED   <tool_call>{"name": …, "arguments": {…}}</tool_call>          (Hermes, Qwen 2.5 / 3, QwQ)
 *              <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>
 *                                                                      (Qwen3-Coder, Qwen3.5; per block)
 *   - LLAMA3   a bare JSON object {"name": …, "parameters": {…}} as the whole reply, optionally after
 *              <|python_tag|>                                           (Llama 3.1 / 3.2 / 3.3)
 *   - MISTRAL  [TOOL_CALLS][{"name": …, "arguments": {…}}, …] or [TOOL_CALLS]NAME[ARGS]{…}
 *   - DEEPSEEK <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```
 *              <｜tool▁call▁end｜>… (R1) or …<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜> (V3.1)
 * and <think>…</think> reasoning where the template knows it (also when the generation prompt
 * already opened <think>).
 *
 * Streaming: text is fed in arbitrary pieces (a piece may end inside a marker or a UTF-8 sequence of
 * a marker); events come out as soon as they are certain. Content and reasoning may come in several
 * events; a tool call comes as one event once its block is complete and parsed. Text that starts
 * like a call but does not parse is given back as content (never an error). Feeding the same text in
 * any split gives the same concatenated content, the same reasoning and the same calls.
 *
 * Ownership: a kvt_toolcall is owned by its creator (one per generated choice, one thread at a
 * time). Event strings are valid only during the emit callback. opts->tools_json is copied.
 */
#ifndef KVT_TOOLCALL_H
#define KVT_TOOLCALL_H

#include "../util/common.h"

typedef enum kvt_tool_format {
    KVT_TOOL_FMT_NONE = 0, /* no tool-call parsing (reasoning only) */
    KVT_TOOL_FMT_TAGGED = 1,
    KVT_TOOL_FMT_LLAMA3 = 2,
    KVT_TOOL_FMT_MISTRAL = 3,
    KVT_TOOL_FMT_DEEPSEEK = 4,
} kvt_tool_format;

/* The format a template's source implies (NULL source: NONE), and whether it knows <think>. */
kvt_tool_format kvt_tool_format_detect(const char *template_src);
bool kvt_tool_reasoning_detect(const char *template_src);
const char *kvt_tool_format_name(kvt_tool_format f);
/* True when a rendered prompt ends inside an open <think> block (the generation prompt opened it:
 * the output starts as reasoning). */
bool kvt_tool_prompt_opens_think(const char *prompt, size_t len);

/* The syntax a forced tool call is constrained to (json_schema.h prefix / suffix around a JSON object
 * {"name": …, <args_key>: {…}}). False for formats whose call is not one JSON object (DEEPSEEK). */
bool kvt_toolcall_syntax(kvt_tool_format f, const char **prefix, const char **suffix, const char **args_key);

typedef enum kvt_tc_kind { KVT_TC_CONTENT = 1, KVT_TC_REASONING = 2, KVT_TC_CALL = 3 } kvt_tc_kind;

typedef struct kvt_tc_event {
    kvt_tc_kind kind;
    const char *text; /* CONTENT / REASONING: the bytes (not NUL-terminated) */
    size_t len;
    uint32_t index;   /* CALL: 0-based position among this output's calls */
    const char *id;   /* CALL: "call_" + 24 characters, unique per parser (seeded) */
    const char *name; /* CALL: the function name */
    const char *arguments; /* CALL: the arguments as compact JSON object text */
} kvt_tc_event;
typedef void (*kvt_tc_emit)(void *ctx, const kvt_tc_event *ev);

typedef struct kvt_tc_opts {
    kvt_tool_format format;
    bool reasoning;         /* split <think>…</think> off as reasoning */
    bool in_think;          /* the output starts inside <think> (kvt_tool_prompt_opens_think) */
    const char *tools_json; /* NULL or the request's tools: XML parameter values whose schema type is
                               "string" stay strings; others are parsed as JSON when they are JSON */
    uint64_t id_seed;       /* call ids derive from it (splitmix64) */
} kvt_tc_opts;

typedef struct kvt_toolcall kvt_toolcall;

kvt_status kvt_toolcall_create(const kvt_tc_opts *o, kvt_toolcall **out);
void kvt_toolcall_free(kvt_toolcall *p);
/* Feeds the next piece of output. KVT_ERR_NOMEM only. */
kvt_status kvt_toolcall_feed(kvt_toolcall *p, const char *text, size_t len, kvt_tc_emit emit, void *ctx);
/* End of output: whatever is held back comes out (an unfinished call block as content). */
kvt_status kvt_toolcall_finish(kvt_toolcall *p, kvt_tc_emit emit, void *ctx);
/* Calls emitted so far. */
uint32_t kvt_toolcall_n_calls(const kvt_toolcall *p);

#endif
