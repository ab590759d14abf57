/* test_hybrid_cache.c — recurrent-state reuse of a hybrid model (qwen35 fixture) through the engine:
 * snapshots at the prompt boundary, every --recurrent-snapshot-every tokens and at the end of a
 * generation; RAM and SSD (after restart) restores continue bit-identically to cold runs; an edit
 * reuses exactly up to the last snapshot before it (counted as reuse_impossible{untrimmable});
 * a 10-turn chat reuses every previous turn entirely. */
#include "testutil.h"

#include "engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define FIX_GGUF "tests/fixtures/qwen35-tiny.gguf"
#define BT 64
#define EVERY 128

static kvt_engine *open_engine_chat(const char *ssd, const char *chat) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = FIX_GGUF;
    o.n_threads = 2;
    o.n_ctx = 2048;
    o.ubatch = 96; /* not a multiple of the block: snapshot stops must still land on blocks */
    o.block_tokens = BT;
    o.prompt_cache_gb = 1.0;
    o.recurrent_snapshot_every = EVERY;
    o.ssd_dir = ssd;
    o.chat_template = chat;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return e;
}

static kvt_engine *open_engine(const char *ssd) { return open_engine_chat(ssd, NULL); }

static void fill(int32_t *ids, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(300 + tu_rand(&seed) % 49000);
}

typedef struct run_out {
    int32_t tok[64];
    uint32_t n, reused;
    kvt_tier tier;
} run_out;

static void gen(kvt_engine *e, const int32_t *ids, uint32_t n, uint32_t max, bool no_cache, run_out *out) {
    kvt_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = max, .ignore_eog = true, .no_cache = no_cache};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256] = "";
    kvt_status st = kvt_engine_generate(e, &r, &res, err, sizeof err);
    if (st) fprintf(stderr, "generate: %s\n", err);
    assert_int_equal(st, KVT_OK);
    assert_int_equal(res.n_gen, max);
    memcpy(out->tok, res.tokens, sizeof(int32_t) * res.n_gen);
    out->n = res.n_gen;
    out->reused = res.n_reused;
    out->tier = res.reused_from;
    free(res.tokens);
}

static uint64_t untrimmable(kvt_engine *e) {
    kvt_engine_stats s;
    kvt_engine_stats_get(e, &s);
    return s.pc_reuse_impossible_untrimmable;
}

/* RAM tier: restores on a periodic snapshot (block aligned), on the prompt boundary (off any block)
 * and on the end-of-generation snapshot, each == the cold run of the same prompt. */
static void test_ram_restore_eq_cold(void **st) {
    (void)st;
    kvt_engine *e = open_engine(NULL);
    int32_t p[600];
    fill(p, 600, 1);
    run_out cold, hot, first;
    gen(e, p, 300, 8, false, &first); /* snapshots at 128, 256, 299 (n-1), 300 (prompt), 307 (end) */
    /* same prompt: 300 itself is not usable (one token must be computed); the prefill took a
     * snapshot at n-1 for exactly this retry */
    gen(e, p, 300, 8, false, &hot);
    assert_int_equal(hot.reused, 299);
    assert_int_equal(hot.tier, KVT_TIER_RAM);
    assert_memory_equal(hot.tok, first.tok, sizeof(int32_t) * 8);
    /* the next turn: prompt + reply + new text reuses the end-of-generation snapshot at 307 */
    int32_t q[400];
    memcpy(q, p, 300 * sizeof(int32_t));
    memcpy(q + 300, first.tok, 8 * sizeof(int32_t));
    fill(q + 308, 92, 2);
    gen(e, q, 400, 8, true, &cold);
    gen(e, q, 400, 8, false, &hot);
    assert_int_equal(hot.reused, 307);
    assert_memory_equal(hot.tok, cold.tok, sizeof(int32_t) * 8);
    /* a prompt one past a periodic snapshot reuses it; one ending exactly on it must compute its
     * last token, so it continues from the snapshot before */
    const uint32_t lens[] = {257, 256, 129};
    const uint32_t want[] = {256, 128, 128};
    for (int i = 0; i < 3; i++) {
        gen(e, p, lens[i], 8, true, &cold);
        gen(e, p, lens[i], 8, false, &hot);
        assert_int_equal(hot.reused, want[i]);
        assert_memory_equal(hot.tok, cold.tok, sizeof(int32_t) * 8);
    }
    kvt_engine_free(e);
}

/* An edit at token p reuses exactly up to the last snapshot <= p, and the lookup that matched more
 * tokens than it could use is counted as untrimmable. */
static void test_edit_reuses_last_snapshot(void **st) {
    (void)st;
    kvt_engine *e = open_engine(NULL);
    int32_t p[600];
    fill(p, 600, 3);
    run_out r, cold;
    gen(e, p, 600, 4, false, &r); /* snapshots at 128, 256, 384, 512, 600, 603 */
    const uint32_t edits[] = {100, 128, 200, 383, 384, 590};
    const uint32_t want[] = {0, 128, 128, 256, 384, 512};
    for (size_t i = 0; i < KVT_ARRAY_LEN(edits); i++) {
        int32_t q[600];
        memcpy(q, p, sizeof q);
        q[edits[i]] = q[edits[i]] == 301 ? 302 : 301;
        uint64_t u0 = untrimmable(e);
        gen(e, q, 600, 4, true, &cold);
        gen(e, q, 600, 4, false, &r);
        if (r.reused != want[i]) fail_msg("edit at %u: reused %u, want %u", edits[i], r.reused, want[i]);
        assert_memory_equal(r.tok, cold.tok, sizeof(int32_t) * 4);
        /* every edit except one exactly on a snapshot matched more tokens than it could reuse */
        uint64_t du = untrimmable(e) - u0;
        assert_int_equal(du, edits[i] == want[i] ? 0 : 1);
    }
    kvt_engine_free(e);
}

/* SSD tier after a restart: snapshots were persisted with their blocks and a new engine continues
 * exactly as a cold run (prompt-boundary snapshot off a block boundary, and a periodic one). */
static void test_ssd_restart_eq_cold(void **st) {
    (void)st;
    char *dir = tu_tmpdir("hyb-ssd");
    int32_t p[500];
    fill(p, 500, 5);
    run_out first, cold, hot;
    {
        kvt_engine *e = open_engine(dir);
        gen(e, p, 330, 6, false, &first); /* snapshots 128, 256, 330, 335 */
        kvt_flush_result fr;
        kvt_engine_flush(e, 20000, &fr);
        assert_true(fr.durable);
        kvt_engine_free(e);
    }
    int32_t q[500];
    memcpy(q, p, 330 * sizeof(int32_t));
    memcpy(q + 330, first.tok, 6 * sizeof(int32_t));
    fill(q + 336, 100, 6);
    {
        kvt_engine *e = open_engine(dir);
        gen(e, q, 436, 6, true, &cold);
        gen(e, q, 436, 6, false, &hot);
        assert_int_equal(hot.tier, KVT_TIER_SSD);
        assert_int_equal(hot.reused, 335);
        assert_memory_equal(hot.tok, cold.tok, sizeof(int32_t) * 6);
        kvt_engine_free(e);
    }
    {
        kvt_engine *e = open_engine(dir); /* an edit at 300: the periodic snapshot at 256 */
        q[300] ^= 1;
        gen(e, q, 436, 6, true, &cold);
        gen(e, q, 436, 6, false, &hot);
        assert_int_equal(hot.tier, KVT_TIER_SSD);
        assert_int_equal(hot.reused, 256);
        assert_memory_equal(hot.tok, cold.tok, sizeof(int32_t) * 6);
        kvt_engine_free(e);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

/* Ten turns: every turn's prompt = the previous prompt + its reply + a new message; each turn
 * reuses everything the previous generation computed (all but its last sampled token). */
static void test_ten_turn_chat(void **st) {
    (void)st;
    kvt_engine *e = open_engine(NULL);
    int32_t conv[2048];
    uint32_t n = 40;
    fill(conv, n, 9);
    for (int turn = 0; turn < 10; turn++) {
        run_out r, cold;
        gen(e, conv, n, 12, false, &r);
        if (turn > 0) {
            /* previous prompt (n - 30) + its 12-token reply, minus the never-forwarded last token */
            if (r.reused != n - 19) fail_msg("turn %d: reused %u of %u, want %u", turn, r.reused, n, n - 19);
        } else {
            assert_int_equal(r.reused, 0);
        }
        if (turn % 3 == 2) {
            gen(e, conv, n, 12, true, &cold);
            assert_memory_equal(r.tok, cold.tok, sizeof(int32_t) * 12);
        }
        memcpy(conv + n, r.tok, 12 * sizeof(int32_t));
        n += 12;
        fill(conv + n, 18, 100 + (uint64_t)turn); /* the new user message (with template tokens) */
        n += 18;
    }
    kvt_engine_free(e);
}

/* ------------------------------------------------------------------ chat */

/* The Qwen3/3.5 family is detected from the template text, and rendering drops the thinking of
 * assistant turns before the last user message only. */
static void test_qwen35_template(void **st) {
    (void)st;
    const char *tmpl = "{%- for message in messages %}{%- if message.role == 'assistant' %}"
                       "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
                       "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' }}{%- endfor %}";
    bool known = false;
    assert_int_equal(kvt_chat_detect(tmpl, strlen(tmpl), &known), KVT_CHAT_QWEN35);
    assert_true(known);
    const char *chatml = "{{'<|im_start|>' + message['role']}}";
    assert_int_equal(kvt_chat_detect(chatml, strlen(chatml), &known), KVT_CHAT_CHATML);
    kvt_chat_template *c = NULL;
    char err[256];
    assert_int_equal(kvt_chat_template_create_text(tmpl, strlen(tmpl), NULL, NULL, &c, err, sizeof err), KVT_OK);
    const char *a1 = "<think>\nplan</think>\n\nHello!", *a2 = "<think>\nmore</think>\n\nBye";
    kvt_chat_msg m[4] = {{.role = "user", .content = "Hi", .content_len = 2}, {.role = "assistant", .content = a1, .content_len = strlen(a1)},
                         {.role = "user", .content = "Go", .content_len = 2}, {.role = "assistant", .content = a2, .content_len = strlen(a2)}};
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(kvt_chat_render(c, m, 4, false, &out, &len, err, sizeof err), KVT_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                             "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n<think>\nmore</think>\n\nBye<|im_end|>\n");
    free(out);
    assert_int_equal(kvt_chat_render(c, m, 3, true, &out, &len, err, sizeof err), KVT_OK);
    assert_true(len > 24 && !strcmp(out + len - 22, "<|im_start|>assistant\n"));
    free(out);
    kvt_chat_template_free(c);
}

static int32_t *chat_ids(kvt_engine *e, const kvt_chat_msg *m, size_t n, uint32_t *n_ids) {
    int32_t *ids = NULL;
    int64_t ni = 0;
    char err[256];
    assert_int_equal(kvt_chat_tokenize(kvt_engine_chat(e), kvt_engine_tokenizer(e), m, n, true, &ids, &ni, err, sizeof err),
                     KVT_OK);
    *n_ids = (uint32_t)ni;
    return ids;
}

/* Turn 2 of a thinking chat: the client sends back the reply (its thinking + answer), the template
 * strips the thinking, so the rendered history leaves the generated path right after the turn-1
 * prompt. Reuse falls back to the prompt-boundary snapshot (exactly the turn-1 prompt), is counted
 * as a hit of that many tokens, and continues exactly as a cold run. */
static void test_chat_thinking_falls_back_to_boundary(void **st) {
    (void)st;
    kvt_engine *e = open_engine_chat(NULL, "qwen35");
    assert_int_equal(kvt_chat_family_of(kvt_engine_chat(e)), KVT_CHAT_QWEN35);
    char sys[2048];
    snprintf(sys, sizeof sys, "You are a careful agent.");
    for (int i = 0; i < 40; i++) strcat(sys, " Think before you act, then answer briefly.");
    kvt_chat_msg m[4] = {{.role = "system", .content = sys, .content_len = strlen(sys)}, {.role = "user", .content = "What is the plan for today?", .content_len = 27}};
    uint32_t n1, n2;
    int32_t *p1 = chat_ids(e, m, 2, &n1);
    run_out r1, hot, cold;
    gen(e, p1, n1, 16, false, &r1);
    /* the model's output is its thinking; the client appends the closing tag and an answer */
    size_t tl = 0;
    char *think = kvt_detokenize(kvt_engine_tokenizer(e), r1.tok, 16, false, &tl);
    char reply[4096];
    snprintf(reply, sizeof reply, "%s</think>\n\nThe plan is ready.", think);
    free(think);
    m[2] = (kvt_chat_msg){.role = "assistant", .content = reply, .content_len = strlen(reply)};
    m[3] = (kvt_chat_msg){.role = "user", .content = "Good, go ahead.", .content_len = 15};
    int32_t *p2 = chat_ids(e, m, 4, &n2);
    assert_true(n2 > n1 && !memcmp(p1, p2, n1 * sizeof(int32_t))); /* turn-1 prompt is a prefix */
    assert_true(memcmp(p2 + n1, r1.tok, 4 * sizeof(int32_t)) != 0);  /* but the reply is not */
    kvt_engine_stats s0, s1;
    kvt_engine_stats_get(e, &s0);
    gen(e, p2, n2, 8, false, &hot);
    kvt_engine_stats_get(e, &s1);
    assert_int_equal(hot.reused, n1);
    assert_int_equal(s1.pc_hits, s0.pc_hits + 1);
    assert_int_equal(s1.pc_reused_tokens, s0.pc_reused_tokens + n1);
    gen(e, p2, n2, 8, true, &cold);
    assert_memory_equal(hot.tok, cold.tok, 8 * sizeof(int32_t));
    free(p1);
    free(p2);
    kvt_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ram_restore_eq_cold),
        cmocka_unit_test(test_edit_reuses_last_snapshot),
        cmocka_unit_test(test_ssd_restart_eq_cold),
        cmocka_unit_test(test_ten_turn_chat),
        cmocka_unit_test(test_qwen35_template),
        cmocka_unit_test(test_chat_thinking_falls_back_to_boundary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
