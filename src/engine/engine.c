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
 * [watch] The model file is watched (model/file_watch.h) from before it is mapped: a change of it
 * after the load means the weights being read may no longer be the ones the compatibility key
 * names. Invariants:
 *   W1. Nothing reaches a tier (RAM put, SSD write-behind, shared publish, boundary/recurrent
 *       snapshot, generation checkpoint) unless a check of the file made after it was computed and
 *       before the hand-off found the file unchanged (weights_ok); a refused hand-off is counted.
 *   W2. No token is sampled or streamed from a forward pass unless such a check after the pass
 *       found the file unchanged (kvt_row_advance); the row ends with KVT_ERR_STALE instead.
 *   W3. Once a change is seen, every new request (generate, score) fails with KVT_ERR_STALE and a
 *       message naming the file and the change; the state never goes back (restart to reload).
 * What the tiers held before the change was checked on its way in and stays valid under the key.
 *
 * The steps are the phases of a row (row.h, row.c): kvt_row_begin (2 and the prefill setup),
 * kvt_row_plan + kvt_row_advance per forward (one prefill chunk, one decode token, or a speculative
 * round's verify pass with --draft-model: spec.h; sampling and streaming in advance), kvt_row_end
 * (5). With --parallel 1 kvt_engine_generate drives its row inline under gen_mu; otherwise, and for
 * every kvt_engine_submit (the server), the batching scheduler (sched.c) drives the rows, one
 * kvt_model_forward_batch per step (docs/batching.md).
 */
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/quant.h"
#include "engine_int.h"
#include "scheme.h"

/* The SSD and shared tiers' options from the engine's (the same for the target's tiers and the
 * draft's: each caller sets its own layout, pool and compatibility key). With a draft the SSD cap is
 * split between the two compat directories by bytes per token; share_draft picks the draft's part. */
static void ssd_opts_of(const kvt_engine *e, bool share_draft, kvt_ssd_opts *so) {
    const kvt_engine_opts *o = &e->o;
    kvt_ssd_opts_default(so);
    so->dir = o->ssd_dir;
    so->max_bytes = (uint64_t)(o->ssd_max_gb * 1e9);
    if (e->spec) {
        const double tb = kvt_kv_layout_bytes_per_token(e->layout), db = kvt_kv_layout_bytes_per_token(kvt_spec_layout(e->spec));
        so->max_bytes = (uint64_t)((double)so->max_bytes * (share_draft ? db : tb) / (tb + db));
    }
    so->verify = o->ssd_verify;
    so->queue_max_bytes = (uint64_t)o->ssd_spill_queue_mb << 20;
}
static void shared_opts_of(const kvt_engine_opts *o, kvt_shared_opts *sho) {
    kvt_shared_opts_default(sho);
    sho->url = o->shared_url;
    if (o->shared_timeout_ms) sho->timeout_ms = o->shared_timeout_ms;
    sho->tls_ca_file = o->shared_tls_ca;
    sho->tls_cert_file = o->shared_tls_cert;
    sho->tls_key_file = o->shared_tls_key;
    sho->tls_insecure = o->shared_tls_insecure;
}

static bool weights_ok_cb(void *e);

static void restore_progress(void *ctx, uint32_t done, uint32_t total) { kvt_engine_report(ctx, KVT_PROGRESS_RESTORE, done, total); }

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
    o->pin_budget_mb = -1;
    o->draft_max = 16;
    o->draft_min = 0;
    o->draft_p_min = 0.75f;
    o->draft_threads = 1;
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

/* ---- the memory budget ------------------------------------------------------------------------ */

#define KVT_TEXT_BUFFERS_DEFAULT_MB 16 /* tokenizer and parse buffers when the caller names none */

/* Splits --memory-budget (budget.h) into its parts once the model, layout and compute context exist;
 * *pc_bytes / *pool_bytes get the RAM tier cap and the pool budget. Logs the split in one line. */
static kvt_status plan_memory(kvt_engine *e, uint64_t *pc_bytes, uint64_t *pool_bytes, char *err, size_t errlen) {
    const kvt_engine_opts *o = &e->o;
    kvt_mem_split_in *in = &e->mem_in;
    char source[256];
    memset(in, 0, sizeof *in);
    if (o->memory_budget_auto) {
        kvt_mem_probe pr;
        kvt_status st = kvt_mem_probe_auto(&pr, err, errlen);
        if (st) return st;
        char a[32], l[32], m[32];
        snprintf(source, sizeof source, "auto: %s available%s%s, margin %s kept",
                 kvt_fmt_bytes((double)pr.available, a, sizeof a), pr.cgroup_limit ? ", cgroup limit " : "",
                 pr.cgroup_limit ? kvt_fmt_bytes((double)pr.cgroup_limit, l, sizeof l) : "",
                 kvt_fmt_bytes((double)pr.margin, m, sizeof m));
        in->budget = pr.budget;
    } else {
        snprintf(source, sizeof source, "--memory-budget");
        in->budget = o->memory_budget;
    }
    const uint32_t par = o->parallel ? o->parallel : 1;
    in->parts.weights = kvt_gguf_file_size(e->gguf);
    in->parts.weight_copies = kvt_model_private_bytes(e->model);
    /* the context's buffers, plus the logits rows a batched step of every live row grows to */
    in->parts.compute = kvt_ctx_bytes(e->ctx) + (uint64_t)par * e->n_vocab * sizeof(float);
    in->parts.spill_queue = o->ssd_dir ? (o->ssd_spill_queue_mb ? (uint64_t)o->ssd_spill_queue_mb << 20 : 256ull << 20) : 0;
    in->parts.text = (uint64_t)(o->text_buffers_mb ? o->text_buffers_mb : KVT_TEXT_BUFFERS_DEFAULT_MB) << 20;
    in->parts.draft = e->spec ? kvt_spec_fixed_bytes(e->spec) : 0;
    in->row_bytes = kvt_row_kv_bytes(e->layout, e->n_ctx, o->ubatch);
    in->parallel = par;
    in->kv_pool = o->kv_pool_gb > 0 ? (uint64_t)(o->kv_pool_gb * 1e9) : 0;
    in->ram_tier_set = o->prompt_cache_set;
    in->ram_tier = (uint64_t)(o->prompt_cache_gb * 1e9);
    kvt_status st = kvt_mem_split_plan(in, &e->mem, err, errlen);
    if (st) return st;
    if (o->ssd_dir && e->mem.ram_tier == 0)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "the memory budget leaves no room for the RAM tier, which --ssd-cache needs; raise --memory-budget");
    char line[1024];
    kvt_mem_split_describe(in, &e->mem, source, line, sizeof line);
    KVT_INFO("%s", line);
    e->mem_on = true;
    *pc_bytes = e->mem.ram_tier;
    *pool_bytes = e->mem.kv_pool;
    return KVT_OK;
}

/* ---- tier wiring -------------------------------------------------------------------------- */

static bool weights_ok_cb(void *e);
static bool both_weights_ok_cb(void *ctx) { /* the companion's admit gate: target and draft unchanged */
    kvt_engine *e = ctx;
    return weights_ok_cb(e) && kvt_spec_weights_ok(e->spec);
}

/* The draft's own tier set (companion.h) beside the target's: the same RAM-tier token capacity, the
 * SSD tier's byte cap split between the two by bytes per token, the same shared tier settings. */
static kvt_status open_companion(kvt_engine *e, char *err, size_t errlen) {
    const kvt_engine_opts *o = &e->o;
    char key[KVT_SSD_COMPAT_KEY_MAX];
    kvt_status st = kvt_spec_companion_key(e->spec, e->compat, o->ssd_dir, o->ssd_dir || o->shared_url, key, sizeof key,
                                           err, errlen);
    if (st) return st;
    kvt_ssd_opts so;
    kvt_shared_opts sho;
    if (o->ssd_dir) ssd_opts_of(e, true, &so);
    if (o->shared_url) shared_opts_of(o, &sho);
    kvt_companion_opts co = {.key = key, .layout = kvt_spec_layout(e->spec), .pool = kvt_spec_pool(e->spec),
                             .ram_bytes = KVT_MAX(kvt_spec_cache_bytes(e->spec), (uint64_t)1 << 20),
                             .ssd = o->ssd_dir ? &so : NULL, .shared = o->shared_url ? &sho : NULL,
                             .writeback = o->ssd_writeback, .demote_idle_s = o->ssd_demote_idle_s,
                             .admit = both_weights_ok_cb, .admit_ctx = e};
    if ((st = kvt_companion_create(&co, &e->companion, err, errlen))) return st;
    kvt_spec_set_tiers(e->spec, kvt_companion_tiers(e->companion), key);
    return KVT_OK;
}

/* The speculative-decoding options (docs/speculative.md), before anything is loaded. */
static kvt_status check_draft_opts(const kvt_engine_opts *o, char *err, size_t errlen) {
    if (!o->draft_model) return KVT_OK;
    if (o->draft_max < 1 || o->draft_max > KVT_SPEC_MAX_DRAFT)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--draft-max must be in [1, %u] (got %u)", KVT_SPEC_MAX_DRAFT,
                        o->draft_max);
    if (o->draft_min > o->draft_max)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--draft-min %u is more than --draft-max %u", o->draft_min,
                        o->draft_max);
    if (!(o->draft_p_min >= 0.0f && o->draft_p_min <= 1.0f))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--draft-p-min must be in [0, 1] (got %g)", (double)o->draft_p_min);
    if (o->draft_threads < 1 || o->draft_threads > 512)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--draft-threads must be in [1, 512] (got %d)", o->draft_threads);
    /* a verify pass (next + draft_max tokens) is one forward chunk, and the window blocks kept for
     * its rollback stay within the row's KV reservation (kvt_row_kv_bytes over one ubatch) */
    const uint32_t ub = o->ubatch ? o->ubatch : 512;
    if (2 * o->draft_max + 2 > ub)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--draft-max %u needs --ubatch of at least %u (got %u)",
                        o->draft_max, 2 * o->draft_max + 2, ub);
    return KVT_OK;
}

kvt_status kvt_engine_create(const kvt_engine_opts *o, kvt_engine **out, char *err, size_t errlen) {
    *out = NULL;
    if (!o->model_path) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "no model given (-m MODEL.gguf)");
    if (o->ssd_dir && o->prompt_cache_gb <= 0)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--ssd-cache needs the RAM tier: it cannot be used with --prompt-cache 0");
    if (o->block_tokens < 16 || o->block_tokens > 4096)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--block-tokens must be in [16, 4096]");
    if (o->mla_prefill < KVT_MLA_PREFILL_ABSORBED || o->mla_prefill > KVT_MLA_PREFILL_AUTO)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--mla-prefill must be absorbed, expanded or auto");
    kvt_status st = check_draft_opts(o, err, errlen);
    if (st) return st;
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
    /* [watch] opened first: the mapping and the identity hash below must read the watched file */
    st = kvt_file_watch_open(o->model_path, &e->watch, err, errlen);
    if (st) goto fail;
    st = kvt_gguf_open(o->model_path, &e->gguf, err, errlen);
    if (st) goto fail;
    st = kvt_model_load(e->gguf, &e->model, err, errlen);
    if (st) goto fail;
    st = kvt_tokenizer_create(e->gguf, &e->tok, err, errlen);
    if (st) goto fail;
    st = o->chat_template_file ? kvt_chat_template_create_file(o->chat_template_file, e->tok, &e->chat, err, errlen)
                               : kvt_chat_template_create(e->gguf, e->tok, o->chat_template, &e->chat, err, errlen);
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
    st = kvt_scheme_layout(&e->o, e->model, &e->layout, err, errlen);
    if (st) goto fail;
    kvt_kv_layout_key(e->layout, e->scheme, sizeof e->scheme);
    e->recurrent = kvt_kv_layout_state_bytes(e->layout) > 0;
    for (uint32_t g = 0; g < kvt_kv_layout_n_groups(e->layout); g++)
        if (kvt_kv_layout_group_kind(e->layout, g) == KVT_KIND_WINDOW) {
            uint32_t w = kvt_kv_layout_group_window(e->layout, g);
            if (!e->min_window || w < e->min_window) e->min_window = w;
        }

    /* compatibility key: SHA-256 of the weights (memoized) only when something persists */
    /* a non-default MLA prefill mode changes KV numerics: its tag keeps every tier's blocks apart */
    const char *mla_tag = kvt_mla_prefill_numerics_tag(hp, (kvt_mla_prefill)o->mla_prefill);
    if (o->mla_prefill != KVT_MLA_PREFILL_ABSORBED && !hp->mla.kv_lora_rank)
        KVT_WARN("--mla-prefill %s has no effect: %s has no latent (MLA) attention layers",
                 o->mla_prefill == KVT_MLA_PREFILL_EXPANDED ? "expanded" : "auto", kvt_arch_name(hp->arch));
    {
        char num[96];
        snprintf(num, sizeof num, "%s%s%s", kvt_kernels_numerics_id(), kvt_model_numerics_tag(e->model), mla_tag);
        st = kvt_scheme_compat_key(o->model_path, e->watch, e->layout, kvt_tokenizer_hash(e->tok), num, o->ssd_dir,
                                   o->ssd_dir || o->shared_url, e->compat, sizeof e->compat, err, errlen);
        if (st) goto fail;
    }
    /* [watch] the mapping, the tokenizer and the identity hash all read the watched file, unchanged */
    if (!kvt_file_watch_path_ok(e->watch)) {
        char what[256] = "";
        kvt_file_watch_changed(e->watch, what, sizeof what);
        st = kvt_errf(err, errlen, KVT_ERR_STALE, "the model file %s changed while it was being loaded (%s); try again",
                      o->model_path, what);
        goto fail;
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
    if (o->draft_model) {
        if (e->recurrent) {
            st = kvt_errf(err, errlen, KVT_ERR_UNSUPPORTED,
                          "--draft-model: the target (%s) has recurrent layers, whose state cannot be cut back to the "
                          "accepted tokens; speculative decoding needs a target with attention layers only",
                          kvt_arch_name(hp->arch));
            goto fail;
        }
        /* one draft sequence per row: --parallel rows, and an inline --parallel 1 generation beside them */
        kvt_spec_opts so = {.model_path = o->draft_model, .draft_max = o->draft_max, .draft_min = o->draft_min,
                            .p_min = o->draft_p_min, .n_threads = o->draft_threads, .ubatch = e->o.ubatch,
                            .n_ctx = e->n_ctx, .block_tokens = o->block_tokens,
                            .rows = (o->parallel ? o->parallel : 1) + 1};
        st = kvt_spec_create(&so, e->tok, e->n_vocab, &e->spec, err, errlen);
        if (st) goto fail;
    }
    /* pool budget: one full context for each live row (--parallel) + the prompt cache cap, or the
     * memory budget's split (budget.h) */
    uint64_t pc_bytes = (uint64_t)(o->prompt_cache_gb * 1e9), budget = 0;
    if (o->memory_budget || o->memory_budget_auto) {
        st = plan_memory(e, &pc_bytes, &budget, err, errlen);
        if (st) goto fail;
    } else {
        double bpt = kvt_kv_layout_bytes_per_token(e->layout);
        uint64_t live = (uint64_t)((double)(e->n_ctx + 2 * e->o.block_tokens + e->o.ubatch) * bpt) + (1u << 20);
        live *= o->parallel ? o->parallel : 1;
        budget = o->kv_pool_gb > 0 ? (uint64_t)(o->kv_pool_gb * 1e9) : live + pc_bytes;
    }
    if (e->spec) { /* the draft's RAM tier (companion.h) */
        const double tb = kvt_kv_layout_bytes_per_token(e->layout), db = kvt_spec_bytes_per_token(e->spec);
        uint64_t draft_cache = 0;
        if (pc_bytes && e->mem_on) { /* a share of the budget's RAM tier, by bytes per token */
            draft_cache = (uint64_t)((double)pc_bytes * db / (tb + db));
            pc_bytes -= draft_cache;
            budget -= draft_cache;
        } else if (pc_bytes) { /* as many tokens as the target's, beside --prompt-cache */
            draft_cache = (uint64_t)((double)pc_bytes * db / tb);
        }
        if ((st = kvt_spec_open_pool(e->spec, draft_cache))) goto fail;
        if (draft_cache) {
            char a[32], b[32];
            KVT_INFO("--draft-model: the draft's RAM tier %s (%s, as many tokens as the target's %s)",
                     kvt_fmt_bytes((double)draft_cache, a, sizeof a),
                     e->mem_on ? "its share of the budget's RAM tier" : "beside --prompt-cache",
                     kvt_fmt_bytes((double)pc_bytes, b, sizeof b));
        }
    }
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
        ssd_opts_of(e, false, &so);
        so.compat_key = e->compat;
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
    if (o->shared_url) {
        kvt_shared_opts sho;
        shared_opts_of(o, &sho);
        sho.layout = e->layout;
        sho.pool = e->pool;
        sho.compat_key = e->compat;
        st = kvt_shared_create(&sho, NULL, &e->shared, err, errlen);
        if (st) goto fail;
    }
    if (e->pc) { /* the tier manager over every backend created above */
        uint64_t pin_budget = o->pin_budget_mb >= 0 ? (uint64_t)(o->pin_budget_mb * 1048576.0)
                                                    : KVT_MIN((uint64_t)1 << 30, pc_bytes / 2);
        kvt_tiers_opts to = {.pool = e->pool, .ram = e->pc, .ssd = e->ssd, .ckpt = e->ckpt, .shared = e->shared,
                             .writeback = o->ssd_writeback, .demote_idle_s = o->ssd_demote_idle_s,
                             .admit = weights_ok_cb, .admit_ctx = e, .pin_budget = pin_budget};
        e->tier = kvt_tiers_create(&to);
        if (!e->tier) {
            st = KVT_ERR_NOMEM;
            goto fail;
        }
        if (e->spec && (st = open_companion(e, err, errlen))) goto fail;
    }
    snprintf(e->ckpt_compat, sizeof e->ckpt_compat, "%s%s%s", e->compat, e->spec ? ";draft=" : "",
             e->spec ? kvt_spec_key(e->spec) : "");
    /* the scheduler runs at every --parallel: kvt_engine_submit always queues there; with
     * --parallel 1 kvt_engine_generate still drives its row inline (one row at a time either way) */
    e->parallel = o->parallel ? o->parallel : 1;
    kvt_sched_opts so = {.parallel = e->parallel, .queue_max = o->queue_max ? o->queue_max : 64, .ubatch = e->o.ubatch,
                         .budget = kvt_block_pool_budget(e->pool)};
    st = kvt_sched_create(e, &so, &e->sched);
    if (st) {
        kvt_errf(err, errlen, st, "cannot start the batching scheduler (--parallel %u)", e->parallel);
        goto fail;
    }
    kvt_engine_pins_warm_start(e); /* pinned prefixes of the pin list back into RAM, in the background */
    *out = e;
    return KVT_OK;
fail:
    if (err && !err[0]) kvt_errf(err, errlen, st, "%s", kvt_status_str(st));
    kvt_engine_free(e);
    return st;
}

void kvt_engine_free(kvt_engine *e) {
    if (!e) return;
    kvt_engine_pins_warm_stop(e); /* its generation is a row: before the scheduler goes */
    kvt_sched_free(e->sched); /* cancels what still runs; no row touches the tiers after this */
    e->sched = NULL;
    kvt_companion_free(e->companion); /* every row (and its draft state) ended with the scheduler */
    e->companion = NULL;
    kvt_spec_free(e->spec); /* after the companion tiers: they borrow the draft's pool */
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
    kvt_file_watch_free(e->watch);
    pthread_mutex_destroy(&e->gen_mu);
    pthread_mutex_destroy(&e->lookup_mu);
    pthread_mutex_destroy(&e->stats_mu);
    free(e->model_path);
    free(e);
}

/* ---- [watch] the model file ------------------------------------------------------------------ */

/* KVT_ERR_STALE with the message every refusal carries (W2, W3). */
static kvt_status model_changed(kvt_engine *e, char *err, size_t errlen) {
    char what[256] = "";
    kvt_file_watch_changed(e->watch, what, sizeof what);
    return kvt_errf(err, errlen, KVT_ERR_STALE,
                    "the model file %s changed after it was loaded (%s): kvtier no longer computes from it; "
                    "restart kvtier to load the file as it is now", e->model_path, what);
}

/* W1: true when what is about to be handed to a tier was computed from the loaded weights (the
 * file is unchanged now, after the computation: file_watch.h); otherwise counts the refusal. */
static bool weights_ok(kvt_engine *e) {
    if (kvt_file_watch_ok(e->watch)) return true;
    __atomic_add_fetch(&e->stale_dropped, 1, __ATOMIC_RELAXED);
    return false;
}
static bool weights_ok_cb(void *e) { return weights_ok(e); } /* the tier manager's admit gate */

bool kvt_engine_model_changed(kvt_engine *e, char *what, size_t len) {
    if (kvt_file_watch_ok(e->watch)) return false;
    kvt_file_watch_changed(e->watch, what, len);
    return true;
}

/* ---- generate ------------------------------------------------------------------------------- */

/* A finished or boundary sequence into the tiers (RAM put, write-behind incl. its recurrent-state
 * snapshot, the shared tier's publisher: kvt_tiers_put; W1 is its admit gate). */
static void cache_put(kvt_engine *e, kvt_seq *seq) { kvt_tiers_put(e->tier, seq); }
/* A growing sequence's sealed blocks into the RAM tier and write-behind. */
static void put_blocks(kvt_engine *e, kvt_seq *seq) { kvt_tiers_put_blocks(e->tier, seq); }

/* ---- what the row phases use (engine_int.h; the phases themselves are in row.c) ---------------- */

void kvt_engine_cache_put(kvt_engine *e, kvt_seq *seq) { cache_put(e, seq); }
void kvt_engine_cache_put_local(kvt_engine *e, kvt_seq *seq) { kvt_tiers_put_local(e->tier, seq); }
void kvt_engine_put_blocks(kvt_engine *e, kvt_seq *seq) { put_blocks(e, seq); }
bool kvt_engine_weights_ok(kvt_engine *e) { return weights_ok(e); }
kvt_status kvt_engine_stale(kvt_engine *e, char *err, size_t errlen) { return model_changed(e, err, errlen); }
uint64_t kvt_engine_row_reserve(const kvt_engine *e, uint32_t n, uint32_t max_new) {
    return kvt_row_kv_bytes(e->layout, (uint64_t)n + max_new, e->o.ubatch); /* what the row really holds */
}
void kvt_engine_set_decoding(kvt_engine *e, bool any) {
    if (any == e->decoding) return;
    e->decoding = any;
    kvt_tiers_set_busy(e->tier, any);
    if (e->companion) kvt_tiers_set_busy(kvt_companion_tiers(e->companion), any);
}

/* 1. validate the request; *max_new: the new tokens it may make. */
static kvt_status validate(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen,
                           uint32_t *max_new) {
    memset(res, 0, sizeof *res);
    res->finish = KVT_FINISH_ERROR;
    if (!kvt_file_watch_ok(e->watch)) return model_changed(e, err, errlen); /* W3 */
    const uint32_t n = req->n_prompt;
    if (n == 0) return kvt_errf(err, errlen, KVT_ERR_RANGE, "the prompt is empty");
    if (n >= e->n_ctx)
        return kvt_errf(err, errlen, KVT_ERR_RANGE, "prompt has %u tokens but the context holds %u (leave room for at least one generated token)", n, e->n_ctx);
    for (uint32_t i = 0; i < n; i++)
        if (req->prompt[i] < 0 || (uint32_t)req->prompt[i] >= e->n_vocab)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "token id %d at position %u is outside the vocabulary [0, %u)",
                            req->prompt[i], i, e->n_vocab);
    *max_new = e->n_ctx - n;
    if (req->max_tokens && req->max_tokens < *max_new) *max_new = req->max_tokens;
    return KVT_OK;
}

/* A submitted row on the heap, with the caller's completion callback (kvt_engine_submit). */
typedef struct submitted {
    kvt_row r; /* first: the scheduler's on_done gets &r */
    kvt_gen_done_cb done;
    void *ctx;
} submitted;

static void submitted_done(kvt_row *r, void *ctx) {
    submitted *sb = ctx;
    const kvt_status st = r->st;
    sb->done(sb->ctx, st);
    free(sb);
}

kvt_status kvt_engine_submit(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen,
                             bool follow_up, kvt_gen_done_cb done, void *ctx) {
    uint32_t max_new = 0;
    kvt_status st = validate(e, req, res, err, errlen, &max_new);
    if (st) return st;
    submitted *sb = malloc(sizeof *sb);
    if (!sb) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    kvt_row_init(&sb->r, e, req, res, err, errlen, req->n_prompt, max_new);
    sb->done = done;
    sb->ctx = ctx;
    st = kvt_sched_submit(e->sched, &sb->r, follow_up, submitted_done, sb);
    if (st) free(sb);
    return st;
}

kvt_status kvt_engine_generate(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen) {
    uint32_t max_new = 0;
    kvt_status vst = validate(e, req, res, err, errlen, &max_new);
    if (vst) return vst;
    kvt_row r;
    kvt_row_init(&r, e, req, res, err, errlen, req->n_prompt, max_new);
    if (e->parallel > 1) return kvt_sched_run(e->sched, &r); /* the scheduler thread drives it */

    /* --parallel 1: this thread drives its one row, one generation at a time */
    pthread_mutex_lock(&e->gen_mu);
    __atomic_store_n(&e->inline_active, 1, __ATOMIC_RELAXED);
    kvt_row_begin(&r);
    while (r.state != KVT_ROW_DONE) {
        const int32_t *tok = NULL;
        uint32_t m = kvt_row_plan(&r, UINT32_MAX, &tok);
        if (!m) break;
        float *logits = NULL;
        kvt_status st = kvt_model_forward(e->ctx, r.seq, tok, m, kvt_row_verifies(&r), req->cancel, &logits);
        kvt_row_advance(&r, m, st, logits);
    }
    kvt_row_end(&r);
    __atomic_store_n(&e->inline_active, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&e->gen_mu);
    return r.st;
}

/* ---- stats, flush, maintenance ---------------------------------------------------------------- */

/* VmRSS and VmHWM of this process (bytes; 0 when /proc is unreadable). */
static void read_rss(uint64_t *rss, uint64_t *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) *rss = (uint64_t)kb << 10;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) *hwm = (uint64_t)kb << 10;
    }
    fclose(f);
}

/* The memory section of /stats (stats_table.h KVT_STATS_MEMORY). */
static void memory_stats(kvt_engine *e, const kvt_sched_stats *b, kvt_engine_stats *out) {
    if (e->mem_on) {
        out->mem_budget_bytes = e->mem_in.budget;
        out->mem_weights_bytes = e->mem_in.parts.weights;
        out->mem_weight_copies_bytes = e->mem_in.parts.weight_copies;
        out->mem_compute_bytes = e->mem_in.parts.compute;
        out->mem_spill_queue_bytes = e->mem_in.parts.spill_queue;
        out->mem_text_bytes = e->mem_in.parts.text;
        out->mem_live_rows_bytes = e->mem.live_rows;
    }
    out->mem_kv_pool_bytes = out->pool_budget_bytes;
    out->mem_kv_pool_used_bytes = out->pool_used_bytes;
    out->mem_ram_tier_bytes = out->pc_max_bytes;
    out->mem_ram_tier_used_bytes = out->pc_bytes;
    out->mem_spill_queue_used_bytes = out->ssd_pending_bytes;
    out->mem_rows_reserved_bytes = b->reserved;
    read_rss(&out->mem_rss_bytes, &out->mem_rss_peak_bytes);
    kvt_tiers_pressure_stats(e->tier, &out->mem_pressure_events, &out->mem_pressure_freed_bytes, &out->mem_pressure_failed);
}

void kvt_engine_stats_get(kvt_engine *e, kvt_engine_stats *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->model_path, sizeof out->model_path, "%s", e->model_path);
    out->model_changed = kvt_engine_model_changed(e, out->model_change, sizeof out->model_change); /* [watch] */
    out->model_stale_dropped = __atomic_load_n(&e->stale_dropped, __ATOMIC_RELAXED);
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
        out->ssd_staged = s.staged;
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
    kvt_sched_stats b;
    kvt_sched_stats_get(e->sched, &b);
    /* --parallel 1: inline generations (kvt_engine_generate) beside submitted rows */
    out->rows_active = b.rows_active + (uint64_t)__atomic_load_n(&e->inline_active, __ATOMIC_RELAXED);
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
    memory_stats(e, &b, out);
    if (e->spec) {
        kvt_spec_stats ss;
        kvt_spec_stats_get(e->spec, &ss);
        out->spec_enabled = true;
        out->spec_rounds = ss.rounds;
        out->spec_proposed = ss.proposed;
        out->spec_accepted = ss.accepted;
        out->spec_acceptance_rate = ss.proposed ? (double)ss.accepted / (double)ss.proposed : 0;
        out->spec_draft_ms = ss.draft_ms;
        out->spec_draft_time_share = ss.decode_ms > 0 ? KVT_MIN(1.0, ss.draft_ms / ss.decode_ms) : 0;
        out->spec_off_rows = ss.off_rows;
        out->spec_reused_ram = ss.reused[KVT_TIER_RAM];
        out->spec_reused_ssd = ss.reused[KVT_TIER_SSD];
        out->spec_reused_shared = ss.reused[KVT_TIER_SHARED];
        out->spec_recomputed = ss.recomputed;
        out->spec_recompute_rows = ss.recompute_rows;
        kvt_companion_stats cs;
        kvt_companion_stats_get(e->companion, &cs);
        out->spec_state_ram_bytes = cs.ram_bytes;
        out->spec_state_ssd_entries = cs.ssd_entries;
        out->spec_state_ssd_bytes = cs.ssd_bytes;
    }
}

uint32_t kvt_engine_cache_prefixes(kvt_engine *e, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes) {
    return kvt_tiers_prefixes(e->tier, out, max, n_prefixes);
}

static void flush_result_of(const kvt_tiers_flush_result *r, kvt_flush_result *out) {
    memset(out, 0, sizeof *out);
    out->durable = r->durable;
    out->entries = r->blocks.entries;
    out->pending_blocks = r->blocks.pending_blocks;
    out->dropped = r->blocks.dropped;
    out->failed = r->blocks.failed;
    out->records_written = r->blocks.records_written;
    out->longest_durable_prefix_tokens = r->blocks.longest_durable_prefix_tokens;
    out->elapsed_ms = r->blocks.elapsed_ms;
    out->shared_pending = r->shared_pending;
    out->demoted = r->demoted;
    snprintf(out->reason, sizeof out->reason, "%s", r->reason);
}

void kvt_engine_flush(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out) {
    kvt_tiers_flush_result r;
    kvt_tiers_flush(e->tier, timeout_ms, &r);
    if (e->companion) { /* the draft's state (companion.h): durable only with the target's */
        kvt_tiers_flush_result d;
        kvt_tiers_flush(kvt_companion_tiers(e->companion), timeout_ms, &d);
        kvt_companion_merge_flush(&r, &d);
    }
    flush_result_of(&r, out);
}

kvt_status kvt_engine_drain(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out) {
    memset(out, 0, sizeof *out);
    if (!e->ssd) return KVT_ERR_UNSUPPORTED;
    kvt_tiers_flush_result r;
    kvt_status st = e->tier ? kvt_tiers_drain(e->tier, timeout_ms, &r) : KVT_ERR_UNSUPPORTED;
    if (st == KVT_OK && e->companion) {
        kvt_tiers_flush_result d;
        if (kvt_tiers_drain(kvt_companion_tiers(e->companion), timeout_ms, &d) == KVT_OK) kvt_companion_merge_flush(&r, &d);
    }
    if (st == KVT_OK) flush_result_of(&r, out);
    return st;
}

void kvt_engine_tick(kvt_engine *e) {
    (void)kvt_file_watch_ok(e->watch); /* [watch] an idle server notices (and logs) a change too */
    /* idle demotion: between steps only (the scheduler holds gen_mu while it forwards) */
    kvt_tiers_tick(e->tier, &e->gen_mu);
    if (e->companion) kvt_tiers_tick(kvt_companion_tiers(e->companion), &e->gen_mu);
}

/* ---- scoring (quality harness) ---------------------------------------------------------------- */

kvt_status kvt_engine_score(kvt_engine *e, const int32_t *prompt, uint32_t n_prompt, uint32_t n_steps,
                            kvt_logits_fn fn, void *ctx, char *err, size_t errlen) {
    if (n_prompt == 0 || n_steps == 0) return kvt_errf(err, errlen, KVT_ERR_RANGE, "score: empty prompt or no steps");
    if (!kvt_file_watch_ok(e->watch)) return model_changed(e, err, errlen); /* W3 */
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
        if (!kvt_file_watch_ok(e->watch)) { /* W2 */
            st = model_changed(e, err, errlen);
            break;
        }
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

bool kvt_engine_shared_flush(kvt_engine *e, uint32_t timeout_ms) {
    const double t0 = kvt_now_ms();
    const bool ok = kvt_shared_flush(e->shared, timeout_ms);
    const double left = (double)timeout_ms - (kvt_now_ms() - t0);
    /* the draft's publishes too (companion.h), within what is left of the timeout */
    return kvt_companion_shared_flush(e->companion, left > 1 ? (uint32_t)left : 1) && ok;
}
