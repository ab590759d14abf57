/* test_model.c — model loading, the forward pass (batch/thread invariance, cache consistency,
 * sliding window), an independent naive reference forward, and the thread pool. */
#include "testutil.h"

#include <math.h>
#include <stdatomic.h>
#include <xxhash.h>

#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "kv/kv.h"
#include "model/gen_model.h"
#include "model/model.h"
#include "util/threadpool.h"

/* ------------------------------------------------------------------ tiny model writer */

typedef struct spec {
    const char *arch;
    uint32_t n_vocab, n_embd, n_layer, n_head, n_kv, head_dim, n_ff, n_swa;
    uint32_t type;      /* 2-D weight type */
    bool tied;
    bool rope_freqs;    /* llama: write rope_freqs.weight */
    float rope_factor;  /* linear scaling factor (0 = none) */
    uint64_t seed;
    /* fault injection */
    const char *omit;   /* tensor name to leave out */
    const char *bad;    /* tensor name to write with a wrong ne[1] */
    /* gemma3 attention.sliding_window_pattern: a period (swa_period > 0), or swa_n_bools booleans
     * (swa_bools[il]: window layer); neither: the key is absent */
    uint32_t swa_period, swa_n_bools;
    const uint8_t *swa_bools;
} spec;

/* Whether the spec's layer il is a sliding-window layer (as gemma3 reads the key; period 6 without it). */
static bool spec_layer_swa(const spec *s, uint32_t il) {
    if (strcmp(s->arch, "gemma3")) return false;
    if (s->swa_bools) return s->swa_bools[il];
    const uint32_t p = s->swa_period ? s->swa_period : 6;
    return il % p < p - 1;
}

static spec tiny(const char *arch) {
    spec s = {arch, 384, 64, 2, 4, 2, 32, 128, 0, KVT_TYPE_F32, false, false, 0.0f, 42, NULL, NULL, 0, 0, NULL};
    if (!strcmp(arch, "qwen3")) s.head_dim = 24; /* head_dim != n_embd/n_head */
    if (!strcmp(arch, "gemma3")) {
        s.n_layer = 6; /* 5 local layers + 1 global */
        s.n_swa = 32;
        s.tied = true;
        s.head_dim = 32;
        s.rope_factor = 2.0f;
    }
    return s;
}

/* A decode step on 2 threads gives each thread its own KV heads (model.c heads_own_columns: Q/K/V
 * columns, rows, K/V writes and attention per thread, no barrier between them); with 4 KV heads each
 * thread owns two, and qwen2's biases cover the K/V side's column range. */
static spec tiny_kv4(void) {
    spec s = tiny("qwen2");
    s.n_head = 8, s.n_kv = 4, s.head_dim = 16;
    return s;
}

static void put_tensor(kvt_gguf_writer *w, const spec *s, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
                       int kind, uint64_t *rng) {
    if (s->omit && !strcmp(s->omit, name)) return;
    if (s->bad && !strcmp(s->bad, name)) ne1 += 1;
    int64_t n = ne0 * ne1;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float r = tu_randf(rng);
        if (kind == 0) f[i] = r / sqrtf((float)ne0) * 1.5f; /* matrix */
        else if (kind == 1) f[i] = 1.0f + 0.2f * r;         /* norm */
        else if (kind == 2) f[i] = 0.2f * r;                /* bias */
        else if (kind == 3) f[i] = r;                       /* embedding */
        else f[i] = 1.0f + 0.5f * (r + 1.0f);               /* rope_freqs factor in [1, 2) */
    }
    int64_t ne[2] = {ne0, ne1};
    uint32_t nd = ne1 == 1 ? 1 : 2;
    if (type == KVT_TYPE_F32) {
        assert_int_equal(kvt_gguf_w_tensor(w, name, type, nd, ne, f, (uint64_t)n * 4), KVT_OK);
    } else {
        uint64_t nb = kvt_type_row_bytes(type, ne0) * (uint64_t)ne1;
        void *q = malloc(nb);
        kvt_quantize_ref(type, f, q, n);
        assert_int_equal(kvt_gguf_w_tensor(w, name, type, nd, ne, q, nb), KVT_OK);
        free(q);
    }
    free(f);
}

static void write_model(const spec *s, const char *path) {
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    char k[128];
    const char *a = s->arch;
    kvt_gguf_w_str(w, "general.architecture", a, strlen(a));
    kvt_gguf_w_str(w, "general.name", "tiny-test", 9);
    if (s->type != KVT_TYPE_F32) kvt_gguf_w_u32(w, "general.quantization_version", 2);
#define K(x) (snprintf(k, sizeof(k), "%s." x, a), k)
    kvt_gguf_w_u32(w, K("context_length"), 4096);
    kvt_gguf_w_u32(w, K("embedding_length"), s->n_embd);
    kvt_gguf_w_u32(w, K("block_count"), s->n_layer);
    kvt_gguf_w_u32(w, K("feed_forward_length"), s->n_ff);
    kvt_gguf_w_u32(w, K("attention.head_count"), s->n_head);
    kvt_gguf_w_u32(w, K("attention.head_count_kv"), s->n_kv);
    kvt_gguf_w_u32(w, K("attention.key_length"), s->head_dim);
    kvt_gguf_w_u32(w, K("attention.value_length"), s->head_dim);
    kvt_gguf_w_f32(w, K("rope.freq_base"), !strcmp(a, "gemma3") ? 1000000.0f : 10000.0f);
    kvt_gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), !strcmp(a, "llama") ? 1e-5f : 1e-6f);
    if (s->rope_factor > 0) kvt_gguf_w_f32(w, K("rope.scaling.factor"), s->rope_factor);
    if (s->n_swa) kvt_gguf_w_u32(w, K("attention.sliding_window"), s->n_swa);
    if (s->swa_period) kvt_gguf_w_u32(w, K("attention.sliding_window_pattern"), s->swa_period);
    if (s->swa_bools) kvt_gguf_w_arr(w, K("attention.sliding_window_pattern"), KVT_GGUF_BOOL, s->swa_bools, s->swa_n_bools);
#undef K
    uint64_t rng = s->seed;
    const uint32_t E = s->n_embd, QD = s->n_head * s->head_dim, KD = s->n_kv * s->head_dim, t = s->type;
    put_tensor(w, s, "token_embd.weight", t, E, s->n_vocab, 3, &rng);
    put_tensor(w, s, "output_norm.weight", KVT_TYPE_F32, E, 1, 1, &rng);
    if (!s->tied) put_tensor(w, s, "output.weight", t, E, s->n_vocab, 0, &rng);
    if (s->rope_freqs) put_tensor(w, s, "rope_freqs.weight", KVT_TYPE_F32, s->head_dim / 2, 1, 4, &rng);
    for (uint32_t il = 0; il < s->n_layer; il++) {
        char nm[96];
#define NM(x) (snprintf(nm, sizeof(nm), "blk.%u." x, il), nm)
        put_tensor(w, s, NM("attn_norm.weight"), KVT_TYPE_F32, E, 1, 1, &rng);
        put_tensor(w, s, NM("attn_q.weight"), t, E, QD, 0, &rng);
        put_tensor(w, s, NM("attn_k.weight"), t, E, KD, 0, &rng);
        put_tensor(w, s, NM("attn_v.weight"), t, E, KD, 0, &rng);
        put_tensor(w, s, NM("attn_output.weight"), t, QD, E, 0, &rng);
        put_tensor(w, s, NM("ffn_norm.weight"), KVT_TYPE_F32, E, 1, 1, &rng);
        put_tensor(w, s, NM("ffn_gate.weight"), t, E, s->n_ff, 0, &rng);
        put_tensor(w, s, NM("ffn_up.weight"), t, E, s->n_ff, 0, &rng);
        put_tensor(w, s, NM("ffn_down.weight"), t, s->n_ff, E, 0, &rng);
        if (!strcmp(a, "qwen2")) {
            put_tensor(w, s, NM("attn_q.bias"), KVT_TYPE_F32, QD, 1, 2, &rng);
            put_tensor(w, s, NM("attn_k.bias"), KVT_TYPE_F32, KD, 1, 2, &rng);
            put_tensor(w, s, NM("attn_v.bias"), KVT_TYPE_F32, KD, 1, 2, &rng);
        }
        if (!strcmp(a, "qwen3") || !strcmp(a, "gemma3")) {
            put_tensor(w, s, NM("attn_q_norm.weight"), KVT_TYPE_F32, s->head_dim, 1, 1, &rng);
            put_tensor(w, s, NM("attn_k_norm.weight"), KVT_TYPE_F32, s->head_dim, 1, 1, &rng);
        }
        if (!strcmp(a, "gemma3")) {
            put_tensor(w, s, NM("post_attention_norm.weight"), KVT_TYPE_F32, E, 1, 1, &rng);
            put_tensor(w, s, NM("post_ffw_norm.weight"), KVT_TYPE_F32, E, 1, 1, &rng);
        }
#undef NM
    }
    char err[256];
    kvt_status st = kvt_gguf_writer_finish(w, path, err, sizeof(err));
    if (st != KVT_OK) fail_msg("writer: %s", err);
    kvt_gguf_writer_free(w);
}

/* ------------------------------------------------------------------ fixture */

typedef struct fx {
    char *dir;
    char path[512];
    kvt_gguf *g;
    kvt_model *m;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
} fx;

/* Open the model at f->path (written by the caller) with an f16 KV layout. */
static void fx_open_written(fx *f, uint32_t block_tokens) {
    char err[256];
    if (kvt_gguf_open(f->path, &f->g, err, sizeof(err)) != KVT_OK) fail_msg("open: %s", err);
    if (kvt_model_load(f->g, &f->m, err, sizeof(err)) != KVT_OK) fail_msg("load: %s", err);
    const kvt_hparams *hp = kvt_model_hparams(f->m);
    kvt_codec *codecs = calloc(hp->n_layer, sizeof(kvt_codec));
    kvt_layer_desc *d = calloc(hp->n_layer, sizeof(kvt_layer_desc));
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i].kind = KVT_CODEC_F16;
    kvt_model_layer_descs(f->m, codecs, d);
    kvt_codec base = {.kind = KVT_CODEC_F16};
    if (kvt_kv_layout_create(d, hp->n_layer, block_tokens, base, 0, &f->layout, err, sizeof(err)) != KVT_OK)
        fail_msg("layout: %s", err);
    free(codecs);
    free(d);
    f->pool = kvt_block_pool_create(f->layout, 0);
    assert_non_null(f->pool);
}

static void fx_open(fx *f, const spec *s, uint32_t block_tokens) {
    memset(f, 0, sizeof(*f));
    f->dir = tu_tmpdir("model");
    assert_non_null(f->dir);
    snprintf(f->path, sizeof(f->path), "%s/m.gguf", f->dir);
    write_model(s, f->path);
    fx_open_written(f, block_tokens);
}

static void fx_close(fx *f) {
    kvt_block_pool_free(f->pool);
    kvt_kv_layout_free(f->layout);
    kvt_model_free(f->m);
    kvt_gguf_free(f->g);
    unlink(f->path);
    rmdir(f->dir);
    free(f->dir);
}

static kvt_seq *new_seq(fx *f) {
    kvt_seq *s = NULL;
    assert_int_equal(kvt_seq_create(f->pool, 1234, &s), KVT_OK);
    return s;
}

static kvt_ctx *new_ctx(fx *f, int nth, uint32_t ubatch) {
    kvt_ctx *c = NULL;
    assert_int_equal(kvt_ctx_create(f->m, nth, ubatch, &c), KVT_OK);
    return c;
}

static void make_tokens(int32_t *t, uint32_t n, uint32_t n_vocab, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)(tu_rand(&seed) % n_vocab);
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ------------------------------------------------------------------ decode == full recompute */

/* Token-by-token decode logits must equal (bitwise) the all_logits rows of one full pass. */
static void decode_eq_full(fx *fp, const char *what, uint32_t n_tok, uint64_t seed) {
    fx f = *fp;
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
    int32_t *tok = malloc(n_tok * sizeof(int32_t));
    make_tokens(tok, n_tok, V, seed);
    kvt_ctx *c = new_ctx(&f, 2, n_tok);
    kvt_seq *a = new_seq(&f);
    float *lg;
    assert_int_equal(kvt_model_forward(c, a, tok, n_tok, true, NULL, &lg), KVT_OK);
    float *full = malloc((size_t)n_tok * V * sizeof(float));
    memcpy(full, lg, (size_t)n_tok * V * sizeof(float));
    for (size_t i = 0; i < (size_t)n_tok * V; i++) assert_true(isfinite(full[i]));
    kvt_seq *b = new_seq(&f);
    for (uint32_t i = 0; i < n_tok; i++) {
        assert_int_equal(kvt_model_forward(c, b, tok + i, 1, false, NULL, &lg), KVT_OK);
        if (memcmp(lg, full + (size_t)i * V, V * sizeof(float)) != 0)
            fail_msg("%s: decode logits of token %u differ from the full recompute", what, i);
    }
    assert_int_equal(kvt_seq_len(b), n_tok);
    /* windowed groups really dropped their old blocks on the way (so masking was exercised) */
    for (uint32_t g = 0; g < kvt_kv_layout_n_groups(f.layout); g++)
        if (kvt_kv_layout_group_kind(f.layout, g) == KVT_KIND_WINDOW &&
            n_tok > kvt_kv_layout_group_window(f.layout, g) + 2 * kvt_kv_layout_block_tokens(f.layout))
            assert_null(kvt_seq_block(b, g, 0));
    /* the logits depend on position/context: rows must not all be equal */
    assert_true(memcmp(full, full + (size_t)(n_tok - 1) * V, V * sizeof(float)) != 0);
    kvt_seq_free(a);
    kvt_seq_free(b);
    kvt_ctx_free(c);
    free(full);
    free(tok);
}

static void check_decode_eq_full(const spec *s, uint32_t n_tok, uint32_t block_tokens) {
    fx f;
    fx_open(&f, s, block_tokens);
    decode_eq_full(&f, s->arch, n_tok, s->seed + 7);
    fx_close(&f);
}

/* The same on the project's model generator (model/gen_model.h) for every arch's tiny shape. */
static void test_gen_model_archs(void **st) {
    (void)st;
    struct { const char *arch, *type; } cases[] = {
        {"llama", "f16"}, {"llama", "q8_0"}, {"qwen2", "f16"}, {"qwen3", "bf16"}, {"gemma3", "f16"}, {"gemma3", "q8_0"},
    };
    for (size_t i = 0; i < KVT_ARRAY_LEN(cases); i++) {
        fx f;
        memset(&f, 0, sizeof(f));
        f.dir = tu_tmpdir("genmodel");
        assert_non_null(f.dir);
        snprintf(f.path, sizeof(f.path), "%s/m.gguf", f.dir);
        kvt_gen_model_opts o = {.arch = cases[i].arch, .shape = "tiny", .type = cases[i].type, .seed = 3};
        char err[256];
        if (kvt_gen_model(&o, f.path, err, sizeof(err)) != KVT_OK) fail_msg("gen-model %s/%s: %s", cases[i].arch, cases[i].type, err);
        fx_open_written(&f, 16);
        assert_string_equal(kvt_arch_name(kvt_model_hparams(f.m)->arch), cases[i].arch);
        char what[64];
        snprintf(what, sizeof(what), "gen %s/%s", cases[i].arch, cases[i].type);
        decode_eq_full(&f, what, 40, 21);
        fx_close(&f);
    }
}

static void test_decode_eq_full_llama(void **st) { (void)st; spec s = tiny("llama"); check_decode_eq_full(&s, 24, 16); }
static void test_decode_eq_full_kv4(void **st) { (void)st; spec s = tiny_kv4(); check_decode_eq_full(&s, 24, 16); }
static void test_decode_eq_full_llama_rope_freqs(void **st) {
    (void)st;
    spec s = tiny("llama");
    s.rope_freqs = true;
    s.tied = true;
    check_decode_eq_full(&s, 20, 16);
}
static void test_decode_eq_full_qwen2(void **st) { (void)st; spec s = tiny("qwen2"); check_decode_eq_full(&s, 24, 16); }
static void test_decode_eq_full_qwen3(void **st) { (void)st; spec s = tiny("qwen3"); check_decode_eq_full(&s, 24, 16); }
static void test_decode_eq_full_gemma3(void **st) { (void)st; spec s = tiny("gemma3"); check_decode_eq_full(&s, 24, 16); }
static spec tiny_quant(uint32_t type) {
    spec s = tiny("llama");
    s.type = type;
    s.n_embd = 256; /* K-quant rows need multiples of 256 */
    s.n_head = 4;
    s.head_dim = 64;
    s.n_ff = 512;
    return s;
}
static void test_decode_eq_full_llama_q8_0(void **st) { (void)st; spec s = tiny_quant(KVT_TYPE_Q8_0); check_decode_eq_full(&s, 20, 16); }
static void test_decode_eq_full_llama_q4_k(void **st) { (void)st; spec s = tiny_quant(KVT_TYPE_Q4_K); check_decode_eq_full(&s, 20, 16); }
static void test_decode_eq_full_llama_f16(void **st) { (void)st; spec s = tiny_quant(KVT_TYPE_F16); check_decode_eq_full(&s, 20, 16); }

/* Gemma 3 with window 32 and 16-token blocks, past 100 tokens: old window blocks are dropped during
 * decode, yet every decode row equals the full recompute (window masking consistent). */
static void test_gemma3_window_long(void **st) {
    (void)st;
    spec s = tiny("gemma3");
    s.n_embd = 32;
    s.n_ff = 64;
    s.head_dim = 16;
    s.n_head = 2;
    s.n_kv = 1;
    s.n_vocab = 128;
    check_decode_eq_full(&s, 110, 16);
}

/* ------------------------------------------------------------------ chunking and threads */

static void test_chunked_prefill(void **st) {
    (void)st;
    const char *archs[] = {"llama", "gemma3"};
    for (size_t ai = 0; ai < 2; ai++) {
        spec s = tiny(archs[ai]);
        fx f;
        fx_open(&f, &s, 16);
        const uint32_t V = kvt_model_hparams(f.m)->n_vocab, N = 41;
        int32_t tok[41];
        make_tokens(tok, N, V, 99);
        float *ref = malloc(2 * V * sizeof(float)), *lg;
        kvt_ctx *c0 = new_ctx(&f, 1, 64);
        kvt_seq *s0 = new_seq(&f);
        assert_int_equal(kvt_model_forward(c0, s0, tok, N - 1, false, NULL, &lg), KVT_OK);
        memcpy(ref, lg, V * sizeof(float));
        assert_int_equal(kvt_model_forward(c0, s0, tok + N - 1, 1, false, NULL, &lg), KVT_OK);
        memcpy(ref + V, lg, V * sizeof(float));
        uint32_t ubs[2] = {3, 5};
        for (int u = 0; u < 2; u++) {
            kvt_ctx *c = new_ctx(&f, 2, ubs[u]);
            kvt_seq *sq = new_seq(&f);
            assert_int_equal(kvt_model_forward(c, sq, tok, N - 1, false, NULL, &lg), KVT_OK);
            assert_int_equal(kvt_seq_len(sq), N - 1);
            assert_memory_equal(lg, ref, V * sizeof(float));
            assert_int_equal(kvt_model_forward(c, sq, tok + N - 1, 1, false, NULL, &lg), KVT_OK);
            assert_memory_equal(lg, ref + V, V * sizeof(float));
            /* all_logits beyond ubatch is refused */
            assert_int_equal(kvt_model_forward(c, sq, tok, ubs[u] + 1, true, NULL, &lg), KVT_ERR_INVALID_ARG);
            kvt_seq_free(sq);
            kvt_ctx_free(c);
        }
        kvt_seq_free(s0);
        kvt_ctx_free(c0);
        free(ref);
        fx_close(&f);
    }
}

/* 1, 2 and 3 threads give the same tokens and logits (prompt then 12 greedy steps): QKV biases,
 * QK norms and the query pre-scale, whose decode row work is split between the threads by heads. */
static void threads_identical(void) {
    const char *archs[] = {"qwen2", "gemma3", "qwen3", "qwen2"};
    for (size_t ai = 0; ai < 4; ai++) {
        spec s = ai == 3 ? tiny_kv4() : tiny(archs[ai]);
        fx f;
        fx_open(&f, &s, 16);
        const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
        int32_t prompt[13];
        make_tokens(prompt, 13, V, 5);
        int32_t gen[3][12];
        float *last[3];
        for (int t = 0; t < 3; t++) { /* 1, 2 and 3 threads */
            kvt_ctx *c = new_ctx(&f, t + 1, 8);
            assert_int_equal(kvt_ctx_n_threads(c), t + 1);
            kvt_seq *sq = new_seq(&f);
            float *lg;
            assert_int_equal(kvt_model_forward(c, sq, prompt, 13, false, NULL, &lg), KVT_OK);
            for (int i = 0; i < 12; i++) {
                gen[t][i] = (int32_t)argmax(lg, V);
                assert_int_equal(kvt_model_forward(c, sq, &gen[t][i], 1, false, NULL, &lg), KVT_OK);
            }
            last[t] = malloc(V * sizeof(float));
            memcpy(last[t], lg, V * sizeof(float));
            kvt_seq_free(sq);
            kvt_ctx_free(c);
        }
        for (int t = 1; t < 3; t++) {
            assert_memory_equal(gen[0], gen[t], sizeof(gen[0]));
            assert_memory_equal(last[0], last[t], V * sizeof(float));
        }
        for (int t = 0; t < 3; t++) free(last[t]);
        fx_close(&f);
    }
}

static void test_threads_identical(void **st) {
    (void)st;
    threads_identical();
}

/* Split-K decode (kvt_attention_split), forced at every context by KVT_SPLITK=1: decode still equals
 * the full recompute (GQA, head dims 32 and 64, window layers dropping blocks) and 2 or 3 threads
 * still equal 1; the forward pass really took it. */
static void test_decode_splitk(void **st) {
    (void)st;
    setenv("KVT_SPLITK", "1", 1);
    const uint64_t calls = kvt_attention_split_calls();
    spec s = tiny("llama");
    check_decode_eq_full(&s, 24, 16);
    assert_true(kvt_attention_split_calls() > calls);
    s = tiny_quant(KVT_TYPE_F16);
    check_decode_eq_full(&s, 20, 16);
    s = tiny("gemma3");
    s.n_embd = 32, s.n_ff = 64, s.head_dim = 16, s.n_head = 2, s.n_kv = 1, s.n_vocab = 128;
    check_decode_eq_full(&s, 110, 16);
    threads_identical();
    unsetenv("KVT_SPLITK");
}

/* By default (KVT_SPLITK unset) 3 threads over 2 KV heads take split-K exactly from
 * KVT_ATT_SPLIT_MIN_KEYS visible keys on, and the logits equal the query-head split's (KVT_SPLITK=0). */
static void test_decode_splitk_auto(void **st) {
    (void)st;
    spec s = tiny("llama");
    fx f;
    fx_open(&f, &s, 64);
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab, n_layer = kvt_model_hparams(f.m)->n_layer;
    const uint32_t n_pre = KVT_ATT_SPLIT_MIN_KEYS - 2, n_dec = 4;
    int32_t *tok = malloc((n_pre + n_dec) * sizeof(int32_t));
    make_tokens(tok, n_pre + n_dec, V, 17);
    float *lg_mode[2];
    for (int mode = 0; mode < 2; mode++) { /* 0: default, 1: KVT_SPLITK=0 */
        if (mode) setenv("KVT_SPLITK", "0", 1);
        kvt_ctx *c = new_ctx(&f, 3, 256);
        kvt_seq *sq = new_seq(&f);
        float *lg;
        assert_int_equal(kvt_model_forward(c, sq, tok, n_pre, false, NULL, &lg), KVT_OK);
        lg_mode[mode] = malloc((size_t)n_dec * V * sizeof(float));
        for (uint32_t i = 0; i < n_dec; i++) {
            const uint64_t calls = kvt_attention_split_calls();
            assert_int_equal(kvt_model_forward(c, sq, tok + n_pre + i, 1, false, NULL, &lg), KVT_OK);
            /* the row at position n_pre + i sees n_pre + i + 1 keys */
            const bool split = mode == 0 && n_pre + i + 1 >= KVT_ATT_SPLIT_MIN_KEYS;
            assert_true(kvt_attention_split_calls() == calls + (split ? n_layer : 0));
            memcpy(lg_mode[mode] + (size_t)i * V, lg, V * sizeof(float));
        }
        kvt_seq_free(sq);
        kvt_ctx_free(c);
        unsetenv("KVT_SPLITK");
    }
    assert_memory_equal(lg_mode[0], lg_mode[1], (size_t)n_dec * V * sizeof(float));
    free(lg_mode[0]), free(lg_mode[1]), free(tok);
    fx_close(&f);
}

/* ------------------------------------------------------------------ clone / trim / append */

static uint64_t hash_seq_blocks(const kvt_seq *s, const kvt_kv_layout *l) {
    uint64_t h = 0;
    for (uint32_t g = 0; g < kvt_kv_layout_n_groups(l); g++)
        for (uint32_t b = 0; b < kvt_seq_n_blocks(s); b++) {
            kvt_block *blk = kvt_seq_block(s, g, b);
            if (!blk) continue;
            h = XXH3_64bits_withSeed(kvt_block_data(blk), kvt_block_data_bytes(blk), h ^ (g * 1000003u + b));
        }
    return h;
}

static void test_clone_trim_append(void **st) {
    (void)st;
    const char *archs[] = {"llama", "gemma3"};
    for (size_t ai = 0; ai < 2; ai++) {
        spec s = tiny(archs[ai]);
        fx f;
        fx_open(&f, &s, 16);
        const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
        int32_t tok[45];
        make_tokens(tok, 45, V, 11);
        kvt_ctx *c = new_ctx(&f, 2, 16);
        kvt_seq *a = new_seq(&f);
        float *lg;
        assert_int_equal(kvt_model_forward(c, a, tok, 40, false, NULL, &lg), KVT_OK);
        uint64_t h0 = hash_seq_blocks(a, f.layout);
        /* clone, trim back to 30 and append 5 different tokens */
        kvt_seq *b = NULL;
        assert_int_equal(kvt_seq_clone(a, &b), KVT_OK);
        uint32_t cut = kvt_seq_can_trim(b, 30) ? 30 : 40;
        assert_int_equal(kvt_seq_trim(b, cut), KVT_OK);
        int32_t extra[5];
        make_tokens(extra, 5, V, 12);
        assert_int_equal(kvt_model_forward(c, b, extra, 5, false, NULL, &lg), KVT_OK);
        float *lb = malloc(V * sizeof(float));
        memcpy(lb, lg, V * sizeof(float));
        assert_int_equal(hash_seq_blocks(a, f.layout), h0);
        assert_int_equal(kvt_seq_len(a), 40);
        /* the donor continues exactly as before */
        assert_int_equal(kvt_model_forward(c, a, tok + 40, 5, false, NULL, &lg), KVT_OK);
        /* a fresh sequence with the same tokens gives the same logits as the continued clone */
        int32_t all[45];
        memcpy(all, tok, cut * sizeof(int32_t));
        memcpy(all + cut, extra, 5 * sizeof(int32_t));
        kvt_seq *fresh = new_seq(&f);
        assert_int_equal(kvt_model_forward(c, fresh, all, cut + 5, false, NULL, &lg), KVT_OK);
        assert_memory_equal(lg, lb, V * sizeof(float));
        free(lb);
        kvt_seq_free(fresh);
        kvt_seq_free(b);
        kvt_seq_free(a);
        kvt_ctx_free(c);
        fx_close(&f);
    }
}

/* ------------------------------------------------------------------ errors */

static void test_forward_errors(void **st) {
    (void)st;
    spec s = tiny("llama");
    fx f;
    fx_open(&f, &s, 16);
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab;
    kvt_ctx *c = new_ctx(&f, 1, 4);
    kvt_seq *sq = new_seq(&f);
    float *lg;
    int32_t bad[3] = {1, (int32_t)V, 2};
    assert_int_equal(kvt_model_forward(c, sq, bad, 3, false, NULL, &lg), KVT_ERR_INVALID_ARG);
    bad[1] = -1;
    assert_int_equal(kvt_model_forward(c, sq, bad, 3, false, NULL, &lg), KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_seq_len(sq), 0);
    volatile int cancel = 1;
    int32_t ok[10];
    make_tokens(ok, 10, V, 3);
    assert_int_equal(kvt_model_forward(c, sq, ok, 10, false, &cancel, &lg), KVT_ERR_CANCELLED);
    cancel = 0;
    assert_int_equal(kvt_model_forward(c, sq, ok, 10, false, &cancel, &lg), KVT_OK);
    assert_int_equal(kvt_seq_len(sq), 10);
    kvt_seq_free(sq);
    kvt_ctx_free(c);
    fx_close(&f);
}

static void test_pool_exhausted(void **st) {
    (void)st;
    spec s = tiny("llama");
    fx f;
    fx_open(&f, &s, 16);
    kvt_block_pool *small = kvt_block_pool_create(f.layout, kvt_kv_layout_block_bytes(f.layout, 0, 0) * 2);
    kvt_seq *sq = NULL;
    assert_int_equal(kvt_seq_create(small, 1, &sq), KVT_OK);
    kvt_ctx *c = new_ctx(&f, 1, 8);
    int32_t tok[64];
    make_tokens(tok, 64, 300, 4);
    float *lg;
    assert_int_equal(kvt_model_forward(c, sq, tok, 64, false, NULL, &lg), KVT_ERR_POOL_EXHAUSTED);
    assert_true(kvt_seq_len(sq) <= 32 && kvt_seq_len(sq) % 8 == 0);
    kvt_seq_free(sq);
    kvt_ctx_free(c);
    kvt_block_pool_free(small);
    fx_close(&f);
}

static kvt_status load_spec(const spec *s, char *err, size_t errlen) {
    char *dir = tu_tmpdir("modelerr");
    char path[512];
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    write_model(s, path);
    kvt_gguf *g = NULL;
    kvt_status st = kvt_gguf_open(path, &g, err, errlen);
    if (st == KVT_OK) {
        kvt_model *m = NULL;
        st = kvt_model_load(g, &m, err, errlen);
        if (st == KVT_OK) {
            const kvt_hparams *hp = kvt_model_hparams(m);
            assert_int_equal(hp->n_vocab, s->n_vocab);
            assert_int_equal(hp->tied_output, s->tied);
            assert_true(kvt_model_weight_bytes(m) > 0);
        }
        kvt_model_free(m);
        kvt_gguf_free(g);
    }
    unlink(path);
    rmdir(dir);
    free(dir);
    return st;
}

static void test_load_errors(void **st) {
    (void)st;
    char err[256];
    spec s = tiny("llama");
    assert_int_equal(load_spec(&s, err, sizeof(err)), KVT_OK);
    s.omit = "blk.1.ffn_up.weight";
    assert_int_equal(load_spec(&s, err, sizeof(err)), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "blk.1.ffn_up.weight"));
    s.omit = NULL;
    s.bad = "blk.0.attn_k.weight";
    assert_int_equal(load_spec(&s, err, sizeof(err)), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "blk.0.attn_k.weight"));
    assert_non_null(strstr(err, "shape"));
    s.bad = NULL;
    spec q = tiny("qwen2");
    q.omit = "blk.0.attn_v.bias";
    assert_int_equal(load_spec(&q, err, sizeof(err)), KVT_ERR_FORMAT);
    spec gm = tiny("gemma3");
    gm.omit = "blk.3.post_ffw_norm.weight";
    assert_int_equal(load_spec(&gm, err, sizeof(err)), KVT_ERR_FORMAT);
    spec u = tiny("gpt2");
    assert_int_equal(load_spec(&u, err, sizeof(err)), KVT_ERR_UNSUPPORTED);
    assert_string_equal(err, "unsupported architecture 'gpt2'");
    /* tied detection and layer kinds */
    spec t = tiny("qwen3");
    t.tied = true;
    assert_int_equal(load_spec(&t, err, sizeof(err)), KVT_OK);
}

static void test_layer_descs(void **st) {
    (void)st;
    spec s = tiny("gemma3");
    fx f;
    fx_open(&f, &s, 16);
    kvt_codec cod[6];
    kvt_layer_desc d[6];
    for (int i = 0; i < 6; i++) cod[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(f.m, cod, d);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(d[i].kind, i == 5 ? KVT_KIND_FULL : KVT_KIND_WINDOW);
        assert_int_equal(kvt_model_layer_is_swa(f.m, i), i != 5);
        if (i != 5) assert_int_equal(d[i].window, 32);
        assert_int_equal(d[i].n_kv_heads, 2);
        assert_int_equal(d[i].head_dim_k, 32);
    }
    assert_int_equal(kvt_kv_layout_n_groups(f.layout), 2);
    const kvt_hparams *hp = kvt_model_hparams(f.m);
    assert_true(hp->tied_output);
    assert_true(hp->rope_neox);
    assert_float_equal(hp->rope_freq_scale, 0.5f, 1e-7);
    fx_close(&f);
}

/* ------------------------------------------------------------------ independent reference */

/* Naive forward written from the architecture math: f32 weights dequantized with kvt_dequant_ref,
 * contiguous KV (rounded to f16 like the cache), double accumulations. Returns logits [n][V]. */
typedef struct refw {
    float *data;
    int64_t n_in, n_out;
} refw;

static refw ref_get(const kvt_gguf *g, const char *name) {
    refw r = {0};
    const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
    if (!t) return r;
    r.n_in = t->ne[0];
    r.n_out = t->ne[1];
    r.data = malloc((size_t)(r.n_in * r.n_out) * sizeof(float));
    kvt_dequant_ref(t->type, t->data, r.data, r.n_in * r.n_out);
    return r;
}

static void ref_mv(const refw *w, const float *x, float *y) {
    for (int64_t o = 0; o < w->n_out; o++) {
        double acc = 0;
        for (int64_t i = 0; i < w->n_in; i++) acc += (double)w->data[o * w->n_in + i] * x[i];
        y[o] = (float)acc;
    }
}

static void ref_norm(float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] * sc * w[i]);
}

static void ref_rope(float *x, uint32_t hd, uint32_t pos, double base, double scale, const float *ff, bool neox) {
    for (uint32_t i = 0; i < hd / 2; i++) {
        double th = pos * pow(base, -2.0 * i / hd);
        if (ff) th /= ff[i];
        th *= scale;
        uint32_t a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = (float)(x0 * cos(th) - x1 * sin(th));
        x[b] = (float)(x0 * sin(th) + x1 * cos(th));
    }
}

static float *ref_forward(const kvt_gguf *g, const spec *s, const int32_t *tok, uint32_t n) {
    const bool gem = !strcmp(s->arch, "gemma3"), llama = !strcmp(s->arch, "llama");
    const bool qwen2 = !strcmp(s->arch, "qwen2"), qkn = gem || !strcmp(s->arch, "qwen3");
    const uint32_t E = s->n_embd, HD = s->head_dim, NH = s->n_head, NKV = s->n_kv, F = s->n_ff, V = s->n_vocab;
    const float eps = llama ? 1e-5f : 1e-6f;
    const uint32_t L = s->n_layer;
    refw emb = ref_get(g, "token_embd.weight"), outn = ref_get(g, "output_norm.weight");
    refw out = s->tied ? emb : ref_get(g, "output.weight");
    refw rf = ref_get(g, "rope_freqs.weight");
    float *kc = malloc((size_t)L * n * NKV * HD * sizeof(float)), *vc = malloc((size_t)L * n * NKV * HD * sizeof(float));
    float *logits = malloc((size_t)n * V * sizeof(float));
    float *x = malloc(E * 4), *xn = malloc(E * 4), *q = malloc(NH * HD * 4), *k = malloc(NKV * HD * 4),
          *v = malloc(NKV * HD * 4), *att = malloc(NH * HD * 4), *o = malloc(E * 4), *ga = malloc(F * 4),
          *up = malloc(F * 4), *sc = malloc(n * sizeof(float));
    refw (*lw)[13] = calloc(L, sizeof(*lw));
    const char *names[13] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                             "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                             "ffn_down.weight", "attn_q_norm.weight", "attn_k_norm.weight",
                             "post_attention_norm.weight", "post_ffw_norm.weight"};
    for (uint32_t il = 0; il < L; il++)
        for (int j = 0; j < 13; j++) {
            char nm[96];
            snprintf(nm, sizeof(nm), "blk.%u.%s", il, names[j]);
            lw[il][j] = ref_get(g, nm);
        }
    refw (*bias)[3] = calloc(L, sizeof(*bias));
    if (qwen2)
        for (uint32_t il = 0; il < L; il++) {
            char nm[96];
            snprintf(nm, sizeof(nm), "blk.%u.attn_q.bias", il); bias[il][0] = ref_get(g, nm);
            snprintf(nm, sizeof(nm), "blk.%u.attn_k.bias", il); bias[il][1] = ref_get(g, nm);
            snprintf(nm, sizeof(nm), "blk.%u.attn_v.bias", il); bias[il][2] = ref_get(g, nm);
        }
    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t i = 0; i < E; i++) x[i] = emb.data[(size_t)tok[p] * E + i] * (gem ? sqrtf((float)E) : 1.0f);
        for (uint32_t il = 0; il < L; il++) {
            refw *w = lw[il];
            bool swa = spec_layer_swa(s, il);
            memcpy(xn, x, E * 4);
            ref_norm(xn, w[0].data, E, eps);
            ref_mv(&w[1], xn, q);
            ref_mv(&w[2], xn, k);
            ref_mv(&w[3], xn, v);
            if (qwen2) {
                for (uint32_t i = 0; i < NH * HD; i++) q[i] += bias[il][0].data[i];
                for (uint32_t i = 0; i < NKV * HD; i++) k[i] += bias[il][1].data[i], v[i] += bias[il][2].data[i];
            }
            for (uint32_t h = 0; h < NH; h++) {
                if (qkn) ref_norm(q + h * HD, w[9].data, HD, eps);
                ref_rope(q + h * HD, HD, p, swa ? 10000.0 : (gem ? 1e6 : 1e4), (gem && !swa && s->rope_factor > 0) ? 1.0 / s->rope_factor : 1.0,
                         llama ? rf.data : NULL, !llama);
                if (gem)
                    for (uint32_t i = 0; i < HD; i++) q[h * HD + i] *= 1.0f / sqrtf((float)HD);
            }
            for (uint32_t h = 0; h < NKV; h++) {
                if (qkn) ref_norm(k + h * HD, w[10].data, HD, eps);
                ref_rope(k + h * HD, HD, p, swa ? 10000.0 : (gem ? 1e6 : 1e4), (gem && !swa && s->rope_factor > 0) ? 1.0 / s->rope_factor : 1.0,
                         llama ? rf.data : NULL, !llama);
            }
            float *kl = kc + ((size_t)il * n + p) * NKV * HD, *vl = vc + ((size_t)il * n + p) * NKV * HD;
            for (uint32_t i = 0; i < NKV * HD; i++) {
                kl[i] = kvt_f16_to_f32(kvt_f32_to_f16(k[i]));
                vl[i] = kvt_f16_to_f32(kvt_f32_to_f16(v[i]));
            }
            double scale = gem ? 1.0 : 1.0 / sqrt((double)HD);
            for (uint32_t h = 0; h < NH; h++) {
                uint32_t kh = h / (NH / NKV);
                double mx = -INFINITY;
                for (uint32_t j = 0; j <= p; j++) {
                    if (swa && p - j >= s->n_swa) { sc[j] = -INFINITY; continue; }
                    const float *kj = kc + ((size_t)il * n + j) * NKV * HD + kh * HD;
                    double d = 0;
                    for (uint32_t i = 0; i < HD; i++) d += (double)q[h * HD + i] * kj[i];
                    sc[j] = (float)(d * scale);
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0;
                for (uint32_t j = 0; j <= p; j++) sum += isinf(sc[j]) ? 0 : exp(sc[j] - mx);
                for (uint32_t i = 0; i < HD; i++) {
                    double a = 0;
                    for (uint32_t j = 0; j <= p; j++)
                        if (!isinf(sc[j])) a += exp(sc[j] - mx) / sum * vc[((size_t)il * n + j) * NKV * HD + kh * HD + i];
                    att[h * HD + i] = (float)a;
                }
            }
            ref_mv(&w[4], att, o);
            if (gem) ref_norm(o, w[11].data, E, eps);
            for (uint32_t i = 0; i < E; i++) x[i] += o[i];
            memcpy(xn, x, E * 4);
            ref_norm(xn, w[5].data, E, eps);
            ref_mv(&w[6], xn, ga);
            ref_mv(&w[7], xn, up);
            for (uint32_t i = 0; i < F; i++) {
                double gv = ga[i];
                double a = gem ? 0.5 * gv * (1.0 + tanh(sqrt(2.0 / M_PI) * (gv + 0.044715 * gv * gv * gv)))
                               : gv / (1.0 + exp(-gv));
                ga[i] = (float)(a * up[i]);
            }
            ref_mv(&w[8], ga, o);
            if (gem) ref_norm(o, w[12].data, E, eps);
            for (uint32_t i = 0; i < E; i++) x[i] += o[i];
        }
        memcpy(xn, x, E * 4);
        ref_norm(xn, outn.data, E, eps);
        ref_mv(&out, xn, logits + (size_t)p * V);
    }
    for (uint32_t il = 0; il < L; il++) {
        for (int j = 0; j < 13; j++) free(lw[il][j].data);
        for (int j = 0; j < 3; j++) free(bias[il][j].data);
    }
    free(lw); free(bias); free(emb.data); free(outn.data); free(rf.data);
    if (!s->tied) free(out.data);
    free(kc); free(vc); free(x); free(xn); free(q); free(k); free(v); free(att); free(o); free(ga); free(up); free(sc);
    return logits;
}

static void check_reference(const spec *s, uint32_t n_tok, float tol) {
    fx f;
    fx_open(&f, s, 16);
    int32_t *tok = malloc(n_tok * sizeof(int32_t));
    make_tokens(tok, n_tok, s->n_vocab, 77);
    kvt_ctx *c = new_ctx(&f, 2, n_tok);
    kvt_seq *sq = new_seq(&f);
    float *lg;
    assert_int_equal(kvt_model_forward(c, sq, tok, n_tok, true, NULL, &lg), KVT_OK);
    float *ref = ref_forward(f.g, s, tok, n_tok);
    double maxd = 0, maxv = 0;
    for (size_t i = 0; i < (size_t)n_tok * s->n_vocab; i++) {
        double d = fabs((double)lg[i] - ref[i]);
        if (d > maxd) maxd = d;
        if (fabs(ref[i]) > maxv) maxv = fabs(ref[i]);
    }
    print_message("# reference %s: max |diff| %.3g, max |logit| %.3g\n", s->arch, maxd, maxv);
    assert_true(maxv > 0.1); /* non-degenerate */
    if (maxd > tol * (maxv > 1 ? maxv : 1)) fail_msg("%s: kvt vs reference max diff %g (max logit %g)", s->arch, maxd, maxv);
    free(ref);
    free(tok);
    kvt_seq_free(sq);
    kvt_ctx_free(c);
    fx_close(&f);
}

static void test_reference_llama(void **st) {
    (void)st;
    spec s = tiny("llama");
    s.rope_freqs = true;
    check_reference(&s, 20, 1e-3f);
}
static void test_reference_qwen2(void **st) { (void)st; spec s = tiny("qwen2"); check_reference(&s, 20, 1e-3f); }
static void test_reference_qwen3(void **st) { (void)st; spec s = tiny("qwen3"); check_reference(&s, 20, 1e-3f); }
static void test_reference_gemma3(void **st) {
    (void)st;
    spec s = tiny("gemma3");
    check_reference(&s, 50, 1e-3f); /* > window 32: masking exercised */
}
/* The window layers come from the file's sliding_window_pattern where it has one (a period, or one
 * boolean per layer): the cache declares them, and the forward pass masks and rotates by them, as
 * the independent reference does. */
static void test_reference_gemma3_swa_pattern(void **st) {
    (void)st;
    static const uint8_t bools[6] = {1, 0, 1, 1, 0, 0};
    spec by_period = tiny("gemma3"), by_bools = tiny("gemma3");
    by_period.swa_period = 3;
    by_bools.swa_bools = bools;
    by_bools.swa_n_bools = 6;
    const spec *cases[2] = {&by_period, &by_bools};
    for (int ci = 0; ci < 2; ci++) {
        fx f;
        fx_open(&f, cases[ci], 16);
        kvt_codec cod[6];
        kvt_layer_desc d[6];
        for (int i = 0; i < 6; i++) cod[i] = (kvt_codec){.kind = KVT_CODEC_F16};
        kvt_model_layer_descs(f.m, cod, d);
        for (uint32_t i = 0; i < 6; i++) {
            const bool swa = spec_layer_swa(cases[ci], i);
            assert_int_equal(kvt_model_layer_is_swa(f.m, i), swa);
            assert_int_equal(d[i].kind, swa ? KVT_KIND_WINDOW : KVT_KIND_FULL);
        }
        fx_close(&f);
        check_reference(cases[ci], 50, 1e-3f); /* > window 32: masking exercised */
    }
    /* malformed patterns are refused */
    static const uint8_t short_bools[5] = {1, 1, 1, 1, 1};
    char err[256];
    spec empty = tiny("gemma3"), wrong_len = tiny("gemma3");
    empty.swa_bools = short_bools;
    empty.swa_n_bools = 0;
    assert_int_equal(load_spec(&empty, err, sizeof(err)), KVT_ERR_FORMAT);
    wrong_len.swa_bools = short_bools;
    wrong_len.swa_n_bools = 5;
    assert_int_equal(load_spec(&wrong_len, err, sizeof(err)), KVT_ERR_FORMAT);
}

static void test_reference_llama_q8_0(void **st) {
    (void)st;
    spec s = tiny_quant(KVT_TYPE_Q8_0);
    check_reference(&s, 12, 3e-2f); /* activations are quantized to q8_0 by the kernels */
}

/* ------------------------------------------------------------------ thread pool */

typedef struct tp_arg {
    kvt_threadpool *tp;
    _Atomic int hits[8];
    int stage[8][64];
    atomic_int errors;
} tp_arg;

static void tp_fn(void *ctx, int ith, int nth) {
    tp_arg *a = ctx;
    atomic_fetch_add(&a->hits[ith], 1);
    for (int s = 0; s < 64; s++) {
        a->stage[ith][s] = s;
        kvt_threadpool_barrier(a->tp);
        for (int t = 0; t < nth; t++)
            if (a->stage[t][s] != s) atomic_fetch_add(&a->errors, 1);
        kvt_threadpool_barrier(a->tp);
    }
}

static void test_threadpool(void **st) {
    (void)st;
    int counts[3] = {1, 2, 4};
    for (int ci = 0; ci < 3; ci++) {
        tp_arg *a = calloc(1, sizeof(*a));
        a->tp = kvt_threadpool_create(counts[ci]);
        assert_non_null(a->tp);
        assert_int_equal(kvt_threadpool_n_threads(a->tp), counts[ci]);
        for (int r = 0; r < 200; r++) {
            memset(a->stage, 0xff, sizeof(a->stage));
            kvt_threadpool_run(a->tp, tp_fn, a);
            if (r == 100) usleep(20000); /* let workers fall asleep on the futex */
        }
        for (int t = 0; t < counts[ci]; t++) assert_int_equal(atomic_load(&a->hits[t]), 200);
        assert_int_equal(atomic_load(&a->errors), 0);
        kvt_threadpool_free(a->tp);
        free(a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threadpool),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_layer_descs),
        cmocka_unit_test(test_decode_eq_full_llama),
        cmocka_unit_test(test_decode_eq_full_kv4),
        cmocka_unit_test(test_decode_eq_full_llama_rope_freqs),
        cmocka_unit_test(test_decode_eq_full_qwen2),
        cmocka_unit_test(test_decode_eq_full_qwen3),
        cmocka_unit_test(test_decode_eq_full_gemma3),
        cmocka_unit_test(test_decode_eq_full_llama_f16),
        cmocka_unit_test(test_decode_eq_full_llama_q8_0),
        cmocka_unit_test(test_decode_eq_full_llama_q4_k),
        cmocka_unit_test(test_gemma3_window_long),
        cmocka_unit_test(test_gen_model_archs),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_decode_splitk),
        cmocka_unit_test(test_decode_splitk_auto),
        cmocka_unit_test(test_clone_trim_append),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_pool_exhausted),
        cmocka_unit_test(test_reference_llama),
        cmocka_unit_test(test_reference_qwen2),
        cmocka_unit_test(test_reference_qwen3),
        cmocka_unit_test(test_reference_gemma3),
        cmocka_unit_test(test_reference_gemma3_swa_pattern),
        cmocka_unit_test(test_reference_llama_q8_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
