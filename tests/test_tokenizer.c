/* test_tokenizer.c — tokenizers against real vocabularies (data/vocab): every reference
 * vector, round trips, byte fuzzing, streaming detokenization, special tokens, EOG set, and a
 * 1 MB timing that is printed, never asserted. */
#include "testutil.h"

#include "gguf/gguf.h"
#include "text/tok_internal.h" /* SPM reference path (no chunking) */
#include "text/tokenizer.h"
#include "util/common.h"

typedef struct vocab {
    kvt_gguf *g;
    kvt_tokenizer *t;
} vocab;

static vocab g_gpt2, g_spm;

static bool load_vocab(const char *name, vocab *v) {
    char path[512], err[256];
    tu_vocab_path(path, sizeof path, name, "");
    if (kvt_gguf_open(path, &v->g, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "open %s: %s\n", path, err);
        return false;
    }
    if (kvt_tokenizer_create(v->g, &v->t, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "tokenizer %s: %s\n", path, err);
        return false;
    }
    return true;
}

static int setup_all(void **state) {
    (void)state;
    /* the vocabularies are part of the repository: missing or unreadable fails the suite */
    return load_vocab("ggml-vocab-gpt-2.gguf", &g_gpt2) && load_vocab("ggml-vocab-llama-spm.gguf", &g_spm) ? 0 : -1;
}

static int teardown_all(void **state) {
    (void)state;
    vocab *vs[2] = {&g_gpt2, &g_spm};
    for (int i = 0; i < 2; i++) {
        kvt_tokenizer_free(vs[i]->t);
        kvt_gguf_free(vs[i]->g);
    }
    return 0;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

static int32_t *tok(const kvt_tokenizer *t, const char *s, size_t len, uint32_t flags, int64_t *n) {
    *n = kvt_tokenize_ex(t, s, len, flags, NULL, 0);
    assert_true(*n >= 0);
    int32_t *ids = malloc((size_t)(*n + 1) * sizeof *ids);
    int64_t n2 = kvt_tokenize_ex(t, s, len, flags, ids, *n);
    assert_int_equal(n2, *n);
    return ids;
}

/* Runs every .inp/.out vector; returns the number that passed and checks round trips. */
static void run_vectors(const char *name, const kvt_tokenizer *t) {
    char p1[512], p2[512];
    tu_vocab_path(p1, sizeof p1, name, ".inp");
    tu_vocab_path(p2, sizeof p2, name, ".out");
    size_t il, ol;
    char *inp = read_file(p1, &il), *outp = read_file(p2, &ol);
    assert_non_null(inp);
    assert_non_null(outp);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep);
    char *ip = inp, *op = outp;
    int total = 0, pass = 0, rt = 0;
    for (;;) {
        char *e = strstr(ip, sep);
        if (!e) break;
        char *oe = strchr(op, '\n');
        assert_non_null(oe);
        *oe = 0;
        /* expected ids */
        int32_t want[1024];
        int nw = 0;
        for (char *q = op; *q;) {
            while (*q == ' ') q++;
            if (!*q) break;
            want[nw++] = (int32_t)strtol(q, &q, 10);
        }
        int64_t n;
        int32_t *ids = tok(t, ip, (size_t)(e - ip), 0, &n);
        bool ok = n == nw && !memcmp(ids, want, (size_t)nw * sizeof *ids);
        if (!ok) {
            fprintf(stderr, "%s vector %d mismatch: '%.*s'\n  want:", name, total, (int)(e - ip), ip);
            for (int i = 0; i < nw; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got: ");
            for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        pass += ok;
        size_t dl;
        char *d = kvt_detokenize(t, ids, n, false, &dl);
        assert_non_null(d);
        if (dl == (size_t)(e - ip) && !memcmp(d, ip, dl)) rt++;
        else fprintf(stderr, "%s vector %d round trip: '%s'\n", name, total, d);
        free(d);
        free(ids);
        total++;
        ip = e + seplen;
        op = oe + 1;
    }
    fprintf(stderr, "%s: %d/%d vectors pass, %d/%d round-trip\n", name, pass, total, rt, total);
    assert_true(total >= 40);
    assert_int_equal(pass, total);
    assert_int_equal(rt, total);
    free(inp);
    free(outp);
}

static void test_vectors_gpt2(void **s) {
    (void)s;
    assert_string_equal(kvt_tokenizer_model_name(g_gpt2.t), "gpt2");
    assert_int_equal(kvt_tokenizer_n_vocab(g_gpt2.t), 50257);
    run_vectors("ggml-vocab-gpt-2.gguf", g_gpt2.t);
}

static void test_vectors_spm(void **s) {
    (void)s;
    assert_string_equal(kvt_tokenizer_model_name(g_spm.t), "llama");
    assert_int_equal(kvt_tokenizer_n_vocab(g_spm.t), 32000);
    run_vectors("ggml-vocab-llama-spm.gguf", g_spm.t);
}

/* random byte strings of several flavours */
static size_t rand_text(uint64_t *rng, char *buf, size_t cap) {
    size_t n = tu_rand(rng) % 64;
    int mode = (int)(tu_rand(rng) % 4);
    size_t o = 0;
    static const char *pieces[] = {" ", "  ", "\n", "\t", "a", "Hello", "'s", "123", "é", "中文", "🦙",
                                   "\xE2\x96\x81", "<s>", "\xff", "\xc3", "\xe2\x82", "!", "   \n"};
    while (o < n && o + 8 < cap) {
        if (mode == 0) buf[o++] = (char)(tu_rand(rng) & 0xff);
        else if (mode == 1) buf[o++] = (char)(32 + tu_rand(rng) % 95);
        else {
            const char *p = pieces[tu_rand(rng) % KVT_ARRAY_LEN(pieces)];
            size_t l = strlen(p);
            memcpy(buf + o, p, l);
            o += l;
        }
    }
    return o;
}

/* The SPM fast path cuts the text before U+2581 runs; it must equal the uncut algorithm. */
static void test_spm_chunking_exact(void **s) {
    (void)s;
    assert_true(g_spm.t->spm_split_ws);
    uint64_t rng = 4242;
    char buf[128];
    static const char *extra[] = {"\xE2\x96\x81Hello\xE2\x96\x81\xE2\x96\x81world", "a\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81" "b",
                                  "\xE2\x96\x81\xE2\x96\x81", "x\xE2\x96\x81"};
    for (int i = 0; i < 1500; i++) {
        size_t n;
        if (i < 4) {
            n = strlen(extra[i]);
            memcpy(buf, extra[i], n);
        } else {
            n = rand_text(&rng, buf, sizeof buf);
            for (size_t k = 0; k < n; k++) /* escape spaces like the real pipeline */
                if (buf[k] == ' ' && n + 2 < sizeof buf) {
                    memmove(buf + k + 3, buf + k + 1, n - k - 1);
                    memcpy(buf + k, "\xE2\x96\x81", 3);
                    n += 2;
                }
        }
        kvt_idvec a = {0}, b = {0};
        kvt_spm_encode_opt(g_spm.t, buf, n, &a, true);
        kvt_spm_encode_opt(g_spm.t, buf, n, &b, false);
        assert_int_equal(a.n, b.n);
        if (a.n) assert_memory_equal(a.v, b.v, (size_t)a.n * sizeof(int32_t));
        free(a.v);
        free(b.v);
    }
}

/* kvt_tokenize_limit: under the limit it is kvt_tokenize_ex; over it, it stops early with a
 * count > limit whose ids are the full result's prefix; and no text ever needs fewer tokens than
 * len / kvt_tokenizer_max_token_bytes (the server's pre-check relies on that bound). */
static void test_tokenize_limit(void **s) {
    (void)s;
    const kvt_tokenizer *ts[2] = {g_gpt2.t, g_spm.t};
    uint64_t rng = 777;
    char buf[1024];
    int32_t full[1100], part[1100];
    for (int v = 0; v < 2; v++) {
        const kvt_tokenizer *t = ts[v];
        uint32_t maxb = kvt_tokenizer_max_token_bytes(t);
        assert_true(maxb >= 4 && maxb < 1024);
        for (int it = 0; it < 600; it++) {
            size_t n = 0;
            while (n + 80 < sizeof buf && (n == 0 || tu_rand(&rng) % 8)) n += rand_text(&rng, buf + n, sizeof buf - n);
            uint32_t flags = (it & 1 ? KVT_TOK_PARSE_SPECIAL : 0) | (it & 2 ? KVT_TOK_ADD_SPECIAL : 0);
            int64_t nf = kvt_tokenize_ex(t, buf, n, flags, full, KVT_ARRAY_LEN(full));
            assert_true(nf >= 0 && nf <= (int64_t)KVT_ARRAY_LEN(full));
            assert_true((uint64_t)nf >= (n + maxb - 1) / maxb);
            int64_t limits[] = {1, nf / 2, nf - 1, nf, nf + 3};
            for (size_t k = 0; k < KVT_ARRAY_LEN(limits); k++) {
                int64_t lim = limits[k];
                if (lim < 1) continue;
                int64_t np = kvt_tokenize_limit(t, buf, n, flags, part, KVT_ARRAY_LEN(part), lim);
                if (nf <= lim) {
                    assert_int_equal(np, nf);
                } else {
                    assert_true(np > lim && np <= nf);
                }
                if (np > 0) assert_memory_equal(part, full, (size_t)np * sizeof(int32_t));
            }
        }
        /* a long text stops near the limit instead of running to its end */
        size_t big = 1u << 20;
        char *text = malloc(big);
        assert_non_null(text);
        for (size_t i = 0; i < big; i++) text[i] = "abcdefgh ijklmnop"[tu_rand(&rng) % 17];
        int64_t np = kvt_tokenize_limit(t, text, big, 0, part, KVT_ARRAY_LEN(part), 100);
        assert_true(np > 100 && np < 1000);
        free(text);
    }
}

static void test_fuzz_roundtrip(void **s) {
    (void)s;
    uint64_t rng = 12345;
    char buf[128];
    int spm_rt = 0, spm_total = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = rand_text(&rng, buf, sizeof buf);
        int64_t m;
        int32_t *ids = tok(g_gpt2.t, buf, n, i % 2 ? KVT_TOK_PARSE_SPECIAL : 0, &m);
        size_t dl;
        char *d = kvt_detokenize(g_gpt2.t, ids, m, true, &dl);
        assert_non_null(d);
        assert_int_equal(dl, n);
        assert_memory_equal(d, buf, n);
        free(d);
        free(ids);
        ids = tok(g_spm.t, buf, n, i % 2 ? KVT_TOK_PARSE_SPECIAL | KVT_TOK_ADD_SPECIAL : 0, &m);
        for (int64_t k = 0; k < m; k++) assert_true(ids[k] >= 0 && ids[k] < 32000);
        d = kvt_detokenize(g_spm.t, ids, m, true, &dl);
        assert_non_null(d);
        /* U+2581 in the input itself decodes as a space: SPM cannot round-trip it */
        bool has_lower_one_eighth = memmem(buf, n, "\xE2\x96\x81", 3) != NULL;
        if (!(i % 2) && !has_lower_one_eighth) {
            spm_total++;
            if (dl == n && !memcmp(d, buf, n)) spm_rt++;
            else if (getenv("KVT_DEBUG_RT")) {
                fprintf(stderr, "rt:");
                for (size_t k = 0; k < n; k++) fprintf(stderr, " %02x", (unsigned char)buf[k]);
                fprintf(stderr, "\n -> ");
                for (size_t k = 0; k < dl; k++) fprintf(stderr, " %02x", (unsigned char)d[k]);
                fprintf(stderr, "\n");
            }
        }
        free(d);
        free(ids);
    }
    fprintf(stderr, "fuzz: 2000 gpt2 byte-exact round trips; spm round trips %d/%d (no special parsing, no U+2581 in input)\n",
            spm_rt, spm_total);
    /* SPM has byte fallback for every byte, so plain text round-trips exactly too */
    assert_true(spm_total > 500);
    assert_int_equal(spm_rt, spm_total);
}

static bool valid_utf8(const char *s, size_t n) {
    if (kvt_utf8_complete_prefix(s, n) != n) return false;
    size_t l;
    char *z = kvt_utf8_sanitize(s, n, &l);
    bool ok = z && l == n && !memcmp(z, s, n);
    free(z);
    return ok;
}

static void stream_check(const kvt_tokenizer *t, const int32_t *ids, int64_t n, bool special) {
    kvt_detok *d = kvt_detok_create(t, special);
    assert_non_null(d);
    char *acc = malloc(1 << 16);
    size_t al = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        const char *p = kvt_detok_push(d, ids[i], &l);
        assert_true(valid_utf8(p, l)); /* never half a code point */
        memcpy(acc + al, p, l);
        al += l;
    }
    size_t l;
    const char *p = kvt_detok_flush(d, &l);
    assert_true(valid_utf8(p, l));
    memcpy(acc + al, p, l);
    al += l;
    size_t fl, sl;
    char *full = kvt_detokenize(t, ids, n, special, &fl);
    char *san = kvt_utf8_sanitize(full, fl, &sl);
    assert_int_equal(al, sl);
    assert_memory_equal(acc, san, sl);
    free(full);
    free(san);
    free(acc);
    kvt_detok_free(d);
}

static void test_stream_detok(void **s) {
    (void)s;
    uint64_t rng = 777;
    int32_t ids[48];
    for (int it = 0; it < 600; it++) {
        const kvt_tokenizer *t = it % 2 ? g_spm.t : g_gpt2.t;
        uint32_t nv = kvt_tokenizer_n_vocab(t);
        int64_t n = (int64_t)(tu_rand(&rng) % 48);
        for (int64_t i = 0; i < n; i++) {
            uint64_t r = tu_rand(&rng);
            /* bias towards byte tokens so that code points get split across tokens */
            if (r % 3 == 0) ids[i] = (int32_t)(it % 2 ? 3 + (r >> 8) % 256 : (r >> 8) % 256);
            else if (r % 17 == 1) ids[i] = -5; /* invalid ids are skipped consistently */
            else ids[i] = (int32_t)((r >> 8) % nv);
        }
        stream_check(t, ids, n, it % 4 < 2);
    }
    /* a real multi-byte text split into byte tokens (SPM byte fallback of "🦙") */
    int64_t n;
    int32_t *v = tok(g_spm.t, "a🦙中", strlen("a🦙中"), 0, &n);
    stream_check(g_spm.t, v, n, false);
    free(v);
    /* partial sequence then flush: U+FFFD only at the end */
    int32_t b0 = kvt_tokenizer_find(g_spm.t, "<0xF0>");
    assert_true(b0 >= 0);
    kvt_detok *d = kvt_detok_create(g_spm.t, false);
    size_t l;
    kvt_detok_push(d, kvt_tokenizer_find(g_spm.t, "▁a"), &l);
    kvt_detok_push(d, b0, &l);
    assert_int_equal(l, 0); /* waits for the rest of the code point */
    const char *p = kvt_detok_flush(d, &l);
    assert_int_equal(l, 3);
    assert_memory_equal(p, "\xEF\xBF\xBD", 3);
    kvt_detok_free(d);
}

static void test_special_tokens(void **s) {
    (void)s;
    const char *txt = "Hi<|endoftext|>there";
    int64_t n1, n2;
    int32_t *a = tok(g_gpt2.t, txt, strlen(txt), KVT_TOK_PARSE_SPECIAL, &n1);
    int32_t *b = tok(g_gpt2.t, txt, strlen(txt), 0, &n2);
    int32_t eot = kvt_tokenizer_find(g_gpt2.t, "<|endoftext|>");
    assert_int_equal(eot, 50256);
    int found_a = 0, found_b = 0;
    for (int64_t i = 0; i < n1; i++) found_a += a[i] == eot;
    for (int64_t i = 0; i < n2; i++) found_b += b[i] == eot;
    assert_int_equal(found_a, 1);
    assert_int_equal(found_b, 0);
    assert_true(n2 > n1);
    free(a);
    free(b);
    /* SPM: <s> splits only with parse_special; the fragment after it gets the space prefix */
    const char *t2 = "x<s>y";
    a = tok(g_spm.t, t2, strlen(t2), KVT_TOK_PARSE_SPECIAL, &n1);
    b = tok(g_spm.t, t2, strlen(t2), 0, &n2);
    found_a = found_b = 0;
    for (int64_t i = 0; i < n1; i++) found_a += a[i] == 1;
    for (int64_t i = 0; i < n2; i++) found_b += b[i] == 1;
    assert_int_equal(found_a, 1);
    assert_int_equal(found_b, 0);
    assert_int_equal(a[n1 - 1], kvt_tokenizer_find(g_spm.t, "▁y"));
    /* render_special controls whether <s> shows in the output */
    size_t l;
    char *d1 = kvt_detokenize(g_spm.t, a, n1, true, &l);
    char *d2 = kvt_detokenize(g_spm.t, a, n1, false, &l);
    assert_string_equal(d1, "x<s> y");
    assert_string_equal(d2, "x y");
    free(d1);
    free(d2);
    free(a);
    free(b);
    /* NO_SPACE_PREFIX */
    a = tok(g_spm.t, "Hello", 5, 0, &n1);
    b = tok(g_spm.t, "Hello", 5, KVT_TOK_NO_SPACE_PREFIX, &n2);
    assert_int_equal(a[0], kvt_tokenizer_find(g_spm.t, "▁Hello"));
    assert_int_not_equal(b[0], a[0]);
    free(a);
    free(b);
}

static void test_bos_eos_eog(void **s) {
    (void)s;
    /* SPM defaults: bos 1, eos 2, add_bos true */
    assert_int_equal(kvt_tokenizer_bos(g_spm.t), 1);
    assert_int_equal(kvt_tokenizer_eos(g_spm.t), 2);
    assert_true(kvt_tokenizer_add_bos(g_spm.t));
    assert_true(kvt_tokenizer_is_eog(g_spm.t, 2));
    assert_false(kvt_tokenizer_is_eog(g_spm.t, 1));
    assert_false(kvt_tokenizer_is_eog(g_spm.t, 100));
    assert_false(kvt_tokenizer_is_eog(g_spm.t, -1));
    assert_false(kvt_tokenizer_is_eog(g_spm.t, 32000));
    int64_t n;
    int32_t *v = tok(g_spm.t, "Hi", 2, KVT_TOK_ADD_SPECIAL, &n);
    assert_int_equal(v[0], 1);
    free(v);
    /* gpt2: eos = <|endoftext|> = 50256, no BOS added by default */
    assert_int_equal(kvt_tokenizer_eos(g_gpt2.t), 50256);
    assert_true(kvt_tokenizer_is_eog(g_gpt2.t, 50256));
    assert_false(kvt_tokenizer_is_eog(g_gpt2.t, 40));
    assert_false(kvt_tokenizer_add_bos(g_gpt2.t));
    v = tok(g_gpt2.t, "Hi", 2, KVT_TOK_ADD_SPECIAL, &n);
    assert_int_not_equal(v[0], 50256);
    free(v);
    /* hashes differ between vocabularies and are stable */
    assert_true(kvt_tokenizer_hash(g_gpt2.t) != kvt_tokenizer_hash(g_spm.t));
    assert_true(kvt_tokenizer_hash(g_gpt2.t) != 0);
    /* token_to_bytes: gpt2 'Ġ' prefix decodes to a space; SPM byte token decodes to one byte */
    char b[16];
    int32_t id = kvt_tokenizer_find(g_gpt2.t, "\xC4\xA0the");
    assert_true(id >= 0);
    assert_int_equal(kvt_token_to_bytes(g_gpt2.t, id, false, b, sizeof b), 4);
    assert_memory_equal(b, " the", 4);
    assert_int_equal(kvt_token_to_bytes(g_spm.t, kvt_tokenizer_find(g_spm.t, "<0x0A>"), false, b, 16), 1);
    assert_int_equal(b[0], '\n');
    assert_int_equal(kvt_token_to_bytes(g_spm.t, 99999, false, b, 16), 0);
}

static void test_speed_1mb(void **s) {
    (void)s;
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and",
                                  "tokenizer", "inference", "server", "cache", "of", "in", "to", "is",
                                  "memory", "blocks", "shared", "sequences", "It's", "we'll", "2024",
                                  "Hello,", "world.", "(parenthesis)", "don't", "a", "an"};
    size_t cap = 1 << 20;
    char *txt = malloc(cap + 32);
    size_t o = 0;
    uint64_t rng = 99;
    while (o < cap) {
        const char *w = words[tu_rand(&rng) % KVT_ARRAY_LEN(words)];
        size_t l = strlen(w);
        memcpy(txt + o, w, l);
        o += l;
        txt[o++] = tu_rand(&rng) % 12 == 0 ? '\n' : ' ';
    }
    const kvt_tokenizer *ts[2] = {g_gpt2.t, g_spm.t};
    for (int i = 0; i < 2; i++) {
        double t0 = kvt_now_ms();
        int64_t n = kvt_tokenize(ts[i], txt, o, false, false, NULL, 0);
        double t1 = kvt_now_ms();
        assert_true(n > 100000);
        fprintf(stderr, "speed: %s tokenized %zu bytes into %lld tokens in %.1f ms\n",
                kvt_tokenizer_model_name(ts[i]), o, (long long)n, t1 - t0);
    }
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_gpt2),   cmocka_unit_test(test_vectors_spm),
        cmocka_unit_test(test_fuzz_roundtrip), cmocka_unit_test(test_stream_detok),
        cmocka_unit_test(test_spm_chunking_exact),
        cmocka_unit_test(test_special_tokens), cmocka_unit_test(test_bos_eos_eog),
        cmocka_unit_test(test_speed_1mb),      cmocka_unit_test(test_tokenize_limit),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
