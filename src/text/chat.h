/*
 * chat.h — chat template rendering for the families real GGUF files carry: ChatML (Qwen 2/2.5/3,
 * SmolLM), Qwen3 / Qwen3.5 (ChatML + thinking), Llama 3.x, Gemma 3, Mistral / Llama 2 [INST], Phi-3.
 * The family is detected from
 * tokenizer.chat_template; a name can override it; an unknown template falls back to ChatML with a
 * warning.
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
    const char *role;    /* "system" | "user" | "assistant" (NUL-terminated) */
    const char *content; /* UTF-8 */
    size_t content_len;
} kvt_chat_msg;

typedef struct kvt_chat_template kvt_chat_template;

/* name_override: NULL or one of "chatml", "qwen35", "llama3", "gemma", "mistral", "llama2", "phi3".
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
/* Same as kvt_chat_template_create, but the template text is given directly (e.g. from a
 * --chat-template-file, or tests); tmpl may be NULL. t may be NULL (then BOS texts are assumed to
 * exist in the vocabulary). */
kvt_status kvt_chat_template_create_text(const char *tmpl, size_t tmpl_len, const kvt_tokenizer *t,
                                         const char *name_override, kvt_chat_template **out, char *err,
                                         size_t errlen);
/* The text the family appends after an assistant reply to end its turn ("<|im_end|>\n",
 * "<|eot_id|>", "<end_of_turn>\n", "</s>" (or the vocab's EOS text), "<|end|>\n"). Borrowed. */
const char *kvt_chat_end_of_turn(const kvt_chat_template *c);

#endif
