/* test_file_watch.c — the model file watch (model/file_watch.h): which changes count (in-place
 * rewrite with the mtime put back, truncate, rename over, delete, chmod/touch, a write right after
 * open), what does not (reads, a retargeted symlink for the held file), stickiness; and the engine
 * (issue 31.1): a model file rewritten in place during a generation stops it with KVT_ERR_STALE,
 * nothing computed after the change reaches the SSD tier, later requests are refused, and after the
 * bytes are restored a restarted engine's greedy output equals a cold run's. */
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/engine.h"
#include "model/file_watch.h"

static char *g_dir;

static void write_file(const char *path, size_t n, int seed) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) fputc((int)((i * 131 + (size_t)seed) & 0xff), f);
    assert_int_equal(fclose(f), 0);
}

static char *path_in(const char *name) {
    char *p = malloc(strlen(g_dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", g_dir, name);
    return p;
}

static kvt_file_watch *open_watch(const char *path) {
    kvt_file_watch *w = NULL;
    char err[256] = "";
    kvt_status st = kvt_file_watch_open(path, &w, err, sizeof err);
    if (st) fprintf(stderr, "watch: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return w;
}

static void assert_changed(kvt_file_watch *w, const char *needle) {
    assert_false(kvt_file_watch_ok(w));
    char what[256] = "";
    assert_true(kvt_file_watch_changed(w, what, sizeof what));
    if (!strstr(what, needle)) fail_msg("change '%s' does not mention '%s'", what, needle);
    assert_false(kvt_file_watch_ok(w)); /* sticky */
}

/* Reads of the file and repeated checks change nothing. */
static void test_unchanged(void **s) {
    char *p = path_in("same.bin");
    write_file(p, 10000, 1);
    kvt_file_watch *w = open_watch(p);
    char buf[4096];
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_true(read(fd, buf, sizeof buf) > 0);
    close(fd);
    for (int i = 0; i < 100; i++) assert_true(kvt_file_watch_ok(w));
    assert_true(kvt_file_watch_path_ok(w));
    assert_false(kvt_file_watch_changed(w, buf, sizeof buf));
    assert_true(kvt_file_watch_ok(NULL));
    kvt_file_watch_free(w);
    kvt_file_watch_free(NULL);
    free(p);
}

/* The attack of issue 31: same inode, same size, and the mtime put back afterwards. Only the ctime
 * witnesses the write. */
static void test_inplace_rewrite_mtime_restored(void **s) {
    char *p = path_in("inplace.bin");
    write_file(p, 10000, 2);
    struct stat sb0;
    assert_int_equal(stat(p, &sb0), 0);
    kvt_file_watch *w = open_watch(p);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "ZZZZ", 4, 5000), 4);
    close(fd);
    struct timespec ts[2] = {sb0.st_atim, sb0.st_mtim};
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    struct stat sb1;
    assert_int_equal(stat(p, &sb1), 0);
    assert_int_equal(sb1.st_ino, sb0.st_ino);
    assert_int_equal(sb1.st_size, sb0.st_size);
    assert_int_equal(sb1.st_mtim.tv_nsec, sb0.st_mtim.tv_nsec);
    assert_changed(w, "ctime changed");
    kvt_file_watch_free(w);
    free(p);
}

static void test_inplace_write(void **s) {
    char *p = path_in("write.bin");
    write_file(p, 10000, 3);
    kvt_file_watch *w = open_watch(p);
    int fd = open(p, O_WRONLY);
    assert_int_equal(pwrite(fd, "Y", 1, 0), 1);
    close(fd);
    assert_changed(w, "contents modified");
    kvt_file_watch_free(w);
    free(p);
}

/* A write made at once after open (within the same clock tick as the file's creation): open waits
 * until such a write is guaranteed a new ctime. */
static void test_write_right_after_open(void **s) {
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "quick%d.bin", i);
        char *p = path_in(name);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, "abcdefgh", 8, 0), 8);
        kvt_file_watch *w = open_watch(p);
        assert_true(kvt_file_watch_ok(w));
        assert_int_equal(pwrite(fd, "X", 1, 3), 1); /* same size, same inode */
        close(fd);
        assert_false(kvt_file_watch_ok(w));
        kvt_file_watch_free(w);
        free(p);
    }
}

static void test_truncate(void **s) {
    char *p = path_in("trunc.bin");
    write_file(p, 10000, 4);
    kvt_file_watch *w = open_watch(p);
    assert_int_equal(truncate(p, 100), 0);
    assert_changed(w, "size 10000 -> 100");
    kvt_file_watch_free(w);
    free(p);
}

/* A rename over the file (an atomic model swap) unlinks the held inode: its ctime and link count
 * change, so it counts, though the held bytes are intact (file_watch.h: ctime cannot tell). */
static void test_rename_over(void **s) {
    char *p = path_in("renamed.bin"), *q = path_in("renamed.new");
    write_file(p, 10000, 5);
    write_file(q, 10000, 6);
    kvt_file_watch *w = open_watch(p);
    assert_int_equal(rename(q, p), 0);
    assert_changed(w, "deleted or replaced by a rename");
    kvt_file_watch_free(w);
    /* the path check alone sees it too */
    w = open_watch(p);
    write_file(q, 10000, 7);
    assert_int_equal(rename(q, p), 0);
    assert_false(kvt_file_watch_path_ok(w));
    kvt_file_watch_free(w);
    free(p);
    free(q);
}

static void test_delete(void **s) {
    char *p = path_in("deleted.bin");
    write_file(p, 10000, 8);
    kvt_file_watch *w = open_watch(p);
    assert_int_equal(unlink(p), 0);
    assert_changed(w, "deleted");
    kvt_file_watch_free(w);
    free(p);
}

/* Attribute-only changes count (documented choice: ctime is the one unforgeable witness). */
static void test_attrib_only_counts(void **s) {
    char *p = path_in("attr.bin");
    write_file(p, 10000, 9);
    kvt_file_watch *w = open_watch(p);
    assert_int_equal(chmod(p, 0600), 0);
    assert_changed(w, "ctime changed");
    kvt_file_watch_free(w);
    w = open_watch(p);
    assert_int_equal(utimensat(AT_FDCWD, p, NULL, 0), 0); /* touch */
    assert_false(kvt_file_watch_ok(w));
    kvt_file_watch_free(w);
    free(p);
}

/* A symlink retargeted to another file leaves the held file as it was: the weights in use are still
 * the ones that were hashed, so run-time checks stay clean; the start-up path check refuses. */
static void test_symlink_retarget(void **s) {
    char *a = path_in("la.bin"), *b = path_in("lb.bin"), *l = path_in("link.gguf"), *t = path_in("link.tmp");
    write_file(a, 10000, 10);
    write_file(b, 10000, 11);
    assert_int_equal(symlink(a, l), 0);
    kvt_file_watch *w = open_watch(l);
    assert_true(kvt_file_watch_path_ok(w));
    assert_int_equal(symlink(b, t), 0);
    assert_int_equal(rename(t, l), 0);
    assert_true(kvt_file_watch_ok(w));
    assert_false(kvt_file_watch_path_ok(w));
    char what[256];
    assert_true(kvt_file_watch_changed(w, what, sizeof what));
    assert_non_null(strstr(what, "names another file"));
    kvt_file_watch_free(w);
    free(a);
    free(b);
    free(l);
    free(t);
}

static void test_open_errors(void **s) {
    kvt_file_watch *w = (kvt_file_watch *)1;
    char err[256] = "";
    char *p = path_in("missing.bin");
    assert_int_equal(kvt_file_watch_open(p, &w, err, sizeof err), KVT_ERR_IO);
    assert_null(w);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(kvt_file_watch_open(g_dir, &w, err, sizeof err), KVT_ERR_IO);
    assert_non_null(strstr(err, "not a regular file"));
    free(p);
}

/* Many threads checking while the file changes: all see the change, the state stays CHANGED. */
typedef struct race {
    kvt_file_watch *w;
    int stop;
    int saw_false;
} race;
static void *race_fn(void *arg) {
    race *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
        if (!kvt_file_watch_ok(r->w)) __atomic_store_n(&r->saw_false, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void test_threads(void **s) {
    char *p = path_in("threads.bin");
    write_file(p, 10000, 12);
    race r = {.w = open_watch(p)};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, race_fn, &r), 0);
    usleep(20000);
    assert_false(__atomic_load_n(&r.saw_false, __ATOMIC_ACQUIRE));
    int fd = open(p, O_WRONLY);
    assert_int_equal(pwrite(fd, "Q", 1, 10), 1);
    close(fd);
    usleep(20000);
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    assert_true(r.saw_false);
    /* "changed", not "modified": the write sets ctime, then mtime, and a check between the two (stat
     * does not lock against it) latches "ctime changed" first, as seen under a loaded `make test` */
    assert_changed(r.w, "changed");
    kvt_file_watch_free(r.w);
    free(p);
}

/* ---- the engine ------------------------------------------------------------------------------- */

static char *make_model(const char *name, uint64_t seed) {
    char *p = path_in(name);
    kvt_gen_model_opts o = {.arch = "llama", .shape = "tiny", .type = "f16", .seed = seed};
    char err[256] = "";
    kvt_status st = kvt_gen_model(&o, p, err, sizeof err);
    if (st) fprintf(stderr, "gen_model: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return p;
}

static kvt_engine *open_engine(const char *model, const char *ssd, uint32_t parallel) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.prompt_cache_gb = 0.5;
    o.snapshot_min_tokens = 64;
    o.ssd_dir = ssd;
    o.parallel = parallel;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(st, KVT_OK);
    return e;
}

/* Overwrites dst in place (same inode, no truncation) with src's bytes. */
static void overwrite_inplace(const char *dst, const char *src) {
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    int fd = open(dst, O_WRONLY);
    assert_true(fd >= 0);
    char buf[1 << 16];
    size_t n;
    off_t off = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        assert_int_equal(pwrite(fd, buf, n, off), (ssize_t)n);
        off += (off_t)n;
    }
    close(fd);
    fclose(in);
}

typedef struct rewrite_cb {
    const char *model, *other;
    uint32_t at, seen;
} rewrite_cb;
/* on_token: rewrites the model in place after `at` tokens — mid-generation, deterministically */
static bool rewrite_on_token(void *ctx, int32_t id, const char *t, size_t len) {
    rewrite_cb *c = ctx;
    if (id >= 0 && ++c->seen == c->at) overwrite_inplace(c->model, c->other);
    return true;
}

/* The cache records under dir: their names relative to it, sorted, one a line (caller frees). */
static char *list_records(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -type f \\( -name '*.kvb' -o -name '*.kvt' -o -name '*.kvs' \\) | sort", dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - 1 - n, f)) > 0) n += r;
    b[n] = 0;
    assert_true(n < cap - 1);
    pclose(f);
    return b;
}

static void prompt_ids(int32_t *ids, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(300 + tu_rand(&seed) % 600);
}

static kvt_status gen(kvt_engine *e, const int32_t *ids, uint32_t n, uint32_t max, rewrite_cb *cb, int32_t *out,
                      uint32_t *n_out, kvt_gen_result *res_out, char *err, size_t errlen) {
    kvt_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = max, .ignore_eog = true};
    kvt_sampling_default(&r.sampling);
    if (cb) {
        r.on_token = rewrite_on_token;
        r.cb_ctx = cb;
    }
    kvt_gen_result res;
    kvt_status st = kvt_engine_generate(e, &r, &res, err, errlen);
    if (out && res.tokens) memcpy(out, res.tokens, sizeof(int32_t) * res.n_gen);
    if (n_out) *n_out = res.n_gen;
    if (res_out) *res_out = res;
    free(res.tokens);
    return st;
}

/* The issue-31 attack through the engine: rewrite mid-decode, flush, restore, restart. */
static void check_rewrite_mid_generation(uint32_t parallel) {
    char *m = make_model(parallel > 1 ? "wm-p.gguf" : "wm-1.gguf", 1);
    char *orig = make_model(parallel > 1 ? "wm-p.orig" : "wm-1.orig", 1);
    char *other = make_model(parallel > 1 ? "wm-p.other" : "wm-1.other", 2);
    char *dir = tu_tmpdir("watch-ssd"), *ctl = tu_tmpdir("watch-ctl");
    int32_t ids[100], ref[40], got[40], ids2[100];
    prompt_ids(ids, 100, 11);
    prompt_ids(ids2, 100, 12);
    char err[512];
    uint32_t nref = 0, ngot = 0;
    { /* cold reference, no tiers */
        kvt_engine *e = open_engine(m, NULL, parallel);
        kvt_gen_result res;
        assert_int_equal(gen(e, ids, 100, 40, NULL, ref, &nref, &res, err, sizeof err), KVT_OK);
        assert_int_equal(nref, 40);
        kvt_engine_free(e);
    }
    kvt_flush_result fr;
    { /* control: what the prompt alone leaves on disk (its prompt-boundary snapshot: 6 blocks + tail) */
        kvt_engine *e = open_engine(m, ctl, parallel);
        kvt_gen_result res;
        assert_int_equal(gen(e, ids, 100, 1, NULL, NULL, NULL, &res, err, sizeof err), KVT_OK);
        kvt_engine_flush(e, 10000, &fr);
        assert_true(fr.durable);
        kvt_engine_free(e);
    }
    char *expect = list_records(ctl), *after = NULL;
    assert_true(strlen(expect) > 0);
    {
        kvt_engine *e = open_engine(m, dir, parallel);
        /* the prompt-boundary snapshot (100 >= 64 tokens) is put before decoding: from intact weights */
        rewrite_cb cb = {.model = m, .other = other, .at = 4};
        kvt_gen_result res;
        kvt_status st = gen(e, ids, 100, 40, &cb, got, &ngot, &res, err, sizeof err);
        assert_int_equal(st, KVT_ERR_STALE);
        assert_non_null(strstr(err, m));
        assert_non_null(strstr(err, "changed after it was loaded"));
        assert_true(cb.seen >= 4 && cb.seen < 40); /* stopped right after the rewrite */
        kvt_engine_flush(e, 10000, &fr);
        assert_true(fr.durable);
        after = list_records(dir);
        /* refused from now on */
        st = gen(e, ids2, 100, 4, NULL, NULL, NULL, NULL, err, sizeof err);
        assert_int_equal(st, KVT_ERR_STALE);
        kvt_engine_stats es;
        kvt_engine_stats_get(e, &es);
        assert_true(es.model_changed);
        assert_true(es.model_stale_dropped >= 1); /* the row's own put at its end */
        assert_non_null(strstr(es.model_change, "modified"));
        char what[256];
        assert_true(kvt_engine_model_changed(e, what, sizeof what));
        kvt_engine_free(e); /* its final flush writes nothing new either */
        char *last = list_records(dir);
        assert_string_equal(last, after);
        free(last);
    }
    /* on disk: exactly the prompt-boundary snapshot, put before the rewrite; nothing of the decode */
    assert_string_equal(after, expect);
    free(after);
    free(expect);
    overwrite_inplace(m, orig); /* restore, same inode */
    {
        kvt_engine *e = open_engine(m, dir, parallel);
        kvt_gen_result res;
        assert_int_equal(gen(e, ids, 100, 40, NULL, got, &ngot, &res, err, sizeof err), KVT_OK);
        assert_int_equal(res.reused_from, KVT_TIER_SSD); /* the blocks from before the rewrite are reused */
        assert_true(res.n_reused >= 96);
        assert_int_equal(ngot, nref);
        assert_memory_equal(got, ref, sizeof(int32_t) * nref);
        kvt_engine_stats es;
        kvt_engine_stats_get(e, &es);
        assert_false(es.model_changed);
        kvt_engine_free(e);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, ctl);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(ctl);
    free(m);
    free(orig);
    free(other);
}
static void test_engine_rewrite_inline(void **s) { check_rewrite_mid_generation(1); }
static void test_engine_rewrite_batched(void **s) { check_rewrite_mid_generation(4); }

/* The identity memo is keyed on the held file (hashed through /proc/self/fd): restarts of an
 * unchanged model reuse one memo line; a rewrite adds one. */
static void test_engine_identity_memo(void **s) {
    char *m = make_model("memo.gguf", 3);
    char *other = make_model("memo.other", 4);
    char *dir = tu_tmpdir("watch-memo");
    for (int i = 0; i < 3; i++) kvt_engine_free(open_engine(m, dir, 1));
    char memo[1200], cmd[1300];
    snprintf(memo, sizeof memo, "%s/.model-ids", dir);
    snprintf(cmd, sizeof cmd, "test $(wc -l < '%s') -eq 1", memo);
    assert_int_equal(system(cmd), 0);
    char *line1 = NULL;
    {
        FILE *f = fopen(memo, "r");
        size_t cap = 0;
        assert_true(getline(&line1, &cap, f) > 0);
        fclose(f);
        assert_null(strstr(line1, "/proc/")); /* the real path, not the descriptor's name */
    }
    overwrite_inplace(m, other);
    kvt_engine_free(open_engine(m, dir, 1));
    snprintf(cmd, sizeof cmd, "test $(wc -l < '%s') -eq 2", memo);
    assert_int_equal(system(cmd), 0);
    free(line1);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(m);
    free(other);
}

int main(void) {
    g_dir = tu_tmpdir("filewatch");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unchanged),
        cmocka_unit_test(test_inplace_rewrite_mtime_restored),
        cmocka_unit_test(test_inplace_write),
        cmocka_unit_test(test_write_right_after_open),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_rename_over),
        cmocka_unit_test(test_delete),
        cmocka_unit_test(test_attrib_only_counts),
        cmocka_unit_test(test_symlink_retarget),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_engine_rewrite_inline),
        cmocka_unit_test(test_engine_rewrite_batched),
        cmocka_unit_test(test_engine_identity_memo),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) rc = 1;
    free(g_dir);
    return rc;
}
