/*
 * engine.c — see engine.h. The generate loop:
 *
 *   1. validate the request (non-empty, ids in range, fits the context);
 *   2. lookup (kvt_tiers_lookup): peek both tiers, take from the one with the longer usable prefix
 *      (RAM take shares blocks and copies at most one partial block; SSD restore streams into the
 *      pool);
 *   3. prefill the remaining prompt tokens in ubatch chunks; a long cold prefill registers the
 *      prompt-only prefix (prompt-boundary snapshot) before decoding;
 *   4. decode: sample, stream text (stop strings held back until they can no longer match),
 *      forward one token at a time;
 *   5. put the final sequence back into the RAM tier (whose spill path and the write-behind queue
 *      persist blocks to SSD off this thread).
 *
 * Nothing in steps 3–4 waits for disk: SSD writes happen on the SSD tier's writer thread, which only
 * reads sealed (immutable) blocks.
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
    kvt_sampler *sampler;
    uint32_t n_ctx, n_vocab;
    uint32_t min_window; /* smallest sliding window of any layer group; 0 = none */
    bool recurrent;      /* the layout has RECURRENT layers (state snapshots instead of trimming) */
    char compat[1024];
    char scheme[128];
    char name[160];
    pthread_mutex_t gen_mu;   /* one generation at a time */
    pthread_mutex_t stats_mu; /* request counters */
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
    } else if (strcmp(q, "off") != 0 && hp->mla.kv_lora_rank) {
        codecs[0] = (kvt_codec){.kind = KVT_CODEC_AFFINE}; /* refused with its reason just below */
    } else if (strcmp(q, "off") != 0) {
        kvt_codec c;
        st = kvt_engine_uniform_codec(q, e->o.kv_quant_group, hp->head_dim, &c, err, errlen);
        if (st) goto out;
        if (c.kind == KVT_CODEC_AFFINE && !e->o.kv_quant_group)
            KVT_INFO("kv: affine group %u picked (largest of 128/64/32 dividing head_dim %u; --kv-quant-group overrides)",
                     c.group_size, hp->head_dim);
        for (uint32_t i = 0; i < hp->n_layer; i++) codecs[i] = c;
    }
    /* Latent (MLA) blocks stay 16-bit: affine quantization of the latent has not been measured
     * against the model's quality yet (docs/models.md), so it is refused rather than guessed. */
    for (uint32_t i = 0; i < hp->n_layer && hp->mla.kv_lora_rank; i++)
        if (codecs[i].kind != KVT_CODEC_F16 && codecs[i].kind != KVT_CODEC_BF16) {
            st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                          "--kv-quant %s: quantized latent (MLA) blocks are not supported for %s; the latent cache "
                          "is already %u values per layer and token (use --kv-quant off)",
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
    kvt_engine *e = calloc(1, sizeof *e);
    if (!e) return KVT_ERR_NOMEM;
    e->o = *o;
    pthread_mutex_init(&e->gen_mu, NULL);
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
    if (o->ssd_dir) {
        char th[32];
        snprintf(th, sizeof th, "%016llx", (unsigned long long)kvt_tokenizer_hash(e->tok));
        st = kvt_ssd_compat_key(o->ssd_dir, o->model_path, e->layout, th, kvt_kernels_numerics_id(), e->compat,
                                sizeof e->compat, err, errlen);
        if (st) goto fail;
    } else {
        struct stat sb;
        if (stat(o->model_path, &sb) != 0) memset(&sb, 0, sizeof sb);
        snprintf(e->compat, sizeof e->compat, "model=%s:%lld:%lld;scheme=%s;tok=%016llx;num=%s", o->model_path,
                 (long long)sb.st_size, (long long)sb.st_mtime, e->scheme, (unsigned long long)kvt_tokenizer_hash(e->tok),
                 KVT_ENGINE_NUMERICS_TAG);
    }

    /* pool budget: one full context for the live sequence + the prompt cache cap */
    double bpt = kvt_kv_layout_bytes_per_token(e->layout);
    uint64_t live = (uint64_t)((double)(e->n_ctx + 2 * e->o.block_tokens + e->o.ubatch) * bpt) + (1u << 20);
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
        st = kvt_shared_create(&sho, e->ssd, &e->shared, err, errlen);
        if (st) goto fail;
    }
    st = kvt_ctx_create(e->model, o->n_threads, e->o.ubatch, &e->ctx);
    if (st) {
        kvt_errf(err, errlen, st, "cannot create the compute context: %s", kvt_status_str(st));
        goto fail;
    }
    st = kvt_ctx_reserve(e->ctx, e->layout, e->n_ctx);
    if (st) {
        kvt_errf(err, errlen, st, "cannot reserve attention scratch for %u tokens", e->n_ctx);
        goto fail;
    }
    e->sampler = kvt_sampler_create(e->n_vocab);
    if (!e->sampler) {
        st = KVT_ERR_NOMEM;
        goto fail;
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
    if (e->ssd) {
        kvt_flush_result fr;
        kvt_engine_flush(e, 30000, &fr);
    }
    kvt_ckpt_store_free(e->ckpt); /* [ckpt] publishes what is queued (bounded) */
    if (e->shared) kvt_shared_flush(e->shared, 10000); /* bounded: publish what is queued */
    kvt_shared_free(e->shared); /* releases its queued block references before the pool goes */
    kvt_sampler_free(e->sampler);
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
 * like a restore. *seq may be NULL (local miss). Updates *reused / res. */
static void shared_lookup(kvt_engine *e, const int32_t *prompt, uint32_t n, uint64_t root, kvt_seq **seq,
                          uint32_t *reused, kvt_gen_result *res) {
    if (!e->shared) return;
    if (*reused % e->o.block_tokens) return; /* a local partial block: the shared tier adds < 1 block */
    if (!*seq && kvt_seq_create(e->pool, root, seq) != KVT_OK) return;
    double r0 = kvt_now_ms();
    uint32_t got = kvt_shared_extend(e->shared, *seq, prompt, n);
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
    if (e->ssd && e->o.ssd_writeback) kvt_ssd_enqueue_seq(e->ssd, *seq, NULL);
}
/* Write-behind: the sealed blocks of seq also go to the shared tier (background publisher). */
static void shared_publish(kvt_engine *e, const kvt_seq *seq) {
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

    pthread_mutex_lock(&e->gen_mu);
    kvt_status st = KVT_OK;
    kvt_seq *seq = NULL;
    kvt_detok *dt = NULL;
    kvt_strbuf tb = {0};
    size_t emitted = 0; /* bytes of tb already passed to on_token */
    kvt_ckpt_run ck = {0}; /* [ckpt] this request's checkpoint state */
    int32_t *gen = malloc(sizeof(int32_t) * (max_new + 1));
    if (!gen) {
        st = KVT_ERR_NOMEM;
        goto done;
    }
    const double t0 = kvt_now_ms();
    const uint64_t root = kvt_root_hash(e->compat, req->ns ? req->ns : "");
    const bool use_cache = e->pc && !req->no_cache;

    /* [ckpt] before the lookup: an identical request with a checkpoint resumes from it. Lookup and
     * prefill then cover prompt ++ already-emitted tokens (pp[0..pn)); the sampler history still
     * starts from the prompt (the emitted tokens are accepted again as they are replayed). */
    kvt_ckpt_begin(&ck, use_cache ? e->ckpt : NULL, e->o.generation_checkpoint, e->compat, req, max_new, e->n_vocab);
    const int32_t *pp = ck.resumed ? ck.look : req->prompt;
    const uint32_t pn = ck.resumed ? ck.n_look : n;

    /* 2. lookup */
    uint32_t reused = 0;
    if (use_cache) {
        kvt_tiers_hit hit;
        st = kvt_tiers_lookup(e->tier, pp, pn, root, &hit);
        if (st) goto done;
        seq = hit.seq;
        reused = hit.n_reused;
        res->restore_ms = hit.restore_ms;
        res->reused_from = hit.from == KVT_TIERS_SSD ? KVT_TIER_SSD : hit.from == KVT_TIERS_RAM ? KVT_TIER_RAM : KVT_TIER_NONE;
        shared_lookup(e, pp, pn, root, &seq, &reused, res);
    }
    if (!seq) {
        st = kvt_seq_create(e->pool, root, &seq);
        if (st) goto done;
        reused = 0;
        res->reused_from = KVT_TIER_NONE;
    }
    res->n_prompt = n;
    res->n_reused = KVT_MIN(reused, n);

    /* admission: the whole request must fit in the pool once cache-only blocks are evicted */
    {
        double need = (double)(n + max_new - reused) * kvt_kv_layout_bytes_per_token(e->layout);
        uint64_t budget = kvt_block_pool_budget(e->pool);
        if (budget && need > (double)budget) {
            st = kvt_errf(err, errlen, KVT_ERR_POOL_EXHAUSTED,
                          "out of KV memory: the request needs %.0f MB of KV but the pool holds %.0f MB", need / 1e6, (double)budget / 1e6);
            goto done;
        }
    }

    /* 3. prefill */
    kvt_sampler_reset(e->sampler, &req->sampling);
    for (uint32_t i = n > 64 ? n - 64 : 0; i < n; i++) kvt_sampler_accept(e->sampler, req->prompt[i]);
    if (ck.resumed) kvt_sampler_set_rng_state(e->sampler, ck.rec.rng); /* [ckpt] RNG after the pending draw */
    float *logits = NULL;
    const double tp0 = kvt_now_ms();
    /* Sliding-window layouts: blocks leave the live window as the sequence grows; registering the
     * sealed blocks after every chunk keeps them reusable from the cache. Chunks are capped at the
     * window so no block can be sealed and dropped within one chunk. */
    const bool keep_window = use_cache && e->min_window > 0;
    uint32_t chunk = pn - reused;
    if (keep_window) chunk = KVT_MIN(KVT_MIN(e->o.ubatch, e->min_window), chunk);
    if (e->progress) chunk = KVT_MIN(e->o.ubatch, chunk); /* same chunks the model makes, reported one by one */
    report(e, KVT_PROGRESS_PREFILL, 0, pn - reused);
    /* Recurrent layouts: a state snapshot every `every` tokens (whole blocks), so an edit at token
     * p can reuse up to the last snapshot <= p; the prefill stops at those positions. */
    const uint32_t bt = e->o.block_tokens;
    const uint32_t every = use_cache && e->recurrent && e->o.recurrent_snapshot_every
                               ? (e->o.recurrent_snapshot_every + bt - 1) / bt * bt
                               : 0;
    for (uint32_t done_tok = reused; done_tok < pn && st == KVT_OK;) {
        uint32_t m = KVT_MIN(chunk, pn - done_tok);
        if (every) m = KVT_MIN(m, (done_tok / every + 1) * every - done_tok);
        st = kvt_model_forward(e->ctx, seq, pp + done_tok, m, false, req->cancel, &logits);
        done_tok += m;
        if (st == KVT_OK && keep_window && done_tok < pn) kvt_tiers_put_blocks(e->tier, seq);
        if (done_tok < pn) report(e, KVT_PROGRESS_PREFILL, done_tok - reused, pn - reused);
        if (st == KVT_OK && every && done_tok < pn && done_tok % every == 0) cache_put(e, seq);
    }
    report(e, KVT_PROGRESS_PREFILL, pn - reused, pn - reused);
    if (st) {
        if (st == KVT_ERR_POOL_EXHAUSTED)
            kvt_errf(err, errlen, st, "out of KV memory during prefill (pool %.0f MB in use)", (double)kvt_block_pool_used_bytes(e->pool) / 1e6);
        else if (st == KVT_ERR_CANCELLED)
            res->finish = KVT_FINISH_CANCELLED;
        else
            kvt_errf(err, errlen, st, "prefill failed: %s", kvt_status_str(st));
        goto put_back;
    }
    res->prefill_ms = kvt_now_ms() - tp0;
    if (res->prefill_ms > 0) res->prefill_tps = (double)(pn - reused) / (res->prefill_ms / 1000.0);
    /* prompt-boundary snapshot: the prompt-only prefix is what the next turn renders identically */
    /* (always for recurrent layouts: their state cannot be cut back to the prompt later) */
    if (use_cache && !ck.resumed && n > reused && (n - reused >= e->o.snapshot_min_tokens || e->recurrent)) cache_put(e, seq);

    /* 4. decode (the SSD writer defers while we decode; see kvt_ssd_set_busy) */
    if (e->ssd) kvt_ssd_set_busy(e->ssd, true);
    shared_set_busy(e, true);
    dt = kvt_detok_create(e->tok, false);
    if (!dt) {
        st = KVT_ERR_NOMEM;
        goto put_back;
    }
    const double td0 = kvt_now_ms();
    res->finish = KVT_FINISH_LENGTH;
    uint32_t n_gen = 0;
    for (;;) {
        int32_t id;
        const kvt_ckpt_src src = kvt_ckpt_next(&ck, &id); /* [ckpt] replayed / pending tokens first */
        if (src == KVT_CKPT_SAMPLE) id = kvt_sampler_sample(e->sampler, logits);
        if (n_gen == 0) res->ttft_ms = kvt_now_ms() - t0;
        if (!req->ignore_eog && kvt_tokenizer_is_eog(e->tok, id)) {
            res->finish = KVT_FINISH_STOP;
            break;
        }
        if (kvt_ckpt_due(&ck, src, n_gen)) /* [ckpt] n_gen emitted, id sampled but not yet emitted */
            kvt_ckpt_save(&ck, e->ckpt, e->ssd, e->o.ssd_writeback, seq, n, gen, n_gen, id,
                          kvt_sampler_rng_state(e->sampler));
        gen[n_gen++] = id;
        kvt_sampler_accept(e->sampler, id);
        size_t dl = 0;
        const char *d = kvt_detok_push(dt, id, &dl);
        bool stop_hit = false;
        if (req->n_stop) {
            size_t before = tb.n;
            kvt_strbuf_add(&tb, d, dl);
            if (tb.oom) {
                st = KVT_ERR_NOMEM;
                break;
            }
            size_t ml = 0;
            int64_t at = find_stop(&tb, req->stop, req->n_stop, before, &ml);
            size_t upto;
            if (at >= 0) {
                upto = (size_t)at;
                stop_hit = true;
            } else {
                upto = tb.n - stop_holdback(&tb, req->stop, req->n_stop);
            }
            bool keep = true;
            if (upto > emitted) {
                if (req->on_token) keep = req->on_token(req->cb_ctx, id, tb.p + emitted, upto - emitted);
                emitted = upto;
            } else if (req->on_token) {
                keep = req->on_token(req->cb_ctx, id, "", 0);
            }
            if (!keep) {
                res->finish = KVT_FINISH_CANCELLED;
                break;
            }
        } else if (req->on_token && !req->on_token(req->cb_ctx, id, d, dl)) {
            res->finish = KVT_FINISH_CANCELLED;
            break;
        }
        if (stop_hit) {
            res->finish = KVT_FINISH_STOP;
            break;
        }
        if (req->cancel && __atomic_load_n(req->cancel, __ATOMIC_RELAXED)) { /* set by another thread */
            res->finish = KVT_FINISH_CANCELLED;
            break;
        }
        if (n_gen >= max_new) break;
        if (src == KVT_CKPT_REPLAYED) continue; /* [ckpt] its KV was restored or prefilled */
        st = kvt_model_forward(e->ctx, seq, &id, 1, false, req->cancel, &logits);
        if (st == KVT_OK && keep_window && kvt_seq_len(seq) % e->o.block_tokens == 0) kvt_tiers_put_blocks(e->tier, seq);
        if (st) {
            if (st == KVT_ERR_CANCELLED) {
                res->finish = KVT_FINISH_CANCELLED;
                st = KVT_OK;
            } else {
                kvt_errf(err, errlen, st, "decode failed: %s", kvt_status_str(st));
            }
            break;
        }
    }
    /* flush held-back text when finishing for a reason other than a stop string */
    if (st == KVT_OK && res->finish != KVT_FINISH_CANCELLED && req->on_token) {
        size_t fl = 0;
        const char *f = kvt_detok_flush(dt, &fl);
        if (req->n_stop) {
            if (res->finish != KVT_FINISH_STOP) {
                kvt_strbuf_add(&tb, f, fl);
                if (tb.n > emitted) req->on_token(req->cb_ctx, -1, tb.p + emitted, tb.n - emitted);
            }
        } else if (fl) {
            req->on_token(req->cb_ctx, -1, f, fl);
        }
    }
    res->decode_ms = kvt_now_ms() - td0;
    res->n_gen = n_gen;
    if (n_gen > 1 && res->decode_ms > 0) res->decode_tps = (double)(n_gen - 1) / (res->decode_ms / 1000.0);
    res->tokens = gen;
    gen = NULL;
    /* [ckpt] normal completion invalidates the checkpoint; cancellation and errors keep it */
    kvt_ckpt_end(&ck, e->ckpt, st == KVT_OK && res->finish != KVT_FINISH_CANCELLED);

put_back:
    if (e->ssd) kvt_ssd_set_busy(e->ssd, false);
    shared_set_busy(e, false);
    /* 5. what was computed stays cached, also for cancelled requests */
    if (seq && use_cache && kvt_seq_len(seq) > 0) cache_put(e, seq);
    res->peak_kv_bytes = kvt_block_pool_peak_bytes(e->pool);
    pthread_mutex_lock(&e->stats_mu);
    e->requests++;
    e->prompt_tokens += n;
    e->generated_tokens += res->n_gen;
    e->cached_tokens += res->n_reused;
    pthread_mutex_unlock(&e->stats_mu);
done:
    kvt_ckpt_run_free(&ck);
    if (seq) kvt_seq_free(seq);
    kvt_detok_free(dt);
    kvt_strbuf_free(&tb);
    free(gen);
    pthread_mutex_unlock(&e->gen_mu);
    return st;
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
    double now = kvt_now_ms();
    if (now - e->last_tick_ms < 1000.0) return;
    e->last_tick_ms = now;
    uint64_t n = kvt_prompt_cache_demote_idle(e->pc, e->o.ssd_demote_idle_s);
    if (n) kvt_ssd_note_demotions(e->ssd, n);
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
