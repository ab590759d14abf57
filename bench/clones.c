/* clones.c — RAM-tier sharing benchmark: peak memory with K concurrent sequences cloned from one
 * cached donor vs one.
 *
 * Builds a D-token sequence (default 4096, seeded random ids) on the given model with f16 KV, puts
 * it into the prompt cache (the RAM tier), drops the donor, then for K = 1 and K = 8: takes K
 * sequences from the cache for the donor's prompt (each shares the donor's sealed blocks and copies
 * at most one partial block), decodes a few tokens on each round-robin while all K are alive, and
 * records the block pool's bytes and the process's VmRSS at that point. A private (unshared) copy
 * would cost D x bytes/token per sequence; the report gives both.
 *
 * Usage: bench-clones -m MODEL.gguf [-d 4096] [-k 8] [-n 4] [-t 2] [--json]
 * Built by bench/run-all: cc -O2 -Isrc bench/clones.c build/libkvtier.a <libs>.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prompt_cache.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "model/model.h"

/* VmRSS / VmHWM from /proc/self/status, in bytes (0 if unavailable) */
static uint64_t proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

static void fill_prompt(int32_t *ids, uint32_t n, uint32_t n_vocab, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
    for (uint32_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(n_vocab > 512 ? 256 + s % (n_vocab - 512) : s % n_vocab);
    }
}

static int32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

typedef struct measure {
    uint32_t k;
    uint64_t pool_bytes, rss, cache_bytes;
    double ms;
} measure;

/* The RAM tier's lookup (plan, take) over the prompt's chain. */
static kvt_status take_prompt(kvt_prompt_cache *pc, kvt_block_pool *pool, const int32_t *prompt, uint32_t n, uint64_t root,
                              kvt_seq **out, uint32_t *n_reused) {
    kvt_chain *c = NULL;
    kvt_prompt_cache_plan *p = NULL;
    *out = NULL;
    *n_reused = 0;
    kvt_status st = kvt_chain_create(root, prompt, n, kvt_kv_layout_block_tokens(kvt_block_pool_layout(pool)), &c);
    if (st == KVT_OK) st = kvt_prompt_cache_plan_create(pc, c, &p, NULL);
    if (st == KVT_OK) st = kvt_prompt_cache_take_plan(pc, p, out, n_reused);
    kvt_prompt_cache_plan_free(p);
    kvt_chain_release(c);
    return st;
}

/* Take k clones of the donor prompt, decode n_dec tokens on each (round-robin), measure, free. */
static kvt_status run_clones(kvt_prompt_cache *pc, kvt_ctx *ctx, kvt_block_pool *pool, const int32_t *prompt, uint32_t d,
                             uint64_t root, uint32_t k, uint32_t n_dec, uint32_t n_vocab, measure *m) {
    kvt_seq **seqs = calloc(k, sizeof *seqs);
    int32_t *last = calloc(k, sizeof *last);
    kvt_status st = (seqs && last) ? KVT_OK : KVT_ERR_NOMEM;
    double t0 = kvt_now_ms();
    for (uint32_t i = 0; i < k && st == KVT_OK; i++) {
        uint32_t reused = 0;
        st = take_prompt(pc, pool, prompt, d, root, &seqs[i], &reused);
        if (st == KVT_OK && !seqs[i]) st = KVT_ERR_NOT_FOUND;
        if (st) break;
        /* the rest of the prompt (take caps the reuse at d - 1) */
        float *logits = NULL;
        st = kvt_model_forward(ctx, seqs[i], prompt + reused, d - reused, false, NULL, &logits);
        if (st == KVT_OK) last[i] = argmax(logits, n_vocab);
    }
    for (uint32_t step = 0; step < n_dec && st == KVT_OK; step++)
        for (uint32_t i = 0; i < k && st == KVT_OK; i++) {
            float *logits = NULL;
            st = kvt_model_forward(ctx, seqs[i], &last[i], 1, false, NULL, &logits);
            if (st == KVT_OK) last[i] = argmax(logits, n_vocab);
        }
    if (st == KVT_OK) {
        kvt_prompt_cache_stats cs;
        kvt_prompt_cache_stats_get(pc, &cs);
        m->k = k;
        m->pool_bytes = kvt_block_pool_used_bytes(pool);
        m->rss = proc_status_kb("VmRSS");
        m->cache_bytes = cs.bytes;
        m->ms = kvt_now_ms() - t0;
    }
    for (uint32_t i = 0; seqs && i < k; i++)
        if (seqs[i]) kvt_seq_free(seqs[i]);
    free(seqs);
    free(last);
    return st;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    uint32_t d = 4096, kmax = 8, n_dec = 4;
    int threads = 2;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model_path = argv[++i];
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) d = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-k") && i + 1 < argc) kmax = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_dec = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: bench-clones -m MODEL.gguf [-d 4096] [-k 8] [-n 4] [-t 2] [--json]\n");
            return 2;
        }
    }
    if (!model_path || d < 2 || d > (1u << 20) || kmax < 1 || kmax > 256) {
        fprintf(stderr, "bench-clones: need -m MODEL; -d in [2, 2^20]; -k in [1, 256]\n");
        return 2;
    }
    char err[512] = "";
    kvt_gguf *g = NULL;
    kvt_model *model = NULL;
    kvt_kv_layout *layout = NULL;
    kvt_block_pool *pool = NULL;
    kvt_prompt_cache *pc = NULL;
    kvt_ctx *ctx = NULL;
    kvt_seq *donor = NULL;
    kvt_layer_desc *descs = NULL;
    kvt_codec *codecs = NULL;
    int32_t *prompt = NULL;
    int rc = 1;
    kvt_kernels_init();
    kvt_status st = kvt_gguf_open(model_path, &g, err, sizeof err);
    if (!st) st = kvt_model_load(g, &model, err, sizeof err);
    if (st) goto fail;
    const kvt_hparams *hp = kvt_model_hparams(model);
    descs = calloc(hp->n_layer, sizeof *descs);
    codecs = calloc(hp->n_layer, sizeof *codecs);
    prompt = malloc(sizeof(int32_t) * d);
    if (!descs || !codecs || !prompt) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = (kvt_codec){.kind = KVT_CODEC_F16};
    kvt_model_layer_descs(model, codecs, descs);
    st = kvt_kv_layout_create(descs, hp->n_layer, 256, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &layout, err, sizeof err);
    if (st) goto fail;
    const double bpt = kvt_kv_layout_bytes_per_token(layout);
    pool = kvt_block_pool_create(layout, 0);
    pc = pool ? kvt_prompt_cache_create(pool, (uint64_t)8 << 30) : NULL;
    if (!pc) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    kvt_block_pool_set_pressure(pool, kvt_prompt_cache_pressure_cb, pc);
    st = kvt_ctx_create(model, threads, 512, &ctx);
    if (!st) st = kvt_ctx_reserve(ctx, layout, d + n_dec + 8);
    if (st) goto fail;
    const uint64_t root = kvt_root_hash("bench-clones", "");
    fill_prompt(prompt, d, hp->n_vocab, 42);

    const uint64_t rss0 = proc_status_kb("VmRSS");
    double t0 = kvt_now_ms();
    st = kvt_seq_create(pool, root, &donor);
    float *logits = NULL;
    if (!st) st = kvt_model_forward(ctx, donor, prompt, d, false, NULL, &logits);
    if (!st) st = kvt_prompt_cache_put(pc, donor);
    if (st) goto fail;
    const double donor_ms = kvt_now_ms() - t0;
    kvt_seq_free(donor);
    donor = NULL;
    const uint64_t pool_donor = kvt_block_pool_used_bytes(pool), rss_donor = proc_status_kb("VmRSS");

    measure m1 = {0}, mk = {0};
    st = run_clones(pc, ctx, pool, prompt, d, root, 1, n_dec, hp->n_vocab, &m1);
    if (!st) st = run_clones(pc, ctx, pool, prompt, d, root, kmax, n_dec, hp->n_vocab, &mk);
    if (st) goto fail;
    const double priv = d * bpt; /* one private copy of the donor's KV */
    if (json) {
        printf("{\"mode\":\"clones\",\"donor_tokens\":%u,\"decode_tokens\":%u,\"kv_bytes_per_token\":%.1f,\"donor_prefill_ms\":%.1f,"
               "\"rss_before_donor\":%llu,\"pool_after_donor\":%llu,\"rss_after_donor\":%llu,"
               "\"k1\":{\"pool_bytes\":%llu,\"rss\":%llu},\"k\":%u,\"kk\":{\"pool_bytes\":%llu,\"rss\":%llu},"
               "\"pool_ratio_k_vs_1\":%.3f,\"rss_ratio_k_vs_1\":%.3f,\"extra_pool_bytes_per_clone\":%.0f,"
               "\"private_copy_bytes\":%.0f,\"rss_private_estimate\":%.0f}\n",
               d, n_dec, bpt, donor_ms, (unsigned long long)rss0, (unsigned long long)pool_donor, (unsigned long long)rss_donor,
               (unsigned long long)m1.pool_bytes, (unsigned long long)m1.rss, kmax, (unsigned long long)mk.pool_bytes,
               (unsigned long long)mk.rss, (double)mk.pool_bytes / m1.pool_bytes, (double)mk.rss / m1.rss,
               kmax > 1 ? ((double)mk.pool_bytes - m1.pool_bytes) / (kmax - 1) : 0.0, priv,
               (double)m1.rss + (kmax - 1) * priv);
    } else {
        printf("donor %u tokens (%.1f bytes/token, prefill %.1f s): pool %.1f MiB, VmRSS %.1f MiB\n", d, bpt, donor_ms / 1000,
               pool_donor / 1048576.0, rss_donor / 1048576.0);
        printf("1 clone : pool %.1f MiB, VmRSS %.1f MiB\n", m1.pool_bytes / 1048576.0, m1.rss / 1048576.0);
        printf("%u clones: pool %.1f MiB, VmRSS %.1f MiB (x%.3f / x%.3f); private copies would add %.1f MiB each\n", kmax,
               mk.pool_bytes / 1048576.0, mk.rss / 1048576.0, (double)mk.pool_bytes / m1.pool_bytes, (double)mk.rss / m1.rss,
               priv / 1048576.0);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench-clones: %s (%s)\n", err[0] ? err : "failed", kvt_status_str(st));
out:
    if (donor) kvt_seq_free(donor);
    kvt_ctx_free(ctx);
    kvt_prompt_cache_free(pc);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(layout);
    kvt_model_free(model);
    kvt_gguf_free(g);
    free(descs);
    free(codecs);
    free(prompt);
    return rc;
}
