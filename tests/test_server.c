/* test_server.c — the server's pure API layer (src/server/api.c): request validation, UTF-8,
 * auth comparison, response / SSE / stats / Prometheus rendering. The HTTP + engine path is covered
 * end to end by tests/e2e/server_api.sh and server_node.sh. */
#include "testutil.h"

#include "server/server.h"
#include "util/strbuf.h"

static bool parse(kvt_api_kind k, const char *body, kvt_api_req *r, kvt_api_err *e, cJSON **root) {
    memset(e, 0, sizeof *e);
    return kvt_api_parse(k, body, strlen(body), 1000, root, r, e);
}

static void expect_400(kvt_api_kind k, const char *body, const char *msg_part) {
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root = (cJSON *)1;
    bool ok = parse(k, body, &r, &e, &root);
    if (ok) {
        print_error("expected a 400 for %s\n", body);
        kvt_api_req_free(&r);
        cJSON_Delete(root);
        fail();
    }
    assert_null(root);
    assert_int_equal(e.http, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (msg_part && !strstr(e.message, msg_part)) {
        print_error("message '%s' lacks '%s'\n", e.message, msg_part);
        fail();
    }
}

static void test_utf8(void **st) {
    (void)st;
    assert_true(kvt_utf8_valid("hello", 5));
    assert_true(kvt_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    assert_false(kvt_utf8_valid("\xc0\xaf", 2));         /* overlong '/' */
    assert_false(kvt_utf8_valid("\xe0\x80\xaf", 3));     /* overlong 3-byte */
    assert_false(kvt_utf8_valid("\xed\xa0\x80", 3));     /* surrogate D800 */
    assert_false(kvt_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    assert_false(kvt_utf8_valid("\xe2\x82", 2));         /* truncated */
    assert_false(kvt_utf8_valid("\x80", 1));             /* lone continuation */
    assert_false(kvt_utf8_valid("ab\xff", 3));
    /* random valid strings built from code points always validate */
    uint64_t seed = 7;
    for (int it = 0; it < 200; it++) {
        char buf[64];
        size_t n = 0;
        while (n < 56) {
            uint32_t cp = (uint32_t)(tu_rand(&seed) % 0x110000);
            if (cp >= 0xd800 && cp <= 0xdfff) continue;
            if (cp < 0x80) buf[n++] = (char)cp;
            else if (cp < 0x800) buf[n++] = (char)(0xc0 | (cp >> 6)), buf[n++] = (char)(0x80 | (cp & 0x3f));
            else if (cp < 0x10000)
                buf[n++] = (char)(0xe0 | (cp >> 12)), buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)),
                buf[n++] = (char)(0x80 | (cp & 0x3f));
            else
                buf[n++] = (char)(0xf0 | (cp >> 18)), buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3f)),
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)), buf[n++] = (char)(0x80 | (cp & 0x3f));
        }
        assert_true(kvt_utf8_valid(buf, n));
        /* cutting the last multi-byte sequence short must fail unless it was ASCII */
        if ((unsigned char)buf[n - 1] >= 0x80) assert_false(kvt_utf8_valid(buf, n - 1));
    }
}

static void test_auth(void **st) {
    (void)st;
    assert_true(kvt_ct_equal("secret", 6, "secret"));
    assert_false(kvt_ct_equal("secreT", 6, "secret"));
    assert_false(kvt_ct_equal("secre", 5, "secret"));
    assert_false(kvt_ct_equal("secrets", 7, "secret"));
    assert_false(kvt_ct_equal("", 0, "secret"));
    assert_true(kvt_api_check_bearer("Bearer secret", "secret"));
    assert_true(kvt_api_check_bearer("bearer secret ", "secret"));
    assert_false(kvt_api_check_bearer("Bearer wrong", "secret"));
    assert_false(kvt_api_check_bearer("secret", "secret"));
    assert_false(kvt_api_check_bearer(NULL, "secret"));
    assert_true(kvt_api_check_bearer(NULL, NULL)); /* no key configured */
}

static void test_parse_chat_ok(void **st) {
    (void)st;
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"he\"},{\"type\":\"text\",\"text\":\"llo\"}]}],"
                       "\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"min_p\":0.1,\"seed\":42,\"max_tokens\":7,"
                       "\"stop\":[\"a\",\"bc\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
                       "\"repeat_penalty\":1.1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    assert_true(parse(KVT_API_CHAT, body, &r, &e, &root));
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "hello");
    assert_int_equal(r.msgs[1].content_len, 5);
    assert_true(r.sampling.temperature == 0.0f);
    assert_true(r.sampling.top_p == 0.5f);
    assert_int_equal(r.sampling.top_k, 40);
    assert_true(r.sampling.min_p > 0.09f && r.sampling.min_p < 0.11f);
    assert_int_equal(r.sampling.seed, 42);
    assert_true(r.seed_given);
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_true(r.sampling.presence_penalty == 0.5f);
    assert_true(r.sampling.frequency_penalty == -0.5f);
    assert_true(r.sampling.repeat_penalty > 1.09f && r.sampling.repeat_penalty < 1.11f);
    assert_true(r.stream);
    assert_true(r.include_usage);
    kvt_api_req_free(&r);
    cJSON_Delete(root);

    /* defaults: temperature 1, no max_tokens, max_completion_tokens wins */
    assert_true(parse(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":3,"
                                    "\"stop\":\"END\"}", &r, &e, &root));
    assert_true(r.sampling.temperature == 1.0f);
    assert_null(r.model);
    assert_false(r.stream);
    assert_int_equal(r.max_tokens, 3);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    kvt_api_req_free(&r);
    cJSON_Delete(root);
}

static void test_parse_errors(void **st) {
    (void)st;
    expect_400(KVT_API_CHAT, "{\"messages\": [", "malformed");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} xx", "trailing");
    expect_400(KVT_API_CHAT, "[1,2]", "object");
    expect_400(KVT_API_CHAT, "", "empty");
    expect_400(KVT_API_CHAT, "{}", "messages");
    expect_400(KVT_API_CHAT, "{\"messages\":\"hi\"}", "array");
    expect_400(KVT_API_CHAT, "{\"messages\":[]}", "empty");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "role");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "content");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "image_url");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", "temperature");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2.5}", "integer");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", "stream");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", "stop");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":7}", "model");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", "'n'");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", "UTF-8");
    expect_400(KVT_API_COMPLETION, "{}", "prompt");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":\"\"}", "empty");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":[1,2,1000]}", "token id");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":[1,-1]}", "token id");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":[1,2.5]}", "token id");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":[1,\"a\"]}", "prompt[1]");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":{}}", "prompt");
    /* a NUL byte inside the body */
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_false(kvt_api_parse(KVT_API_COMPLETION, "{\"prompt\":\"a\0\"}", 15, 1000, &root, &r, &e));
    assert_int_equal(e.http, 400);
}

static void test_parse_completion_ok(void **st) {
    (void)st;
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_true(parse(KVT_API_COMPLETION, "{\"prompt\":[0,5,999]}", &r, &e, &root));
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 999);
    assert_null(r.prompt_text);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    assert_true(parse(KVT_API_COMPLETION, "{\"prompt\":[\"once upon\"],\"model\":\"x\"}", &r, &e, &root));
    assert_string_equal(r.prompt_text, "once upon");
    assert_int_equal(r.prompt_text_len, 9);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
}

static void test_model_match(void **st) {
    (void)st;
    assert_true(kvt_api_model_matches(NULL, NULL, "tiny", "/x/m.gguf"));
    assert_true(kvt_api_model_matches("", NULL, "tiny", "/x/m.gguf"));
    assert_true(kvt_api_model_matches("tiny", NULL, "tiny", "/x/m.gguf"));
    assert_true(kvt_api_model_matches("m.gguf", NULL, "tiny", "/x/m.gguf"));
    assert_true(kvt_api_model_matches("m", NULL, "tiny", "/x/m.gguf"));
    assert_true(kvt_api_model_matches("alias", "alias", "tiny", "/x/m.gguf"));
    assert_false(kvt_api_model_matches("gpt-4", "alias", "tiny", "/x/m.gguf"));
    assert_false(kvt_api_model_matches("x", NULL, "tiny", "/x/m.gguf"));
}

/* the response body of one choice through kvt_api_out (non-streaming) */
static char *out_body(const kvt_api_resp_info *ri, const char *text, size_t len, kvt_finish fin) {
    kvt_api_out_opts oo = {.kind = ri->kind, .n_choices = 1};
    kvt_api_out *o = NULL;
    assert_int_equal(kvt_api_out_create(&oo, &o), KVT_OK);
    kvt_strbuf sb = {0};
    kvt_api_out_text(o, ri, 0, text, len, &sb);
    kvt_api_out_end(o, ri, 0, fin, &sb);
    assert_int_equal(sb.n, 0); /* not streaming: nothing to send before the body */
    kvt_strbuf_free(&sb);
    char *s = kvt_api_out_response(o, ri);
    kvt_api_out_free(o);
    return s;
}
/* the next SSE event of sb from *at as JSON ("data: {json}\n\n") */
static cJSON *next_event(kvt_strbuf *sb, size_t *at) {
    assert_true(*at + 6 < sb->n);
    assert_memory_equal(sb->p + *at, "data: ", 6);
    char *end = strstr(sb->p + *at, "\n\n");
    assert_non_null(end);
    *end = '\0';
    cJSON *j = cJSON_Parse(sb->p + *at + 6);
    assert_non_null(j);
    *at = (size_t)(end - sb->p) + 2;
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
    return j;
}
static cJSON *delta_of(cJSON *j) { return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta"); }
static cJSON *finish_of(cJSON *j) { return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "finish_reason"); }

static void test_responses(void **st) {
    (void)st;
    kvt_api_resp_info ri = {.kind = KVT_API_CHAT, .id = "chatcmpl-1", .created = 5, .model = "tiny",
                            .n_prompt = 10, .n_gen = 3, .n_cached = 9, .finish = KVT_FINISH_STOP};
    char *s = out_body(&ri, "a\"b\n", 4, KVT_FINISH_STOP);
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring, "a\"b\n");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 13);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")->valueint, 9);
    cJSON_Delete(j);
    free(s);

    ri.kind = KVT_API_COMPLETION;
    ri.finish = KVT_FINISH_LENGTH;
    s = out_body(&ri, "xyz", 2, KVT_FINISH_LENGTH);
    j = cJSON_Parse(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "xy");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    cJSON_Delete(j);
    free(s);

    /* streaming chat: the role chunk, a content chunk, the finish chunk, the usage chunk */
    ri.kind = KVT_API_CHAT;
    ri.finish = KVT_FINISH_STOP;
    kvt_api_out_opts oo = {.kind = KVT_API_CHAT, .stream = true, .n_choices = 1};
    kvt_api_out *o = NULL;
    assert_int_equal(kvt_api_out_create(&oo, &o), KVT_OK);
    kvt_strbuf sb = {0};
    kvt_api_out_begin(o, &ri, 0, &sb);
    kvt_api_out_text(o, &ri, 0, "tok", 3, &sb);
    kvt_api_out_end(o, &ri, 0, KVT_FINISH_STOP, &sb);
    kvt_api_out_usage(&ri, &sb);
    kvt_api_out_free(o);
    assert_false(sb.oom);
    size_t at = 0;
    j = next_event(&sb, &at);
    assert_string_equal(cJSON_GetObjectItem(delta_of(j), "role")->valuestring, "assistant");
    assert_true(cJSON_IsNull(finish_of(j)));
    assert_null(cJSON_GetObjectItem(j, "usage"));
    cJSON_Delete(j);
    j = next_event(&sb, &at);
    assert_string_equal(cJSON_GetObjectItem(delta_of(j), "content")->valuestring, "tok");
    assert_true(cJSON_IsNull(finish_of(j)));
    cJSON_Delete(j);
    j = next_event(&sb, &at);
    assert_string_equal(finish_of(j)->valuestring, "stop");
    cJSON_Delete(j);
    j = next_event(&sb, &at);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    assert_non_null(cJSON_GetObjectItem(j, "usage"));
    cJSON_Delete(j);
    assert_int_equal(at, sb.n);
    kvt_strbuf_free(&sb);

    kvt_api_err e;
    kvt_api_set_err(&e, 400, "invalid_request_error", "prompt", "context_length_exceeded", "too %s", "long");
    s = kvt_api_error_json(&e);
    j = cJSON_Parse(s);
    cJSON *eo = cJSON_GetObjectItem(j, "error");
    assert_string_equal(cJSON_GetObjectItem(eo, "message")->valuestring, "too long");
    assert_string_equal(cJSON_GetObjectItem(eo, "param")->valuestring, "prompt");
    assert_string_equal(cJSON_GetObjectItem(eo, "code")->valuestring, "context_length_exceeded");
    cJSON_Delete(j);
    free(s);
}

/* every field of kvt_engine_stats and kvt_server_counters set to a distinct value */
static void fill_stats(kvt_engine_stats *s, kvt_server_counters *c) {
    memset(s, 0, sizeof *s);
    double v = 1;
#define U(f) s->f = (uint64_t)(v += 1)
#define D(f) s->f = (v += 1) + 0.25
    snprintf(s->model_path, sizeof s->model_path, "/m/model.gguf");
    s->model_changed = true;
    snprintf(s->model_change, sizeof s->model_change, "size 1 -> 2");
    U(model_stale_dropped);
    s->pc_enabled = true;
    U(pc_entries); U(pc_blocks); U(pc_bytes); U(pc_max_bytes); U(pc_hits); U(pc_misses); U(pc_reused_tokens);
    U(pc_evictions); U(pc_reuse_impossible_untrimmable); U(pc_reuse_impossible_namespace); U(pc_reuse_impossible_budget);
    s->ssd_enabled = true;
    snprintf(s->ssd_dir, sizeof s->ssd_dir, "/ssd/dir");
    U(ssd_entries); U(ssd_bytes); U(ssd_max_bytes); U(ssd_restores); U(ssd_spills); U(ssd_demotions);
    U(ssd_pending_blocks); U(ssd_pending_bytes); U(ssd_dropped); U(ssd_failed); U(ssd_longest_durable_prefix_tokens);
    U(ssd_dirty_records); U(ssd_shed); U(ssd_skipped_nonregular); U(ssd_lost_entries); U(ssd_dir_recreated);
    D(ssd_restore_ms_last);
    s->ckpt_enabled = true;
    U(ckpt_written); U(ckpt_resumed); U(ckpt_invalidated); U(ckpt_failed); U(ckpt_dropped); U(ckpt_corrupt);
    U(ckpt_pending); U(ckpt_retried); U(ckpt_resume_reused_tokens);
    s->shared_enabled = true;
    U(shared_lookups); U(shared_hits); U(shared_fetched_blocks); U(shared_fetched_bytes); U(shared_fetched_tokens);
    U(shared_published_blocks); U(shared_published_bytes); U(shared_publish_existing); U(shared_dropped);
    U(shared_errors); U(shared_oom_errors); U(shared_corrupt); U(shared_skipped); U(shared_queue_blocks);
    U(shared_breaker_opens);
    s->shared_fetch_breaker = 1; s->shared_publish_breaker = 2;
    U(shared_fetched_snapshots); U(shared_published_snapshots);
    snprintf(s->shared_last_error, sizeof s->shared_last_error, "connection refused");
    U(pool_used_bytes); U(pool_peak_bytes); U(pool_budget_bytes);
    snprintf(s->scheme, sizeof s->scheme, "k:f16,v:\"q8\"\\x");
    U(requests); U(prompt_tokens); U(generated_tokens); U(cached_tokens);
    U(parallel); U(rows_active); U(rows_queued); U(batch_queue_max); U(batch_steps); U(batch_memory_waits);
    U(batch_queue_full);
    D(batch_tokens_per_step_last); D(batch_tokens_per_step_avg); D(batch_prefill_tps_1m); D(batch_decode_tps_1m);
    D(queue_wait_ms_last); D(queue_wait_ms_avg); D(queue_wait_ms_max); D(max_decode_stall_ms); D(max_decode_step_ms);
    U(mem_budget_bytes); U(mem_weights_bytes); U(mem_weight_copies_bytes); U(mem_compute_bytes); U(mem_spill_queue_bytes);
    U(mem_spill_queue_used_bytes); U(mem_text_bytes); U(mem_kv_pool_bytes); U(mem_kv_pool_used_bytes);
    U(mem_live_rows_bytes); U(mem_rows_reserved_bytes); U(mem_ram_tier_bytes); U(mem_ram_tier_used_bytes);
    U(mem_rss_bytes); U(mem_rss_peak_bytes); U(mem_pressure_events); U(mem_pressure_freed_bytes); U(mem_pressure_failed);
    U(ssd_staged); /* last: the values above stay those of the golden files before it */
    s->spec_enabled = true;
    U(spec_rounds); U(spec_proposed); U(spec_accepted); D(spec_acceptance_rate); D(spec_draft_ms);
    D(spec_draft_time_share); U(spec_off_rows);
    U(spec_reused_ram); U(spec_reused_ssd); U(spec_reused_shared); U(spec_recomputed); U(spec_recompute_rows);
    U(spec_state_ram_bytes); U(spec_state_ssd_entries); U(spec_state_ssd_bytes);
#undef U
#undef D
    memset(c, 0, sizeof *c);
    c->total = 901; c->ok = 902; c->client_errors = 903; c->server_errors = 904; c->cancelled = 905;
    c->rejected_shutdown = 906; c->in_flight = 907; c->queued = 908; c->streamed = 909;
    c->conn_open = 910; c->conn_refused = 911; c->conn_evicted = 912; c->conn_timed_out = 913;
}

static char *slurp_fixture(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/stats/%s", name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}
static int cmp_line(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
/* the lines of text, sorted (text is modified) */
static size_t sorted_lines(char *text, char **lines, size_t cap) {
    size_t n = 0;
    for (char *l = strtok(text, "\n"); l && n < cap; l = strtok(NULL, "\n")) lines[n++] = l;
    qsort(lines, n, sizeof *lines, cmp_line);
    return n;
}

/* The counter tables (engine/stats_table.h, KVT_SERVER_COUNTERS) emit the same /stats keys and
 * /metrics names, with the same values, as the code before them (tests/fixtures/stats/). */
static void test_stats_names_golden(void **unused) {
    (void)unused;
    for (int off = 0; off < 2; off++) {
        kvt_engine_stats es;
        kvt_server_counters c;
        fill_stats(&es, &c);
        if (off) es.pc_enabled = es.ssd_enabled = es.ckpt_enabled = es.shared_enabled = es.spec_enabled = false;
        char *got = kvt_api_stats_json(&es, &c, "tiny", NULL);
        char *want = slurp_fixture(off ? "off.json" : "all.json");
        cJSON *g = cJSON_Parse(got), *w = cJSON_Parse(want);
        assert_non_null(g);
        assert_non_null(w);
        if (!cJSON_Compare(g, w, true)) fail_msg("/stats differs from the golden file:\n%s\n%s", got, want);
        cJSON_Delete(g);
        cJSON_Delete(w);
        free(got);
        free(want);

        got = kvt_api_metrics_text(&es, &c);
        want = slurp_fixture(off ? "off.prom" : "all.prom");
        static char *gl[1024], *wl[1024];
        size_t ng = sorted_lines(got, gl, 1024), nw = sorted_lines(want, wl, 1024);
        assert_int_equal(ng, nw);
        for (size_t i = 0; i < ng; i++)
            if (strcmp(gl[i], wl[i])) fail_msg("/metrics line differs: got '%s', golden '%s'", gl[i], wl[i]);
        free(got);
        free(want);
    }
}

static void test_stats_metrics(void **st) {
    (void)st;
    kvt_engine_stats es;
    memset(&es, 0, sizeof es);
    es.pc_enabled = true;
    es.pc_entries = 3;
    es.pc_hits = 11;
    es.pc_reuse_impossible_budget = 2;
    es.pool_budget_bytes = 123456789012ull;
    snprintf(es.scheme, sizeof es.scheme, "f16");
    kvt_server_counters c0 = {0};
    es.scheme[0] = 'q';
    char *m0 = kvt_api_metrics_text(&es, &c0);
    es.scheme[0] = 'f';
    assert_non_null(strstr(m0, "\nkvtier_kv_scheme_info{scheme=\"q16\"} 1\n"));
    free(m0);
    kvt_server_counters c = {.total = 9, .ok = 7, .client_errors = 2, .conn_open = 3, .conn_refused = 4,
                             .conn_evicted = 5, .conn_timed_out = 6};
    char *s = kvt_api_stats_json(&es, &c, "tiny", NULL);
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    cJSON *cn = cJSON_GetObjectItem(j, "connections");
    assert_int_equal(cJSON_GetObjectItem(cn, "open")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(cn, "refused")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(cn, "evicted")->valueint, 5);
    assert_int_equal(cJSON_GetObjectItem(cn, "timed_out")->valueint, 6);
    cJSON *pc = cJSON_GetObjectItem(j, "prompt_cache");
    assert_int_equal(cJSON_GetObjectItem(pc, "entries")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(pc, "reuse_impossible"), "budget")->valueint, 2);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "ssd_cache")));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "kv"), "scheme")->valuestring, "f16");
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "kv"), "pool_budget_bytes")->valuedouble == 123456789012.0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "requests"), "ok")->valueint, 7);
    cJSON_Delete(j);
    free(s);

    es.ssd_enabled = true;
    snprintf(es.ssd_dir, sizeof es.ssd_dir, "/tmp/x");
    es.ssd_pending_blocks = 4;
    s = kvt_api_stats_json(&es, &c, "tiny", NULL);
    j = cJSON_Parse(s);
    cJSON *sc = cJSON_GetObjectItem(j, "ssd_cache");
    assert_true(cJSON_IsObject(sc));
    assert_string_equal(cJSON_GetObjectItem(sc, "dir")->valuestring, "/tmp/x");
    assert_int_equal(cJSON_GetObjectItem(sc, "pending_blocks")->valueint, 4);
    assert_non_null(cJSON_GetObjectItem(sc, "longest_durable_prefix_tokens"));
    cJSON_Delete(j);
    free(s);

    s = kvt_api_metrics_text(&es, &c);
    assert_non_null(s);
    assert_non_null(strstr(s, "# HELP kvtier_prompt_cache_hits_total "));
    assert_non_null(strstr(s, "# TYPE kvtier_prompt_cache_hits_total counter\nkvtier_prompt_cache_hits_total 11\n"));
    assert_non_null(strstr(s, "\nkvtier_kv_pool_budget_bytes 123456789012\n"));
    assert_non_null(strstr(s, "\nkvtier_ssd_cache_pending_blocks 4\n"));
    assert_non_null(strstr(s, "\nkvtier_http_requests_total 9\n"));
    assert_non_null(strstr(s, "\nkvtier_http_connections_refused_total 4\n"));
    assert_non_null(strstr(s, "\nkvtier_http_connections_timed_out_total 6\n"));
    /* every sample line is preceded by its HELP and TYPE lines */
    int n_samples = 0, n_help = 0, n_type = 0;
    for (char *l = s; *l;) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl);
        if (!strncmp(l, "# HELP kvtier_", 14)) n_help++;
        else if (!strncmp(l, "# TYPE kvtier_", 14)) n_type++;
        else if (!strncmp(l, "kvtier_", 7)) n_samples++;
        else fail_msg("unexpected metrics line: %.*s", (int)(nl - l), l);
        l = nl + 1;
    }
    assert_true(n_samples > 30);
    assert_int_equal(n_help, n_samples);
    assert_int_equal(n_type, n_samples);
    free(s);
}

/* Every integer and float field: out-of-range, non-integer and huge values are a 400 naming the
 * field; in-range extremes parse exactly (no saturating or undefined casts). */
static void test_numeric_ranges(void **st) {
    (void)st;
    static const struct {
        const char *field, *value;
    } bad[] = {
        {"seed", "1e19"},          {"seed", "1.5e19"},        {"seed", "1.7e19"},
        {"seed", "-1e19"},         {"seed", "9007199254740993"}, {"seed", "0.5"},
        {"seed", "\"7\""},         {"seed", "true"},          {"max_tokens", "-1"},
        {"max_tokens", "1e10"},    {"max_tokens", "1e300"},   {"max_completion_tokens", "0"},
        {"temperature", "-0.1"},   {"temperature", "2.5"},    {"temperature", "1e999"},
        {"top_p", "1.01"},         {"top_p", "-1"},           {"top_k", "-1"},
        {"top_k", "1e7"},          {"top_k", "2.5"},          {"min_p", "2"},
        {"presence_penalty", "3"}, {"frequency_penalty", "-2.5"}, {"repeat_penalty", "0"},
        {"repeat_penalty", "11"},  {"n", "0"},                {"logit_bias", "{\"1000\": 1}"},
        {"n", "1e30"},             {"best_of", "2"},          {"logprobs", "21"},
        {"n", "17"},               {"logprobs", "true"},      {"logprobs", "30"},
        {"logit_bias", "{\"5\": 101}"}, {"logit_bias", "{\"x\": 1}"}, {"logit_bias", "[1]"},
        {"echo", "true"},
    };
    char body[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", bad[i].field, bad[i].value);
        kvt_api_req r;
        kvt_api_err e;
        cJSON *root;
        if (parse(KVT_API_COMPLETION, body, &r, &e, &root)) {
            print_error("accepted %s\n", body);
            kvt_api_req_free(&r);
            cJSON_Delete(root);
            fail();
        }
        assert_int_equal(e.http, 400);
        assert_non_null(e.param);
        assert_string_equal(e.param, bad[i].field);
    }
    /* the extremes that are accepted come through exactly */
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_true(parse(KVT_API_COMPLETION,
                      "{\"prompt\":\"x\",\"seed\":9007199254740991,\"top_k\":0,\"temperature\":2,\"top_p\":1,"
                      "\"max_tokens\":1000000000,\"n\":1,\"best_of\":1,\"logprobs\":0,\"logit_bias\":{},"
                      "\"echo\":false}",
                      &r, &e, &root));
    assert_true(r.sampling.seed == 9007199254740991ull);
    assert_int_equal(r.max_tokens, 1000000000);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    assert_true(parse(KVT_API_COMPLETION, "{\"prompt\":\"x\",\"seed\":-1}", &r, &e, &root));
    assert_true(r.sampling.seed == UINT64_MAX); /* -1 mod 2^64 */
    kvt_api_req_free(&r);
    cJSON_Delete(root);
    assert_true(parse(KVT_API_COMPLETION, "{\"prompt\":\"x\",\"seed\":1e15}", &r, &e, &root));
    assert_true(r.sampling.seed == 1000000000000000ull);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
}

/* cJSON is lenient; kvt_json_strict_check is not. */
static void test_json_strict(void **st) {
    (void)st;
    static const char *ok[] = {
        "{}", " {\"a\" : [1, -0.5e+3, 0, true, false, null, \"\\u00e9\\ud83d\\ude00\\n\\/\"]}\r\n", "[]", "\"s\"", "-0",
        "{\"a\":{\"b\":[[],{}]}}",
    };
    static const char *bad[] = {
        "\xef\xbb\xbf{}",            /* BOM */
        "{\"a\":\"x\ny\"}",          /* raw newline in a string */
        "{\"a\":\"x\ty\"}",          /* raw tab */
        "{\"a\":\"\\u0000\"}",       /* escaped NUL */
        "{\"a\":\"\\x41\"}",         /* bad escape */
        "{\"a\":\"\\ud800\"}",       /* lone high surrogate */
        "{\"a\":\"\\udc00\"}",       /* lone low surrogate */
        "{\"a\":\"\\u12\"}",         /* short \u */
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":+1}", "{\"a\":1e}", "{\"a\":-}",
        "{\"a\":NaN}", "{\"a\":Infinity}", "{\"a\":tru}", "{\"a\":1,}", "[1,]", "{,}", "{\"a\"}", "{\"a\" 1}",
        "{a:1}", "{'a':1}", "{\"a\":1} {}", "{\"a\":1", "[", "", "   ", "{\"a\":\"x",
        "{\"a\":1}\x0c",             /* form feed is not JSON whitespace */
        "{\"a\":[}", "{\"a\":]}", "[1 2]",
    };
    size_t off;
    const char *why;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (!kvt_json_strict_check(ok[i], strlen(ok[i]), &off, &why)) fail_msg("rejected %s: %s at %zu", ok[i], why, off);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why = NULL;
        if (kvt_json_strict_check(bad[i], strlen(bad[i]), &off, &why)) fail_msg("accepted [%s]", bad[i]);
        assert_non_null(why);
        assert_true(off <= strlen(bad[i]));
    }
    /* nesting: KVT_JSON_MAX_DEPTH levels pass, one more fails */
    char deep[2 * KVT_JSON_MAX_DEPTH + 4];
    for (int extra = 0; extra <= 1; extra++) {
        size_t d = 0, n = KVT_JSON_MAX_DEPTH + (size_t)extra;
        for (size_t i = 0; i < n; i++) deep[d++] = '[';
        for (size_t i = 0; i < n; i++) deep[d++] = ']';
        assert_int_equal(kvt_json_strict_check(deep, d, &off, &why), extra == 0);
    }
    /* through the request parser: 400 with the reason, and cJSON never sees the body */
    expect_400(KVT_API_COMPLETION, "\xef\xbb\xbf{\"prompt\":\"hi\"}", "byte order mark");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":\"line1\nline2\"}", "control character");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":\"ab\\u0000cd\"}", "NUL");
    expect_400(KVT_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000\"}]}", "NUL");
    /* escaped newline is fine and kept */
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_true(parse(KVT_API_COMPLETION, "{\"prompt\":\"line1\\nline2\"}", &r, &e, &root));
    assert_int_equal(r.prompt_text_len, 11);
    kvt_api_req_free(&r);
    cJSON_Delete(root);
}

/* Issue 31: cJSON reads a number too small for a double as 0 ("seed": -1e-400 became seed 0 while
 * 1e999 was refused). The checker refuses any nonzero number a double rounds to zero, names the
 * enclosing key, and still accepts zeros and the subnormal range. */
static void test_json_underflow(void **st) {
    (void)st;
    static const char *under[] = {
        "[1e-400]", "[-1e-400]", "[2e-324]", "[100e-326]", "[0.0000000001e-320]", "[1e-99999999999999999999]",
        "[2.4703282292062327e-324]",
    };
    static const char *fine[] = {
        "[0]", "[-0]", "[0e-999]", "[0.000e-400]", "[1e-323]", "[3e-324]", "[4.9406564584124654e-324]",
        "[1e-300]", "[1e999]", /* overflow stays the fields' business (a 400 naming the field) */
        "[123456789012345678901234567890e-350]",
    };
    kvt_json_scan_result r;
    for (size_t i = 0; i < sizeof under / sizeof under[0]; i++) {
        if (kvt_json_scan(under[i], strlen(under[i]), 0, &r)) fail_msg("accepted %s", under[i]);
        assert_int_equal(r.fail, KVT_JSON_UNDERFLOW);
        assert_int_equal(r.off, 1);
        assert_null(r.key);
    }
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        if (!kvt_json_scan(fine[i], strlen(fine[i]), 0, &r)) fail_msg("refused %s: %s", fine[i], r.why);
    /* random numbers around the boundary: refused exactly when strtod reads a nonzero literal as 0 */
    uint64_t seed = 31;
    char num[96];
    int n_under = 0, n_fine = 0;
    for (int it = 0; it < 20000; it++) {
        int ni = 1 + (int)(tu_rand(&seed) % 3), nf = (int)(tu_rand(&seed) % 25), m = 0;
        bool nonzero = false;
        if (tu_rand(&seed) & 1) num[m++] = '-';
        for (int k = 0; k < ni; k++) {
            char d = (char)('0' + (k == 0 && ni > 1 ? 1 + tu_rand(&seed) % 9 : tu_rand(&seed) % 10));
            if (tu_rand(&seed) % 4 == 0) d = '0';
            if (k == 0 && ni > 1 && d == '0') d = '1';
            nonzero |= d != '0';
            num[m++] = d;
        }
        if (nf) {
            num[m++] = '.';
            for (int k = 0; k < nf; k++) {
                char d = (char)('0' + tu_rand(&seed) % 10);
                nonzero |= d != '0';
                num[m++] = d;
            }
        }
        m += snprintf(num + m, sizeof num - (size_t)m, "e-%d", 300 + (int)(tu_rand(&seed) % 60));
        double v = strtod(num, NULL);
        bool ok = kvt_json_scan(num, (size_t)m, 0, &r);
        if (ok != !(nonzero && v == 0.0)) fail_msg("%s: strtod %g, scan %s", num, v, ok ? "accepted" : r.why);
        if (ok) n_fine++;
        else n_under++;
    }
    assert_true(n_under > 1000 && n_fine > 1000);
    const char *nested = "{\"a\":1,\"b\":{\"c\":[true,{\"d\":0}],\"e\":[1,-5e-999]}}";
    assert_false(kvt_json_scan(nested, strlen(nested), 0, &r));
    assert_int_equal(r.fail, KVT_JSON_UNDERFLOW);
    assert_int_equal(r.key_len, 1);
    assert_memory_equal(r.key, "e", 1);
    /* through the request parser (api.c): a 400 naming the field */
    expect_400(KVT_API_COMPLETION, "{\"prompt\":\"x\",\"seed\":-1e-400}", "'seed'");
    expect_400(KVT_API_COMPLETION, "{\"prompt\":\"x\",\"temperature\":1e-400}", "'temperature'");
    char label[8];
    assert_true(kvt_json_key_label("seed", 4, label, sizeof label));
    assert_string_equal(label, "seed");
    assert_false(kvt_json_key_label("se\\\"d", 5, label, sizeof label));
    assert_false(kvt_json_key_label("longer_than_8", 13, label, sizeof label));
    assert_false(kvt_json_key_label("", 0, label, sizeof label));
}

/* The value count cJSON will allocate nodes for, and its cap (the server's 413 before cJSON). */
static void test_json_value_cap(void **st) {
    (void)st;
    kvt_json_scan_result r;
    const char *doc = "{\"a\":[1,2,{\"b\":null}],\"c\":\"s\",\"d\":{}}"; /* 8 values */
    assert_true(kvt_json_scan(doc, strlen(doc), 0, &r));
    assert_int_equal(r.nodes, 8);
    assert_true(kvt_json_scan(doc, strlen(doc), 8, &r));
    assert_false(kvt_json_scan(doc, strlen(doc), 7, &r));
    assert_int_equal(r.fail, KVT_JSON_TOO_MANY);
    assert_int_equal(r.nodes, 7);
    /* the junk: 5 values per 10 bytes, refused at the cap without walking the rest */
    size_t n = 10 * 100000 + 2;
    char *junk = malloc(n + 1);
    assert_non_null(junk);
    junk[0] = '[';
    for (size_t i = 0; i < 100000; i++) memcpy(junk + 1 + 10 * i, "[[[[0]]]],", 10);
    junk[n - 2] = ']'; /* over the last comma */
    junk[n - 1] = '\0';
    assert_true(kvt_json_scan(junk, n - 1, 0, &r));
    assert_int_equal(r.nodes, 1 + 5 * 100000);
    assert_false(kvt_json_scan(junk, n - 1, 4096, &r));
    assert_int_equal(r.fail, KVT_JSON_TOO_MANY);
    assert_true(r.off < 10 * 1000);
    free(junk);
    /* syntax errors are reported as such, whatever the cap */
    assert_false(kvt_json_scan("[1,]", 4, 100, &r));
    assert_int_equal(r.fail, KVT_JSON_SYNTAX);
}

/* Random bodies: whatever the strict checker accepts, cJSON parses (the checker is never looser). */
static void test_json_strict_vs_cjson(void **st) {
    (void)st;
    static const char alphabet[] = "{}[]\":,0123456789-+.eEtrufalsn \\u\n\t";
    uint64_t seed = 99;
    char buf[48];
    int n_ok = 0;
    for (int it = 0; it < 200000; it++) {
        size_t n = 1 + tu_rand(&seed) % (sizeof buf - 1);
        for (size_t i = 0; i < n; i++) buf[i] = alphabet[tu_rand(&seed) % (sizeof alphabet - 1)];
        size_t off;
        const char *why;
        if (!kvt_json_strict_check(buf, n, &off, &why)) continue;
        n_ok++;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, false);
        if (!j) fail_msg("strict accepted what cJSON rejects: %.*s", (int)n, buf);
        cJSON_Delete(j);
    }
    assert_true(n_ok > 100);
}

/* Random mutations of valid bodies: every outcome is either a parsed request or a 400 with a
 * message, never a crash (run under ASan/UBSan by `make sanitize`). */
static void test_parse_fuzz(void **st) {
    (void)st;
    const char *seeds[] = {
        ("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
        "\"stop\":[\"a\",\"b\"],\"temperature\":0.5,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"),
        "{\"prompt\":[1,2,3,999],\"max_tokens\":4,\"seed\":7,\"top_k\":3}",
        "{\"prompt\":\"abc\\u00e9\\ud83d\\ude00\",\"stop\":\"x\"}",
    };
    uint64_t seed = 12345;
    int n_ok = 0, n_bad = 0;
    char buf[512];
    for (int it = 0; it < 6000; it++) {
        const char *src = seeds[it % 3];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        int n_mut = 1 + (int)(tu_rand(&seed) % 4);
        for (int m = 0; m < n_mut; m++) {
            size_t at = (size_t)(tu_rand(&seed) % n);
            switch (tu_rand(&seed) % 4) {
            case 0: buf[at] = (char)(tu_rand(&seed) & 0xff); break;           /* replace */
            case 1: n = at + 1; break;                                          /* truncate */
            case 2: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;    /* delete */
            default:                                                            /* duplicate */
                if (n + 1 < sizeof buf) { memmove(buf + at + 1, buf + at, n - at); n++; }
            }
            if (n == 0) n = 1;
        }
        kvt_api_req r;
        kvt_api_err e;
        cJSON *root;
        memset(&e, 0, sizeof e);
        kvt_api_kind k = it % 3 == 0 ? KVT_API_CHAT : KVT_API_COMPLETION;
        if (kvt_api_parse(k, buf, n, 1000, &root, &r, &e)) {
            assert_non_null(root);
            if (k == KVT_API_CHAT) assert_true(r.n_msgs > 0);
            else assert_true(r.prompt_text || r.n_prompt_ids > 0);
            kvt_api_req_free(&r);
            cJSON_Delete(root);
            n_ok++;
        } else {
            assert_null(root);
            assert_int_equal(e.http, 400);
            assert_true(e.message[0] != '\0');
            n_bad++;
        }
    }
    assert_true(n_ok > 0 && n_bad > 0); /* both paths were exercised */
    /* nesting bomb */
    char deep[4200];
    size_t d = 0;
    d += (size_t)sprintf(deep, "{\"prompt\":");
    for (int i = 0; i < 2000; i++) deep[d++] = '[';
    for (int i = 0; i < 2000; i++) deep[d++] = ']';
    deep[d++] = '}';
    kvt_api_req r;
    kvt_api_err e;
    cJSON *root;
    assert_false(kvt_api_parse(KVT_API_COMPLETION, deep, d, 1000, &root, &r, &e));
    assert_int_equal(e.http, 400);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8),          cmocka_unit_test(test_auth),
        cmocka_unit_test(test_parse_chat_ok), cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_parse_completion_ok), cmocka_unit_test(test_model_match),
        cmocka_unit_test(test_responses),     cmocka_unit_test(test_stats_metrics), cmocka_unit_test(test_stats_names_golden),
        cmocka_unit_test(test_parse_fuzz),    cmocka_unit_test(test_numeric_ranges),
        cmocka_unit_test(test_json_strict),   cmocka_unit_test(test_json_strict_vs_cjson),
        cmocka_unit_test(test_json_underflow), cmocka_unit_test(test_json_value_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
