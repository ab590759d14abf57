/*
 * engine.c — see engine.h. The generate loop:
 *
 *   1. validate the request (non-empty, ids in range, fits the context);
 *   2. lookup (kvt_tiers_lookup over the request's chain, hashed once): peek both tiers, execute one
 *      plan (RAM shares its leading blocks and copies at most one partial block; the SSD restore
 *      streams into the pool only the blocks RAM lacks);
 *   3. prefill the remaining prompt tokens in ubatch chunks; a long cold prefill registers the
 *      prompt-only prefix (prompt-boundary snapshot) before decoding;
 *   4. decode: sample, stream text (stop strings held back until they can no longer match),
 *      forward one token at a time;
 *   5. put the final sequence back into the RAM tier (whose spill path and the write-behind queue
 *      persist blocks to SSD off this thread).
 *
 * Nothing in steps 3–4 waits for disk: SSD writes happen on the SSD tier's writer thread, which only
 * reads sealed (immutable) blocks.
 *
 * The steps are the phases of a row (engine_int.h): kvt_row_begin (1-2 and the prefill setup),
 * kvt_row_plan + kvt_row_advance per forward (one prefill chunk or one decode token; sampling and
 * streaming in advance), kvt_row_end (5). With --parallel 1 kvt_engine_generate drives its row
 * inline under gen_mu; otherwise the batching scheduler (sched.c) drives all rows, one
 * kvt_model_forward_batch per step (docs/batching.md).
 */
#include "engine.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../cache/prompt_cache.h"
#include "../cache/shared_tier.h"
#include "../cache/ssd_cache.h"
#include "../cache/tier.h"
#include "../kernels/quant.h"
#include "../model/model.h"
#include "../util/strbuf.h"
#include "checkpoint.h"
#include "sampler.h"
#include "sched.h"

#define KVT_ENGINE_NUMERICS_TAG "kvt-num-1"

struct kvt_engine {
    kvt_engine_opts o;
    char *model_path;
    kvt_gguf *gguf;
    kvt_model *model;
    kvt_tokenizer *tok;
    kvt_chat_template *chat;
    kvt_kv_layout *layout;
    kvt_block_pool *pool;
    kvt_prompt_cache *pc;
    kvt_ssd *ssd;
    kvt_shared *shared; /* optional shared block tier (issue 17) */
    kvt_tiers *tier; /* RAM+SSD policy: memory pressure, flush */
    kvt_ckpt_store *ckpt; /* generation checkpoints (--generation-checkpoint), NULL = off */
    kvt_ctx *ctx;
    uint32_t n_ctx, n_vocab;
    uint32_t min_window; /* smallest sliding window of any layer group; 0 = none */
    bool recurrent;      /* the layout has RECURRENT layers (state snapshots instead of trimming) */
    char compat[1024];
    char scheme[128];
    char name[160];
    pthread_mutex_t gen_mu;   /* the compute context: one generation (--parallel 1) or one step at a time */
    kvt_sched *sched;         /* --parallel > 1: the batching scheduler (sched.h); NULL = inline rows */
    uint32_t parallel;
    int inline_active;        /* --parallel 1: a generation runs (atomic; /stats rows_active) */
    bool decoding;            /* some row decodes: the SSD/shared writers defer (kvt_engine_set_decoding) */
    pthread_mutex_t stats_mu; /* request counters */
    pthread_mutex_t lookup_mu; /* one tier lookup at a time (rows begin on their own threads) */
    uint64_t requests, prompt_tokens, generated_tokens, cached_tokens;
    double last_tick_ms;
    kvt_progress_cb progress; /* kvt_engine_set_progress */
    void *progress_ctx;
};

static void report(kvt_engine *e, kvt_progress_phase ph, uint32_t done, uint32_t total) {
    if (e->progress) e->progress(e->progress_ctx, ph, done, total);
}

static void restore_progress(void *ctx, uint32_t done, uint32_t total) { report(ctx, KVT_PROGRESS_RESTORE, done, total); }

void kvt_engine_set_progress(kvt_engine *e, kvt_progress_cb cb, void *ctx) {
    e->progress = cb;
    e->progress_ctx = ctx;
    if (e->ssd) kvt_ssd_set_progress(e->ssd, cb ? restore_progress : NULL, e);
}

void kvt_engine_opts_default(kvt_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->ubatch = 512;
    o->parallel = 1; /* the library default; the CLI flag defaults to 4 (engine_flags.c) */
    o->queue_max = 64;
    o->block_tokens = KVT_DEFAULT_BLOCK_TOKENS;
    o->kv_quant = "off";
    o->kv_quant_group = 0; /* auto: largest supported group dividing head_dim */
    o->prompt_cache_gb = 8.0;
    o->snapshot_min_tokens = 1024;
    o->recurrent_snapshot_every = 1024; /* 4 blocks: see docs/kv-blocks.md, "Recurrent state" */
    o->ssd_writeback = true;
    o->ssd_demote_idle_s = 300.0;
    o->shared_timeout_ms = 1000;
}

void kvt_sampling_default(kvt_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 0.0f;
    s->top_p = 1.0f;
    s->repeat_penalty = 1.0f;
    s->penalty_last_n = 64;
}

const kvt_tokenizer *kvt_engine_tokenizer(const kvt_engine *e) { return e->tok; }
const kvt_chat_template *kvt_engine_chat(const kvt_engine *e) { return e->chat; }
uint32_t kvt_engine_n_ctx(const kvt_engine *e) { return e->n_ctx; }
uint32_t kvt_engine_n_vocab(const kvt_engine *e) { return e->n_vocab; }
const char *kvt_engine_model_name(const kvt_engine *e) { return e->name; }
const char *kvt_engine_scheme_key(const kvt_engine *e) { return e->scheme; }
const kvt_kv_layout *kvt_engine_layout(const kvt_engine *e) { return e->layout; }
uint32_t kvt_engine_parallel(const kvt_engine *e) { return e->parallel; }

/* One log line per distinct layer declaration, e.g. "kv: layers 0-4,6-10 window(512)/f16". */
static void log_layout(const kvt_kv_layout *l) {
    uint32_t n = kvt_kv_layout_n_layers(l);
    char done[KVT_MAX_LAYERS] = {0};
    for (uint32_t i = 0; i < n; i++) {
        if (done[i]) continue;
        char d[96], d2[96], list[512];
        kvt_kv_layout_describe_layer(l, i, d, sizeof d);
        size_t off = 0;
        uint32_t cnt = 0;
        list[0] = 0;
        for (uint32_t j = i; j < n; j++) {
            kvt_kv_layout_describe_layer(l, j, d2, sizeof d2);
            if (strcmp(d, d2)) continue;
            done[j] = 1;
            cnt++;
            if (off < sizeof list - 16) off += (size_t)snprintf(list + off, sizeof list - off, "%s%u", off ? "," : "", j);
        }
        const kvt_layer_desc *ld = kvt_kv_layout_layer(l, i);
        double bpt = 0;
        const char *trim = "never trimmable (exact snapshots only)";
        if (ld->kind != KVT_KIND_RECURRENT) {
            bpt = kvt_kv_layout_layer_bytes_per_token(l, i);
            trim = ld->kind != KVT_KIND_WINDOW ? "trimmable anywhere" : "trimmable while its window's blocks are held";
        }
        KVT_INFO("kv: %u layer%s %s (%.0f B/token each, %s): %s", cnt, cnt > 1 ? "s" : "", d, bpt, trim, list);
    }
    char key[128];
    kvt_kv_layout_key(l, key, sizeof key);
    KVT_INFO("kv: %.0f bytes/token, block %u tokens, scheme %s", kvt_kv_layout_bytes_per_token(l), kvt_kv_layout_block_tokens(l), key);
}

/* ---- KV scheme resolution ---------------------------------------------------------------- */

kvt_status kvt_engine_uniform_codec(const char *mode, uint32_t group, uint32_t head_dim, kvt_codec *out, char *err,
                                    size_t errlen) {
    if (!strncmp(mode, "turbo", 5)) {
        kvt_status st = kvt_turbo_parse(mode, out, err, errlen);
        if (st) return st;
        if (!kvt_codec_valid(*out, head_dim))
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "--kv-quant %s: turbo needs head_dim a power of two in 8..%u (model head_dim %u); use 8 or 4",
                            mode, KVT_TURBO_MAX_DIM, head_dim);
        return KVT_OK;
    }
    if (strcmp(mode, "8") && strcmp(mode, "4"))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--kv-quant must be off, 8, 4, turbo[:k<b>v<b>] or config (got '%s')", mode);
    const uint32_t g = group ? group : kvt_affine_auto_group(head_dim);
    *out = (kvt_codec){.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)atoi(mode), .group_size = (uint16_t)g};
    if (!kvt_codec_valid(*out, head_dim))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--kv-quant-group %u does not divide head_dim %u (use 32, 64 or 128)",
                        group, head_dim);
    return KVT_OK;
}

static kvt_status read_kv_config(const char *model_path, const kvt_hparams *hp, kvt_codec *codecs,
                                 char *err, size_t errlen) {
    char path[4096];
    const char *slash = strrchr(model_path, '/');
    if (slash)
        snprintf(path, sizeof path, "%.*s/kv_config.json", (int)(slash - model_path), model_path);
    else
        snprintf(path, sizeof path, "kv_config.json");
    FILE *f = fopen(path, "rb");
    if (!f) return kvt_errf(err, errlen, KVT_ERR_IO, "--kv-quant config: cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return KVT_ERR_NOMEM;
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    if (!j || !cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: expected a JSON array of {layer_idx, bits, group_size} or {layer_idx, codec}", path);
    }
    kvt_status st = KVT_OK;
    cJSON *it;
    cJSON_ArrayForEach(it, j) {
        cJSON *li = cJSON_GetObjectItem(it, "layer_idx"), *b = cJSON_GetObjectItem(it, "bits"),
              *g = cJSON_GetObjectItem(it, "group_size"), *cn = cJSON_GetObjectItem(it, "codec");
        if (cJSON_IsString(cn) && cJSON_IsNumber(li)) { /* {"layer_idx": N, "codec": "turbo[:k<b>v<b>]"} */
            const int l = li->valueint;
            if (l < 0 || (uint32_t)l >= hp->n_layer) {
                st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: layer_idx %d out of range (model has %u layers)", path, l, hp->n_layer);
                break;
            }
            char e2[200];
            st = kvt_engine_uniform_codec(cn->valuestring, 0, hp->head_dim, &codecs[l], e2, sizeof e2);
            if (st == KVT_OK && codecs[l].kind != KVT_CODEC_TURBO)
                st = kvt_errf(e2, sizeof e2, KVT_ERR_FORMAT, "codec must be turbo or turbo:k<b>v<b> (affine layers use bits/group_size)");
            if (st) {
                st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: layer %d: %s", path, l, e2);
                break;
            }
            continue;
        }
        if (!cJSON_IsNumber(li) || !cJSON_IsNumber(b)) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: each entry needs numeric layer_idx and bits", path);
            break;
        }
        int l = li->valueint, bits = b->valueint, gs = cJSON_IsNumber(g) ? g->valueint : 64;
        if (l < 0 || (uint32_t)l >= hp->n_layer) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: layer_idx %d out of range (model has %u layers)", path, l, hp->n_layer);
            break;
        }
        kvt_codec c = {.kind = KVT_CODEC_AFFINE, .bits = (uint8_t)bits, .group_size = (uint16_t)gs};
        if (bits == 16) c = (kvt_codec){.kind = KVT_CODEC_F16};
        if (!kvt_codec_valid(c, hp->head_dim)) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: layer %d: unsupported bits %d / group_size %d (bits 2,3,4,5,6,8; group 32,64,128 dividing head_dim %u)",
                          path, l, bits, gs, hp->head_dim);
            break;
        }
        codecs[l] = c;
    }
    cJSON_Delete(j);
    return st;
}

static kvt_status build_layout(kvt_engine *e, char *err, size_t errlen) {
    const kvt_hparams *hp = kvt_model_hparams(e->model);
    kvt_codec base = {.kind = e->o.kv_bf16 ? KVT_CODEC_BF16 : KVT_CODEC_F16};
    kvt_codec *codecs = calloc(hp->n_layer, sizeof *codecs);
    kvt_layer_desc *descs = calloc(hp->n_layer, sizeof *descs);
    kvt_status st = KVT_OK;
    if (!codecs || !descs) {
        st = KVT_ERR_NOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = base;
    const char *q = e->o.kv_quant ? e->o.kv_quant : "off";
    if (!strcmp(q, "config")) {
        st = read_kv_config(e->o.model_path, hp, codecs, err, errlen);
        if (st) goto out;
    } else if (strcmp(q, "off") != 0 && hp->mla.kv_lora_rank && !getenv("KVT_MLA_QUANT_EXPERIMENT")) {
        codecs[0] = (kvt_codec){.kind = KVT_CODEC_AFFINE}; /* refused with its reason just below */
    } else if (strcmp(q, "off") != 0 && hp->mla.kv_lora_rank) {
        kvt_codec c;
        st = kvt_engine_uniform_codec(q, e->o.kv_quant_group, hp->mla.kv_lora_rank + hp->mla.d_rope, &c, err, errlen);
        if (st) goto out;
        for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = c;
    } else if (strcmp(q, "off") != 0) {
        kvt_codec c;
        st = kvt_engine_uniform_codec(q, e->o.kv_quant_group, hp->head_dim, &c, err, errlen);
        if (st) goto out;
        if (c.kind == KVT_CODEC_AFFINE && !e->o.kv_quant_group)
            KVT_INFO("kv: affine group %u picked (largest of 128/64/32 dividing head_dim %u; --kv-quant-group overrides)",
                     c.group_size, hp->head_dim);
        for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = c;
    }
    /* Latent (MLA) blocks stay 16-bit: affine kv8 on the latent measured 78.1% top-1 agreement and
     * mean KL 0.12 against f16 latents (docs/models.md, kvtier bench --kv-quality 64 on a peaked
     * deepseek2-lite), short of the 99% kv8 holds on dense models, so it is refused.
     * KVT_MLA_QUANT_EXPERIMENT=1 in the environment lifts the refusal for that measurement only. */
    for (uint32_t i = 0; i < hp->n_layer && hp->mla.kv_lora_rank && !getenv("KVT_MLA_QUANT_EXPERIMENT"); i++)
        if (codecs[i].kind != KVT_CODEC_F16 && codecs[i].kind != KVT_CODEC_BF16) {
            st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                          "--kv-quant %s: quantized latent (MLA) blocks are not supported for %s; the latent cache "
                          "is already %u values per layer and token, and kv8 latents measured 78%% top-1 agreement "
                          "with f16 ones (docs/models.md); use --kv-quant off",
                          q, kvt_arch_name(hp->arch), hp->mla.kv_lora_rank + hp->mla.d_rope);
            goto out;
        }
    kvt_model_layer_descs(e->model, codecs, descs);
    st = kvt_kv_layout_create(descs, hp->n_layer, e->o.block_tokens, base, e->o.kv_quant_start, &e->layout, err, errlen);
    if (st == KVT_OK) {
        kvt_kv_layout_key(e->layout, e->scheme, sizeof e->scheme);
        log_layout(e->layout);
        e->recurrent = kvt_kv_layout_state_bytes(e->layout) > 0;
        for (uint32_t g = 0; g < kvt_kv_layout_n_groups(e->layout); g++)
            if (kvt_kv_layout_group_kind(e->layout, g) == KVT_KIND_WINDOW) {
                uint32_t w = kvt_kv_layout_group_window(e->layout, g);
                if (!e->min_window || w < e->min_window) e->min_window = w;
            }
    }
out:
    free(codecs);
    free(descs);
    return st;
}

/* ---- tier wiring -------------------------------------------------------------------------- */


kvt_status kvt_engine_create(const kvt_engine_opts *o, kvt_engine **out, char *err, size_t errlen) {
    *out = NULL;
    if (!o->model_path) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "no model given (-m MODEL.gguf)");
    if (o->ssd_dir && o->prompt_cache_gb <= 0)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--ssd-cache needs the RAM tier: it cannot be used with --prompt-cache 0");
    if (o->block_tokens < 16 || o->block_tokens > 4096)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--block-tokens must be in [16, 4096]");
    if (o->mla_prefill < KVT_MLA_PREFILL_ABSORBED || o->mla_prefill > KVT_MLA_PREFILL_AUTO)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--mla-prefill must be absorbed, expanded or auto");
    kvt_engine *e = calloc(1, sizeof *e);
    if (!e) return KVT_ERR_NOMEM;
    e->o = *o;
    pthread_mutex_init(&e->gen_mu, NULL);
    pthread_mutex_init(&e->lookup_mu, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    e->model_path = strdup(o->model_path);
    e->o.model_path = e->model_path;
    if (e->o.ubatch == 0) e->o.ubatch = 512;
    kvt_kernels_init();
    kvt_status st = kvt_gguf_open(o->model_path, &e->gguf, err, errlen);
    if (st) goto fail;
    st = kvt_model_load(e->gguf, &e->model, err, errlen);
    if (st) goto fail;
    st = kvt_tokenizer_create(e->gguf, &e->tok, err, errlen);
    if (st) goto fail;
    st = kvt_chat_template_create(e->gguf, e->tok, o->chat_template, &e->chat, err, errlen);
    if (st) goto fail;
    const kvt_hparams *hp = kvt_model_hparams(e->model);
    e->n_vocab = hp->n_vocab;
    e->n_ctx = o->n_ctx ? o->n_ctx : KVT_MIN(hp->n_ctx_train, 8192u);
    if (e->n_ctx < 8) e->n_ctx = 8;
    if (hp->name[0])
        snprintf(e->name, sizeof e->name, "%s", hp->name);
    else {
        const char *b = strrchr(o->model_path, '/');
        snprintf(e->name, sizeof e->name, "%s", b ? b + 1 : o->model_path);
    }
    st = build_layout(e, err, errlen);
    if (st) goto fail;

    /* compatibility key: SHA-256 of the weights (memoized) only when something persists */
    /* a non-default MLA prefill mode changes KV numerics: its tag keeps every tier's blocks apart */
    const char *mla_tag = kvt_mla_prefill_numerics_tag(hp, (kvt_mla_prefill)o->mla_prefill);
    if (o->mla_prefill != KVT_MLA_PREFILL_ABSORBED && !hp->mla.kv_lora_rank)
        KVT_WARN("--mla-prefill %s has no effect: %s has no latent (MLA) attention layers",
                 o->mla_prefill == KVT_MLA_PREFILL_EXPANDED ? "expanded" : "auto", kvt_arch_name(hp->arch));
    if (o->ssd_dir) {
        char th[32], num[96];
        snprintf(th, sizeof th, "%016llx", (unsigned long long)kvt_tokenizer_hash(e->tok));
        snprintf(num, sizeof num, "%s%s%s", kvt_kernels_numerics_id(), kvt_model_numerics_tag(e->model), mla_tag);
        st = kvt_ssd_compat_key(o->ssd_dir, o->model_path, e->layout, th, num, e->compat,
                                sizeof e->compat, err, errlen);
        if (st) goto fail;
    } else {
        struct stat sb;
        if (stat(o->model_path, &sb) != 0) memset(&sb, 0, sizeof sb);
        snprintf(e->compat, sizeof e->compat, "model=%s:%lld:%lld;scheme=%s;tok=%016llx;num=%s%s%s", o->model_path,
                 (long long)sb.st_size, (long long)sb.st_mtime, e->scheme, (unsigned long long)kvt_tokenizer_hash(e->tok),
                 KVT_ENGINE_NUMERICS_TAG, kvt_model_numerics_tag(e->model), mla_tag);
    }

    /* pool budget: one full context for each live row (--parallel) + the prompt cache cap */
    double bpt = kvt_kv_layout_bytes_per_token(e->layout);
    uint64_t live = (uint64_t)((double)(e->n_ctx + 2 * e->o.block_tokens + e->o.ubatch) * bpt) + (1u << 20);
    live *= o->parallel ? o->parallel : 1;
    uint64_t pc_bytes = (uint64_t)(o->prompt_cache_gb * 1e9);
    uint64_t budget = o->kv_pool_gb > 0 ? (uint64_t)(o->kv_pool_gb * 1e9) : live + pc_bytes;
    e->pool = kvt_block_pool_create(e->layout, budget);
    if (!e->pool) {
        st = KVT_ERR_NOMEM;
        goto fail;
    }
    if (pc_bytes > 0) {
        e->pc = kvt_prompt_cache_create(e->pool, pc_bytes);
        if (!e->pc) {
            st = KVT_ERR_NOMEM;
            goto fail;
        }
    }
    if (o->ssd_dir) {
        kvt_ssd_opts so;
        kvt_ssd_opts_default(&so);
        so.dir = o->ssd_dir;
        so.compat_key = e->compat;
        so.max_bytes = (uint64_t)(o->ssd_max_gb * 1e9);
        so.writeback = o->ssd_writeback;
        so.verify = o->ssd_verify;
        st = kvt_ssd_open(&so, e->layout, e->pool, &e->ssd, err, errlen);
        if (st) goto fail;
        /* [ckpt] generation checkpoints live in the SSD tier's compat directory */
        if (o->generation_checkpoint) {
            st = kvt_ckpt_store_open(kvt_ssd_dir(e->ssd), e->compat, &e->ckpt, err, errlen);
            if (st) goto fail;
        }
    } else if (o->generation_checkpoint) {
        st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--generation-checkpoint needs the SSD tier (--ssd-cache DIR)");
        goto fail;
    }
    if (e->pc) {
        kvt_tiers_opts to = {.pool = e->pool, .ram = e->pc, .ssd = e->ssd, .writeback = o->ssd_writeback};
        e->tier = kvt_tiers_create(&to);
        if (!e->tier) {
            st = KVT_ERR_NOMEM;
            goto fail;
        }
    }
    if (o->shared_url) {
        kvt_shared_opts sho;
        kvt_shared_opts_default(&sho);
        sho.url = o->shared_url;
        if (o->shared_timeout_ms) sho.timeout_ms = o->shared_timeout_ms;
        sho.tls_ca_file = o->shared_tls_ca;
        sho.tls_cert_file = o->shared_tls_cert;
        sho.tls_key_file = o->shared_tls_key;
        sho.tls_insecure = o->shared_tls_insecure;
        st = kvt_shared_create(&sho, e->ssd, &e->shared, err, errlen);
        if (st) goto fail;
    }
    st = kvt_ctx_create(e->model, o->n_threads, e->o.ubatch, &e->ctx);
    if (st) {
        kvt_errf(err, errlen, st, "cannot create the compute context: %s", kvt_status_str(st));
        goto fail;
    }
    kvt_ctx_set_mla_prefill(e->ctx, (kvt_mla_prefill)o->mla_prefill);
    st = kvt_ctx_reserve(e->ctx, e->layout, e->n_ctx);
    if (st) {
        kvt_errf(err, errlen, st, "cannot reserve attention scratch for %u tokens", e->n_ctx);
        goto fail;
    }
    e->parallel = o->parallel ? o->parallel : 1;
    if (e->parallel > 1) {
        kvt_sched_opts so = {.parallel = e->parallel, .queue_max = o->queue_max ? o->queue_max : 64, .ubatch = e->o.ubatch,
                             .budget = kvt_block_pool_budget(e->pool)};
        st = kvt_sched_create(e, &so, &e->sched);
        if (st) {
            kvt_errf(err, errlen, st, "cannot start the batching scheduler (--parallel %u)", e->parallel);
            goto fail;
        }
    }
    e->last_tick_ms = kvt_now_ms();
    *out = e;
    return KVT_OK;
fail:
    if (err && !err[0]) kvt_errf(err, errlen, st, "%s", kvt_status_str(st));
    kvt_engine_free(e);
    return st;
}

void kvt_engine_free(kvt_engine *e) {
    if (!e) return;
    kvt_sched_free(e->sched); /* cancels what still runs; no row touches the tiers after this */
    e->sched = NULL;
    if (e->ssd) {
        kvt_flush_result fr;
        kvt_engine_flush(e, 30000, &fr);
    }
    kvt_ckpt_store_free(e->ckpt); /* [ckpt] publishes what is queued (bounded) */
    if (e->shared) kvt_shared_flush(e->shared, 10000); /* bounded: publish what is queued */
    kvt_shared_free(e->shared); /* releases its queued block references before the pool goes */
    kvt_ctx_free(e->ctx);
    /* the prompt cache spills into the SSD tier on free? no: clear() never spills; what must
     * survive was already queued by write-behind and flushed above. */
    kvt_tiers_free(e->tier);
    if (e->pc) kvt_prompt_cache_free(e->pc);
    if (e->ssd) kvt_ssd_free(e->ssd);
    kvt_block_pool_free(e->pool);
    kvt_kv_layout_free(e->layout);
    kvt_chat_template_free(e->chat);
    kvt_tokenizer_free(e->tok);
    kvt_model_free(e->model);
    kvt_gguf_free(e->gguf);
    pthread_mutex_destroy(&e->gen_mu);
    pthread_mutex_destroy(&e->lookup_mu);
    pthread_mutex_destroy(&e->stats_mu);
    free(e->model_path);
    free(e);
}

/* ---- stop strings --------------------------------------------------------------------------- */

/* With stop strings, the text produced so far is kept in a kvt_strbuf `tb`; `emitted` bytes of it
 * were passed to the callback. Text that could still become the start of a stop string is held
 * back. */

/* Returns the index of the earliest full stop-string match at or after `from`, or -1. */
static int64_t find_stop(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop, size_t from, size_t *match_len) {
    int64_t best = -1;
    for (uint32_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        if (!L) continue;
        size_t start = from > L ? from - L : 0;
        for (size_t p = start; p + L <= t->n; p++) {
            if (!memcmp(t->p + p, stop[i], L)) {
                if (best < 0 || (int64_t)p < best) {
                    best = (int64_t)p;
                    *match_len = L;
                }
                break;
            }
        }
    }
    return best;
}

/* How many bytes at the end of the text could be the beginning of some stop string. */
static size_t stop_holdback(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop) {
    size_t hold = 0;
    for (uint32_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        for (size_t k = KVT_MIN(L - (L > 0), t->n); k > hold; k--) {
            if (!memcmp(t->p + t->n - k, stop[i], k)) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* ---- shared tier hook (issue 17) -------------------------------------------------------------- */
/* Lookup order live -> RAM -> SSD -> shared: after the local tiers, extend the reused prefix with
 * blocks no local tier had, fetched and verified by the shared tier; they land in RAM (and SSD)
 * like a restore. The shared tier walks the request's chain (the local lookups' hashes: nothing is
 * hashed again). *seq may be NULL (local miss). Updates *reused / res. */
static void shared_lookup(kvt_engine *e, const kvt_chain *chain, kvt_seq **seq, uint32_t *reused, kvt_gen_result *res) {
    if (!e->shared) return;
    if (*reused % e->o.block_tokens) return; /* a local partial block: the shared tier adds < 1 block */
    if (!*seq && kvt_seq_create(e->pool, kvt_chain_root(chain), seq) != KVT_OK) return;
    double r0 = kvt_now_ms();
    uint32_t got = kvt_shared_extend(e->shared, seq, chain); /* recurrent: may replace *seq */
    res->restore_ms += kvt_now_ms() - r0;
    if (!got) {
        if (*reused == 0) { /* keep the miss path identical to a server without the tier */
            kvt_seq_free(*seq);
            *seq = NULL;
        }
        return;
    }
    *reused = kvt_seq_len(*seq);
    res->reused_from = KVT_TIER_SHARED;
    kvt_prompt_cache_put_blocks(e->pc, *seq);
    if (e->ssd && e->o.ssd_writeback) {
        kvt_snapshot *snap = NULL; /* recurrent: the fetched state lands on SSD too */
        if (e->recurrent && kvt_seq_snapshot(*seq, &snap) != KVT_OK) snap = NULL;
        kvt_ssd_enqueue_seq(e->ssd, *seq, snap);
        if (snap) kvt_snapshot_release(snap);
    }
}
/* Write-behind: the sealed blocks of seq also go to the shared tier (background publisher). */
static void shared_publish(kvt_engine *e, kvt_seq *seq) {
    if (e->shared) kvt_shared_publish_seq(e->shared, seq);
}
static void shared_set_busy(kvt_engine *e, bool busy) {
    if (e->shared) kvt_shared_set_busy(e->shared, busy);
}

/* ---- generate ------------------------------------------------------------------------------- */

/* Register the sequence in the RAM tier (blocks, tail and, for recurrent layouts, a state snapshot
 * at its length) and queue it for the SSD tier, the snapshot included. */
/* A finished or boundary sequence into the tiers (RAM put, write-behind incl. its recurrent-state
 * snapshot: kvt_tiers_put) and the shared tier's publisher. */
static void cache_put(kvt_engine *e, kvt_seq *seq) {
    kvt_tiers_put(e->tier, seq);
    shared_publish(e, seq);
}

/* ---- one generation as a row: begin / plan / advance / end (engine_int.h) -------------------- */

uint64_t kvt_engine_row_reserve(const kvt_engine *e, uint32_t n, uint32_t max_new) {
    return (uint64_t)((double)(n + max_new) * kvt_kv_layout_bytes_per_token(e->layout));
}
pthread_mutex_t *kvt_engine_ctx_mu(kvt_engine *e) { return &e->gen_mu; }
kvt_ctx *kvt_engine_ctx(kvt_engine *e) { return e->ctx; }
void kvt_engine_set_decoding(kvt_engine *e, bool any) {
    if (any == e->decoding) return;
    e->decoding = any;
    if (e->ssd) kvt_ssd_set_busy(e->ssd, any);
    shared_set_busy(e, any);
}

static bool row_cancelled(const kvt_row *r) {
    return (r->req->cancel && __atomic_load_n(r->req->cancel, __ATOMIC_RELAXED)) || /* set by another thread */
           __atomic_load_n(&r->abort, __ATOMIC_RELAXED);
}

/* 2. lookup and admission, then the prefill setup. */
void kvt_row_begin(kvt_row *r) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    const uint32_t n = r->n;
    r->state = KVT_ROW_DONE;
    r->gen = malloc(sizeof(int32_t) * (r->max_new + 1));
    r->sampler = kvt_sampler_create(e->n_vocab);
    if (!r->gen || !r->sampler) {
        r->st = kvt_errf(r->err, r->errlen, KVT_ERR_NOMEM, "out of memory");
        return;
    }
    r->t0 = kvt_now_ms();
    r->root = kvt_root_hash(e->compat, req->ns ? req->ns : "");
    r->use_cache = e->pc && !req->no_cache;
    /* [ckpt] before the lookup: an identical request with a checkpoint resumes from it. Lookup and
     * prefill then cover prompt ++ already-emitted tokens (pp[0..pn)); the sampler history still
     * starts from the prompt (the emitted tokens are accepted again as they are replayed). The
     * record is read here, on the submitting thread, never on the scheduler's token loop. */
    kvt_ckpt_begin(&r->ck, r->use_cache ? e->ckpt : NULL, e->o.generation_checkpoint, e->compat, req, r->max_new, e->n_vocab);
    r->pp = r->ck.resumed ? r->ck.look : req->prompt;
    r->pn = r->ck.resumed ? r->ck.n_look : n;
    kvt_status st;
    if (r->use_cache) {
        /* lookups run on the submitting threads (sched.h): one at a time (the shared tier's fetch
         * connection is single-user), concurrently with the scheduler's steps */
        pthread_mutex_lock(&e->lookup_mu);
        /* the prompt's chain hashes once, shared by both tiers' lookups and block sealing */
        st = kvt_chain_create(r->root, r->pp, r->pn, e->o.block_tokens, &r->chain);
        kvt_tiers_hit hit;
        if (st == KVT_OK) st = kvt_tiers_lookup(e->tier, r->chain, &hit);
        if (st) {
            pthread_mutex_unlock(&e->lookup_mu);
            r->st = st;
            return;
        }
        r->seq = hit.seq;
        r->reused = hit.n_reused;
        res->restore_ms = hit.restore_ms;
        res->reused_from = hit.from == KVT_TIERS_SSD ? KVT_TIER_SSD : hit.from == KVT_TIERS_RAM ? KVT_TIER_RAM : KVT_TIER_NONE;
        shared_lookup(e, r->chain, &r->seq, &r->reused, res);
        pthread_mutex_unlock(&e->lookup_mu);
        kvt_ckpt_note_reused(&r->ck, e->ckpt, r->reused); /* [ckpt] how much of a resume was restored */
    }
    if (!r->seq) {
        if ((st = kvt_seq_create(e->pool, r->root, &r->seq))) {
            r->st = st;
            return;
        }
        r->reused = 0;
        res->reused_from = KVT_TIER_NONE;
    }
    if (r->chain) kvt_seq_set_chain(r->seq, r->chain);
    res->n_prompt = n;
    res->n_reused = KVT_MIN(r->reused, n); /* a resume also reuses emitted tokens: not prompt tokens */

    /* admission: the whole request must fit in the pool once cache-only blocks are evicted */
    {
        double need = (double)(n + r->max_new - KVT_MIN(r->reused, n)) * kvt_kv_layout_bytes_per_token(e->layout);
        uint64_t budget = kvt_block_pool_budget(e->pool);
        if (budget && need > (double)budget) {
            r->st = kvt_errf(r->err, r->errlen, KVT_ERR_POOL_EXHAUSTED,
                             "out of KV memory: the request needs %.0f MB of KV but the pool holds %.0f MB", need / 1e6,
                             (double)budget / 1e6);
            return;
        }
    }
    r->begun = true;

    /* 3. prefill setup */
    kvt_sampler_reset(r->sampler, &req->sampling);
    for (uint32_t i = n > 64 ? n - 64 : 0; i < n; i++) kvt_sampler_accept(r->sampler, req->prompt[i]);
    if (r->ck.resumed) kvt_sampler_set_rng_state(r->sampler, r->ck.rec.rng); /* [ckpt] RNG after the pending draw */
    r->tp0 = kvt_now_ms();
    /* Sliding-window layouts: blocks leave the live window as the sequence grows; registering the
     * sealed blocks after every chunk keeps them reusable from the cache. Chunks are capped at the
     * window so no block can be sealed and dropped within one chunk. */
    r->keep_window = r->use_cache && e->min_window > 0;
    /* Rows beside other rows: the sealed prompt blocks enter the RAM tier after every chunk, so a
     * request arriving meanwhile with the same prefix reuses them (docs/batching.md). Recurrent
     * layouts need a state snapshot to reuse anything, which only whole-prompt puts make. */
    r->share_prefix = r->use_cache && e->sched && !e->recurrent;
    r->chunk = r->pn - r->reused;
    if (r->keep_window) r->chunk = KVT_MIN(KVT_MIN(e->o.ubatch, e->min_window), r->chunk);
    if (e->progress) r->chunk = KVT_MIN(e->o.ubatch, r->chunk); /* same chunks the model makes, reported one by one */
    report(e, KVT_PROGRESS_PREFILL, 0, r->pn - r->reused);
    /* Recurrent layouts: a state snapshot every `every` tokens (whole blocks), so an edit at token
     * p can reuse up to the last snapshot <= p; the prefill stops at those positions. */
    const uint32_t bt = e->o.block_tokens;
    r->every = r->use_cache && e->recurrent && e->o.recurrent_snapshot_every ? (e->o.recurrent_snapshot_every + bt - 1) / bt * bt : 0;
    r->done_tok = r->reused;
    r->state = KVT_ROW_PREFILL;
}

uint32_t kvt_row_plan(kvt_row *r, uint32_t budget, const int32_t **tokens) {
    if (r->state != KVT_ROW_PREFILL && r->state != KVT_ROW_DECODE) return 0;
    if (row_cancelled(r)) {
        r->res->finish = KVT_FINISH_CANCELLED;
        if (r->state == KVT_ROW_PREFILL) report(r->e, KVT_PROGRESS_PREFILL, r->pn - r->reused, r->pn - r->reused);
        r->state = KVT_ROW_DONE;
        return 0;
    }
    if (r->state == KVT_ROW_DECODE) {
        *tokens = &r->next;
        return budget ? 1 : 0;
    }
    uint32_t m = KVT_MIN(KVT_MIN(r->chunk, r->pn - r->done_tok), budget);
    if (r->every) m = KVT_MIN(m, (r->done_tok / r->every + 1) * r->every - r->done_tok);
    *tokens = r->pp + r->done_tok;
    return m;
}

/* 4. one sampled token: stream its text (stop strings held back until they can no longer match);
 * the row either ends (DONE) or forwards it next (DECODE). */
static void row_sample(kvt_row *r, float *logits) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    r->state = KVT_ROW_DONE;
    for (;;) { /* more than one iteration only while replaying a checkpoint's emitted tokens */
        int32_t id;
        const kvt_ckpt_src src = kvt_ckpt_next(&r->ck, &id); /* [ckpt] replayed / pending tokens first */
        if (src == KVT_CKPT_SAMPLE) id = kvt_sampler_sample(r->sampler, logits);
        if (r->n_gen == 0) res->ttft_ms = kvt_now_ms() - r->t0;
        if (!req->ignore_eog && kvt_tokenizer_is_eog(e->tok, id)) {
            res->finish = KVT_FINISH_STOP;
            return;
        }
        if (kvt_ckpt_due(&r->ck, src, r->n_gen)) /* [ckpt] n_gen emitted, id sampled but not yet emitted */
            kvt_ckpt_save(&r->ck, e->ckpt, e->ssd, e->o.ssd_writeback, r->seq, r->n, r->gen, r->n_gen, id,
                          kvt_sampler_rng_state(r->sampler));
        r->gen[r->n_gen++] = id;
        kvt_sampler_accept(r->sampler, id);
        size_t dl = 0;
        const char *d = kvt_detok_push(r->dt, id, &dl);
        bool stop_hit = false;
        if (req->n_stop) {
            kvt_strbuf *tb = &r->tb;
            size_t before = tb->n;
            kvt_strbuf_add(tb, d, dl);
            if (tb->oom) {
                r->st = KVT_ERR_NOMEM;
                return;
            }
            size_t ml = 0;
            int64_t at = find_stop(tb, req->stop, req->n_stop, before, &ml);
            size_t upto;
            if (at >= 0) {
                upto = (size_t)at;
                stop_hit = true;
            } else {
                upto = tb->n - stop_holdback(tb, req->stop, req->n_stop);
            }
            bool keep = true;
            if (upto > r->emitted) {
                if (req->on_token) keep = req->on_token(req->cb_ctx, id, tb->p + r->emitted, upto - r->emitted);
                r->emitted = upto;
            } else if (req->on_token) {
                keep = req->on_token(req->cb_ctx, id, "", 0);
            }
            if (!keep) {
                res->finish = KVT_FINISH_CANCELLED;
                return;
            }
        } else if (req->on_token && !req->on_token(req->cb_ctx, id, d, dl)) {
            res->finish = KVT_FINISH_CANCELLED;
            return;
        }
        if (stop_hit) {
            res->finish = KVT_FINISH_STOP;
            return;
        }
        if (row_cancelled(r)) {
            res->finish = KVT_FINISH_CANCELLED;
            return;
        }
        if (r->n_gen >= r->max_new) return;
        if (src == KVT_CKPT_REPLAYED) continue; /* [ckpt] its KV was restored or prefilled: no forward */
        r->next = id;
        r->state = KVT_ROW_DECODE;
        return;
    }
}

void kvt_row_advance(kvt_row *r, uint32_t m, kvt_status st, float *logits) {
    kvt_engine *e = r->e;
    kvt_gen_result *res = r->res;
    const uint32_t n = r->n, reused = r->reused;
    if (r->state == KVT_ROW_PREFILL) {
        if (st == KVT_OK) {
            const uint32_t before = r->done_tok;
            r->done_tok += m;
            if (r->done_tok < r->pn) {
                if (r->keep_window) kvt_tiers_put_blocks(e->tier, r->seq);
                else if (r->share_prefix && r->done_tok / e->o.block_tokens > before / e->o.block_tokens)
                    kvt_tiers_put_blocks(e->tier, r->seq); /* a block sealed: visible to new rows */
                report(e, KVT_PROGRESS_PREFILL, r->done_tok - reused, r->pn - reused);
                if (r->every && r->done_tok % r->every == 0) cache_put(e, r->seq);
                return;
            }
        }
        report(e, KVT_PROGRESS_PREFILL, r->pn - reused, r->pn - reused);
        if (st) {
            r->state = KVT_ROW_DONE;
            if (st == KVT_ERR_POOL_EXHAUSTED)
                r->st = kvt_errf(r->err, r->errlen, st, "out of KV memory during prefill (pool %.0f MB in use)",
                                 (double)kvt_block_pool_used_bytes(e->pool) / 1e6);
            else if (st == KVT_ERR_CANCELLED)
                res->finish = KVT_FINISH_CANCELLED;
            else
                r->st = kvt_errf(r->err, r->errlen, st, "prefill failed: %s", kvt_status_str(st));
            return;
        }
        res->prefill_ms = kvt_now_ms() - r->tp0;
        if (res->prefill_ms > 0) res->prefill_tps = (double)(r->pn - reused) / (res->prefill_ms / 1000.0);
        /* prompt-boundary snapshot: the prompt-only prefix is what the next turn renders identically
         * (always for recurrent layouts: their state cannot be cut back to the prompt later; with
         * prefix sharing too, so the whole prompt is visible to new rows while this one decodes) */
        if (r->use_cache && !r->ck.resumed && n > reused && (n - reused >= e->o.snapshot_min_tokens || e->recurrent || r->share_prefix))
            cache_put(e, r->seq);
        /* 4. decode (the SSD writer defers while rows decode; see kvt_engine_set_decoding) */
        if (!e->sched) kvt_engine_set_decoding(e, true);
        r->dt = kvt_detok_create(e->tok, false);
        if (!r->dt) {
            r->state = KVT_ROW_DONE;
            r->st = KVT_ERR_NOMEM;
            return;
        }
        r->decoding = true;
        r->td0 = kvt_now_ms();
        res->finish = KVT_FINISH_LENGTH;
        row_sample(r, logits);
        return;
    }
    if (r->state != KVT_ROW_DECODE) return;
    if (st == KVT_OK && r->keep_window && kvt_seq_len(r->seq) % e->o.block_tokens == 0) kvt_tiers_put_blocks(e->tier, r->seq);
    if (st) {
        r->state = KVT_ROW_DONE;
        if (st == KVT_ERR_CANCELLED)
            res->finish = KVT_FINISH_CANCELLED;
        else
            r->st = kvt_errf(r->err, r->errlen, st, "decode failed: %s", kvt_status_str(st));
        return;
    }
    row_sample(r, logits);
}

void kvt_row_end(kvt_row *r) {
    kvt_engine *e = r->e;
    const kvt_gen_request *req = r->req;
    kvt_gen_result *res = r->res;
    if (r->decoding) {
        /* flush held-back text when finishing for a reason other than a stop string */
        if (r->st == KVT_OK && res->finish != KVT_FINISH_CANCELLED && req->on_token) {
            size_t fl = 0;
            const char *f = kvt_detok_flush(r->dt, &fl);
            if (req->n_stop) {
                if (res->finish != KVT_FINISH_STOP) {
                    kvt_strbuf_add(&r->tb, f, fl);
                    if (r->tb.n > r->emitted) req->on_token(req->cb_ctx, -1, r->tb.p + r->emitted, r->tb.n - r->emitted);
                }
            } else if (fl) {
                req->on_token(req->cb_ctx, -1, f, fl);
            }
        }
        res->decode_ms = kvt_now_ms() - r->td0;
        res->n_gen = r->n_gen;
        if (r->n_gen > 1 && res->decode_ms > 0) res->decode_tps = (double)(r->n_gen - 1) / (res->decode_ms / 1000.0);
        res->tokens = r->gen;
        r->gen = NULL;
        /* [ckpt] normal completion invalidates the checkpoint; cancellation and errors keep it */
        kvt_ckpt_end(&r->ck, e->ckpt, r->st == KVT_OK && res->finish != KVT_FINISH_CANCELLED);
    }
    if (r->begun) {
        if (!e->sched) kvt_engine_set_decoding(e, false);
        /* 5. what was computed stays cached, also for cancelled requests */
        if (r->seq && r->use_cache && kvt_seq_len(r->seq) > 0) cache_put(e, r->seq);
        res->peak_kv_bytes = kvt_block_pool_peak_bytes(e->pool);
        pthread_mutex_lock(&e->stats_mu);
        e->requests++;
        e->prompt_tokens += r->n;
        e->generated_tokens += res->n_gen;
        e->cached_tokens += res->n_reused;
        pthread_mutex_unlock(&e->stats_mu);
    }
    if (r->seq) kvt_seq_free(r->seq);
    r->seq = NULL;
    kvt_chain_release(r->chain);
    r->chain = NULL;
    kvt_ckpt_run_free(&r->ck); /* [ckpt] */
    kvt_detok_free(r->dt);
    r->dt = NULL;
    kvt_sampler_free(r->sampler);
    r->sampler = NULL;
    kvt_strbuf_free(&r->tb);
    free(r->gen);
    r->gen = NULL;
}

kvt_status kvt_engine_generate(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    res->finish = KVT_FINISH_ERROR;
    const uint32_t n = req->n_prompt;
    if (n == 0) return kvt_errf(err, errlen, KVT_ERR_RANGE, "the prompt is empty");
    if (n >= e->n_ctx)
        return kvt_errf(err, errlen, KVT_ERR_RANGE, "prompt has %u tokens but the context holds %u (leave room for at least one generated token)", n, e->n_ctx);
    for (uint32_t i = 0; i < n; i++)
        if (req->prompt[i] < 0 || (uint32_t)req->prompt[i] >= e->n_vocab)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "token id %d at position %u is outside the vocabulary [0, %u)",
                            req->prompt[i], i, e->n_vocab);
    uint32_t max_new = e->n_ctx - n;
    if (req->max_tokens && req->max_tokens < max_new) max_new = req->max_tokens;

    kvt_row r;
    memset(&r, 0, sizeof r);
    r.e = e;
    r.req = req;
    r.res = res;
    r.err = err;
    r.errlen = errlen;
    r.n = n;
    r.max_new = max_new;
    r.reserve = kvt_engine_row_reserve(e, n, max_new);
    if (e->sched) return kvt_sched_run(e->sched, &r); /* --parallel > 1: the scheduler thread drives it */

    /* --parallel 1: this thread drives its one row, one generation at a time */
    pthread_mutex_lock(&e->gen_mu);
    __atomic_store_n(&e->inline_active, 1, __ATOMIC_RELAXED);
    kvt_row_begin(&r);
    while (r.state != KVT_ROW_DONE) {
        const int32_t *tok = NULL;
        uint32_t m = kvt_row_plan(&r, UINT32_MAX, &tok);
        if (!m) break;
        float *logits = NULL;
        kvt_status st = kvt_model_forward(e->ctx, r.seq, tok, m, false, req->cancel, &logits);
        kvt_row_advance(&r, m, st, logits);
    }
    kvt_row_end(&r);
    __atomic_store_n(&e->inline_active, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&e->gen_mu);
    return r.st;
}

/* ---- stats, flush, maintenance ---------------------------------------------------------------- */

void kvt_engine_stats_get(kvt_engine *e, kvt_engine_stats *out) {
    memset(out, 0, sizeof *out);
    if (e->pc) {
        kvt_prompt_cache_stats s;
        kvt_prompt_cache_stats_get(e->pc, &s);
        out->pc_enabled = true;
        out->pc_entries = s.entries;
        out->pc_blocks = s.blocks;
        out->pc_bytes = s.bytes;
        out->pc_max_bytes = s.max_bytes;
        out->pc_hits = s.hits;
        out->pc_misses = s.misses;
        out->pc_reused_tokens = s.reused_tokens;
        out->pc_evictions = s.evictions;
        out->pc_reuse_impossible_untrimmable = s.reuse_impossible[KVT_REUSE_IMPOSSIBLE_UNTRIMMABLE];
        out->pc_reuse_impossible_namespace = s.reuse_impossible[KVT_REUSE_IMPOSSIBLE_NAMESPACE];
        out->pc_reuse_impossible_budget = s.reuse_impossible[KVT_REUSE_IMPOSSIBLE_BUDGET];
    }
    if (e->ssd) {
        kvt_ssd_stats s;
        kvt_ssd_stats_get(e->ssd, &s);
        out->ssd_enabled = true;
        snprintf(out->ssd_dir, sizeof out->ssd_dir, "%s", e->o.ssd_dir);
        out->ssd_entries = s.entries;
        out->ssd_bytes = s.bytes;
        out->ssd_max_bytes = s.max_bytes;
        out->ssd_restores = s.restores;
        out->ssd_spills = s.spills;
        out->ssd_demotions = s.demotions;
        out->ssd_pending_blocks = s.pending_blocks;
        out->ssd_pending_bytes = s.pending_bytes;
        out->ssd_dropped = s.dropped;
        out->ssd_failed = s.failed;
        out->ssd_longest_durable_prefix_tokens = s.longest_durable_prefix_tokens;
        out->ssd_restore_ms_last = s.restore_ms_last;
        out->ssd_dirty_records = s.dirty_records;
        out->ssd_shed = s.shed;
        out->ssd_skipped_nonregular = s.skipped_nonregular;
        out->ssd_lost_entries = s.lost_entries;
        out->ssd_dir_recreated = s.dir_recreated;
    }
    if (e->ckpt) {
        kvt_ckpt_stats c;
        kvt_ckpt_store_stats(e->ckpt, &c);
        out->ckpt_enabled = true;
        out->ckpt_written = c.written;
        out->ckpt_resumed = c.resumed;
        out->ckpt_invalidated = c.invalidated;
        out->ckpt_failed = c.failed;
        out->ckpt_dropped = c.dropped;
        out->ckpt_corrupt = c.corrupt;
        out->ckpt_pending = c.pending;
        out->ckpt_retried = c.retried;
        out->ckpt_resume_reused_tokens = c.resume_reused_tokens;
    }
    if (e->shared) {
        kvt_shared_stats s;
        kvt_shared_stats_get(e->shared, &s);
        out->shared_enabled = true;
        out->shared_lookups = s.lookups;
        out->shared_hits = s.hits;
        out->shared_fetched_blocks = s.fetched_blocks;
        out->shared_fetched_bytes = s.fetched_bytes;
        out->shared_fetched_tokens = s.fetched_tokens;
        out->shared_published_blocks = s.published_blocks;
        out->shared_published_bytes = s.published_bytes;
        out->shared_publish_existing = s.publish_existing;
        out->shared_dropped = s.dropped;
        out->shared_errors = s.errors;
        out->shared_oom_errors = s.oom_errors;
        out->shared_corrupt = s.corrupt;
        out->shared_skipped = s.skipped;
        out->shared_queue_blocks = s.queue_blocks;
        out->shared_breaker_opens = s.breaker_opens;
        out->shared_fetch_breaker = (int)s.fetch_breaker;
        out->shared_publish_breaker = (int)s.publish_breaker;
        out->shared_fetched_snapshots = s.fetched_snapshots;
        out->shared_published_snapshots = s.published_snapshots;
        snprintf(out->shared_last_error, sizeof out->shared_last_error, "%s", s.last_error);
    }
    out->pool_used_bytes = kvt_block_pool_used_bytes(e->pool);
    out->pool_peak_bytes = kvt_block_pool_peak_bytes(e->pool);
    out->pool_budget_bytes = kvt_block_pool_budget(e->pool);
    snprintf(out->scheme, sizeof out->scheme, "%s", e->scheme);
    pthread_mutex_lock(&e->stats_mu);
    out->requests = e->requests;
    out->prompt_tokens = e->prompt_tokens;
    out->generated_tokens = e->generated_tokens;
    out->cached_tokens = e->cached_tokens;
    pthread_mutex_unlock(&e->stats_mu);
    out->parallel = e->parallel;
    if (e->sched) {
        kvt_sched_stats b;
        kvt_sched_stats_get(e->sched, &b);
        out->rows_active = b.rows_active;
        out->rows_queued = b.queued;
        out->batch_queue_max = b.queue_max;
        out->batch_steps = b.steps;
        out->batch_memory_waits = b.memory_waits;
        out->batch_queue_full = b.queue_full;
        out->batch_tokens_per_step_last = b.tokens_per_step_last;
        out->batch_tokens_per_step_avg = b.tokens_per_step_avg;
        out->batch_prefill_tps_1m = b.prefill_tps_1m;
        out->batch_decode_tps_1m = b.decode_tps_1m;
        out->queue_wait_ms_last = b.queue_wait_ms_last;
        out->queue_wait_ms_avg = b.queue_wait_ms_avg;
        out->queue_wait_ms_max = b.queue_wait_ms_max;
        out->max_decode_stall_ms = b.max_decode_stall_ms;
        out->max_decode_step_ms = b.max_decode_step_ms;
    } else {
        out->rows_active = (uint64_t)__atomic_load_n(&e->inline_active, __ATOMIC_RELAXED);
    }
}

void kvt_engine_flush(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out) {
    memset(out, 0, sizeof *out);
    if (!e->ssd) {
        out->durable = true;
        return;
    }
    kvt_ssd_flush_result r;
    kvt_tiers_flush(e->tier, timeout_ms, &r);
    out->durable = r.durable;
    out->entries = r.entries;
    out->pending_blocks = r.pending_blocks;
    out->dropped = r.dropped;
    out->failed = r.failed;
    out->records_written = r.records_written;
    out->longest_durable_prefix_tokens = r.longest_durable_prefix_tokens;
    out->elapsed_ms = r.elapsed_ms;
    snprintf(out->reason, sizeof out->reason, "%s", r.reason);
    /* [ckpt] queued checkpoint records are owed to disk too */
    if (e->ckpt && !kvt_ckpt_store_flush(e->ckpt, timeout_ms) && out->durable) {
        out->durable = false;
        snprintf(out->reason, sizeof out->reason, "generation checkpoint records are still being written");
    }
}

void kvt_engine_tick(kvt_engine *e) {
    if (!e->ssd || !e->pc || e->o.ssd_demote_idle_s <= 0) return; /* 0 or negative: demotion off */
    /* between steps only (the scheduler holds gen_mu while it forwards); a busy engine skips */
    if (pthread_mutex_trylock(&e->gen_mu) != 0) return;
    double now = kvt_now_ms();
    if (now - e->last_tick_ms >= 1000.0) {
        e->last_tick_ms = now;
        uint64_t n = kvt_prompt_cache_demote_idle(e->pc, e->o.ssd_demote_idle_s);
        if (n) kvt_ssd_note_demotions(e->ssd, n);
    }
    pthread_mutex_unlock(&e->gen_mu);
}

/* ---- scoring (quality harness) ---------------------------------------------------------------- */

kvt_status kvt_engine_score(kvt_engine *e, const int32_t *prompt, uint32_t n_prompt, uint32_t n_steps,
                            kvt_logits_fn fn, void *ctx, char *err, size_t errlen) {
    if (n_prompt == 0 || n_steps == 0) return kvt_errf(err, errlen, KVT_ERR_RANGE, "score: empty prompt or no steps");
    if ((uint64_t)n_prompt + n_steps > e->n_ctx)
        return kvt_errf(err, errlen, KVT_ERR_RANGE, "score: %u + %u tokens exceed the context of %u", n_prompt, n_steps, e->n_ctx);
    for (uint32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= e->n_vocab)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "score: token id %d at position %u is outside the vocabulary", prompt[i], i);
    pthread_mutex_lock(&e->gen_mu);
    kvt_seq *seq = NULL;
    float *logits = NULL;
    kvt_status st = kvt_seq_create(e->pool, kvt_root_hash(e->compat, "score"), &seq);
    if (st == KVT_OK) st = kvt_model_forward(e->ctx, seq, prompt, n_prompt, false, NULL, &logits);
    for (uint32_t step = 0; st == KVT_OK && step < n_steps; step++) {
        const int32_t next = fn(ctx, step, logits);
        if (step + 1 == n_steps) break;
        if (next < 0 || (uint32_t)next >= e->n_vocab) {
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "score: step %u fed token %d outside the vocabulary", step, next);
            break;
        }
        st = kvt_model_forward(e->ctx, seq, &next, 1, false, NULL, &logits);
    }
    if (st && err && !err[0]) kvt_errf(err, errlen, st, "score: forward failed: %s", kvt_status_str(st));
    if (seq) kvt_seq_free(seq);
    pthread_mutex_unlock(&e->gen_mu);
    return st;
}

bool kvt_engine_shared_flush(kvt_engine *e, uint32_t timeout_ms) { return kvt_shared_flush(e->shared, timeout_ms); }
