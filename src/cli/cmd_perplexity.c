/* cmd_perplexity.c — `kvtier perplexity`: perplexity of a model over a text file with the method of
 * llama.cpp's llama-perplexity, so the numbers compare:
 *   - the whole file is tokenized once, with BOS when the model adds it;
 *   - it is cut into floor(n_tokens / ctx) windows of ctx tokens (--chunks caps the count), the
 *     first token of every window replaced by BOS (when the model adds BOS);
 *   - each window runs as one fresh sequence (one forward pass, all logits), and only the second
 *     half is scored: the log-probability of token j+1 from the logits at j, j in [ctx/2, ctx-1);
 *   - ppl = exp(mean negative log-likelihood over all scored tokens), accumulated in double.
 * The KV cache of every window uses the --kv-quant codec (default f16), so codecs compare on text.
 *
 * Lifecycle (one pass, nothing shared): open GGUF -> model, tokenizer -> layout -> pool -> ctx;
 * per window: seq create -> forward -> score -> seq free; then everything is freed in reverse.
 * Invariants: (1) a window is never longer than the ctx's ubatch (all logits come from one call);
 * (2) every sequence is freed before the pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/engine.h"
#include "../kernels/quant.h"
#include "../model/model.h"
#include "../text/tokenizer.h"
#include "args.h"
#include "cmds.h"

#define PPL_MAX_FILE (256u << 20) /* text files larger than this are refused */

static void usage(void) {
    printf("usage: kvtier perplexity -m MODEL -f TEXT [--ctx N] [--chunks N] [--kv-quant MODE] [--json]\n\n"
           "Perplexity over a text file, computed as llama.cpp's llama-perplexity does: the text is\n"
           "tokenized once (with BOS if the model adds it), cut into windows of --ctx tokens whose first\n"
           "token is replaced by BOS, and only the second half of each window is scored (token j+1 from\n"
           "the logits at j, j from ctx/2 to ctx-2). ppl = exp(mean negative log-likelihood).\n\n"
           "  -m, --model FILE      GGUF model (required)\n"
           "  -f, --file FILE       text file (required; at most 256 MiB)\n"
           "  -c, --ctx N           window length in tokens (default: min(512, the model's context))\n"
           "      --chunks N        score at most N windows (default: all)\n"
           "      --kv-quant MODE   KV cache codec: off (f16) | 8 | 4 | turbo[:k<b>v<b>] (as `kvtier run`)\n"
           "      --kv-quant-group N  affine group size along head_dim: 32, 64, 128 (default: largest dividing)\n"
           "  -t, --threads N       compute threads (default: number of cores)\n"
           "      --json            one JSON summary on stdout instead of the text report\n"
           "A progress line (window i/N, running ppl, ETA) is redrawn on stderr when it is a terminal.\n");
}

static char *read_text(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > PPL_MAX_FILE) {
        snprintf(err, errlen, "%s: not a regular file of at most 256 MiB", path);
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t n = buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (!buf || n != (size_t)sb.st_size) {
        snprintf(err, errlen, "%s: read failed", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* log p(target) from a logits row, in double */
static double logprob(const float *x, uint32_t n, int32_t target) {
    float m = x[0];
    for (uint32_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double z = 0;
    for (uint32_t i = 0; i < n; i++) z += exp((double)x[i] - m);
    return (double)x[target] - m - log(z);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *kvq = "off";
    uint32_t ctx_n = 0, chunks = 0, group = 0, threads = 0;
    bool json = false;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "perplexity", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, "-m", "--model")) model = kvt_args_str(&a);
        else if (kvt_args_is(&a, "-f", "--file")) file = kvt_args_str(&a);
        else if (kvt_args_is(&a, "-c", "--ctx")) ctx_n = kvt_args_u32(&a, 16, 1u << 16);
        else if (kvt_args_is(&a, NULL, "--chunks")) chunks = kvt_args_u32(&a, 1, 1u << 30);
        else if (kvt_args_is(&a, NULL, "--kv-quant")) kvq = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--kv-quant-group")) group = kvt_args_u32(&a, 32, 128);
        else if (kvt_args_is(&a, "-t", "--threads")) threads = kvt_args_u32(&a, 1, 1024);
        else if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else kvt_args_unknown(&a);
    }
    if (a.help) return 0;
    if (a.failed) return 2;
    if (!model || !file) {
        fprintf(stderr, "kvtier perplexity: -m MODEL and -f TEXT are required (--help)\n");
        return 2;
    }
    char err[512] = "";
    int rc = 1;
    size_t tlen = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    kvt_gguf *g = NULL;
    kvt_model *m = NULL;
    kvt_tokenizer *tok = NULL;
    kvt_codec *codecs = NULL;
    kvt_layer_desc *descs = NULL;
    kvt_kv_layout *layout = NULL;
    kvt_block_pool *pool = NULL;
    kvt_ctx *cx = NULL;
    kvt_kernels_init();
    if (!(text = read_text(file, &tlen, err, sizeof err))) goto fail;
    if (kvt_gguf_open(model, &g, err, sizeof err) || kvt_model_load(g, &m, err, sizeof err) ||
        kvt_tokenizer_create(g, &tok, err, sizeof err))
        goto fail;
    const kvt_hparams *hp = kvt_model_hparams(m);
    if (hp->arch == KVT_ARCH_QWEN35 || hp->mla.kv_lora_rank) {
        snprintf(err, sizeof err, "perplexity supports attention-only models without MLA (not %s)", kvt_arch_name(hp->arch));
        goto fail;
    }
    if (!ctx_n) ctx_n = hp->n_ctx_train < 512 ? hp->n_ctx_train : 512;
    if (ctx_n < 16) ctx_n = 16;
    /* tokens: at most one per byte, plus BOS */
    ids = malloc(sizeof(int32_t) * (tlen + 2));
    if (!ids) goto oom;
    const bool add_bos = kvt_tokenizer_add_bos(tok);
    const int32_t bos = kvt_tokenizer_bos(tok);
    int64_t nt = kvt_tokenize_ex(tok, text, tlen, KVT_TOK_ADD_SPECIAL, ids, (int64_t)tlen + 2);
    if (nt < 0) goto oom;
    if (nt > (int64_t)tlen + 2) {
        snprintf(err, sizeof err, "tokenizer produced more tokens than bytes");
        goto fail;
    }
    uint32_t n_chunk = (uint32_t)(nt / ctx_n);
    if (chunks && chunks < n_chunk) n_chunk = chunks;
    if (n_chunk == 0) {
        snprintf(err, sizeof err, "%s has %lld tokens, fewer than one window of %u (lower --ctx)", file, (long long)nt, ctx_n);
        goto fail;
    }
    codecs = calloc(hp->n_layer, sizeof *codecs);
    descs = calloc(hp->n_layer, sizeof *descs);
    if (!codecs || !descs) goto oom;
    kvt_codec c = {.kind = KVT_CODEC_F16};
    if (strcmp(kvq, "off") && kvt_engine_uniform_codec(kvq, group, hp->head_dim, &c, err, sizeof err)) goto fail;
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = c;
    kvt_model_layer_descs(m, codecs, descs);
    if (kvt_kv_layout_create(descs, hp->n_layer, 256, (kvt_codec){.kind = KVT_CODEC_F16}, 0, &layout, err, sizeof err))
        goto fail;
    char scheme[256];
    kvt_kv_layout_key(layout, scheme, sizeof scheme);
    if (!(pool = kvt_block_pool_create(layout, 0))) goto oom;
    if (kvt_ctx_create(m, (int)threads, ctx_n, &cx) || kvt_ctx_reserve(cx, layout, ctx_n)) goto oom;

    const bool tty = !json && isatty(fileno(stderr));
    const uint32_t first = ctx_n / 2, nv = hp->n_vocab;
    double nll = 0, nll2 = 0;
    uint64_t count = 0;
    const double t0 = kvt_now_ms();
    int32_t *win = malloc(sizeof(int32_t) * ctx_n);
    if (!win) goto oom;
    for (uint32_t ch = 0; ch < n_chunk; ch++) {
        const int32_t *src = ids + (size_t)ch * ctx_n;
        memcpy(win, src, sizeof(int32_t) * ctx_n);
        if (add_bos && bos >= 0) win[0] = bos;
        kvt_seq *seq = NULL;
        float *logits = NULL;
        kvt_status st = kvt_seq_create(pool, 0x7065727078ull + ch, &seq);
        if (st == KVT_OK) st = kvt_model_forward(cx, seq, win, ctx_n, true, NULL, &logits);
        if (st == KVT_OK)
            for (uint32_t j = first; j + 1 < ctx_n; j++) {
                const double lp = logprob(logits + (size_t)j * nv, nv, src[j + 1]);
                nll -= lp;
                nll2 += lp * lp;
                count++;
            }
        if (seq) kvt_seq_free(seq);
        if (st) {
            free(win);
            snprintf(err, sizeof err, "window %u: forward failed: %s", ch, kvt_status_str(st));
            goto fail;
        }
        if (tty) {
            const double el = (kvt_now_ms() - t0) / 1000.0;
            fprintf(stderr, "\rperplexity: window %u/%u  ppl %.4f  %.0f tok/s  ETA %.1fs   ", ch + 1, n_chunk,
                    exp(nll / count), (double)(ch + 1) * ctx_n / el, el / (ch + 1) * (n_chunk - ch - 1));
            fflush(stderr);
        }
    }
    free(win);
    if (tty) fprintf(stderr, "\r\033[K");
    const double secs = (kvt_now_ms() - t0) / 1000.0;
    const double mean = nll / count, ppl = exp(mean);
    /* llama-perplexity's uncertainty: ppl * stddev(nll) / sqrt(count) */
    const double var = nll2 / count - mean * mean;
    const double ppl_err = ppl * sqrt(var > 0 ? var : 0) / sqrt((double)(count > 1 ? count - 1 : 1));
    if (json) {
        printf("{\"model\":\"");
        for (const char *p = model; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : (unsigned char)*p < 32 ? "?" : "%c", *p);
        printf("\",\"text_bytes\":%zu,\"tokens\":%lld,\"ctx\":%u,\"chunks\":%u,\"scored\":%llu,\"kv_quant\":\"%s\","
               "\"scheme\":\"%s\",\"nll\":%.9f,\"ppl\":%.9g,\"ppl_err\":%.6g,\"seconds\":%.2f,\"tok_per_s\":%.1f}\n",
               tlen, (long long)nt, ctx_n, n_chunk, (unsigned long long)count, kvq, scheme, mean, ppl, ppl_err, secs,
               (double)n_chunk * ctx_n / secs);
    } else {
        printf("perplexity: %s on %s (%lld tokens), %u windows of %u, second half scored (%llu tokens), KV %s\n", model,
               file, (long long)nt, n_chunk, ctx_n, (unsigned long long)count, scheme);
        printf("ppl = %.4f +/- %.4f  (mean NLL %.6f nats/token; %.1f s, %.0f tok/s)\n", ppl, ppl_err, mean, secs,
               (double)n_chunk * ctx_n / secs);
    }
    rc = 0;
    goto out;
oom:
    snprintf(err, sizeof err, "out of memory");
fail:
    fprintf(stderr, "kvtier perplexity: %s\n", err[0] ? err : "failed");
out:
    kvt_ctx_free(cx);
    kvt_block_pool_free(pool);
    kvt_kv_layout_free(layout);
    free(codecs);
    free(descs);
    kvt_tokenizer_free(tok);
    kvt_model_free(m);
    kvt_gguf_free(g);
    free(ids);
    free(text);
    return rc;
}
