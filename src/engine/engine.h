/*
 * engine.h — one loaded model with its tokenizer, chat template, KV layout, block pool and cache
 * tiers (RAM prompt cache, optional SSD tier), and the generate loop that ties them together:
 * lookup (RAM, then SSD if strictly longer) -> prefill the rest in ubatch chunks (with a
 * prompt-boundary snapshot for long cold prompts) -> decode with sampling -> put back into the cache.
 *
 * Ownership / threading: kvt_engine owns everything it creates. kvt_engine_generate runs one request
 * at a time (an internal mutex serialises callers); callbacks run on the calling thread. The
 * stats/flush functions may be called from any thread concurrently with a generation.
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
    const char *kv_quant;       /* "off" | "8" | "4" | "config"; NULL = off */
    uint32_t kv_quant_group;    /* affine group size, default 64 */
    uint32_t kv_quant_start;    /* tokens kept in f16 before quantized blocks start, default 0 */
    bool kv_bf16;               /* base codec bf16 instead of f16 */
    double prompt_cache_gb;     /* RAM tier cap, default 8, 0 disables */
    uint32_t snapshot_min_tokens; /* prompt-boundary snapshot threshold, default 1024 */
    const char *ssd_dir;        /* NULL = no SSD tier */
    double ssd_max_gb;          /* 0 = unlimited */
    bool ssd_writeback;         /* default true */
    double ssd_demote_idle_s;   /* default 300 when the SSD tier is on; <0 disables */
    const char *chat_template;  /* override, NULL = detect */
} kvt_engine_opts;

void kvt_engine_opts_default(kvt_engine_opts *o);

kvt_status kvt_engine_create(const kvt_engine_opts *o, kvt_engine **out, char *err, size_t errlen);
void kvt_engine_free(kvt_engine *e); /* flushes the SSD tier (bounded wait) */

const kvt_tokenizer *kvt_engine_tokenizer(const kvt_engine *e);
const kvt_chat_template *kvt_engine_chat(const kvt_engine *e);
uint32_t kvt_engine_n_ctx(const kvt_engine *e);
uint32_t kvt_engine_n_vocab(const kvt_engine *e);
const char *kvt_engine_model_name(const kvt_engine *e); /* general.name or file basename */
const char *kvt_engine_scheme_key(const kvt_engine *e); /* KV scheme cache key */
const kvt_kv_layout *kvt_engine_layout(const kvt_engine *e);

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
typedef enum kvt_tier { KVT_TIER_NONE = 0, KVT_TIER_RAM = 1, KVT_TIER_SSD = 2 } kvt_tier;

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

/* Cache statistics and control for /stats, /metrics and the CLI. */
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
    double ssd_restore_ms_last;
    /* pool */
    uint64_t pool_used_bytes, pool_peak_bytes, pool_budget_bytes;
    char scheme[128];
    /* requests */
    uint64_t requests, prompt_tokens, generated_tokens, cached_tokens;
} kvt_engine_stats;
void kvt_engine_stats_get(kvt_engine *e, kvt_engine_stats *out);

typedef struct kvt_flush_result {
    bool durable;
    uint64_t entries, pending_blocks, dropped, failed;
} kvt_flush_result;
/* Wait (up to timeout_ms) until everything queued for the SSD tier is durable. Without an SSD tier:
 * durable = true, entries = 0. */
void kvt_engine_flush(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out);
/* Periodic maintenance: idle demotion to the SSD tier. Cheap; call from a timer. */
void kvt_engine_tick(kvt_engine *e);

#endif
