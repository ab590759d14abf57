/*
 * engine.h — one loaded model with its tokenizer, chat template, KV layout, block pool and cache
 * tiers (RAM prompt cache, optional SSD tier), and the generate loop that ties them together:
 * lookup (RAM, then SSD if strictly longer) -> prefill the rest in ubatch chunks (with a
 * prompt-boundary snapshot for long cold prompts) -> decode with sampling -> put back into the cache.
 *
 * Ownership / threading: kvt_engine owns everything it creates. With parallel == 1,
 * kvt_engine_generate runs one request at a time (an internal mutex serialises callers) and its
 * callbacks run on the calling thread. With parallel > 1 (continuous batching, sched.h,
 * docs/batching.md) many threads may call it at once: each request becomes a row of the batching
 * scheduler, the call blocks until its row ended, and its callbacks (on_token, progress) run on
 * the scheduler thread: they must return quickly and never block (a slow callback stalls every
 * row). The stats/flush functions may be called from any thread concurrently with a generation.
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "../text/chat.h"
#include "../kv/kv.h"
#include "../text/tokenizer.h"

typedef struct kvt_engine kvt_engine;

typedef struct kvt_engine_opts {
    const char *model_path;
    int n_threads;              /* 0 = number of cores */
    uint32_t n_ctx;             /* 0 = min(model context, 8192) */
    uint32_t ubatch;            /* prefill chunk, default 512 */
    uint32_t block_tokens;      /* default 256 */
    double kv_pool_gb;          /* block pool budget, 0 = derived (ctx*bytes/token + prompt cache) */
    const char *kv_quant;       /* "off" | "8" | "4" | "turbo[:k<b>v<b>]" | "config"; NULL = off */
    uint32_t kv_quant_group;    /* affine group size; 0 (default) = largest of 128/64/32 dividing head_dim */
    uint32_t kv_quant_start;    /* tokens kept in f16 before quantized blocks start, default 0 */
    bool kv_bf16;               /* base codec bf16 instead of f16 */
    double prompt_cache_gb;     /* RAM tier cap, default 8, 0 disables */
    uint32_t snapshot_min_tokens; /* prompt-boundary snapshot threshold, default 1024 */
    uint32_t recurrent_snapshot_every; /* hybrid (recurrent) models: also snapshot every N prompt
                                        * tokens, rounded up to whole blocks; 0 = off; default 1024 */
    const char *ssd_dir;        /* NULL = no SSD tier */
    double ssd_max_gb;          /* 0 = unlimited */
    bool ssd_writeback;         /* default true */
    double ssd_demote_idle_s;   /* default 300 when the SSD tier is on; <= 0 disables */
    bool ssd_verify;            /* --ssd-cache-verify: check every payload checksum at startup */
    uint32_t generation_checkpoint; /* --generation-checkpoint N: checkpoint a generation every N
                                     * emitted tokens (needs ssd_dir); 0 = off (default) */
    const char *shared_url;     /* redis://… shared block tier (needs ssd_dir); NULL = off */
    uint32_t shared_timeout_ms; /* budget of one request's shared lookup; default 1000 */
    const char *shared_tls_ca, *shared_tls_cert, *shared_tls_key; /* rediss:// (docs/shared-tier.md) */
    bool shared_tls_insecure;   /* rediss:// without certificate verification (explicit opt-in) */
    const char *chat_template;  /* override, NULL = detect */
    uint32_t parallel;          /* rows batched per forward step (docs/batching.md); default 4;
                                 * 1 (or 0) = one generation at a time on the calling thread */
    uint32_t queue_max;         /* requests waiting for a row or KV memory before the
                                 * "out of KV memory" error; default 64 */
    int mla_prefill;            /* kvt_mla_prefill (model/model.h): deepseek2 prefill chunks absorbed
                                 * (0, default), expanded or auto; non-default modes enter the compat key */
} kvt_engine_opts;

void kvt_engine_opts_default(kvt_engine_opts *o);
/* The layer codec of a uniform --kv-quant mode ("8", "4", "turbo[:k<b>v<b>]") for a model with this
 * head_dim; group 0 = auto. The one place that maps the option to a codec (engine and bench). */
kvt_status kvt_engine_uniform_codec(const char *mode, uint32_t group, uint32_t head_dim, kvt_codec *out, char *err,
                                    size_t errlen);

kvt_status kvt_engine_create(const kvt_engine_opts *o, kvt_engine **out, char *err, size_t errlen);
void kvt_engine_free(kvt_engine *e); /* flushes the SSD tier (bounded wait) */

const kvt_tokenizer *kvt_engine_tokenizer(const kvt_engine *e);
const kvt_chat_template *kvt_engine_chat(const kvt_engine *e);
uint32_t kvt_engine_n_ctx(const kvt_engine *e);
uint32_t kvt_engine_n_vocab(const kvt_engine *e);
const char *kvt_engine_model_name(const kvt_engine *e); /* general.name or file basename */
const char *kvt_engine_scheme_key(const kvt_engine *e); /* KV scheme cache key */
const kvt_kv_layout *kvt_engine_layout(const kvt_engine *e);
uint32_t kvt_engine_parallel(const kvt_engine *e); /* rows per step (1 = no scheduler) */

typedef struct kvt_sampling {
    float temperature;       /* 0 = greedy; default 0.8 for servers, CLI decides */
    int32_t top_k;           /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 = off */
    float presence_penalty;  /* 0 = off */
    float frequency_penalty; /* 0 = off */
    int32_t penalty_last_n;  /* window for penalties, default 64 */
    uint64_t seed;
} kvt_sampling;
void kvt_sampling_default(kvt_sampling *s); /* greedy */

typedef enum kvt_finish { KVT_FINISH_LENGTH = 0, KVT_FINISH_STOP = 1, KVT_FINISH_CANCELLED = 2, KVT_FINISH_ERROR = 3 } kvt_finish;
typedef enum kvt_tier { KVT_TIER_NONE = 0, KVT_TIER_RAM = 1, KVT_TIER_SSD = 2, KVT_TIER_SHARED = 3 } kvt_tier;

/* Called for each generated token with its text delta (UTF-8 complete; may be empty). Return false
 * to stop (finish = CANCELLED). */
typedef bool (*kvt_token_cb)(void *ctx, int32_t id, const char *text, size_t len);

typedef struct kvt_gen_request {
    const int32_t *prompt;
    uint32_t n_prompt;
    uint32_t max_tokens;      /* 0 = until context end */
    kvt_sampling sampling;
    const char *ns;           /* namespace (tenant/adapter salt); NULL = "" */
    const char *const *stop;  /* stop strings (NUL-terminated), may be NULL */
    uint32_t n_stop;
    bool ignore_eog;          /* benchmarks: do not stop on end-of-generation tokens */
    bool no_cache;            /* bypass the tiers for this request (neither take nor put) */
    kvt_token_cb on_token;
    void *cb_ctx;
    volatile int *cancel;     /* optional: set non-zero to cancel (from another thread: __atomic_store_n) */
} kvt_gen_request;

typedef struct kvt_gen_result {
    uint32_t n_prompt;
    uint32_t n_reused;        /* prompt tokens not recomputed */
    kvt_tier reused_from;
    uint32_t n_gen;
    int32_t *tokens;          /* malloc'd generated ids (caller frees with free()) */
    kvt_finish finish;
    double ttft_ms, prefill_ms, decode_ms, restore_ms;
    double prefill_tps, decode_tps;
    uint64_t peak_kv_bytes;
} kvt_gen_result;

/* Errors: KVT_ERR_RANGE (prompt too long for the context / empty prompt), KVT_ERR_INVALID_ARG (token
 * id out of range), KVT_ERR_POOL_EXHAUSTED ("out of KV memory" after evicting cache-only data). */
kvt_status kvt_engine_generate(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res,
                               char *err, size_t errlen);

/* Progress of long work inside kvt_engine_generate, for terminal indicators (src/cli/progress.h).
 * Called on the generating thread (the scheduler thread with parallel > 1, where the rows' reports
 * interleave): once with done = 0 when a phase starts, after each prefill
 * chunk / restored block, and once with done == total when the phase ends (also when it stops
 * early). Prefill counts the tokens being computed (the prompt less what was reused). NULL cb =
 * none (the default). Set it while no generation runs. */
typedef enum kvt_progress_phase { KVT_PROGRESS_PREFILL = 1, KVT_PROGRESS_RESTORE = 2 } kvt_progress_phase;
typedef void (*kvt_progress_cb)(void *ctx, kvt_progress_phase phase, uint32_t done, uint32_t total);
void kvt_engine_set_progress(kvt_engine *e, kvt_progress_cb cb, void *ctx);

/* Cache statistics and control for /stats, /metrics and the CLI. */
/* Scoring pass for quality measurements (kvtier bench --kv-quality): forwards prompt[0..n_prompt)
 * through a private sequence (no tiers, no sampler), then n_steps - 1 more tokens one at a time.
 * fn(ctx, step, logits) is called for step = 0 .. n_steps-1 with the next-token logits (n_vocab
 * floats, valid during the call) and returns the token to feed next (teacher forcing: a reference
 * token; free running: its own argmax); the return value of the last step is not forwarded. A
 * returned id outside the vocabulary stops the pass with KVT_ERR_INVALID_ARG. Needs
 * n_prompt + n_steps <= n_ctx. Serialised with generate. */
typedef int32_t (*kvt_logits_fn)(void *ctx, uint32_t step, const float *logits);
kvt_status kvt_engine_score(kvt_engine *e, const int32_t *prompt, uint32_t n_prompt, uint32_t n_steps,
                            kvt_logits_fn fn, void *ctx, char *err, size_t errlen);

typedef struct kvt_engine_stats {
    /* prompt cache */
    bool pc_enabled;
    uint64_t pc_entries, pc_blocks, pc_bytes, pc_max_bytes, pc_hits, pc_misses, pc_reused_tokens,
        pc_evictions, pc_reuse_impossible_untrimmable, pc_reuse_impossible_namespace,
        pc_reuse_impossible_budget;
    /* ssd */
    bool ssd_enabled;
    char ssd_dir[512];
    uint64_t ssd_entries, ssd_bytes, ssd_max_bytes, ssd_restores, ssd_spills, ssd_demotions,
        ssd_pending_blocks, ssd_pending_bytes, ssd_dropped, ssd_failed, ssd_longest_durable_prefix_tokens;
    uint64_t ssd_dirty_records, ssd_shed, ssd_skipped_nonregular, ssd_lost_entries, ssd_dir_recreated;
    double ssd_restore_ms_last;
    /* generation checkpoints (--generation-checkpoint) */
    bool ckpt_enabled;
    uint64_t ckpt_written, ckpt_resumed, ckpt_invalidated, ckpt_failed, ckpt_dropped, ckpt_corrupt, ckpt_pending;
    uint64_t ckpt_retried;               /* saves made early to replace a failed or dropped record */
    uint64_t ckpt_resume_reused_tokens;  /* resumes: prompt ++ emitted tokens restored, not recomputed */
    /* shared tier (Redis) */
    bool shared_enabled;
    uint64_t shared_lookups, shared_hits, shared_fetched_blocks, shared_fetched_bytes, shared_fetched_tokens,
        shared_published_blocks, shared_published_bytes, shared_publish_existing, shared_dropped, shared_errors,
        shared_oom_errors, shared_corrupt, shared_skipped, shared_queue_blocks, shared_breaker_opens;
    int shared_fetch_breaker, shared_publish_breaker; /* kvt_breaker_state: 0 closed, 1 open, 2 half-open */
    uint64_t shared_fetched_snapshots, shared_published_snapshots; /* recurrent layouts */
    char shared_last_error[200];  /* latest shared-tier connect failure ("" after a success) */
    /* pool */
    uint64_t pool_used_bytes, pool_peak_bytes, pool_budget_bytes;
    char scheme[128];
    /* requests */
    uint64_t requests, prompt_tokens, generated_tokens, cached_tokens;
    /* continuous batching (docs/batching.md); with parallel 1 only rows_active is kept */
    uint64_t parallel, rows_active, rows_queued, batch_queue_max, batch_steps, batch_memory_waits, batch_queue_full;
    double batch_tokens_per_step_last, batch_tokens_per_step_avg;
    double batch_prefill_tps_1m, batch_decode_tps_1m;   /* tokens forwarded per second, last minute */
    double queue_wait_ms_last, queue_wait_ms_avg, queue_wait_ms_max;
    double max_decode_stall_ms; /* longest step that carried prefill tokens while rows decoded */
    double max_decode_step_ms;  /* longest step of decode rows only (the stall's baseline) */
} kvt_engine_stats;
void kvt_engine_stats_get(kvt_engine *e, kvt_engine_stats *out);

typedef struct kvt_flush_result {
    bool durable;
    uint64_t entries, pending_blocks, dropped, failed;
    uint64_t records_written, longest_durable_prefix_tokens;
    double elapsed_ms;
    char reason[160]; /* why not durable; empty when durable */
} kvt_flush_result;
/* Durability boundary (kvt_tier_flush): waits (up to timeout_ms) until nothing the tiers hold is
 * still owed to disk (with --ssd-writeback off it first writes what the RAM tier holds). durable is
 * never true over a dropped or failed record. Without an SSD tier: durable = true, entries = 0. */
void kvt_engine_flush(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out);
/* Wait (up to timeout_ms) until the shared tier's publish queue is empty; true if it is (or no tier). */
bool kvt_engine_shared_flush(kvt_engine *e, uint32_t timeout_ms);
/* Periodic maintenance: idle demotion to the SSD tier. Cheap; call from a timer. */
void kvt_engine_tick(kvt_engine *e);

#endif
