/*
 * chat.c — chat prompt rendering: the GGUF's Jinja template through text/jinja.h with Hugging
 * Face's context, and the built-in renderers (string emitters) for ChatML, Llama 3.x, Gemma 3,
 * Mistral / Llama 2 [INST] and Phi-3 with detection of the family from tokenizer.chat_template
 * (engine-facts §4.2 order). The exact text per family is documented in docs/chat-templates.md.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "chat.h"
#include "jinja.h"
#include "util/strbuf.h"

static const char *g_date; /* kvt_chat_set_date; NULL = KVT_JINJA_DEFAULT_DATE */

struct kvt_chat_template {
    kvt_chat_family family;
    bool qwen_default_system; /* template text mentions "You are Qwen" */
    bool llama3_date;         /* template text mentions "Cutting Knowledge Date" */
    char bos_text[32];        /* family BOS text if the vocabulary has it, else "" */
    char eos_text[32];        /* Mistral end of assistant turn */
    char *source;             /* the template text (owned), NULL when none */
    kvt_jinja_template *jt;   /* the compiled template when rendering through Jinja, else NULL */
    char *bos_token, *eos_token; /* Jinja context values (owned) */
};

static const struct {
    const char *name;
    kvt_chat_family f;
} k_names[] = {{"chatml", KVT_CHAT_CHATML}, {"llama3", KVT_CHAT_LLAMA3}, {"gemma", KVT_CHAT_GEMMA},
               {"mistral", KVT_CHAT_MISTRAL}, {"llama2", KVT_CHAT_MISTRAL}, {"phi3", KVT_CHAT_PHI3},
               {"qwen35", KVT_CHAT_QWEN35}};

const char *kvt_chat_family_name(kvt_chat_family f) {
    switch (f) {
    case KVT_CHAT_CHATML: return "chatml";
    case KVT_CHAT_LLAMA3: return "llama3";
    case KVT_CHAT_GEMMA: return "gemma";
    case KVT_CHAT_MISTRAL: return "mistral";
    case KVT_CHAT_PHI3: return "phi3";
    case KVT_CHAT_QWEN35: return "qwen35";
    }
    return "unknown";
}

kvt_status kvt_chat_family_parse(const char *name, kvt_chat_family *out) {
    for (size_t i = 0; name && i < KVT_ARRAY_LEN(k_names); i++)
        if (!strcmp(name, k_names[i].name)) {
            *out = k_names[i].f;
            return KVT_OK;
        }
    return KVT_ERR_INVALID_ARG;
}

static bool has(const char *s, size_t len, const char *needle) {
    return s && memmem(s, len, needle, strlen(needle)) != NULL;
}

kvt_chat_family kvt_chat_detect(const char *text, size_t len, bool *known) {
    if (known) *known = true;
    for (size_t i = 0; text && i < KVT_ARRAY_LEN(k_names); i++)
        if (strlen(k_names[i].name) == len && !memcmp(text, k_names[i].name, len)) return k_names[i].f;
    /* Qwen3 / Qwen3.5 templates: ChatML that splits assistant content on </think> */
    if (has(text, len, "<|im_start|>") && has(text, len, "</think>")) return KVT_CHAT_QWEN35;
    if (has(text, len, "<|im_start|>")) return KVT_CHAT_CHATML; /* (phi4 / smolvlm variants: ChatML) */
    if ((len >= 7 && !memcmp(text, "mistral", 7)) || has(text, len, "[INST]")) return KVT_CHAT_MISTRAL;
    if (has(text, len, "<|assistant|>") && has(text, len, "<|end|>")) return KVT_CHAT_PHI3;
    if (has(text, len, "<start_of_turn>")) return KVT_CHAT_GEMMA;
    if (has(text, len, "<|start_header_id|>") && has(text, len, "<|end_header_id|>")) return KVT_CHAT_LLAMA3;
    if (known) *known = false;
    return KVT_CHAT_CHATML;
}

kvt_status kvt_chat_template_create(const kvt_gguf *g, const kvt_tokenizer *t, const char *name_override,
                                    kvt_chat_template **out, char *err, size_t errlen) {
    const char *tt = NULL;
    uint64_t tl = 0;
    if (g && !kvt_gguf_get_str(g, "tokenizer.chat_template", &tt, &tl)) {
        tt = NULL;
        tl = 0;
    }
    if (tt && tl && !name_override) {
        char e2[400] = "";
        kvt_status st = kvt_chat_template_create_jinja(tt, (size_t)tl, t, NULL, NULL, out, e2, sizeof e2);
        if (st != KVT_OK)
            return kvt_errf(err, errlen, st, "the model's tokenizer.chat_template: %s (--chat-template NAME uses a "
                            "built-in renderer instead)", e2);
        return KVT_OK;
    }
    return kvt_chat_template_create_text(tt, (size_t)tl, t, name_override, out, err, errlen);
}

static char *dupz(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

kvt_status kvt_chat_template_create_jinja(const char *tmpl, size_t tmpl_len, const kvt_tokenizer *t,
                                          const char *bos, const char *eos, kvt_chat_template **out, char *err,
                                          size_t errlen) {
    *out = NULL;
    kvt_jinja_template *jt = NULL;
    kvt_status st = kvt_jinja_template_create(tmpl, tmpl ? tmpl_len : 0, &jt, err, errlen);
    if (st != KVT_OK) return st;
    bool known;
    kvt_chat_family f = kvt_chat_detect(tmpl, tmpl ? tmpl_len : 0, &known);
    char tmp[16];
    snprintf(tmp, sizeof tmp, "%s", kvt_chat_family_name(f));
    kvt_chat_template *c = NULL;
    st = kvt_chat_template_create_text(tmpl, tmpl_len, t, tmp, &c, err, errlen);
    if (st != KVT_OK) {
        kvt_jinja_template_free(jt);
        return st;
    }
    c->jt = jt;
    if (!bos) {
        int32_t id = t ? kvt_tokenizer_bos(t) : -1;
        bos = id >= 0 && kvt_tokenizer_token_text(t, id) ? kvt_tokenizer_token_text(t, id) : "";
    }
    if (!eos) {
        int32_t id = t ? kvt_tokenizer_eos(t) : -1;
        eos = id >= 0 && kvt_tokenizer_token_text(t, id) ? kvt_tokenizer_token_text(t, id) : "";
    }
    c->bos_token = dupz(bos);
    c->eos_token = dupz(eos);
    if (!c->bos_token || !c->eos_token) {
        kvt_chat_template_free(c);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    }
    *out = c;
    return KVT_OK;
}

kvt_status kvt_chat_template_create_file(const char *path, const kvt_tokenizer *t, kvt_chat_template **out,
                                         char *err, size_t errlen) {
    *out = NULL;
    enum { MAX_TEMPLATE = 4 << 20 };
    FILE *f = fopen(path, "rb");
    if (!f) return kvt_errf(err, errlen, KVT_ERR_IO, "chat template file %s: cannot open", path);
    char *buf = malloc(MAX_TEMPLATE + 1);
    size_t n = buf ? fread(buf, 1, MAX_TEMPLATE + 1, f) : 0;
    bool bad = buf && ferror(f);
    fclose(f);
    if (!buf) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    if (bad || n > MAX_TEMPLATE) {
        free(buf);
        return kvt_errf(err, errlen, KVT_ERR_IO, "chat template file %s: %s", path,
                        bad ? "read error" : "larger than 4 MiB");
    }
    char e2[400] = "";
    kvt_status st = kvt_chat_template_create_jinja(buf, n, t, NULL, NULL, out, e2, sizeof e2);
    free(buf);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "chat template file %s: %s", path, e2);
    return KVT_OK;
}

bool kvt_chat_is_jinja(const kvt_chat_template *c) { return c->jt != NULL; }
void kvt_chat_set_date(const char *date) { g_date = date; }

const char *kvt_chat_end_of_turn(const kvt_chat_template *c) {
    switch (c->family) {
    case KVT_CHAT_CHATML:
    case KVT_CHAT_QWEN35: return "<|im_end|>\n";
    case KVT_CHAT_LLAMA3: return "<|eot_id|>";
    case KVT_CHAT_GEMMA: return "<end_of_turn>\n";
    case KVT_CHAT_MISTRAL: return c->eos_text;
    case KVT_CHAT_PHI3: return "<|end|>\n";
    }
    return "";
}

kvt_status kvt_chat_template_create_text(const char *tt, size_t tl, const kvt_tokenizer *t,
                                         const char *name_override, kvt_chat_template **out, char *err,
                                         size_t errlen) {
    *out = NULL;
    if (!tt) tl = 0;
    kvt_chat_family f;
    if (name_override) {
        if (kvt_chat_family_parse(name_override, &f) != KVT_OK)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "unknown chat template '%s' (valid: chatml, qwen35, llama3, gemma, mistral, llama2, phi3)",
                            name_override);
    } else {
        bool known;
        f = kvt_chat_detect(tt, tl, &known);
        if (!known)
            KVT_WARN("chat: %s; using ChatML", tt ? "unrecognised tokenizer.chat_template" : "no tokenizer.chat_template");
    }
    kvt_chat_template *c = calloc(1, sizeof *c);
    if (!c) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    c->family = f;
    if (tt && tl) {
        c->source = malloc(tl + 1);
        if (!c->source) {
            free(c);
            return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
        }
        memcpy(c->source, tt, tl);
        c->source[tl] = 0;
    }
    c->qwen_default_system = has(tt, tl, "You are Qwen");
    c->llama3_date = has(tt, tl, "Cutting Knowledge Date");
    const char *bos = f == KVT_CHAT_LLAMA3 ? "<|begin_of_text|>" : f == KVT_CHAT_GEMMA ? "<bos>"
                      : f == KVT_CHAT_MISTRAL ? "<s>" : NULL;
    if (bos && (!t || kvt_tokenizer_find(t, bos) >= 0)) snprintf(c->bos_text, sizeof c->bos_text, "%s", bos);
    if (f == KVT_CHAT_MISTRAL) {
        if (!t || kvt_tokenizer_find(t, "</s>") >= 0) snprintf(c->eos_text, sizeof c->eos_text, "</s>");
        else if (kvt_tokenizer_eos(t) >= 0 && kvt_tokenizer_token_text(t, kvt_tokenizer_eos(t)))
            snprintf(c->eos_text, sizeof c->eos_text, "%s", kvt_tokenizer_token_text(t, kvt_tokenizer_eos(t)));
    }
    *out = c;
    return KVT_OK;
}

void kvt_chat_template_free(kvt_chat_template *c) {
    if (!c) return;
    kvt_jinja_template_free(c->jt);
    free(c->bos_token);
    free(c->eos_token);
    free(c->source);
    free(c);
}
const char *kvt_chat_template_source(const kvt_chat_template *c) { return c->source; }
kvt_chat_family kvt_chat_family_of(const kvt_chat_template *c) { return c->family; }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
/* Length of s[0..n) without its leading and trailing whitespace; *start gets the first kept byte. */
static size_t trimmed(const char *s, size_t n, const char **start) {
    size_t a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    *start = s + a;
    return n - a;
}
/* Appends s[0..n) without its leading and trailing whitespace. */
static void add_trimmed(kvt_strbuf *b, const char *s, size_t n) {
    const char *t;
    size_t len = trimmed(s, n, &t);
    kvt_strbuf_add(b, t, len);
}

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT } role_t;

static int role_of(const char *r) {
    if (!r) return -1;
    if (!strcmp(r, "system")) return R_SYSTEM;
    if (!strcmp(r, "user")) return R_USER;
    if (!strcmp(r, "assistant")) return R_ASSISTANT;
    return -1;
}

/* Gemma and [INST] formats: optional leading system, then user/assistant alternating from user. */
static kvt_status check_alternation(const kvt_chat_msg *m, size_t n, const char *fam, char *err, size_t errlen) {
    size_t i = 0;
    if (n && role_of(m[0].role) == R_SYSTEM) i = 1;
    for (size_t k = 0; i < n; i++, k++) {
        int want = (k % 2 == 0) ? R_USER : R_ASSISTANT;
        if (role_of(m[i].role) != want)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "chat: %s needs an optional first system message, then user/assistant turns "
                            "alternating from user (message %zu is '%s')",
                            fam, i, m[i].role);
    }
    return KVT_OK;
}

/* Gemma and Llama 2 fold a leading system message into the first user turn: *sys gets it (or NULL)
 * and the return value is the index of the first turn message. */
static size_t split_system(const kvt_chat_msg *m, size_t n, const kvt_chat_msg **sys) {
    *sys = n && role_of(m[0].role) == R_SYSTEM ? &m[0] : NULL;
    return *sys ? 1 : 0;
}

static kvt_status render_jinja(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                               const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen);

kvt_status kvt_chat_render(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                           bool add_generation_prompt, char **out, size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (c->jt) {
        kvt_chat_opts o = {.add_generation_prompt = add_generation_prompt};
        return render_jinja(c, msgs, n_msgs, &o, out, out_len, err, errlen);
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (role_of(msgs[i].role) < 0)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: unknown role '%s' (message %zu)",
                            msgs[i].role ? msgs[i].role : "(null)", i);
        if (!msgs[i].content && msgs[i].content_len)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: message %zu has no content", i);
    }
    if (c->family == KVT_CHAT_GEMMA || c->family == KVT_CHAT_MISTRAL) {
        kvt_status st = check_alternation(msgs, n_msgs, c->family == KVT_CHAT_GEMMA ? "gemma" : "mistral/llama2",
                                          err, errlen);
        if (st != KVT_OK) return st;
    }
    kvt_strbuf b = {0};
    switch (c->family) {
    case KVT_CHAT_QWEN35: {
        /* Qwen3 rule: an assistant turn before the last user message keeps only what follows its
         * last "</think>" (leading newlines dropped); later turns are rendered verbatim. */
        size_t last_user = 0;
        for (size_t i = 0; i < n_msgs; i++)
            if (role_of(msgs[i].role) == R_USER) last_user = i;
        for (size_t i = 0; i < n_msgs; i++) {
            const char *t = msgs[i].content;
            size_t tl = msgs[i].content_len;
            if (role_of(msgs[i].role) == R_ASSISTANT && i < last_user) {
                for (const char *p; t && (p = memmem(t, tl, "</think>", 8)) != NULL;) {
                    tl -= (size_t)(p + 8 - t);
                    t = p + 8;
                }
                while (tl && *t == '\n') t++, tl--;
            }
            kvt_strbuf_addstr(&b, "<|im_start|>");
            kvt_strbuf_addstr(&b, msgs[i].role);
            kvt_strbuf_addstr(&b, "\n");
            kvt_strbuf_add(&b, t, tl);
            kvt_strbuf_addstr(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) kvt_strbuf_addstr(&b, "<|im_start|>assistant\n");
        break;
    }
    case KVT_CHAT_CHATML:
        if (c->qwen_default_system && (n_msgs == 0 || role_of(msgs[0].role) != R_SYSTEM))
            kvt_strbuf_addstr(&b, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                  "assistant.<|im_end|>\n");
        for (size_t i = 0; i < n_msgs; i++) {
            kvt_strbuf_addstr(&b, "<|im_start|>");
            kvt_strbuf_addstr(&b, msgs[i].role);
            kvt_strbuf_addstr(&b, "\n");
            kvt_strbuf_add(&b, msgs[i].content, msgs[i].content_len);
            kvt_strbuf_addstr(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) kvt_strbuf_addstr(&b, "<|im_start|>assistant\n");
        break;
    case KVT_CHAT_LLAMA3: {
        kvt_strbuf_addstr(&b, c->bos_text);
        size_t i = 0;
        if (c->llama3_date) { /* 3.1 / 3.2: the system block with the date lines is always there */
            kvt_strbuf_addstr(&b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                                  "Today Date: 26 Jul 2024\n\n");
            if (n_msgs && role_of(msgs[0].role) == R_SYSTEM) {
                add_trimmed(&b, msgs[0].content, msgs[0].content_len);
                i = 1;
            }
            kvt_strbuf_addstr(&b, "<|eot_id|>");
        }
        for (; i < n_msgs; i++) {
            kvt_strbuf_addstr(&b, "<|start_header_id|>");
            kvt_strbuf_addstr(&b, msgs[i].role);
            kvt_strbuf_addstr(&b, "<|end_header_id|>\n\n");
            add_trimmed(&b, msgs[i].content, msgs[i].content_len);
            kvt_strbuf_addstr(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) kvt_strbuf_addstr(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    case KVT_CHAT_GEMMA: {
        kvt_strbuf_addstr(&b, c->bos_text);
        const kvt_chat_msg *sys;
        size_t i = split_system(msgs, n_msgs, &sys);
        for (; i < n_msgs; i++) {
            bool user = role_of(msgs[i].role) == R_USER;
            kvt_strbuf_addstr(&b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (user && sys) {
                const char *t;
                size_t tl = trimmed(sys->content, sys->content_len, &t);
                if (tl) {
                    kvt_strbuf_add(&b, t, tl);
                    kvt_strbuf_addstr(&b, "\n\n");
                }
                sys = NULL;
            }
            add_trimmed(&b, msgs[i].content, msgs[i].content_len);
            kvt_strbuf_addstr(&b, "<end_of_turn>\n");
        }
        if (add_generation_prompt) kvt_strbuf_addstr(&b, "<start_of_turn>model\n");
        break;
    }
    case KVT_CHAT_MISTRAL: {
        /* Llama 2 format: <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A</s><s>[INST] U2 [/INST] */
        const kvt_chat_msg *sys;
        size_t i = split_system(msgs, n_msgs, &sys);
        for (; i < n_msgs; i++) {
            if (role_of(msgs[i].role) == R_USER) {
                kvt_strbuf_addstr(&b, c->bos_text);
                kvt_strbuf_addstr(&b, "[INST] ");
                if (sys) {
                    kvt_strbuf_addstr(&b, "<<SYS>>\n");
                    add_trimmed(&b, sys->content, sys->content_len);
                    kvt_strbuf_addstr(&b, "\n<</SYS>>\n\n");
                    sys = NULL;
                }
                add_trimmed(&b, msgs[i].content, msgs[i].content_len);
                kvt_strbuf_addstr(&b, " [/INST]");
            } else {
                kvt_strbuf_addstr(&b, " ");
                add_trimmed(&b, msgs[i].content, msgs[i].content_len);
                kvt_strbuf_addstr(&b, c->eos_text);
            }
        }
        /* the generation prompt is implicit: the text already ends with " [/INST]" */
        break;
    }
    case KVT_CHAT_PHI3:
        for (size_t i = 0; i < n_msgs; i++) {
            kvt_strbuf_addstr(&b, "<|");
            kvt_strbuf_addstr(&b, msgs[i].role);
            kvt_strbuf_addstr(&b, "|>\n");
            kvt_strbuf_add(&b, msgs[i].content, msgs[i].content_len);
            kvt_strbuf_addstr(&b, "<|end|>\n");
        }
        if (add_generation_prompt) kvt_strbuf_addstr(&b, "<|assistant|>\n");
        break;
    }
    size_t len;
    *out = kvt_strbuf_take(&b, &len);
    if (!*out) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    if (out_len) *out_len = len;
    return KVT_OK;
}

kvt_status kvt_chat_tokenize(const kvt_chat_template *c, const kvt_tokenizer *t, const kvt_chat_msg *msgs,
                             size_t n_msgs, bool add_generation_prompt, int32_t **ids, int64_t *n_ids, char *err,
                             size_t errlen) {
    *ids = NULL;
    *n_ids = 0;
    char *text;
    size_t len;
    kvt_status st = kvt_chat_render(c, msgs, n_msgs, add_generation_prompt, &text, &len, err, errlen);
    if (st != KVT_OK) return st;
    int64_t n = kvt_tokenize(t, text, len, false, true, NULL, 0);
    int32_t *v = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *v) : NULL;
    if (!v) {
        free(text);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    }
    kvt_tokenize(t, text, len, false, true, v, n);
    free(text);
    *ids = v;
    *n_ids = n;
    return KVT_OK;
}

/* ---- the Jinja path: HF's context as JSON ---- */
/* Validates that text is JSON of the wanted shape (cJSON_IsArray / IsObject / any when NULL). */
static kvt_status check_json(const char *text, size_t len, cJSON_bool (*shape)(const cJSON *), const char *field,
                             const char *want, char *err, size_t errlen) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    bool ok = j && (!shape || shape(j) || cJSON_IsNull(j));
    cJSON_Delete(j);
    if (!ok) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: %s must be %s", field, want);
    return KVT_OK;
}

/* Everything but the messages: kwargs first (so the standard names win), then HF's variables. */
static kvt_status ctx_rest(const kvt_chat_template *c, const kvt_chat_opts *opts, kvt_strbuf *b, char *err,
                           size_t errlen) {
    kvt_strbuf_addstr(b, "{");
    if (opts && opts->kwargs_json) {
        size_t n = strlen(opts->kwargs_json);
        kvt_status st = check_json(opts->kwargs_json, n, cJSON_IsObject, "chat_template_kwargs", "a JSON object", err, errlen);
        if (st != KVT_OK) return st;
        const char *s = opts->kwargs_json, *e = s + n;
        while (s < e && *s != '{') s++;
        while (e > s && e[-1] != '}') e--;
        if (e - s > 2) { /* a non-empty object: splice its members */
            kvt_strbuf_add(b, s + 1, (size_t)(e - s - 2));
            kvt_strbuf_addstr(b, ",");
        }
    }
    kvt_strbuf_addstr(b, "\"tools\":");
    if (opts && opts->tools_json) {
        size_t n = strlen(opts->tools_json);
        kvt_status st = check_json(opts->tools_json, n, cJSON_IsArray, "tools", "a list", err, errlen);
        if (st != KVT_OK) return st;
        kvt_strbuf_add(b, opts->tools_json, n);
    } else kvt_strbuf_addstr(b, "null");
    kvt_strbuf_addstr(b, ",\"documents\":null,\"add_generation_prompt\":");
    kvt_strbuf_addstr(b, opts && opts->add_generation_prompt ? "true" : "false");
    kvt_strbuf_addstr(b, ",\"bos_token\":");
    kvt_strbuf_json_str(b, c->bos_token, strlen(c->bos_token));
    kvt_strbuf_addstr(b, ",\"eos_token\":");
    kvt_strbuf_json_str(b, c->eos_token, strlen(c->eos_token));
    kvt_strbuf_addstr(b, ",\"messages\":");
    return KVT_OK;
}

static kvt_status run_jinja(const kvt_chat_template *c, kvt_strbuf *ctx, char **out, size_t *out_len, char *err,
                            size_t errlen) {
    if (ctx->oom) {
        kvt_strbuf_free(ctx);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "chat: out of memory");
    }
    kvt_jinja_render_opts ro = {.now = g_date};
    char e2[512] = "";
    kvt_status st = kvt_jinja_render(c->jt, ctx->p, ctx->n, &ro, out, out_len, e2, sizeof e2);
    kvt_strbuf_free(ctx);
    if (st == KVT_ERR_FORMAT) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: %s", e2);
    if (st != KVT_OK) return kvt_errf(err, errlen, st, "%s", e2);
    return KVT_OK;
}

static kvt_status render_jinja(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                               const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen) {
    kvt_strbuf b = {0};
    kvt_status st = ctx_rest(c, opts, &b, err, errlen);
    if (st != KVT_OK) {
        kvt_strbuf_free(&b);
        return st;
    }
    kvt_strbuf_addstr(&b, "[");
    for (size_t i = 0; i < n_msgs; i++) {
        const kvt_chat_msg *m = &msgs[i];
        if (!m->role || (!m->content && m->content_len)) {
            kvt_strbuf_free(&b);
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: message %zu has no role or content", i);
        }
        kvt_strbuf_addstr(&b, i ? ",{\"role\":" : "{\"role\":");
        kvt_strbuf_json_str(&b, m->role, strlen(m->role));
        kvt_strbuf_addstr(&b, ",\"content\":");
        if (m->content) kvt_strbuf_json_str(&b, m->content, m->content_len);
        else kvt_strbuf_addstr(&b, "null");
        if (m->reasoning_content) {
            kvt_strbuf_addstr(&b, ",\"reasoning_content\":");
            kvt_strbuf_json_str(&b, m->reasoning_content, strlen(m->reasoning_content));
        }
        if (m->tool_calls_json) {
            size_t n = strlen(m->tool_calls_json);
            char field[64];
            snprintf(field, sizeof field, "messages[%zu].tool_calls", i);
            st = check_json(m->tool_calls_json, n, cJSON_IsArray, field, "a list", err, errlen);
            if (st != KVT_OK) {
                kvt_strbuf_free(&b);
                return st;
            }
            kvt_strbuf_addstr(&b, ",\"tool_calls\":");
            kvt_strbuf_add(&b, m->tool_calls_json, n);
        }
        if (m->tool_call_id) {
            kvt_strbuf_addstr(&b, ",\"tool_call_id\":");
            kvt_strbuf_json_str(&b, m->tool_call_id, strlen(m->tool_call_id));
        }
        if (m->name) {
            kvt_strbuf_addstr(&b, ",\"name\":");
            kvt_strbuf_json_str(&b, m->name, strlen(m->name));
        }
        kvt_strbuf_addstr(&b, "}");
    }
    kvt_strbuf_addstr(&b, "]}");
    return run_jinja(c, &b, out, out_len, err, errlen);
}

kvt_status kvt_chat_render_json(const kvt_chat_template *c, const char *messages_json, size_t messages_len,
                                const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!c->jt)
        return kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED, "chat: the %s renderer takes no JSON messages",
                        kvt_chat_family_name(c->family));
    /* the shape only: the interpreter's own JSON reader checks the rest (one pass over big input) */
    size_t i = 0;
    while (i < messages_len && (messages_json[i] == ' ' || messages_json[i] == '\t' || messages_json[i] == '\n' ||
                                messages_json[i] == '\r'))
        i++;
    if (i >= messages_len || messages_json[i] != '[')
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: messages must be a list");
    kvt_status st;
    kvt_strbuf b = {0};
    st = ctx_rest(c, opts, &b, err, errlen);
    if (st != KVT_OK) {
        kvt_strbuf_free(&b);
        return st;
    }
    kvt_strbuf_add(&b, messages_json, messages_len);
    kvt_strbuf_addstr(&b, "}");
    return run_jinja(c, &b, out, out_len, err, errlen);
}

kvt_status kvt_chat_render_ex(const kvt_chat_template *c, const kvt_chat_msg *msgs, size_t n_msgs,
                              const kvt_chat_opts *opts, char **out, size_t *out_len, char *err, size_t errlen) {
    if (c->jt) {
        *out = NULL;
        if (out_len) *out_len = 0;
        kvt_chat_opts o = {0};
        return render_jinja(c, msgs, n_msgs, opts ? opts : &o, out, out_len, err, errlen);
    }
    if (opts && opts->tools_json)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "chat: the %s renderer cannot render tools",
                        kvt_chat_family_name(c->family));
    return kvt_chat_render(c, msgs, n_msgs, opts && opts->add_generation_prompt, out, out_len, err, errlen);
}
