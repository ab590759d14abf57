/*
 * chat.h — chat prompt rendering. A GGUF's own tokenizer.chat_template (or a --chat-template-file)
 * is rendered by the Jinja interpreter (text/jinja.h) with Hugging Face's context: messages, tools,
 * documents (null), add_generation_prompt, bos_token, eos_token and the chat_template_kwargs at
 * top level. Without a template, or with an explicit family name, the built-in renderers are used:
 * ChatML (Qwen 2/2.5/3, SmolLM), Qwen3 / Qwen3.5 (ChatML + thinking), Llama 3.x, Gemma 3,
 * Mistral / Llama 2 [INST], Phi-3. The family is still detected from the template text (for
 * kvt_chat_end_of_turn and the output parsers); an unknown one falls back to ChatML with a warning.
 *
 * Ownership: kvt_chat_template is immutable after creation (thread-safe). Rendered strings are
 * malloc'd and owned by the caller.
 */
#ifndef KVT_CHAT_H
#define KVT_CHAT_H

#include "tokenizer.h"

typedef enum kvt_chat_family {
    KVT_CHAT_CHATML = 1,
    KVT_CHAT_LLAMA3 = 2,
    KVT_CHAT_GEMMA = 3,
    KVT_CHAT_MISTRAL = 4, /* also Llama 2 [INST] */
    KVT_CHAT_PHI3 = 5,
    KVT_CHAT_QWEN35 = 6,  /* Qwen3 / Qwen3.5: ChatML whose earlier assistant turns drop their thinking */
} kvt_chat_family;

typedef struct kvt_chat_msg {
    const char *role;    /* "system" | "user" | "assistant" | "tool" (NUL-terminated) */
    const char *content; /* UTF-8; may be NULL with content_len 0 (an assistant turn of tool calls only) */
    size_t content_len;
    /* Optional (NULL when absent), all borrowed for the duration of the render call: */
    const char *reasoning_content; /* assistant: its thinking text (UTF-8, NUL-terminated) */
    const char *tool_calls_json;   /* assistant: the OpenAI `tool_calls` array as JSON text */
    const char *tool_call_id;      /* tool: the id of the call this message answers */
    const char *name;              /* tool: the function name, where the client sent one */
} kvt_chat_msg;

/* What a render takes besides the messages. Borrowed for the duration of the call. */
typedef struct kvt_chat_opts {
    bool add_generation_prompt;
    const char *tools_json;  /* NULL, or the request's `tools` array as JSON text */
    const char *kwargs_json; /* NULL, or a JSON object of extra template variables
                                (chat_template_kwargs, e.g. {"enable_thinking": false}) */
} kvt_chat_opts;

typedef struct kvt_chat_template kvt_chat_template;

/* From a GGUF: the Jinja template when the GGUF carries tokenizer.chat_template and name_override
 * is NULL (a template that fails to parse is KVT_ERR_FORMAT with its line and column), else the
 * built-in family renderer.
 * name_override: NULL or one of "chatml", "qwen35", "llama3", "gemma", "mistral", "llama2", "phi3".
 * An unknown override is KVT_ERR_INVALID_ARG with a message listing the valid names. */
kvt_status kvt_chat_template_create(const kvt_gguf *g, const kvt_tokenizer *t, const char *name_override,
                                    kvt_chat_template **out, char *err, size_t errlen);
void kvt_chat_template_free(kvt_chat_template *c);
kvt_chat_family kvt_chat_family_of(const kvt_chat_template *c);
const char *kvt_chat_family_name(kvt_chat_family f);
kvt_status kvt_chat_family_parse(const char *name, kvt_chat_family *out);
kvt_chat_family kvt_chat_detect(const char *template_text, size_t len, bool *known);

/* Render messages; add_generation_prompt appends the assistant header. Returns malloc'd text (the
 * caller tokenizes it with parse_special = true and add_bos = false: BOS, where the family wants
 * it, is part of the rendered text). KVT_ERR_INVALID_ARG for an unknown role or a role order the
 * family cannot express (message in err). */
kvt_status kvt_chat_render(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                           bool add_generation_prompt, char **out, size_t *out_len, char *err, size_t errlen);

/* Renders and tokenizes in one step (prompt ids malloc'd, caller frees). */
kvt_status kvt_chat_tokenize(const kvt_chat_template *c, const kvt_tokenizer *t, const kvt_chat_msg *msgs,
                             size_t n_msgs, bool add_generation_prompt, int32_t **ids, int64_t *n_ids,
                             char *err, size_t errlen);

/* ---- additions (add-only) ---- */
/* A built-in family renderer chosen by detection from the template text (or name_override); the
 * text is kept (kvt_chat_template_source) but NOT executed as Jinja. tmpl may be NULL. t may be
 * NULL (then BOS texts are assumed to exist in the vocabulary). */
kvt_status kvt_chat_template_create_text(const char *tmpl, size_t tmpl_len, const kvt_tokenizer *t,
                                         const char *name_override, kvt_chat_template **out, char *err,
                                         size_t errlen);
/* The text the family appends after an assistant reply to end its turn ("<|im_end|>\n",
 * "<|eot_id|>", "<end_of_turn>\n", "</s>" (or the vocab's EOS text), "<|end|>\n"). Borrowed. */
const char *kvt_chat_end_of_turn(const kvt_chat_template *c);

/* Render with tools and template variables. A template that raises (raise_exception) or a
 * message the template cannot express is KVT_ERR_INVALID_ARG with the message in err. */
kvt_status kvt_chat_render_ex(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                              const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen);

/* The template source the renderer was built from (the GGUF's tokenizer.chat_template or the
 * --chat-template-file text); NULL when the model carries none. Borrowed: valid until
 * kvt_chat_template_free. Output parsers (tool calls, reasoning) detect their format from it. */
const char *kvt_chat_template_source(const kvt_chat_template *c);

/* A Jinja renderer for tmpl[0..tmpl_len) (a --chat-template-file, or tests). t may be NULL; then
 * bos_token / eos_token are "" unless given (bos/eos NULL = take them from t). A template that
 * fails to parse is KVT_ERR_FORMAT with "line L, column C" in err. */
kvt_status kvt_chat_template_create_jinja(const char *tmpl, size_t tmpl_len, const kvt_tokenizer *t,
                                          const char *bos, const char *eos, kvt_chat_template **out, char *err,
                                          size_t errlen);
/* kvt_chat_template_create_jinja over the text of a file (at most 4 MiB); bos/eos from t.
 * An unreadable file is KVT_ERR_IO, a template that fails to parse KVT_ERR_FORMAT; err names the
 * file either way. */
kvt_status kvt_chat_template_create_file(const char *path, const kvt_tokenizer *t, kvt_chat_template **out,
                                         char *err, size_t errlen);
/* True when renders go through the Jinja template. */
bool kvt_chat_is_jinja(const kvt_chat_template *c);

/* Render with the messages given as a JSON array exactly as the client sent them (HF passes the
 * message dicts through unchanged). Jinja templates only; a family renderer is
 * KVT_ERR_UNSUPPORTED. messages_json and opts are borrowed for the call. Errors as
 * kvt_chat_render_ex; malformed JSON is KVT_ERR_INVALID_ARG naming the field. */
kvt_status kvt_chat_render_json(const kvt_chat_template *c, const char *messages_json, size_t messages_len,
                                const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen);

/* The fixed moment strftime_now() formats ("YYYY-MM-DD[ HH:MM:SS]", NULL = KVT_JINJA_DEFAULT_DATE,
 * 2026-01-01). Process-wide, set once at startup before any render (not thread-safe to change). */
void kvt_chat_set_date(const char *date);

#endif
