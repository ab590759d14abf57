/* test_gguf.c — GGUF reader/writer round trips, malformed-file rejection, fuzzing, writer fault
 * injection, and the gen-model generator (model/gen_model.h). */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "model/gen_model.h"

/* ------------------------------------------------------------------ helpers */

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    size_t r = fread(b, 1, (size_t)n, f);
    fclose(f);
    assert_int_equal(r, (size_t)n);
    *len = (size_t)n;
    return b;
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = path_in(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Raw byte builder for hand-made (possibly malformed) GGUF files. */
typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;
static void bb_put(bb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(bb *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_header(bb *b, uint32_t version, uint64_t n_t, uint64_t n_kv) {
    bb_u32(b, 0x46554747u);
    bb_u32(b, version);
    bb_u64(b, n_t);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *k, uint32_t v) { bb_str(b, k); bb_u32(b, KVT_GGUF_U32); bb_u32(b, v); }
static void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, (uint64_t)ne[i]);
    bb_u32(b, type);
    bb_u64(b, off);
}
static void bb_pad(bb *b, size_t a) {
    while (b->n % a) bb_u8(b, 0);
}
static void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}

/* Expects open_buffer to fail with a message containing `want`. */
static void expect_reject(const bb *b, const char *want) {
    kvt_gguf *g = NULL;
    char err[512] = "";
    kvt_status st = kvt_gguf_open_buffer(b->p, b->n, &g, err, sizeof err);
    if (st == KVT_OK || !strstr(err, want)) {
        print_error("expected rejection containing '%s', got status %d message '%s'\n", want, st, err);
        kvt_gguf_free(g);
        fail();
    }
    assert_null(g);
    assert_null(strchr(err, '\n')); /* one line */
}

/* A valid file with two F32 tensors and a few KVs, built by hand. */
static void bb_valid(bb *b) {
    int64_t ne[2] = {8, 2};
    bb_header(b, 3, 2, 2);
    bb_kv_u32(b, "general.alignment", 32);
    bb_str(b, "general.architecture"); bb_u32(b, KVT_GGUF_STRING); bb_str(b, "llama");
    bb_tinfo(b, "a", 2, ne, KVT_TYPE_F32, 0);
    bb_tinfo(b, "b", 1, ne, KVT_TYPE_F32, 64);
    bb_pad(b, 32);
    for (int i = 0; i < 24; i++) { float f = (float)i; bb_put(b, &f, 4); }
    bb_pad(b, 32);
}

/* ------------------------------------------------------------------ round trip */

static void test_roundtrip_all_types(void **state) {
    (void)state;
    char *dir = tu_tmpdir("gguf");
    char *path = path_in(dir, "rt.gguf");
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    uint8_t u8 = 200; int8_t i8 = -5; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint64_t u64 = 0xfedcba9876543210ull; int64_t i64 = -1234567890123ll; double f64 = 3.25;
    kvt_gguf_w_scalar(w, "t.u8", KVT_GGUF_U8, &u8);
    kvt_gguf_w_scalar(w, "t.i8", KVT_GGUF_I8, &i8);
    kvt_gguf_w_scalar(w, "t.u16", KVT_GGUF_U16, &u16);
    kvt_gguf_w_scalar(w, "t.i16", KVT_GGUF_I16, &i16);
    kvt_gguf_w_u32(w, "t.u32", 4000000000u);
    kvt_gguf_w_i32(w, "t.i32", -7);
    kvt_gguf_w_f32(w, "t.f32", 0.5f);
    kvt_gguf_w_bool(w, "t.bool", true);
    kvt_gguf_w_str(w, "t.str", "h\xc3\xa9llo", 6);
    kvt_gguf_w_u64(w, "t.u64", u64);
    kvt_gguf_w_scalar(w, "t.i64", KVT_GGUF_I64, &i64);
    kvt_gguf_w_scalar(w, "t.f64", KVT_GGUF_F64, &f64);
    int32_t ai[5] = {1, -2, 3, -4, 5};
    float af[3] = {1.5f, -2.5f, 1e-6f};
    uint8_t ab[4] = {1, 0, 1, 1};
    kvt_gguf_w_arr(w, "t.arr_i32", KVT_GGUF_I32, ai, 5);
    kvt_gguf_w_arr(w, "t.arr_f32", KVT_GGUF_F32, af, 3);
    kvt_gguf_w_arr(w, "t.arr_bool", KVT_GGUF_BOOL, ab, 4);
    kvt_gguf_w_arr(w, "t.arr_empty", KVT_GGUF_U8, NULL, 0);
    const char *strs[4] = {"alpha", "", "g\xc3\xa5mma", "delta with space"};
    kvt_gguf_w_arr_str(w, "t.arr_str", strs, NULL, 4);
    /* tensors: f32, f16, q8_0, q4_K with odd sizes so padding matters */
    uint64_t seed = 7;
    float src[512];
    for (int i = 0; i < 512; i++) src[i] = tu_randf(&seed);
    int64_t ne_a[2] = {3, 5}, ne_b[1] = {7}, ne_c[2] = {64, 2}, ne_d[2] = {256, 2};
    assert_int_equal(kvt_gguf_w_tensor(w, "a.f32", KVT_TYPE_F32, 2, ne_a, src, 15 * 4), KVT_OK);
    uint16_t h[7];
    for (int i = 0; i < 7; i++) h[i] = kvt_f32_to_f16(src[i]);
    assert_int_equal(kvt_gguf_w_tensor(w, "b.f16", KVT_TYPE_F16, 1, ne_b, h, sizeof h), KVT_OK);
    uint8_t q8[4 * 34], q4k[2 * 144];
    kvt_quantize_ref(KVT_TYPE_Q8_0, src, q8, 128);
    kvt_quantize_ref(KVT_TYPE_Q4_K, src, q4k, 512);
    assert_int_equal(kvt_gguf_w_tensor(w, "c.q8_0", KVT_TYPE_Q8_0, 2, ne_c, q8, sizeof q8), KVT_OK);
    assert_int_equal(kvt_gguf_w_tensor(w, "d.q4_K", KVT_TYPE_Q4_K, 2, ne_d, q4k, sizeof q4k), KVT_OK);
    /* wrong size and duplicate name are refused */
    assert_int_equal(kvt_gguf_w_tensor(w, "e", KVT_TYPE_F32, 2, ne_a, src, 14 * 4), KVT_ERR_INVALID_ARG);
    assert_int_equal(kvt_gguf_w_tensor(w, "a.f32", KVT_TYPE_F32, 2, ne_a, src, 15 * 4), KVT_ERR_INVALID_ARG);
    char err[512];
    assert_int_equal(kvt_gguf_writer_finish(w, path, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);

    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_version(g), 3);
    assert_int_equal(kvt_gguf_n_kv(g), 17);
    uint32_t v32;
    int64_t v64;
    float f;
    bool b;
    assert_true(kvt_gguf_get_u32(g, "t.u8", &v32)); assert_int_equal(v32, 200);
    assert_false(kvt_gguf_get_u32(g, "t.i8", &v32)); /* negative */
    assert_true(kvt_gguf_get_i64(g, "t.i8", &v64)); assert_int_equal(v64, -5);
    assert_true(kvt_gguf_get_u32(g, "t.u16", &v32)); assert_int_equal(v32, 60000);
    assert_true(kvt_gguf_get_i64(g, "t.i16", &v64)); assert_int_equal(v64, -30000);
    assert_true(kvt_gguf_get_u32(g, "t.u32", &v32)); assert_int_equal(v32, 4000000000u);
    assert_true(kvt_gguf_get_i64(g, "t.i32", &v64)); assert_int_equal(v64, -7);
    assert_true(kvt_gguf_get_f32(g, "t.f32", &f)); assert_true(f == 0.5f);
    assert_true(kvt_gguf_get_bool(g, "t.bool", &b)); assert_true(b);
    assert_false(kvt_gguf_get_u32(g, "t.u64", &v32));   /* does not fit */
    assert_false(kvt_gguf_get_i64(g, "t.u64", &v64));   /* > INT64_MAX */
    assert_true(kvt_gguf_get_i64(g, "t.i64", &v64)); assert_true(v64 == i64);
    assert_true(kvt_gguf_get_f32(g, "t.f64", &f)); assert_true(f == 3.25f);
    assert_false(kvt_gguf_get_f32(g, "t.u32", &f));     /* type mismatch */
    assert_false(kvt_gguf_get_u32(g, "missing", &v32));
    const char *s;
    uint64_t len;
    assert_true(kvt_gguf_get_str(g, "t.str", &s, &len));
    assert_int_equal(len, 6);
    assert_memory_equal(s, "h\xc3\xa9llo", 6);
    int64_t ki = kvt_gguf_find_key(g, "t.arr_str");
    assert_true(ki >= 0);
    assert_string_equal(kvt_gguf_key_name(g, ki), "t.arr_str");
    assert_int_equal(kvt_gguf_key_type(g, ki), KVT_GGUF_ARRAY);
    assert_int_equal(kvt_gguf_arr_type(g, ki), KVT_GGUF_STRING);
    for (int i = 3; i >= 0; i--) { /* any order: O(1) index */
        assert_true(kvt_gguf_get_arr_str(g, "t.arr_str", (uint64_t)i, &s, &len));
        assert_int_equal(len, strlen(strs[i]));
        assert_memory_equal(s, strs[i], len);
    }
    assert_false(kvt_gguf_get_arr_str(g, "t.arr_str", 4, &s, &len));
    kvt_gguf_vtype et;
    uint64_t n;
    const void *data;
    assert_true(kvt_gguf_get_arr(g, "t.arr_i32", &et, &n, &data));
    assert_int_equal(et, KVT_GGUF_I32);
    assert_int_equal(n, 5);
    assert_memory_equal(data, ai, sizeof ai);
    for (int i = 0; i < 5; i++) {
        assert_true(kvt_gguf_get_arr_i64(g, "t.arr_i32", (uint64_t)i, &v64));
        assert_int_equal(v64, ai[i]);
    }
    assert_false(kvt_gguf_get_arr_i64(g, "t.arr_i32", 5, &v64));
    assert_true(kvt_gguf_get_arr_f32(g, "t.arr_f32", 2, &f)); assert_true(f == 1e-6f);
    assert_true(kvt_gguf_get_arr(g, "t.arr_bool", &et, &n, &data));
    assert_int_equal(n, 4);
    assert_memory_equal(data, ab, 4);
    assert_true(kvt_gguf_get_arr(g, "t.arr_empty", &et, &n, NULL));
    assert_int_equal(n, 0);

    /* tensors, and the ggml-strict layout: offsets are running padded sums */
    assert_int_equal(kvt_gguf_n_tensors(g), 4);
    assert_int_equal(kvt_gguf_data_offset(g) % 32, 0);
    const char *names[4] = {"a.f32", "b.f16", "c.q8_0", "d.q4_K"};
    const void *want[4] = {src, h, q8, q4k};
    uint64_t expect_off = 0;
    for (int i = 0; i < 4; i++) {
        const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
        assert_string_equal(t->name, names[i]);
        assert_ptr_equal(kvt_gguf_find_tensor(g, names[i]), t);
        assert_int_equal(t->offset, expect_off);
        assert_memory_equal(t->data, want[i], t->nbytes);
        expect_off = (expect_off + t->nbytes + 31) / 32 * 32;
    }
    assert_int_equal(kvt_gguf_tensor_at(g, 0)->ne[1], 5);
    assert_int_equal(kvt_gguf_tensor_at(g, 0)->ne[2], 1);
    assert_int_equal(kvt_gguf_tensor_at(g, 3)->nbytes, 288);
    assert_int_equal(kvt_gguf_file_size(g), kvt_gguf_data_offset(g) + expect_off);
    assert_null(kvt_gguf_find_tensor(g, "nope"));
    assert_null(kvt_gguf_tensor_at(g, 4));

    /* copy every KV verbatim into a second file: identical values */
    char *path2 = path_in(dir, "copy.gguf");
    w = kvt_gguf_writer_create();
    for (int64_t i = 0; i < kvt_gguf_n_kv(g); i++) assert_true(kvt_gguf_w_copy_kv(w, g, kvt_gguf_key_name(g, i)));
    assert_false(kvt_gguf_w_copy_kv(w, g, "missing"));
    assert_int_equal(kvt_gguf_writer_finish(w, path2, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);
    kvt_gguf *g2;
    assert_int_equal(kvt_gguf_open(path2, &g2, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_n_kv(g2), kvt_gguf_n_kv(g));
    assert_true(kvt_gguf_get_arr_str(g2, "t.arr_str", 3, &s, &len));
    assert_memory_equal(s, strs[3], len);
    assert_true(kvt_gguf_get_i64(g2, "t.i64", &v64)); assert_true(v64 == i64);
    assert_true(kvt_gguf_get_arr(g2, "t.arr_i32", &et, &n, &data));
    assert_memory_equal(data, ai, sizeof ai);
    kvt_gguf_free(g2);
    kvt_gguf_free(g);
    free(path2);
    free(path);
    rm_rf(dir);
    free(dir);
}

static void test_writer_errors(void **state) {
    (void)state;
    char err[512];
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    kvt_gguf_w_u32(w, "a", 1);
    kvt_gguf_w_u32(w, "a", 2);
    assert_int_equal(kvt_gguf_writer_finish(w, "/tmp/kvt-never-written.gguf", err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "duplicate key 'a'"));
    assert_int_equal(access("/tmp/kvt-never-written.gguf", F_OK), -1);
    kvt_gguf_writer_free(w);
    /* unwritable destination */
    w = kvt_gguf_writer_create();
    kvt_gguf_w_u32(w, "a", 1);
    assert_int_equal(kvt_gguf_writer_finish(w, "/nonexistent-dir/x.gguf", err, sizeof err), KVT_ERR_IO);
    kvt_gguf_writer_free(w);
    /* n_dims 5, unknown type and bad block multiple are refused at add time */
    w = kvt_gguf_writer_create();
    int64_t ne[5] = {32, 1, 1, 1, 1};
    uint8_t buf[64] = {0};
    assert_int_not_equal(kvt_gguf_w_tensor(w, "x", KVT_TYPE_F32, 5, ne, buf, 128), KVT_OK);
    assert_int_not_equal(kvt_gguf_w_tensor(w, "x", 4, 1, ne, buf, 64), KVT_OK);
    int64_t ne33[1] = {33};
    assert_int_not_equal(kvt_gguf_w_tensor(w, "x", KVT_TYPE_Q8_0, 1, ne33, buf, 34), KVT_OK);
    kvt_gguf_writer_free(w);
}

/* Disk faults: every failing write point leaves no temp file and the old file untouched. */
static void test_writer_fault_injection(void **state) {
    (void)state;
    char *dir = tu_tmpdir("gguf-fault");
    char *path = path_in(dir, "m.gguf");
    char err[512];
    FILE *f = fopen(path, "wb");
    fputs("old contents", f);
    fclose(f);
    float data[300];
    for (int i = 0; i < 300; i++) data[i] = (float)i;
    int64_t ne[1] = {300};
    const int64_t points[] = {0, 1, 20, 100, 200, 500, 1000};
    for (size_t k = 0; k < KVT_ARRAY_LEN(points); k++) {
        kvt_gguf_writer *w = kvt_gguf_writer_create();
        kvt_gguf_w_str(w, "general.architecture", "llama", 5);
        assert_int_equal(kvt_gguf_w_tensor(w, "t", KVT_TYPE_F32, 1, ne, data, sizeof data), KVT_OK);
        kvt_gguf_test_fail_write_after(points[k]);
        kvt_status st = kvt_gguf_writer_finish(w, path, err, sizeof err);
        kvt_gguf_test_fail_write_after(-1);
        kvt_gguf_writer_free(w);
        assert_int_equal(st, KVT_ERR_IO);
        assert_non_null(strstr(err, "write failed"));
        assert_int_equal(count_files(dir), 1);
        size_t len;
        uint8_t *b = read_all(path, &len);
        assert_int_equal(len, 12);
        assert_memory_equal(b, "old contents", 12);
        free(b);
    }
    /* without the fault it replaces the file */
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    assert_int_equal(kvt_gguf_w_tensor(w, "t", KVT_TYPE_F32, 1, ne, data, sizeof data), KVT_OK);
    assert_int_equal(kvt_gguf_writer_finish(w, path, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);
    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    assert_memory_equal(kvt_gguf_find_tensor(g, "t")->data, data, sizeof data);
    kvt_gguf_free(g);
    assert_int_equal(count_files(dir), 1);
    free(path);
    rm_rf(dir);
    free(dir);
}

/* ------------------------------------------------------------------ malformed files */

static void test_hand_built_valid(void **state) {
    (void)state;
    bb b = {0};
    bb_valid(&b);
    kvt_gguf *g;
    char err[256];
    assert_int_equal(kvt_gguf_open_buffer(b.p, b.n, &g, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_n_tensors(g), 2);
    assert_true(((const float *)kvt_gguf_find_tensor(g, "b")->data)[1] == 17.0f);
    kvt_gguf_free(g);
    /* v2 has the same layout */
    b.p[4] = 2;
    assert_int_equal(kvt_gguf_open_buffer(b.p, b.n, &g, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_version(g), 2);
    kvt_gguf_free(g);
    free(b.p);
}

static void test_truncation_everywhere(void **state) {
    (void)state;
    bb b = {0};
    bb_valid(&b);
    /* every cut inside the header, tensor infos and data must fail cleanly */
    for (size_t cut = 0; cut < b.n; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan catches any over-read */
        memcpy(copy, b.p, cut);
        kvt_gguf *g = NULL;
        char err[256] = "";
        kvt_status st = kvt_gguf_open_buffer(copy, cut, &g, err, sizeof err);
        if (st == KVT_OK) {
            print_error("cut at %zu accepted\n", cut);
            fail();
        }
        assert_true(strlen(err) > 0);
        assert_true(strstr(err, "truncated") || strstr(err, "beyond end of file") || strstr(err, "exceeds"));
        free(copy);
    }
    /* and a real generated model cut at every byte of its header region */
    kvt_gen_model_opts o = {.arch = "qwen2", .shape = "tiny", .type = "q8_0", .byte_vocab = true};
    char *dir = tu_tmpdir("gguf-trunc");
    char *path = path_in(dir, "m.gguf");
    char err[512];
    assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
    size_t len;
    uint8_t *full = read_all(path, &len);
    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open_buffer(full, len, &g, err, sizeof err), KVT_OK);
    uint64_t hdr = kvt_gguf_data_offset(g);
    kvt_gguf_free(g);
    for (size_t cut = 0; cut < hdr + 64; cut++) {
        kvt_status st = kvt_gguf_open_buffer(full, cut, &g, err, sizeof err);
        assert_int_not_equal(st, KVT_OK);
    }
    assert_int_not_equal(kvt_gguf_open_buffer(full, len - 1, &g, err, sizeof err), KVT_OK);
    assert_non_null(strstr(err, "beyond end of file"));
    free(full);
    free(path);
    rm_rf(dir);
    free(dir);
    free(b.p);
}

static void test_malformed_header(void **state) {
    (void)state;
    bb b = {0};
    bb_valid(&b);
    b.p[0] = 'X';
    expect_reject(&b, "bad magic");
    b.n = 0;
    bb_valid(&b);
    b.p[4] = 1;
    expect_reject(&b, "version 1 not supported");
    b.p[4] = 4;
    expect_reject(&b, "version 4 not supported");
    b.p[4] = 0; b.p[7] = 3; /* 0x03000000: a byte-swapped v3 */
    expect_reject(&b, "big-endian GGUF not supported");
    free(b.p);

    /* huge counts must not allocate */
    b = (bb){0};
    bb_header(&b, 3, 0, UINT64_MAX / 2);
    bb_zeros(&b, 64);
    expect_reject(&b, "KV count");
    b.n = 0;
    bb_header(&b, 3, 1ull << 40, 0);
    bb_zeros(&b, 64);
    expect_reject(&b, "tensor count");
    free(b.p);
}

static void test_malformed_kv(void **state) {
    (void)state;
    bb b = {0};
    /* huge key length */
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 62);
    bb_zeros(&b, 16);
    expect_reject(&b, "key length");
    /* key longer than 65535 even though present */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 70000);
    for (int i = 0; i < 70000; i++) bb_u8(&b, 'a');
    bb_u32(&b, KVT_GGUF_U8);
    bb_u8(&b, 1);
    expect_reject(&b, "exceeds 65535");
    /* huge string value length */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, KVT_GGUF_STRING);
    bb_u64(&b, UINT64_MAX - 4);
    bb_zeros(&b, 16);
    expect_reject(&b, "truncated at KV 0");
    /* invalid value type */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_zeros(&b, 16);
    expect_reject(&b, "invalid value type 13");
    /* bool must be 0/1 */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, KVT_GGUF_BOOL);
    bb_u8(&b, 2);
    bb_zeros(&b, 16);
    expect_reject(&b, "invalid bool value 2");
    /* duplicate key */
    b.n = 0;
    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "dup.key", 1);
    bb_kv_u32(&b, "dup.key", 2);
    expect_reject(&b, "duplicate key 'dup.key'");
    /* nested array */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, KVT_GGUF_ARRAY);
    bb_u32(&b, KVT_GGUF_ARRAY);
    bb_u64(&b, 1);
    bb_zeros(&b, 32);
    expect_reject(&b, "nested arrays");
    /* array count beyond the file */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, KVT_GGUF_ARRAY);
    bb_u32(&b, KVT_GGUF_U32);
    bb_u64(&b, 1ull << 61);
    bb_zeros(&b, 32);
    expect_reject(&b, "exceeds file size");
    /* string array count beyond the file (would be a huge offset table) */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, KVT_GGUF_ARRAY);
    bb_u32(&b, KVT_GGUF_STRING);
    bb_u64(&b, 1ull << 50);
    bb_zeros(&b, 32);
    expect_reject(&b, "exceeds file size");
    /* alignment not a power of two, or of the wrong type */
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_reject(&b, "not a power of two");
    b.n = 0;
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, KVT_GGUF_STRING);
    bb_str(&b, "32");
    expect_reject(&b, "must be u32");
    free(b.p);
}

static void test_malformed_tensors(void **state) {
    (void)state;
    bb b = {0};
    int64_t ne[5] = {32, 2, 1, 1, 1};
#define ONE_TENSOR(nd, type, off, databytes) do { b.n = 0; bb_header(&b, 3, 1, 0); \
        bb_tinfo(&b, "w", nd, ne, type, off); bb_pad(&b, 32); bb_zeros(&b, databytes); } while (0)
    ONE_TENSOR(2, KVT_TYPE_F32, 0, 256);
    kvt_gguf *g;
    char err[256];
    assert_int_equal(kvt_gguf_open_buffer(b.p, b.n, &g, err, sizeof err), KVT_OK);
    kvt_gguf_free(g);
    ONE_TENSOR(2, 99, 0, 256);
    expect_reject(&b, "unsupported tensor type 99");
    ONE_TENSOR(2, 4, 0, 256); /* removed Q4_2 */
    expect_reject(&b, "unsupported tensor type 4");
    ONE_TENSOR(2, 31, 0, 256);
    expect_reject(&b, "unsupported tensor type 31");
    ONE_TENSOR(2, KVT_TYPE_BF16X, 0, 256); /* kvtier's internal packed type is not a file type */
    expect_reject(&b, "unsupported tensor type 40");
    ONE_TENSOR(5, KVT_TYPE_F32, 0, 256);
    expect_reject(&b, "n_dims 5");
    ONE_TENSOR(2, KVT_TYPE_F32, 16, 256);
    expect_reject(&b, "not aligned to 32");
    ONE_TENSOR(2, KVT_TYPE_F32, 0, 255);
    expect_reject(&b, "beyond end of file");
    ONE_TENSOR(2, KVT_TYPE_F32, 1ull << 63, 256); /* offset + size overflows */
    expect_reject(&b, "beyond end of file");
    ne[0] = 33;
    ONE_TENSOR(2, KVT_TYPE_Q8_0, 0, 256);
    expect_reject(&b, "not a multiple of the q8_0 block size 32");
    ne[0] = -1;
    ONE_TENSOR(2, KVT_TYPE_F32, 0, 256);
    expect_reject(&b, "negative dimension");
    ne[0] = 1ll << 40; ne[1] = 1ll << 40;
    ONE_TENSOR(2, KVT_TYPE_F32, 0, 256);
    expect_reject(&b, "element count overflows");
    ne[0] = 32; ne[1] = 2;
    /* overlap: two tensors at offsets 0 and 128 but the first is 256 bytes */
    b.n = 0;
    bb_header(&b, 3, 2, 0);
    bb_tinfo(&b, "x", 2, ne, KVT_TYPE_F32, 0);
    bb_tinfo(&b, "y", 2, ne, KVT_TYPE_F32, 128);
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_reject(&b, "overlap");
    /* duplicate tensor name */
    b.n = 0;
    bb_header(&b, 3, 2, 0);
    bb_tinfo(&b, "x", 2, ne, KVT_TYPE_F32, 0);
    bb_tinfo(&b, "x", 2, ne, KVT_TYPE_F32, 256);
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_reject(&b, "duplicate tensor 'x'");
    /* tensor name over 63 bytes */
    b.n = 0;
    bb_header(&b, 3, 1, 0);
    bb_tinfo(&b, "0123456789012345678901234567890123456789012345678901234567890123", 2, ne, KVT_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_reject(&b, "name is 64 bytes");
    /* truncated inside a tensor info names the tensor index and offset */
    b.n = 0;
    bb_header(&b, 3, 2, 0);
    bb_tinfo(&b, "x", 2, ne, KVT_TYPE_F32, 0);
    bb_str(&b, "y");
    bb_u32(&b, 2);
    bb_zeros(&b, 20); /* enough bytes for the count check, not for the info */
    expect_reject(&b, "truncated at tensor info 1 (offset");
#undef ONE_TENSOR
    free(b.p);
}

static void test_open_errors(void **state) {
    (void)state;
    kvt_gguf *g;
    char err[512];
    assert_int_equal(kvt_gguf_open("/nonexistent/model.gguf", &g, err, sizeof err), KVT_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    assert_int_equal(kvt_gguf_open("/tmp", &g, err, sizeof err), KVT_ERR_IO);
    char *dir = tu_tmpdir("gguf-open");
    char *path = path_in(dir, "small.gguf");
    FILE *f = fopen(path, "wb");
    fputs("GGUF", f);
    fclose(f);
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_ERR_FORMAT);
    assert_non_null(strstr(err, "small.gguf: truncated header"));
    free(path);
    rm_rf(dir);
    free(dir);
}

/* Files written by ggml's own writer (the repository's data/vocab GGUFs) read correctly. */
static void test_read_ggml_vocab_files(void **state) {
    (void)state;
    char path[1024], err[512];
    tu_vocab_path(path, sizeof path, "ggml-vocab-gpt-2.gguf", ""); /* missing fails */
    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    uint64_t n;
    kvt_gguf_vtype et;
    assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL));
    assert_int_equal(et, KVT_GGUF_STRING);
    assert_int_equal(n, 50257);
    const char *s;
    uint64_t len;
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 0, &s, &len));
    assert_int_equal(len, 1);
    assert_int_equal(s[0], '!');
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 50256, &s, &len));
    assert_int_equal(len, 13);
    assert_memory_equal(s, "<|endoftext|>", 13);
    assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, NULL));
    assert_int_equal(n, 50000);
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.merges", 0, &s, &len));
    assert_non_null(memchr(s, ' ', len));
    kvt_gguf_free(g);
    tu_vocab_path(path, sizeof path, "ggml-vocab-llama-spm.gguf", "");
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, NULL));
    assert_int_equal(et, KVT_GGUF_F32);
    assert_int_equal(n, 32000);
    float f;
    assert_true(kvt_gguf_get_arr_f32(g, "tokenizer.ggml.scores", 31999, &f));
    uint32_t bos;
    assert_true(kvt_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
    assert_int_equal(bos, 1);
    kvt_gguf_free(g);
}

/* Random byte flips over a small valid file never crash; accepted files are fully walkable. */
static void test_fuzz_byte_flips(void **state) {
    (void)state;
    kvt_gguf_writer *w = kvt_gguf_writer_create();
    kvt_gguf_w_str(w, "general.architecture", "llama", 5);
    kvt_gguf_w_u32(w, "llama.block_count", 2);
    const char *strs[3] = {"a", "bc", "def"};
    kvt_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, 3);
    int32_t ids[3] = {1, 2, 3};
    kvt_gguf_w_arr(w, "tokenizer.ggml.token_type", KVT_GGUF_I32, ids, 3);
    float data[64];
    for (int i = 0; i < 64; i++) data[i] = (float)i;
    int64_t ne1[2] = {32, 2}, ne2[1] = {32};
    uint8_t q8[68];
    kvt_quantize_ref(KVT_TYPE_Q8_0, data, q8, 64);
    kvt_gguf_w_tensor(w, "w", KVT_TYPE_Q8_0, 2, ne1, q8, sizeof q8);
    kvt_gguf_w_tensor(w, "n", KVT_TYPE_F32, 1, ne2, data, 128);
    char *dir = tu_tmpdir("gguf-fuzz");
    char *path = path_in(dir, "f.gguf");
    char err[512];
    assert_int_equal(kvt_gguf_writer_finish(w, path, err, sizeof err), KVT_OK);
    kvt_gguf_writer_free(w);
    size_t len;
    uint8_t *orig = read_all(path, &len);
    uint8_t *buf = malloc(len);
    uint64_t seed = 12345;
    int accepted = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, orig, len);
        int flips = 1 + (int)(tu_rand(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tu_rand(&seed) % len);
            if (tu_rand(&seed) & 1) buf[at] ^= (uint8_t)(1u << (tu_rand(&seed) % 8));
            else buf[at] = (uint8_t)tu_rand(&seed);
        }
        size_t n = (tu_rand(&seed) % 8 == 0) ? (size_t)(tu_rand(&seed) % len) : len;
        kvt_gguf *g = NULL;
        if (kvt_gguf_open_buffer(buf, n, &g, err, sizeof err) != KVT_OK) {
            assert_null(g);
            continue;
        }
        accepted++;
        volatile uint64_t sink = 0;
        for (int64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
            const char *key = kvt_gguf_key_name(g, i);
            const char *s;
            uint64_t sl, an;
            kvt_gguf_vtype et;
            const void *d;
            if (kvt_gguf_get_str(g, key, &s, &sl) && sl) sink += (uint8_t)s[sl - 1];
            if (kvt_gguf_get_arr(g, key, &et, &an, &d))
                for (uint64_t j = 0; j < an && j < 16; j++) {
                    int64_t v;
                    float f;
                    if (kvt_gguf_get_arr_str(g, key, j, &s, &sl) && sl) sink += (uint8_t)s[sl - 1];
                    if (kvt_gguf_get_arr_i64(g, key, j, &v)) sink += (uint64_t)v;
                    if (kvt_gguf_get_arr_f32(g, key, j, &f)) sink += (uint64_t)(f != 0);
                }
        }
        for (int64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
            const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
            if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        (void)sink;
        kvt_gguf_free(g);
    }
    /* some mutations (in tensor data or string bytes) stay valid: the loop did exercise the walk */
    assert_true(accepted > 50);
    free(buf);
    free(orig);

    /* second pass: flips confined to the header region of a generated model (every KV kind,
     * 36 tensor infos), mutated in place and restored */
    kvt_gen_model_opts o = {.arch = "qwen3", .shape = "tiny", .type = "q4_0", .byte_vocab = true};
    assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
    orig = read_all(path, &len);
    kvt_gguf *g0;
    assert_int_equal(kvt_gguf_open_buffer(orig, len, &g0, err, sizeof err), KVT_OK);
    size_t hdr = (size_t)kvt_gguf_data_offset(g0);
    kvt_gguf_free(g0);
    for (int it = 0; it < 1000; it++) {
        size_t at[3];
        uint8_t old[3];
        for (int k = 0; k < 3; k++) {
            at[k] = (size_t)(tu_rand(&seed) % hdr);
            old[k] = orig[at[k]];
        }
        for (int k = 0; k < 3; k++) orig[at[k]] ^= (uint8_t)(1 + tu_rand(&seed) % 255);
        kvt_gguf *g = NULL;
        if (kvt_gguf_open_buffer(orig, len, &g, err, sizeof err) == KVT_OK) {
            volatile uint8_t sink = 0; /* touch the last byte of every tensor: ASan checks bounds */
            for (int64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
                const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
                if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
                assert_true((const uint8_t *)t->data + t->nbytes <= orig + len);
            }
            (void)sink;
            kvt_gguf_free(g);
        } else {
            assert_null(g);
            assert_null(strchr(err, '\n'));
        }
        for (int k = 2; k >= 0; k--) orig[at[k]] = old[k];
    }
    free(orig);
    free(path);
    rm_rf(dir);
    free(dir);
}

/* ------------------------------------------------------------------ gen-model */

typedef struct expect_t { const char *name; int64_t ne0, ne1; } expect_t;

static void check_tensor(const kvt_gguf *g, const char *name, int64_t ne0, int64_t ne1, int want_type) {
    const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
    if (!t) {
        print_error("missing tensor %s\n", name);
        fail();
    }
    assert_int_equal(t->ne[0], ne0);
    assert_int_equal(t->ne[1], ne1);
    if (want_type >= 0) assert_int_equal(t->type, (uint32_t)want_type);
}

static uint32_t u32key(const kvt_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    uint32_t v = 0;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!kvt_gguf_get_u32(g, key, &v)) {
        print_error("missing key %s\n", key);
        fail();
    }
    return v;
}

static void test_gen_tiny_each_arch(void **state) {
    (void)state;
    const char *archs[4] = {"llama", "qwen2", "qwen3", "gemma3"};
    const char *types[2] = {"f16", "q8_0"};
    char *dir = tu_tmpdir("gguf-gen");
    char *path = path_in(dir, "m.gguf");
    char vocab[1024];
    tu_vocab_path(vocab, sizeof vocab, "ggml-vocab-gpt-2.gguf", "");
    for (int ai = 0; ai < 4; ai++) {
        for (int ti = 0; ti < 2; ti++) {
            const char *arch = archs[ai];
            kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = types[ti], .seed = 1};
            /* the real vocab once per arch (f16); byte vocab otherwise (faster) */
            if (ti == 0) o.vocab_path = vocab;
            else o.byte_vocab = true;
            char err[512];
            assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
            kvt_gguf *g;
            assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
            const char *s;
            uint64_t len;
            assert_true(kvt_gguf_get_str(g, "general.architecture", &s, &len));
            assert_int_equal(len, strlen(arch));
            assert_memory_equal(s, arch, len);
            uint32_t qv;
            assert_true(kvt_gguf_get_u32(g, "general.quantization_version", &qv));
            assert_int_equal(qv, 2);
            uint64_t n_vocab;
            assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n_vocab, NULL));
            if (o.byte_vocab) assert_int_equal(n_vocab, 256);
            else assert_int_equal(n_vocab, 50257);
            assert_true(kvt_gguf_get_str(g, "tokenizer.ggml.model", &s, &len));
            assert_memory_equal(s, "gpt2", 4);
            assert_true(kvt_gguf_get_str(g, "tokenizer.chat_template", &s, &len));
            const char *marker = ai == 3 ? "<start_of_turn>" : "<|im_start|>";
            char *tmpl = strndup(s, len);
            assert_non_null(strstr(tmpl, marker));
            free(tmpl);
            uint32_t n_embd = u32key(g, arch, "embedding_length"), n_layer = u32key(g, arch, "block_count");
            uint32_t n_head = u32key(g, arch, "attention.head_count"), n_kv = u32key(g, arch, "attention.head_count_kv");
            uint32_t hd = u32key(g, arch, "attention.key_length"), n_ff = u32key(g, arch, "feed_forward_length");
            assert_int_equal(u32key(g, arch, "rope.dimension_count"), hd);
            assert_int_equal(u32key(g, arch, "context_length"), 2048);
            assert_int_equal(n_embd, 64);
            char key[128];
            float eps;
            snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
            assert_true(kvt_gguf_get_f32(g, key, &eps));
            if (ai == 3) {
                assert_true(n_layer >= 6);
                assert_int_equal(u32key(g, arch, "attention.sliding_window"), 32);
            }
            if (ai >= 2) assert_int_not_equal(n_head * hd, n_embd); /* exercises head_dim != n_embd/n_head */
            int wt = ti == 0 ? KVT_TYPE_F16 : KVT_TYPE_Q8_0;
            check_tensor(g, "token_embd.weight", n_embd, (int64_t)n_vocab, wt);
            check_tensor(g, "output_norm.weight", n_embd, 1, KVT_TYPE_F32);
            if (ai == 0) check_tensor(g, "output.weight", n_embd, (int64_t)n_vocab, wt);
            else assert_null(kvt_gguf_find_tensor(g, "output.weight"));
            int64_t n_expect = 2 + (ai == 0); /* token_embd, output_norm (+ output) */
            for (uint32_t il = 0; il < n_layer; il++) {
                char tn[96];
#define CT(x, a, b2, t) do { snprintf(tn, sizeof tn, "blk.%u." x, il); check_tensor(g, tn, a, b2, t); n_expect++; } while (0)
                CT("attn_norm.weight", n_embd, 1, KVT_TYPE_F32);
                CT("attn_q.weight", n_embd, n_head * hd, wt);
                CT("attn_k.weight", n_embd, n_kv * hd, wt);
                CT("attn_v.weight", n_embd, n_kv * hd, wt);
                CT("attn_output.weight", n_head * hd, n_embd, wt);
                CT("ffn_norm.weight", n_embd, 1, KVT_TYPE_F32);
                CT("ffn_gate.weight", n_embd, n_ff, wt);
                CT("ffn_up.weight", n_embd, n_ff, wt);
                CT("ffn_down.weight", n_ff, n_embd, wt);
                if (ai == 1) {
                    CT("attn_q.bias", n_head * hd, 1, KVT_TYPE_F32);
                    CT("attn_k.bias", n_kv * hd, 1, KVT_TYPE_F32);
                    CT("attn_v.bias", n_kv * hd, 1, KVT_TYPE_F32);
                }
                if (ai >= 2) {
                    CT("attn_q_norm.weight", hd, 1, KVT_TYPE_F32);
                    CT("attn_k_norm.weight", hd, 1, KVT_TYPE_F32);
                }
                if (ai == 3) {
                    CT("post_attention_norm.weight", n_embd, 1, KVT_TYPE_F32);
                    CT("post_ffw_norm.weight", n_embd, 1, KVT_TYPE_F32);
                }
#undef CT
            }
            assert_int_equal(kvt_gguf_n_tensors(g), n_expect);
            /* realistic scales: norms near 1, projections small and not all zero */
            const float *nw = kvt_gguf_find_tensor(g, "blk.0.attn_norm.weight")->data;
            for (uint32_t i = 0; i < n_embd; i++) assert_true(fabsf(nw[i] - 1.0f) <= 0.06f);
            if (ti == 0) {
                const uint16_t *q = kvt_gguf_find_tensor(g, "blk.0.attn_q.weight")->data;
                double ss = 0;
                for (uint32_t i = 0; i < n_embd * n_head * hd; i++) {
                    float x = kvt_f16_to_f32(q[i]);
                    assert_true(fabsf(x) < 0.035f);
                    ss += (double)x * x;
                }
                double sd = sqrt(ss / (n_embd * n_head * hd));
                assert_true(sd > 0.017 && sd < 0.023);
            }
            kvt_gguf_free(g);
        }
    }
    free(path);
    rm_rf(dir);
    free(dir);
}

static void test_gen_determinism(void **state) {
    (void)state;
    char *dir = tu_tmpdir("gguf-det");
    char *p1 = path_in(dir, "a.gguf"), *p2 = path_in(dir, "b.gguf"), *p3 = path_in(dir, "c.gguf");
    char err[512];
    kvt_gen_model_opts o = {.arch = "gemma3", .shape = "tiny", .type = "q4_0", .seed = 42, .byte_vocab = true};
    assert_int_equal(kvt_gen_model(&o, p1, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gen_model(&o, p2, err, sizeof err), KVT_OK);
    o.seed = 43;
    assert_int_equal(kvt_gen_model(&o, p3, err, sizeof err), KVT_OK);
    size_t l1, l2, l3;
    uint8_t *a = read_all(p1, &l1), *b = read_all(p2, &l2), *c = read_all(p3, &l3);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    assert_int_equal(l1, l3); /* same shape, different weights */
    assert_true(memcmp(a, c, l1) != 0);
    free(a); free(b); free(c);
    free(p1); free(p2); free(p3);
    rm_rf(dir);
    free(dir);
}

static void test_gen_types_and_fallback(void **state) {
    (void)state;
    /* llama-quantize fallback rules */
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q4_K, 2048), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q4_K, 1152), KVT_TYPE_Q5_0);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q4_K, 576), KVT_TYPE_Q5_0);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q4_K, 40), KVT_TYPE_F16);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q6_K, 896), KVT_TYPE_Q8_0);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q8_0, 64), KVT_TYPE_Q8_0);
    assert_int_equal(kvt_gen_model_pick_type(KVT_TYPE_Q8_0, 48), KVT_TYPE_F16);
    /* llama3 rope factors: 1 at high frequency, `factor` at low frequency, monotone between */
    float prev = 0;
    for (uint32_t i = 0; i < 32; i++) {
        float f = kvt_gen_model_llama3_factor(500000.0f, 64, i);
        assert_true(f >= prev && f >= 1.0f && f <= 32.0f);
        prev = f;
    }
    assert_true(kvt_gen_model_llama3_factor(500000.0f, 64, 0) == 1.0f);
    assert_true(kvt_gen_model_llama3_factor(500000.0f, 64, 31) == 32.0f);

    char *dir = tu_tmpdir("gguf-types");
    char *path = path_in(dir, "m.gguf");
    char err[512];
    const char *types[6] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k"};
    const uint32_t want[6] = {KVT_TYPE_F32, KVT_TYPE_F16, KVT_TYPE_BF16, KVT_TYPE_Q8_0, KVT_TYPE_Q4_0, KVT_TYPE_Q5_0};
    for (int i = 0; i < 6; i++) {
        kvt_gen_model_opts o = {.arch = "llama", .shape = "tiny", .type = types[i], .byte_vocab = true};
        assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
        kvt_gguf *g;
        assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
        const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "blk.1.ffn_down.weight");
        assert_int_equal(t->type, want[i]);
        /* dequantized values stay within the generator's range */
        float row[128];
        kvt_dequant_ref(t->type, t->data, row, 128);
        for (int k = 0; k < 128; k++) assert_true(fabsf(row[k]) < 0.04f);
        assert_int_equal(kvt_gguf_find_tensor(g, "blk.1.ffn_norm.weight")->type, KVT_TYPE_F32);
        kvt_gguf_free(g);
    }
    /* bad options */
    kvt_gen_model_opts bad = {.shape = "huge"};
    assert_int_equal(kvt_gen_model(&bad, path, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "unknown shape 'huge'"));
    bad = (kvt_gen_model_opts){.arch = "gpt2"};
    assert_int_equal(kvt_gen_model(&bad, path, err, sizeof err), KVT_ERR_INVALID_ARG);
    bad = (kvt_gen_model_opts){.type = "q3_k"};
    assert_int_equal(kvt_gen_model(&bad, path, err, sizeof err), KVT_ERR_INVALID_ARG);
    bad = (kvt_gen_model_opts){.vocab_path = "/nonexistent/vocab.gguf"};
    assert_int_equal(kvt_gen_model(&bad, path, err, sizeof err), KVT_ERR_IO);
    free(path);
    rm_rf(dir);
    free(dir);
}

/* --k-outliers F: the attn_k rows of each KV head's lowest-frequency RoPE pair (llama: dims hd-2 and
 * hd-1; NeoX archs: hd/2-1 and hd-1) are F times the same rows without the option, every other
 * tensor and row is unchanged; 1 and deepseek2 are refused. */
static void check_k_outliers(const char *arch, bool neox) {
    char *dir = tu_tmpdir("gguf-kout");
    char *p1 = path_in(dir, "a.gguf"), *p2 = path_in(dir, "b.gguf");
    char err[512];
    kvt_gen_model_opts o = {.arch = arch, .shape = "tiny", .type = "f32", .byte_vocab = true};
    assert_int_equal(kvt_gen_model(&o, p1, err, sizeof err), KVT_OK);
    o.k_outliers = 8;
    assert_int_equal(kvt_gen_model(&o, p2, err, sizeof err), KVT_OK);
    kvt_gguf *a, *b;
    assert_int_equal(kvt_gguf_open(p1, &a, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_open(p2, &b, err, sizeof err), KVT_OK);
    int scaled = 0;
    for (int64_t i = 0; i < kvt_gguf_n_tensors(a); i++) {
        const kvt_gguf_tensor *ta = kvt_gguf_tensor_at(a, i), *tb = kvt_gguf_find_tensor(b, ta->name);
        assert_non_null(tb);
        assert_int_equal(ta->nbytes, tb->nbytes);
        const size_t len = strlen(ta->name);
        if (len < 13 || strcmp(ta->name + len - 13, "attn_k.weight")) {
            assert_memory_equal(ta->data, tb->data, ta->nbytes);
            continue;
        }
        const int64_t n0 = ta->ne[0], rows = ta->ne[1];
        char key[96];
        snprintf(key, sizeof key, "%s.attention.key_length", arch);
        uint32_t hdk = 0;
        assert_true(kvt_gguf_get_u32(a, key, &hdk));
        assert_true(hdk > 0 && rows % hdk == 0);
        for (int64_t r = 0; r < rows; r++) {
            const uint32_t d = (uint32_t)(r % hdk);
            const bool out = neox ? (d == hdk / 2 - 1 || d == hdk - 1) : (d == hdk - 2 || d == hdk - 1);
            const float *ra = (const float *)ta->data + r * n0, *rb = (const float *)tb->data + r * n0;
            for (int64_t k = 0; k < n0; k++) assert_true(rb[k] == ra[k] * (out ? 8.0f : 1.0f));
            scaled += out;
        }
    }
    assert_true(scaled > 0);
    kvt_gguf_free(a), kvt_gguf_free(b);
    free(p1), free(p2);
    rm_rf(dir);
    free(dir);
}

static void test_gen_k_outliers(void **state) {
    (void)state;
    check_k_outliers("llama", false);
    check_k_outliers("qwen3", true);
    char err[512];
    kvt_gen_model_opts bad = {.shape = "tiny", .byte_vocab = true, .k_outliers = 1};
    assert_int_equal(kvt_gen_model(&bad, "/tmp/kvt-never.gguf", err, sizeof err), KVT_ERR_INVALID_ARG);
    bad = (kvt_gen_model_opts){.arch = "deepseek2", .shape = "tiny", .byte_vocab = true, .k_outliers = 4};
    assert_int_equal(kvt_gen_model(&bad, "/tmp/kvt-never.gguf", err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "deepseek2"));
}

static void test_gen_byte_vocab(void **state) {
    (void)state;
    char *dir = tu_tmpdir("gguf-bv");
    char *path = path_in(dir, "m.gguf");
    char err[512];
    kvt_gen_model_opts o = {.arch = "qwen3", .byte_vocab = true};
    assert_int_equal(kvt_gen_model(&o, path, err, sizeof err), KVT_OK);
    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    const char *s;
    uint64_t len;
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 0x20, &s, &len));
    assert_int_equal(len, 2);
    assert_memory_equal(s, "\xc4\xa0", 2); /* U+0120 'Ġ' */
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 'A', &s, &len));
    assert_int_equal(len, 1);
    assert_int_equal(s[0], 'A');
    assert_true(kvt_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 0x0a, &s, &len));
    assert_memory_equal(s, "\xc4\x8a", 2); /* U+010A 'Ċ' */
    uint64_t n;
    kvt_gguf_vtype et;
    assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, NULL));
    assert_int_equal(et, KVT_GGUF_STRING);
    assert_int_equal(n, 0);
    check_tensor(g, "token_embd.weight", 64, 256, KVT_TYPE_F16);
    kvt_gguf_free(g);
    free(path);
    rm_rf(dir);
    free(dir);
}

/* Without --vocab, gen-model embeds the repository's data/vocab GPT-2 vocabulary, found from the
 * executable's location (not the working directory); an explicit $KVT_VOCAB_DIR without the file
 * is an error naming it, never a silent byte-vocabulary fallback. */
static void test_gen_default_vocab(void **state) {
    (void)state;
    char *dir = tu_tmpdir("gguf-dv");
    char *path = path_in(dir, "m.gguf");
    char err[512], cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0); /* the lookup must not depend on the working directory */
    unsetenv("KVT_VOCAB_DIR");
    kvt_gen_model_opts o = {.arch = "llama", .type = "q8_0"};
    kvt_status st = kvt_gen_model(&o, path, err, sizeof err);
    assert_int_equal(chdir(cwd), 0);
    if (st != KVT_OK) fail_msg("gen-model default vocab: %s", err);
    kvt_gguf *g;
    assert_int_equal(kvt_gguf_open(path, &g, err, sizeof err), KVT_OK);
    uint64_t n;
    assert_true(kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n, NULL));
    assert_int_equal(n, 50257);
    uint32_t bos, eos;
    assert_true(kvt_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
    assert_true(kvt_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos));
    assert_int_equal(eos, 50256);
    kvt_gguf_free(g);
    /* $KVT_VOCAB_DIR is taken as given: an empty folder there is a clear error */
    setenv("KVT_VOCAB_DIR", dir, 1);
    char *p2 = path_in(dir, "none.gguf");
    assert_int_equal(kvt_gen_model(&o, p2, err, sizeof err), KVT_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "KVT_VOCAB_DIR"));
    assert_int_equal(access(p2, F_OK), -1);
    unsetenv("KVT_VOCAB_DIR");
    free(p2);
    free(path);
    rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_fault_injection),
        cmocka_unit_test(test_hand_built_valid),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_malformed_header),
        cmocka_unit_test(test_malformed_kv),
        cmocka_unit_test(test_malformed_tensors),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_read_ggml_vocab_files),
        cmocka_unit_test(test_fuzz_byte_flips),
        cmocka_unit_test(test_gen_tiny_each_arch),
        cmocka_unit_test(test_gen_determinism),
        cmocka_unit_test(test_gen_types_and_fallback),
        cmocka_unit_test(test_gen_k_outliers), cmocka_unit_test(test_gen_byte_vocab),
        cmocka_unit_test(test_gen_default_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
