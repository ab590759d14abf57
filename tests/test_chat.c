/* test_chat.c — chat template detection, exact rendered text per family, role validation, BOS
 * presence by vocabulary, and the multi-turn token-prefix property on both real vocabularies. */
#include "testutil.h"

#include "gguf/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static kvt_gguf *g_g[2];
static kvt_tokenizer *g_t[2]; /* 0 gpt2, 1 llama spm */

static int setup_all(void **state) {
    (void)state;
    const char *names[2] = {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"};
    for (int i = 0; i < 2; i++) {
        char path[512], err[256];
        tu_vocab_path(path, sizeof path, names[i], ""); /* the repository's data/vocab: missing fails */
        if (kvt_gguf_open(path, &g_g[i], err, sizeof err) != KVT_OK ||
            kvt_tokenizer_create(g_g[i], &g_t[i], err, sizeof err) != KVT_OK) {
            fprintf(stderr, "%s: %s\n", path, err);
            return -1;
        }
    }
    return 0;
}

static int teardown_all(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        kvt_tokenizer_free(g_t[i]);
        kvt_gguf_free(g_g[i]);
    }
    return 0;
}

#define M(r, c) {.role = (r), .content = (c), .content_len = sizeof(c) - 1}

static kvt_chat_template *mk(const char *tmpl, const kvt_tokenizer *t, const char *over) {
    kvt_chat_template *c = NULL;
    char err[256];
    assert_int_equal(kvt_chat_template_create_text(tmpl, tmpl ? strlen(tmpl) : 0, t, over, &c, err, sizeof err),
                     KVT_OK);
    return c;
}

static void expect_render(const kvt_chat_template *c, const kvt_chat_msg *m, size_t n, bool gen, const char *want) {
    char *out = NULL, err[256];
    size_t len;
    assert_int_equal(kvt_chat_render(c, m, n, gen, &out, &len, err, sizeof err), KVT_OK);
    assert_int_equal(len, strlen(out));
    if (strcmp(out, want)) fprintf(stderr, "got:\n%s\nwant:\n%s\n", out, want);
    assert_string_equal(out, want);
    free(out);
}

static void test_detect(void **s) {
    (void)s;
    struct {
        const char *tmpl;
        kvt_chat_family f;
        bool known;
    } cases[] = {
        {"{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>\n{% endfor %}", KVT_CHAT_CHATML, 1},
        {"{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} [/INST]", KVT_CHAT_MISTRAL, 1},
        {"mistral-v7", KVT_CHAT_MISTRAL, 1},
        {"{% for m in messages %}<|user|>\n{{m.content}}<|end|>\n<|assistant|>\n", KVT_CHAT_PHI3, 1},
        {"{{ bos_token }}<start_of_turn>user\n", KVT_CHAT_GEMMA, 1},
        {"<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n", KVT_CHAT_LLAMA3, 1},
        {"llama3", KVT_CHAT_LLAMA3, 1},
        {"gemma", KVT_CHAT_GEMMA, 1},
        {"chatml", KVT_CHAT_CHATML, 1},
        {"<|start_header_id|> only", KVT_CHAT_CHATML, 0},
        {"{{ something unknown }}", KVT_CHAT_CHATML, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool known = !cases[i].known;
        assert_int_equal(kvt_chat_detect(cases[i].tmpl, strlen(cases[i].tmpl), &known), cases[i].f);
        assert_int_equal(known, cases[i].known);
    }
    /* <|im_start|> wins over a [INST] mention (detection order) */
    const char *both = "<|im_start|> [INST]";
    assert_int_equal(kvt_chat_detect(both, strlen(both), NULL), KVT_CHAT_CHATML);
    /* names */
    kvt_chat_family f;
    assert_int_equal(kvt_chat_family_parse("llama2", &f), KVT_OK);
    assert_int_equal(f, KVT_CHAT_MISTRAL);
    assert_int_equal(kvt_chat_family_parse("nope", &f), KVT_ERR_INVALID_ARG);
    assert_string_equal(kvt_chat_family_name(KVT_CHAT_PHI3), "phi3");
    kvt_chat_template *c = NULL;
    char err[256];
    assert_int_equal(kvt_chat_template_create_text(NULL, 0, NULL, "bogus", &c, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chatml"));
    /* override beats the template text */
    c = mk("<|im_start|>", NULL, "gemma");
    assert_int_equal(kvt_chat_family_of(c), KVT_CHAT_GEMMA);
    kvt_chat_template_free(c);
    /* unknown -> chatml */
    c = mk("whatever", NULL, NULL);
    assert_int_equal(kvt_chat_family_of(c), KVT_CHAT_CHATML);
    kvt_chat_template_free(c);
}

static const kvt_chat_msg k_conv[] = {M("system", "S"), M("user", "U"), M("assistant", "A"), M("user", "U2")};

static void test_render_text(void **s) {
    (void)s;
    kvt_chat_template *c = mk(NULL, NULL, "chatml");
    expect_render(c, k_conv, 4, true,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                  "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
    expect_render(c, k_conv + 1, 1, false, "<|im_start|>user\nU<|im_end|>\n"); /* no default system */
    kvt_chat_template_free(c);
    c = mk("<|im_start|>... You are Qwen, created by Alibaba Cloud ...", NULL, NULL);
    expect_render(c, k_conv + 1, 1, true,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    expect_render(c, k_conv, 2, false, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
    kvt_chat_template_free(c);

    const kvt_chat_msg padded[] = {M("system", " S \n"), M("user", "\tU "), M("assistant", " A\n")};
    c = mk(NULL, NULL, "llama3");
    expect_render(c, padded, 3, true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    kvt_chat_template_free(c);
    c = mk("<|start_header_id|><|end_header_id|> Cutting Knowledge Date: December 2023", NULL, NULL);
    assert_int_equal(kvt_chat_family_of(c), KVT_CHAT_LLAMA3);
    expect_render(c, k_conv + 1, 1, true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(c, padded, 2, false,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>");
    kvt_chat_template_free(c);

    c = mk(NULL, NULL, "gemma");
    expect_render(c, padded, 3, true,
                  "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_render(c, k_conv + 1, 1, false, "<bos><start_of_turn>user\nU<end_of_turn>\n");
    kvt_chat_template_free(c);

    c = mk(NULL, NULL, "mistral");
    expect_render(c, k_conv, 4, true, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A</s><s>[INST] U2 [/INST]");
    expect_render(c, k_conv + 1, 1, true, "<s>[INST] U [/INST]");
    kvt_chat_template_free(c);

    c = mk(NULL, NULL, "phi3");
    expect_render(c, k_conv, 4, true,
                  "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\nA<|end|>\n<|user|>\nU2<|end|>\n"
                  "<|assistant|>\n");
    kvt_chat_template_free(c);
}

static void test_render_errors(void **s) {
    (void)s;
    char *out = NULL, err[256];
    size_t len;
    const kvt_chat_msg bad_role[] = {M("tool", "x")};
    const kvt_chat_msg two_users[] = {M("user", "a"), M("user", "b")};
    const kvt_chat_msg late_sys[] = {M("user", "a"), M("system", "b")};
    kvt_chat_family fams[] = {KVT_CHAT_CHATML, KVT_CHAT_LLAMA3, KVT_CHAT_GEMMA, KVT_CHAT_MISTRAL, KVT_CHAT_PHI3};
    for (size_t i = 0; i < 5; i++) {
        kvt_chat_template *c = mk(NULL, NULL, kvt_chat_family_name(fams[i]));
        assert_int_equal(kvt_chat_render(c, bad_role, 1, true, &out, &len, err, sizeof err), KVT_ERR_INVALID_ARG);
        assert_null(out);
        assert_non_null(strstr(err, "tool"));
        bool strict = fams[i] == KVT_CHAT_GEMMA || fams[i] == KVT_CHAT_MISTRAL;
        kvt_status st = kvt_chat_render(c, two_users, 2, true, &out, &len, err, sizeof err);
        assert_int_equal(st, strict ? KVT_ERR_INVALID_ARG : KVT_OK);
        free(out);
        out = NULL;
        st = kvt_chat_render(c, late_sys, 2, true, &out, &len, err, sizeof err);
        assert_int_equal(st, strict ? KVT_ERR_INVALID_ARG : KVT_OK);
        free(out);
        out = NULL;
        kvt_chat_template_free(c);
    }
}

static void test_bos_by_vocab(void **s) {
    (void)s;
    char *out, err[256];
    size_t len;
    /* gpt2 has no <|begin_of_text|>, <bos> or <s>: no BOS text */
    const char *fams[3] = {"llama3", "gemma", "mistral"};
    const char *bos[3] = {"<|begin_of_text|>", "<bos>", "<s>"};
    for (int i = 0; i < 3; i++) {
        kvt_chat_template *c = mk(NULL, g_t[0], fams[i]);
        assert_int_equal(kvt_chat_render(c, k_conv + 1, 1, true, &out, &len, err, sizeof err), KVT_OK);
        assert_true(strncmp(out, bos[i], strlen(bos[i])) != 0);
        free(out);
        kvt_chat_template_free(c);
    }
    /* llama SPM has <s> */
    kvt_chat_template *c = mk(NULL, g_t[1], "mistral");
    int32_t *ids;
    int64_t n;
    assert_int_equal(kvt_chat_tokenize(c, g_t[1], k_conv + 1, 1, true, &ids, &n, err, sizeof err), KVT_OK);
    assert_true(n > 2);
    assert_int_equal(ids[0], 1);
    int nbos = 0;
    for (int64_t i = 0; i < n; i++) nbos += ids[i] == 1;
    assert_int_equal(nbos, 1);
    free(ids);
    kvt_chat_template_free(c);
}

/*
 * Multi-turn prefix property. For a conversation S, U1, A1, U2, A2, U3, and each k:
 *   tokens(render(msgs[..Uk], gen=true)) ++ tokens_cont(Ak + end-of-turn as rendered)
 * must be a prefix of tokens(render(msgs[..Uk+1], gen=true)). tokens_cont tokenizes the reply as a
 * continuation (KVT_TOK_NO_SPACE_PREFIX; parse_special on), which is how generated tokens relate to
 * the text. The rendered STRING prefix property is asserted for every family first.
 *
 * Cases where the TOKEN property cannot hold (documented in docs/chat-templates.md; the engine relies
 * on its prompt-boundary snapshot there):
 *  - Llama 3 rendered with the gpt2 vocabulary: the gen prompt ends in "\n\n"; alone, the gpt2 regex
 *    makes it one piece "\n\n", but followed by the reply "\s+(?!\S)" splits it "\n" + "\n". (The real
 *    Llama 3 regex has \s*[\r\n]+, which keeps "\n\n" whole, so real Llama 3 models are fine.)
 *  - A family whose turn markers are not tokens of the vocabulary (Llama 3 markup with the llama-spm
 *    vocab): SPM does not pre-split, so "<|eot_id|>" + "<|start_header_id|>" merges "><" across the
 *    turn boundary. With the family's real vocabulary the markers are control tokens and this cannot
 *    happen.
 *  - Any family that trims content (Llama 3, Gemma, Mistral/Llama 2) when a reply starts/ends with
 *    whitespace: the re-rendered history differs from what was generated. Replies here are trimmed.
 *  - Qwen3 templates drop earlier <think>…</think> reasoning from history (not a built-in family).
 */
typedef struct prefix_case {
    const char *name, *tmpl;
    int vocab;        /* 0 gpt2, 1 spm */
    bool must_hold;
} prefix_case;

static bool prefix_holds(const kvt_chat_template *c, const kvt_tokenizer *t, const char *label) {
    static const kvt_chat_msg conv[] = {M("system", "You are terse."),
                                        M("user", "Hello there, who are you?"),
                                        M("assistant", "I am a model. Ask me anything!"),
                                        M("user", "What is 12*34? Answer\nbriefly."),
                                        M("assistant", "It is 408."),
                                        M("user", "Thanks 🦙 ok")};
    bool all = true;
    char err[256];
    for (size_t upto = 2; upto + 2 <= 6; upto += 2) { /* msgs[0..upto) ends with a user turn */
        char *p1, *p2, *full;
        size_t l1, l2, lf;
        assert_int_equal(kvt_chat_render(c, conv, upto, true, &p1, &l1, err, sizeof err), KVT_OK);
        assert_int_equal(kvt_chat_render(c, conv, upto + 2, true, &p2, &l2, err, sizeof err), KVT_OK);
        assert_int_equal(kvt_chat_render(c, conv, upto + 1, false, &full, &lf, err, sizeof err), KVT_OK);
        /* string prefix: prompt, then the reply as rendered, then the next turn */
        assert_true(lf >= l1 && !memcmp(full, p1, l1));
        assert_true(l2 >= lf && !memcmp(p2, full, lf));
        /* the continuation ends with the family's end-of-turn text */
        const char *eot = kvt_chat_end_of_turn(c);
        assert_true(lf - l1 >= strlen(eot) && !memcmp(full + lf - strlen(eot), eot, strlen(eot)));
        int64_t n1 = kvt_tokenize_ex(t, p1, l1, KVT_TOK_PARSE_SPECIAL, NULL, 0);
        int64_t nc = kvt_tokenize_ex(t, full + l1, lf - l1, KVT_TOK_PARSE_SPECIAL | KVT_TOK_NO_SPACE_PREFIX, NULL, 0);
        int64_t n2 = kvt_tokenize_ex(t, p2, l2, KVT_TOK_PARSE_SPECIAL, NULL, 0);
        int32_t *a = malloc((size_t)(n1 + nc + 1) * sizeof *a), *b = malloc((size_t)(n2 + 1) * sizeof *b);
        kvt_tokenize_ex(t, p1, l1, KVT_TOK_PARSE_SPECIAL, a, n1);
        kvt_tokenize_ex(t, full + l1, lf - l1, KVT_TOK_PARSE_SPECIAL | KVT_TOK_NO_SPACE_PREFIX, a + n1, nc);
        kvt_tokenize_ex(t, p2, l2, KVT_TOK_PARSE_SPECIAL, b, n2);
        bool ok = n1 + nc <= n2 && !memcmp(a, b, (size_t)(n1 + nc) * sizeof *a);
        if (!ok) {
            int64_t k = 0;
            while (k < n1 + nc && k < n2 && a[k] == b[k]) k++;
            fprintf(stderr, "  prefix breaks: %s, turn %zu, at token %lld of %lld (prompt %lld)\n", label, upto / 2,
                    (long long)k, (long long)(n1 + nc), (long long)n1);
        }
        all = all && ok;
        free(a);
        free(b);
        free(p1);
        free(p2);
        free(full);
    }
    return all;
}

static void test_prefix_property(void **s) {
    (void)s;
    const prefix_case cases[] = {
        {"chatml", NULL, 0, true},
        {"chatml", NULL, 1, true},
        {NULL, "<|im_start|> You are Qwen", 0, true},
        {NULL, "<|im_start|> You are Qwen", 1, true},
        {"llama3", NULL, 0, false}, /* gpt2 regex splits "\n\n" before the reply: see above */
        {"llama3", NULL, 1, false}, /* "<|eot_id|>" is plain text in this vocab: "><" merges across turns */
        {NULL, "<|start_header_id|><|end_header_id|>Cutting Knowledge Date", 0, false},
        {NULL, "<|start_header_id|><|end_header_id|>Cutting Knowledge Date", 1, false},
        {"gemma", NULL, 0, true},
        {"gemma", NULL, 1, true},
        {"mistral", NULL, 0, true},
        {"mistral", NULL, 1, true},
        {"phi3", NULL, 0, true},
        {"phi3", NULL, 1, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvt_chat_template *c = mk(cases[i].tmpl, g_t[cases[i].vocab], cases[i].name);
        char label[96];
        snprintf(label, sizeof label, "%s%s/%s", kvt_chat_family_name(kvt_chat_family_of(c)),
                 cases[i].tmpl ? "(template text)" : "", cases[i].vocab ? "llama-spm" : "gpt2");
        bool ok = prefix_holds(c, g_t[cases[i].vocab], label);
        fprintf(stderr, "prefix property %-40s %s%s\n", label, ok ? "holds" : "does not hold",
                cases[i].must_hold ? "" : " (known, documented)");
        if (cases[i].must_hold) assert_true(ok);
        else assert_false(ok); /* if this starts holding, update the docs */
        kvt_chat_template_free(c);
    }
}

/* A llama3-style vocabulary built from the gpt2 one: its tokens and merges, plus the Llama 3 markers
 * as CONTROL tokens and tokenizer.ggml.pre = llama3. Checks the pre-type resolution (llama3 regex,
 * forced add_bos) and that the Llama 3 prefix property holds once the markers are real tokens. */
static kvt_tokenizer *make_llama3_like_t(kvt_gguf **gout, const char *pre, char **path_out, const char *tmpl) {
    static const char *extra[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    uint64_t n0 = kvt_tokenizer_n_vocab(g_t[0]);
    uint64_t n = n0 + 4;
    const char **toks = malloc(n * sizeof *toks);
    uint64_t *lens = malloc(n * sizeof *lens);
    int32_t *types = malloc(n * sizeof *types);
    for (uint64_t i = 0; i < n; i++) {
        toks[i] = i < n0 ? kvt_tokenizer_token_text(g_t[0], (int32_t)i) : extra[i - n0];
        lens[i] = strlen(toks[i]);
        types[i] = i < n0 ? kvt_tokenizer_token_type(g_t[0], (int32_t)i) : 3;
    }
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    kvt_gguf_w_str(w, "general.architecture", "llama", 5);
    kvt_gguf_w_str(w, "tokenizer.ggml.model", "gpt2", 4);
    kvt_gguf_w_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
    kvt_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, lens, n);
    kvt_gguf_w_arr(w, "tokenizer.ggml.token_type", KVT_GGUF_I32, types, n);
    assert_true(kvt_gguf_w_copy_kv(w, g_g[0], "tokenizer.ggml.merges"));
    kvt_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)n0);
    kvt_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n0 + 3);
    if (tmpl) kvt_gguf_w_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl));
    char *dir = tu_tmpdir("chat");
    char *path = malloc(strlen(dir) + 32);
    sprintf(path, "%s/v.gguf", dir);
    free(dir);
    char err[256];
    assert_int_equal(kvt_gguf_writer_finish(w, path, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);
    free(toks);
    free(lens);
    free(types);
    kvt_tokenizer *t = NULL;
    assert_int_equal(kvt_gguf_open(path, gout, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_tokenizer_create(*gout, &t, err, sizeof err), KVT_OK);
    *path_out = path;
    return t;
}

static kvt_tokenizer *make_llama3_like(kvt_gguf **gout, const char *pre, char **path_out) {
    return make_llama3_like_t(gout, pre, path_out, NULL);
}

/* A GGUF's own template renders through the Jinja interpreter (bos_token / eos_token from the
 * vocabulary); --chat-template NAME still picks a built-in renderer; a template that does not
 * parse is a clear creation error naming tokenizer.chat_template and the line. */
static void test_gguf_template_is_jinja(void **st) {
    (void)st;
    const char *tmpl = "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
                       "'<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
                       "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
                       "{{- eos_token if false }}";
    kvt_gguf *g = NULL;
    char *path = NULL, err[512];
    kvt_tokenizer *t = make_llama3_like_t(&g, "llama-bpe", &path, tmpl);
    kvt_chat_template *c = NULL;
    assert_int_equal(kvt_chat_template_create(g, t, NULL, &c, err, sizeof err), KVT_OK);
    assert_true(kvt_chat_is_jinja(c));
    assert_int_equal(kvt_chat_family_of(c), KVT_CHAT_LLAMA3);
    assert_string_equal(kvt_chat_end_of_turn(c), "<|eot_id|>");
    kvt_chat_msg m[2] = {{.role = "user", .content = " Hi ", .content_len = 4}, {.role = "tool", .content = "x", .content_len = 1}};
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(kvt_chat_render(c, m, 2, true, &out, &len, err, sizeof err), KVT_OK);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                             "<|start_header_id|>tool<|end_header_id|>\n\nx<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    assert_true(prefix_holds(c, t, "llama3 jinja/llama3-like vocab"));
    kvt_chat_template_free(c);
    assert_int_equal(kvt_chat_template_create(g, t, "chatml", &c, err, sizeof err), KVT_OK);
    assert_false(kvt_chat_is_jinja(c));
    kvt_chat_template_free(c);
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    unlink(path);
    free(path);
    t = make_llama3_like_t(&g, "llama-bpe", &path, "ok\n{% for m in messages %}{{ m.content }");
    assert_int_not_equal(kvt_chat_template_create(g, t, NULL, &c, err, sizeof err), KVT_OK);
    assert_null(c);
    assert_non_null(strstr(err, "tokenizer.chat_template"));
    assert_non_null(strstr(err, "line 2"));
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    unlink(path);
    free(path);
}

static void expect_same(const kvt_tokenizer *a, const char *ta, const kvt_tokenizer *b, const char *const *parts,
                        int np) {
    int32_t x[64], y[64];
    int64_t nx = kvt_tokenize(a, ta, strlen(ta), false, false, x, 64), ny = 0;
    for (int i = 0; i < np; i++) ny += kvt_tokenize(b, parts[i], strlen(parts[i]), false, false, y + ny, 64 - ny);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, (size_t)nx * sizeof *x);
}

static void test_llama3_vocab(void **s) {
    (void)s;
    kvt_gguf *g;
    char *path;
    kvt_tokenizer *t = make_llama3_like(&g, "llama-bpe", &path);
    assert_string_equal(kvt_tokenizer_pre_name(t), "llama3");
    assert_true(kvt_tokenizer_add_bos(t)); /* forced by the pre-type */
    assert_true(kvt_tokenizer_is_eog(t, kvt_tokenizer_find(t, "<|eot_id|>")));
    /* llama3 regex: digits in groups of three; "\n\n" stays whole before a word */
    const char *p1[] = {"123", "456", "7"};
    expect_same(t, "1234567", g_t[0], p1, 3);
    const char *p2[] = {"a", "\n\n", "b"};
    expect_same(t, "a\n\nb", g_t[0], p2, 3);
    const char *p3[] = {"I", "'M", " fine"};
    expect_same(t, "I'M fine", g_t[0], p3, 3); /* case-insensitive contractions */
    kvt_chat_template *c = mk("<|start_header_id|><|end_header_id|>Cutting Knowledge Date", t, NULL);
    assert_true(prefix_holds(c, t, "llama3/llama3-like vocab"));
    kvt_chat_template_free(c);
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    unlink(path);
    free(path);
    /* qwen2: single digits */
    t = make_llama3_like(&g, "qwen2", &path);
    assert_string_equal(kvt_tokenizer_pre_name(t), "qwen2");
    assert_false(kvt_tokenizer_add_bos(t));
    const char *p4[] = {"1", "2", "3", " x"};
    expect_same(t, "123 x", g_t[0], p4, 4);
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    unlink(path);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),       cmocka_unit_test(test_render_text),
        cmocka_unit_test(test_render_errors), cmocka_unit_test(test_bos_by_vocab),
        cmocka_unit_test(test_prefix_property), cmocka_unit_test(test_llama3_vocab),
        cmocka_unit_test(test_gguf_template_is_jinja),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
