/*
 * jinja.h — a sandboxed Jinja2 interpreter for chat templates (tokenizer.chat_template).
 *
 * It reproduces what Hugging Face transformers renders: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True and the loopcontrols extension ({% break %}, {% continue %}),
 * plus transformers' own globals and filter: raise_exception(msg), strftime_now(fmt) (a fixed date
 * by default, so prompts stay cacheable) and tojson(x, indent=None, separators=None, sort_keys=False)
 * = json.dumps(x, ensure_ascii=False, ...). Values follow Python: str()/repr() formats, truthiness,
 * int/float arithmetic, ordered dicts. The supported subset and the caps are in docs/chat-templates.md.
 *
 * Untrusted input: the template text and the context are both untrusted. Parsing caps the nesting
 * (KVT_JINJA_MAX_NESTING); rendering caps recursion depth, loop steps, output size and memory
 * (kvt_jinja_limits). No I/O, no globals, no crash on any input.
 *
 * Ownership: kvt_jinja_template is immutable after kvt_jinja_template_create and may be rendered
 * from several threads at once (each render owns its memory arena). The rendered text is malloc'd
 * and owned by the caller.
 */
#ifndef KVT_JINJA_H
#define KVT_JINJA_H

#include "util/common.h"

#define KVT_JINJA_MAX_NESTING 96   /* nested blocks + nested brackets/parentheses in one template */

typedef struct kvt_jinja_limits {
    uint32_t max_depth;   /* nested statement/expression evaluation + macro calls (default 400) */
    uint64_t max_steps;   /* loop iterations + macro calls + items visited by filters (default 5,000,000) */
    size_t max_output;    /* bytes of rendered text (default 32 MiB) */
    size_t max_memory;    /* bytes of values built during one render (default 256 MiB) */
} kvt_jinja_limits;

typedef struct kvt_jinja_render_opts {
    const kvt_jinja_limits *limits; /* NULL: the defaults above */
    /* The moment strftime_now() formats, as "YYYY-MM-DD" or "YYYY-MM-DD HH:MM:SS" (UTC).
     * NULL: KVT_JINJA_DEFAULT_DATE. */
    const char *now;
} kvt_jinja_render_opts;

#define KVT_JINJA_DEFAULT_DATE "2026-01-01 00:00:00"

typedef struct kvt_jinja_template kvt_jinja_template;

/* Parses src[0..len). A syntax error is KVT_ERR_FORMAT with "line L, column C: what" in err. */
kvt_status kvt_jinja_template_create(const char *src, size_t len, kvt_jinja_template **out, char *err,
                                     size_t errlen);
void kvt_jinja_template_free(kvt_jinja_template *t);

/* Renders with the variables of a JSON object (ctx_json[0..ctx_len); NULL = no variables). Numbers
 * with a '.', 'e' or 'E' become floats, others ints (as Python's json.loads). A template that
 * raises (raise_exception, an undefined attribute, a type error, an unsafe method) or exceeds a cap
 * is KVT_ERR_INVALID_ARG with the message in err; a malformed context is KVT_ERR_FORMAT.
 * *out (malloc'd, NUL-terminated) and *out_len are set on success only. */
kvt_status kvt_jinja_render(const kvt_jinja_template *t, const char *ctx_json, size_t ctx_len,
                            const kvt_jinja_render_opts *opts, char **out, size_t *out_len, char *err,
                            size_t errlen);

#endif
