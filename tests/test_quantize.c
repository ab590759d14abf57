/* test_quantize.c — `kvtier quantize` (model/quantize.h): llama-quantize's per-tensor type rules,
 * the converted bytes against the reference quantizer, metadata kept, the requantize guard, hostile
 * inputs, a failing disk and a symlinked output. */
#include "testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "model/gen_model.h"
#include "model/quantize.h"

static void rm_dir(char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

/* a qwen3moe tiny model (rows of 256: the k-quants apply as such; 3-D expert tensors; a router) */
static void make_model(const char *path, const char *type) {
    kvt_gen_model_opts mo = {.arch = "qwen3moe", .shape = "tiny", .type = type, .seed = 11, .byte_vocab = true};
    char err[512] = "";
    assert_int_equal(kvt_gen_model(&mo, path, err, sizeof err), KVT_OK);
}

static kvt_status quantize(const char *in, const char *out, const char *type, bool requant, kvt_quantize_result *r,
                           char *err, size_t errlen) {
    kvt_quantize_opts o = {.type = type, .allow_requantize = requant};
    return kvt_quantize_model(&o, in, out, r, err, errlen);
}

static void test_type_rules(void **st) {
    (void)st;
    /* q4_k_m over 32 layers: output in q6_k; attn_v / ffn_down in q6_k on layers < 4, >= 28 and
     * every third from 4 (6, 9, ...); everything else q4_k */
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "output.weight", 2, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "token_embd.weight", 2, 4096, 32), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.0.attn_v.weight", 2, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.3.ffn_down.weight", 2, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.4.attn_v.weight", 2, 4096, 32), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.5.attn_v.weight", 2, 4096, 32), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.6.attn_v.weight", 2, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.9.ffn_down_exps.weight", 3, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.28.ffn_down.weight", 2, 4096, 32), KVT_TYPE_Q6_K);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "blk.6.attn_q.weight", 2, 4096, 32), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_quantize_tensor_type("q5_k_m", "blk.7.attn_k.weight", 2, 4096, 32), KVT_TYPE_Q5_K);
    /* a plain type has no mix rule */
    assert_int_equal(kvt_quantize_tensor_type("q4_k", "output.weight", 2, 4096, 32), KVT_TYPE_Q4_K);
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "blk.0.attn_v.weight", 2, 4096, 32), KVT_TYPE_Q8_0);
    /* rows not a multiple of 256: llama-quantize's fallback */
    assert_int_equal(kvt_quantize_tensor_type("q4_k", "blk.0.attn_q.weight", 2, 384, 8), KVT_TYPE_Q5_0);
    assert_int_equal(kvt_quantize_tensor_type("q4_k_m", "output.weight", 2, 384, 8), KVT_TYPE_Q8_0);
    assert_int_equal(kvt_quantize_tensor_type("q6_k", "blk.0.attn_q.weight", 2, 40, 8), KVT_TYPE_F16);
    /* not converted: 1-D, routers, recurrent parameters, RoPE tables, non-weights, unknown type */
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "blk.0.attn_norm.weight", 1, 4096, 32), UINT32_MAX);
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "blk.0.ffn_gate_inp.weight", 2, 4096, 32), UINT32_MAX);
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "blk.0.ssm_out.weight", 2, 4096, 32), UINT32_MAX);
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "rope_freqs.weight", 2, 64, 32), UINT32_MAX);
    assert_int_equal(kvt_quantize_tensor_type("q8_0", "blk.0.attn_q.bias", 2, 4096, 32), UINT32_MAX);
    assert_int_equal(kvt_quantize_tensor_type("q3_k", "blk.0.attn_q.weight", 2, 4096, 32), UINT32_MAX);
}

/* every converted tensor holds exactly kvt_quantize_ref of the dequantized source rows; unconverted
 * tensors and every metadata key are kept; general.file_type names the result */
static void test_bytes_and_metadata(void **st) {
    (void)st;
    char *dir = tu_tmpdir("quant");
    char in[600], out[600], err[512] = "";
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    make_model(in, "f16");
    kvt_quantize_result r;
    assert_int_equal(quantize(in, out, "q4_k_m", false, &r, err, sizeof err), KVT_OK);
    kvt_gguf *a = NULL, *b = NULL;
    assert_int_equal(kvt_gguf_open(in, &a, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_open(out, &b, err, sizeof err), KVT_OK);
    assert_int_equal(kvt_gguf_n_tensors(a), kvt_gguf_n_tensors(b));
    assert_int_equal(r.n_tensors, (uint64_t)kvt_gguf_n_tensors(a));
    uint32_t n_layer = 0, ft = 0;
    assert_true(kvt_gguf_get_u32(a, "qwen3moe.block_count", &n_layer));
    assert_true(kvt_gguf_get_u32(b, "general.file_type", &ft));
    assert_int_equal(ft, 15); /* llama.cpp's MOSTLY_Q4_K_M */
    assert_int_equal(r.ftype, 15);
    uint64_t converted = 0, q4k = 0, q6k = 0, kept_3d = 0;
    for (int64_t i = 0; i < kvt_gguf_n_tensors(a); i++) {
        const kvt_gguf_tensor *s = kvt_gguf_tensor_at(a, i), *d = kvt_gguf_find_tensor(b, s->name);
        assert_non_null(d);
        for (int k = 0; k < 4; k++) assert_int_equal(s->ne[k], d->ne[k]);
        const uint32_t want = kvt_quantize_tensor_type("q4_k_m", s->name, s->n_dims, s->ne[0], n_layer);
        if (want == UINT32_MAX) {
            assert_int_equal(d->type, s->type);
            assert_int_equal(d->nbytes, s->nbytes);
            assert_memory_equal(d->data, s->data, s->nbytes);
            if (strstr(s->name, "ffn_gate_inp")) assert_int_equal(d->type, KVT_TYPE_F32);
            continue;
        }
        converted++;
        q4k += d->type == KVT_TYPE_Q4_K;
        q6k += d->type == KVT_TYPE_Q6_K;
        kept_3d += s->n_dims == 3;
        assert_int_equal(d->type, want);
        const int64_t n0 = s->ne[0], rows = s->ne[1] * s->ne[2] * s->ne[3];
        const uint64_t irb = kvt_type_row_bytes(s->type, (uint64_t)n0), orb = kvt_type_row_bytes(want, (uint64_t)n0);
        float *row = malloc((size_t)n0 * sizeof *row);
        uint8_t *q = malloc(orb);
        for (int64_t rr = 0; rr < rows; rr++) {
            kvt_dequant_ref(s->type, (const uint8_t *)s->data + rr * irb, row, n0);
            kvt_quantize_ref(want, row, q, n0);
            assert_memory_equal(q, (const uint8_t *)d->data + rr * orb, orb);
        }
        free(row);
        free(q);
    }
    assert_int_equal(converted, r.n_converted);
    assert_true(q4k > 0 && q6k > 0 && kept_3d > 0);
    /* metadata: every input key is in the output with the same type (values: a few read back) */
    for (int64_t i = 0; i < kvt_gguf_n_kv(a); i++) {
        const char *key = kvt_gguf_key_name(a, i);
        const int64_t j = kvt_gguf_find_key(b, key);
        assert_true(j >= 0);
        assert_int_equal(kvt_gguf_key_type(a, i), kvt_gguf_key_type(b, j));
    }
    const char *s1, *s2;
    uint64_t l1, l2;
    assert_true(kvt_gguf_get_str(a, "general.architecture", &s1, &l1));
    assert_true(kvt_gguf_get_str(b, "general.architecture", &s2, &l2));
    assert_int_equal(l1, l2);
    assert_memory_equal(s1, s2, l1);
    assert_true(r.bytes_out < r.bytes_in);
    kvt_gguf_free(a);
    kvt_gguf_free(b);
    rm_dir(dir);
}

/* a quantized input is refused unless asked for; a same-type tensor is copied as it is */
static void test_requantize_guard(void **st) {
    (void)st;
    char *dir = tu_tmpdir("quant");
    char in[600], out[600], out2[600], err[512] = "";
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/q4.gguf", dir);
    snprintf(out2, sizeof out2, "%s/q8.gguf", dir);
    make_model(in, "q8_0");
    assert_int_equal(quantize(in, out, "q4_0", false, NULL, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--allow-requantize"));
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(quantize(in, out, "q4_0", true, NULL, err, sizeof err), KVT_OK);
    kvt_quantize_result r;
    assert_int_equal(quantize(in, out2, "q8_0", false, &r, err, sizeof err), KVT_OK); /* nothing to convert */
    assert_int_equal(r.n_converted, 0);
    rm_dir(dir);
}

/* hostile or missing inputs and bad options: an error naming the problem, no output file */
static void test_bad_inputs(void **st) {
    (void)st;
    char *dir = tu_tmpdir("quant");
    char in[600], out[600], junk[600], err[512] = "";
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    snprintf(junk, sizeof junk, "%s/junk.gguf", dir);
    assert_int_equal(quantize(in, out, "q8_0", false, NULL, err, sizeof err), KVT_ERR_IO); /* missing */
    FILE *f = fopen(junk, "wb");
    fputs("GGUF\3\0\0\0 this is not a model", f);
    fclose(f);
    kvt_status s = quantize(junk, out, "q8_0", false, NULL, err, sizeof err);
    assert_true(s == KVT_ERR_FORMAT || s == KVT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "junk.gguf"));
    make_model(in, "f16");
    /* truncated copies of a good file, at a few cuts */
    struct stat sb;
    assert_int_equal(stat(in, &sb), 0);
    FILE *src = fopen(in, "rb");
    uint8_t *buf = malloc((size_t)sb.st_size);
    assert_int_equal(fread(buf, 1, (size_t)sb.st_size, src), (size_t)sb.st_size);
    fclose(src);
    const off_t cuts[] = {4, 24, 300, sb.st_size / 2, sb.st_size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        f = fopen(junk, "wb");
        fwrite(buf, 1, (size_t)cuts[i], f);
        fclose(f);
        s = quantize(junk, out, "q4_k", false, NULL, err, sizeof err);
        assert_true(s == KVT_ERR_FORMAT || s == KVT_ERR_UNSUPPORTED);
    }
    free(buf);
    assert_int_equal(quantize(in, out, "q3_k", false, NULL, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_int_equal(quantize(in, out, NULL, false, NULL, err, sizeof err), KVT_ERR_INVALID_ARG);
    assert_int_equal(access(out, F_OK), -1);
    rm_dir(dir);
}

/* a disk that fails mid-write leaves neither the output nor a temporary file; an output path that
 * is a symlink is replaced, never written through */
static void test_failing_disk_and_symlink(void **st) {
    (void)st;
    char *dir = tu_tmpdir("quant");
    char in[600], out[600], victim[600], err[512] = "";
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    make_model(in, "f16");
    kvt_gguf_test_fail_write_after(4096);
    assert_int_equal(quantize(in, out, "q8_0", false, NULL, err, sizeof err), KVT_ERR_IO);
    kvt_gguf_test_fail_write_after(-1);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", dir); /* in.gguf alone */
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(victim, "w");
    fputs("keep", f);
    fclose(f);
    assert_int_equal(symlink(victim, out), 0);
    assert_int_equal(quantize(in, out, "q8_0", false, NULL, err, sizeof err), KVT_OK);
    struct stat sb;
    assert_int_equal(lstat(out, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(stat(victim, &sb), 0);
    assert_int_equal(sb.st_size, 4);
    rm_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_rules),     cmocka_unit_test(test_bytes_and_metadata),
        cmocka_unit_test(test_requantize_guard), cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_failing_disk_and_symlink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
