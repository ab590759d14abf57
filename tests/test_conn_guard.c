/* test_conn_guard.c — the connection admission/eviction/deadline policy (src/server/conn_guard.c)
 * driven with fake fds and a fake clock; the real sockets are covered by tests/e2e/server_abuse.sh. */
#include "testutil.h"

#include "server/conn_guard.h"

typedef struct killed {
    int fds[1024];
    int n;
} killed;

static void rec_kill(void *ctx, int fd) {
    killed *k = ctx;
    if (k->n < 1024) k->fds[k->n++] = fd;
}

static bool was_killed(const killed *k, int fd) {
    for (int i = 0; i < k->n; i++)
        if (k->fds[i] == fd) return true;
    return false;
}

/* 300 slow connections from one address: each new one is admitted by evicting the oldest slow one
 * (same address), never more than per_addr are held, and a prompt client is never refused. */
static void test_slowloris_same_addr(void **st) {
    (void)st;
    killed k = {.n = 0};
    kvt_conn_guard *g;
    kvt_conn_guard_opts o = {.max_conns = 64, .per_addr = 8, .header_s = 10, .body_s = 60};
    assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
    kvt_conn *c[300];
    for (int i = 0; i < 300; i++) {
        assert_true(kvt_conn_guard_admit(g, "10.0.0.1", i));
        c[i] = kvt_conn_guard_open(g, "10.0.0.1", 1000 + i, i);
        assert_non_null(c[i]);
    }
    kvt_conn_guard_stats s;
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.open, 8);
    assert_int_equal(s.evicted, 292);
    assert_int_equal(s.refused, 0);
    /* the oldest were evicted, the newest 8 are held */
    assert_true(was_killed(&k, 1000));
    assert_true(was_killed(&k, 1291));
    assert_false(was_killed(&k, 1292));
    /* a client that sends its request promptly gets in and, once BUSY, cannot be evicted */
    assert_true(kvt_conn_guard_admit(g, "10.0.0.1", 400));
    kvt_conn *h = kvt_conn_guard_open(g, "10.0.0.1", 5000, 400);
    kvt_conn_guard_stage(g, h, KVT_CONN_BODY, 401);
    kvt_conn_guard_stage(g, h, KVT_CONN_BUSY, 402);
    for (int i = 0; i < 50; i++) {
        assert_true(kvt_conn_guard_admit(g, "10.0.0.1", 500 + i));
        kvt_conn_guard_open(g, "10.0.0.1", 6000 + i, 500 + i);
    }
    assert_false(was_killed(&k, 5000));
    /* other addresses are unaffected by one address's limit */
    assert_true(kvt_conn_guard_admit(g, "10.0.0.2", 600));
    kvt_conn_guard_free(g);
}

/* The global limit evicts the oldest WAITING connection of any address; when everything held is
 * BUSY or a body arriving at KVT_CONN_EVICT_RATE or faster, the new connection is refused and
 * counted. */
static void test_global_limit_and_refusal(void **st) {
    (void)st;
    killed k = {.n = 0};
    kvt_conn_guard *g;
    kvt_conn_guard_opts o = {.max_conns = 4, .per_addr = 4, .header_s = 10, .body_s = 60};
    assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
    char addr[32];
    kvt_conn *c[4];
    for (int i = 0; i < 4; i++) {
        snprintf(addr, sizeof addr, "10.0.1.%d", i);
        assert_true(kvt_conn_guard_admit(g, addr, i));
        c[i] = kvt_conn_guard_open(g, addr, 100 + i, i);
    }
    kvt_conn_guard_stage(g, c[0], KVT_CONN_BUSY, 5);
    assert_true(kvt_conn_guard_admit(g, "10.0.2.1", 10)); /* evicts c[1], the oldest WAITING */
    assert_true(was_killed(&k, 101));
    assert_false(was_killed(&k, 100));
    kvt_conn *n1 = kvt_conn_guard_open(g, "10.0.2.1", 200, 10);
    kvt_conn_guard_stage(g, c[2], KVT_CONN_BODY, 11);
    kvt_conn_guard_progress(g, c[2], 1000); /* 1000 bytes in 1 ms: a real upload */
    kvt_conn_guard_stage(g, c[3], KVT_CONN_BUSY, 11);
    kvt_conn_guard_stage(g, n1, KVT_CONN_BUSY, 11);
    assert_false(kvt_conn_guard_admit(g, "10.0.2.2", 12)); /* nothing evictable */
    kvt_conn_guard_stats s;
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.open, 4);
    /* the killed entry stays until its close, then frees; closing a live one frees its slot */
    kvt_conn_guard_close(g, c[1]);
    kvt_conn_guard_close(g, c[3]);
    assert_true(kvt_conn_guard_admit(g, "10.0.2.2", 13));
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.open, 3);
    kvt_conn_guard_free(g);
}

/* Deadlines: WAITING past header_s and BODY past body_s are killed once; BUSY never; a keep-alive
 * connection's header deadline restarts when it returns to WAITING. */
static void test_deadlines(void **st) {
    (void)st;
    killed k = {.n = 0};
    kvt_conn_guard *g;
    kvt_conn_guard_opts o = {.max_conns = 16, .per_addr = 16, .header_s = 2, .body_s = 5};
    assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
    kvt_conn *w = kvt_conn_guard_open(g, "a", 1, 0);
    kvt_conn *b = kvt_conn_guard_open(g, "a", 2, 0);
    kvt_conn *busy = kvt_conn_guard_open(g, "a", 3, 0);
    kvt_conn *ka = kvt_conn_guard_open(g, "a", 4, 0);
    kvt_conn_guard_stage(g, b, KVT_CONN_BODY, 100);
    kvt_conn_guard_stage(g, busy, KVT_CONN_BUSY, 100);
    kvt_conn_guard_stage(g, ka, KVT_CONN_WAITING, 1900); /* came back from a request at 1.9 s */
    assert_int_equal(kvt_conn_guard_sweep(g, 1999), 0);
    assert_int_equal(kvt_conn_guard_sweep(g, 2001), 1); /* w */
    assert_true(was_killed(&k, 1));
    assert_int_equal(kvt_conn_guard_sweep(g, 3000), 0); /* w is not killed twice */
    assert_int_equal(kvt_conn_guard_sweep(g, 3901), 1); /* ka */
    assert_int_equal(kvt_conn_guard_sweep(g, 5101), 1); /* b */
    assert_int_equal(kvt_conn_guard_sweep(g, 1e9), 0);  /* busy never */
    assert_false(was_killed(&k, 3));
    kvt_conn_guard_stats s;
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.timed_out, 3);
    assert_int_equal(s.open, 1);
    kvt_conn_guard_close(g, w);
    kvt_conn_guard_close(g, NULL);
    kvt_conn_guard_stage(g, NULL, KVT_CONN_BUSY, 0);
    kvt_conn_guard_free(g); /* frees b, busy, ka */
}

/* The minimum body rate: after the grace time a body averaging below body_min_rate is closed
 * (counted as slow), one above it is not; bytes count from the last entry into BODY; with the rate
 * off only body_s applies. */
static void test_body_min_rate(void **st) {
    (void)st;
    killed k = {.n = 0};
    kvt_conn_guard *g;
    kvt_conn_guard_opts o = {.max_conns = 16, .per_addr = 16, .header_s = 10, .body_s = 60,
                             .body_min_rate = 1024, .body_grace_s = 2};
    assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
    kvt_conn *trickle = kvt_conn_guard_open(g, "a", 1, 0);
    kvt_conn *steady = kvt_conn_guard_open(g, "a", 2, 0);
    kvt_conn *ka = kvt_conn_guard_open(g, "a", 3, 0);
    kvt_conn_guard_stage(g, trickle, KVT_CONN_BODY, 0);
    kvt_conn_guard_stage(g, steady, KVT_CONN_BODY, 0);
    kvt_conn_guard_progress(g, ka, 1 << 20); /* WAITING: not counted */
    for (int t = 200; t <= 1800; t += 200) { /* 1 byte / 0.2 s against 2 KB/s */
        kvt_conn_guard_progress(g, trickle, 1);
        kvt_conn_guard_progress(g, steady, 400);
        assert_int_equal(kvt_conn_guard_sweep(g, t), 0); /* inside the grace time */
    }
    kvt_conn_guard_progress(g, trickle, 1);
    kvt_conn_guard_progress(g, steady, 400);
    assert_int_equal(kvt_conn_guard_sweep(g, 2000), 1);
    assert_true(was_killed(&k, 1));
    assert_false(was_killed(&k, 2));
    /* a keep-alive connection's second body starts from zero bytes: the first body's do not carry */
    kvt_conn_guard_stage(g, ka, KVT_CONN_BODY, 2000);
    kvt_conn_guard_progress(g, ka, 100);
    kvt_conn_guard_progress(g, steady, 4000); /* steady keeps its 2 KB/s */
    assert_int_equal(kvt_conn_guard_sweep(g, 3999), 0);
    assert_int_equal(kvt_conn_guard_sweep(g, 4001), 1); /* 100 bytes in 2 s */
    assert_true(was_killed(&k, 3));
    kvt_conn_guard_stats s;
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.slow, 2);
    assert_int_equal(s.timed_out, 0);
    assert_int_equal(s.open, 1);
    kvt_conn_guard_free(g);

    /* rate off: only the body deadline */
    k.n = 0;
    kvt_conn_guard_opts off = {.max_conns = 4, .per_addr = 4, .header_s = 10, .body_s = 5};
    assert_int_equal(kvt_conn_guard_create(&off, rec_kill, &k, &g), KVT_OK);
    kvt_conn *b = kvt_conn_guard_open(g, "a", 7, 0);
    kvt_conn_guard_stage(g, b, KVT_CONN_BODY, 0);
    assert_int_equal(kvt_conn_guard_sweep(g, 4900), 0);
    assert_int_equal(kvt_conn_guard_sweep(g, 5001), 1);
    kvt_conn_guard_stats_get(g, &s);
    assert_int_equal(s.timed_out, 1);
    assert_int_equal(s.slow, 0);
    kvt_conn_guard_free(g);
}

/* Issue 31 item 3: 32 connections from one address hold bodies they trickle (1 byte / 0.2 s, and
 * 400 bytes / 0.2 s, above the minimum rate). Each new connection from that address is admitted by
 * evicting the most overdue body, never a fresh WAITING client, never a real upload, never BUSY. */
static void test_body_stall_eviction(void **st) {
    (void)st;
    for (int variant = 0; variant < 2; variant++) {
        uint64_t per_tick = variant ? 400 : 1;
        killed k = {.n = 0};
        kvt_conn_guard *g;
        kvt_conn_guard_opts o = {.max_conns = 256, .per_addr = 32, .header_s = 10, .body_s = 60,
                                 .body_min_rate = 1024, .body_grace_s = 2};
        assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
        kvt_conn *c[32];
        for (int i = 0; i < 31; i++) { /* attackers opened 10 ms apart */
            assert_true(kvt_conn_guard_admit(g, "127.0.0.1", i * 10));
            c[i] = kvt_conn_guard_open(g, "127.0.0.1", 100 + i, i * 10);
            kvt_conn_guard_stage(g, c[i], KVT_CONN_BODY, i * 10 + 1);
        }
        /* one real upload among them: 1 MB within 100 ms */
        assert_true(kvt_conn_guard_admit(g, "127.0.0.1", 400));
        c[31] = kvt_conn_guard_open(g, "127.0.0.1", 131, 400);
        kvt_conn_guard_stage(g, c[31], KVT_CONN_BODY, 400);
        kvt_conn_guard_progress(g, c[31], 1 << 20);
        for (int i = 0; i < 31; i++) kvt_conn_guard_progress(g, c[i], per_tick * 2);
        /* a legitimate client: admitted, by evicting an attacker (the longest stalled: c[0]) */
        assert_true(kvt_conn_guard_admit(g, "127.0.0.1", 500));
        assert_int_equal(k.n, 1);
        assert_true(was_killed(&k, 100));
        kvt_conn *legit = kvt_conn_guard_open(g, "127.0.0.1", 900, 500);
        /* the attacker reconnects at once: the victim is another stalled body, not the legitimate
         * client still WAITING for its headers, nor the real upload */
        assert_true(kvt_conn_guard_admit(g, "127.0.0.1", 501));
        assert_false(was_killed(&k, 900));
        assert_false(was_killed(&k, 131));
        assert_true(was_killed(&k, 101));
        kvt_conn_guard_open(g, "127.0.0.1", 200, 501);
        kvt_conn_guard_stage(g, legit, KVT_CONN_BODY, 502);
        kvt_conn_guard_stage(g, legit, KVT_CONN_BUSY, 503);
        for (int i = 0; i < 40; i++) { /* the attacker keeps reconnecting: the BUSY request stays */
            assert_true(kvt_conn_guard_admit(g, "127.0.0.1", 600 + i));
            kvt_conn_guard_open(g, "127.0.0.1", 300 + i, 600 + i);
        }
        assert_false(was_killed(&k, 900));
        assert_false(was_killed(&k, 131));
        kvt_conn_guard_stats s;
        kvt_conn_guard_stats_get(g, &s);
        assert_int_equal(s.refused, 0);
        assert_int_equal(s.evicted, 41); /* the first of the 40 found a free slot (legit left BODY) */
        kvt_conn_guard_free(g);
    }
}

/* The reserve: generations hold max_conns - reserve connections (BUSY), stalled bodies the rest;
 * a new connection (/health) still gets in by evicting the most stalled body. */
static void test_reserve_not_lost_to_bodies(void **st) {
    (void)st;
    killed k = {.n = 0};
    kvt_conn_guard *g;
    kvt_conn_guard_opts o = {.max_conns = 8, .per_addr = 8, .header_s = 10, .body_s = 60, .body_min_rate = 1024};
    assert_int_equal(kvt_conn_guard_create(&o, rec_kill, &k, &g), KVT_OK);
    char addr[32];
    for (int i = 0; i < 8; i++) {
        snprintf(addr, sizeof addr, "10.0.3.%d", i);
        assert_true(kvt_conn_guard_admit(g, addr, i));
        kvt_conn *c = kvt_conn_guard_open(g, addr, 10 + i, i);
        kvt_conn_guard_stage(g, c, i < 6 ? KVT_CONN_BUSY : KVT_CONN_BODY, i);
        if (i == 7) kvt_conn_guard_progress(g, c, 50); /* fd 16 trickles a little, fd 17 a bit more */
        if (i == 6) kvt_conn_guard_progress(g, c, 10);
    }
    assert_true(kvt_conn_guard_admit(g, "10.0.4.1", 1000));
    assert_int_equal(k.n, 1);
    assert_true(was_killed(&k, 16)); /* the one lagging most */
    kvt_conn_guard_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slowloris_same_addr),
        cmocka_unit_test(test_global_limit_and_refusal),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_body_min_rate),
        cmocka_unit_test(test_body_stall_eviction),
        cmocka_unit_test(test_reserve_not_lost_to_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
