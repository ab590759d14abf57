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
 * row). kvt_engine_submit (the server) queues a request there without a waiting thread, at every
 * parallel. The stats/flush functions may be called from any thread concurrently with a generation.
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "stats_table.h"
#include "../text/chat.h"
#include "../cache/tier_source.h"
#include "../kv/kv.h"
#include "../text/tokenizer.h"

typedef struct kvt_engine kvt_engine;

#define KVT_SPEC_MAX_DRAFT 64u /* --draft-max upper bound (speculative decoding, docs/speculative.md) */

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
    uint32_t ssd_spill_queue_mb; /* --ssd-spill-queue-mb: write-behind queue bound; 0 = the SSD tier's default */
    uint32_t generation_checkpoint; /* --generation-checkpoint N: checkpoint a generation every N
                                     * emitted tokens (needs ssd_dir); 0 = off (default) */
    const char *shared_url;     /* redis://… shared block tier (with or without ssd_dir); NULL = off */
    uint32_t shared_timeout_ms; /* budget of one request's shared lookup; default 1000 */
    const char *shared_tls_ca, *shared_tls_cert, *shared_tls_key; /* rediss:// (docs/shared-tier.md) */
    bool shared_tls_insecure;   /* rediss:// without certificate verification (explicit opt-in) */
    const char *chat_template;  /* override, NULL = detect */
    const char *chat_template_file; /* --chat-template-file: a Jinja template replacing the GGUF's */
    uint32_t parallel;          /* rows batched per forward step (docs/batching.md); default 4;
                                 * 1 (or 0) = one generation at a time on the calling thread */
    uint32_t queue_max;         /* requests waiting for a row or KV memory before the
                                 * "out of KV memory" error; default 64 */
    uint64_t memory_budget;     /* --memory-budget SIZE in bytes (docs/tiers.md "Memory budget"); 0 with
                                 * memory_budget_auto false = no budget: the pool is derived as before */
    bool memory_budget_auto;    /* --memory-budget auto (the CLI default): MemAvailable and the cgroup
                                 * limit at startup, less a margin (engine/budget.h) */
    bool prompt_cache_set;      /* --prompt-cache was given: a budget honours it or fails */
    uint32_t text_buffers_mb;   /* the budget's part for tokenizer and request parse buffers (serve:
                                 * --parse-budget-mb + --tokenize-budget-mb); 0 = 16 MiB */
    int mla_prefill;            /* kvt_mla_prefill (model/model.h): deepseek2 prefill chunks absorbed
                                 * (0, default), expanded or auto; non-default modes enter the compat key */
    double pin_budget_mb;       /* --pin-budget-mb: RAM the pinned prefixes may hold together; < 0 =
                                 * default: 1024 MiB, at most half the RAM tier */
    /* speculative decoding (docs/speculative.md, engine/spec.h) */
    const char *draft_model;    /* --draft-model: a draft with the target's vocabulary; NULL = off */
    uint32_t draft_max;         /* --draft-max: tokens proposed per round, 1..64, default 16; at most
                                 * (ubatch - 2) / 2 */
    uint32_t draft_min;         /* --draft-min: shorter proposals are dropped (<= draft_max), default 0 */
    float draft_p_min;          /* --draft-p-min: the draft stops where its top probability is below
                                 * this, [0, 1], default 0.75 */
    int draft_threads;          /* --draft-threads: the draft's compute threads, 1..512, default 1 (a
                                 * small draft's passes are too short to split, and its idle workers
                                 * would spin against the target's) */
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
uint32_t kvt_engine_parallel(const kvt_engine *e); /* rows per step (1 = one row at a time) */

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
    /* logit_bias: n_bias (id, bias) pairs added to the logits after the penalties; the arrays are
     * borrowed from the caller for as long as the sampler uses them (one generation). Ids are
     * checked by the caller (< n_vocab); out-of-range ids are ignored. */
    const int32_t *bias_ids;
    const float *bias_vals;
    uint32_t n_bias;
} kvt_sampling;
void kvt_sampling_default(kvt_sampling *s); /* greedy */

typedef enum kvt_finish { KVT_FINISH_LENGTH = 0, KVT_FINISH_STOP = 1, KVT_FINISH_CANCELLED = 2, KVT_FINISH_ERROR = 3 } kvt_finish;
/* kvt_tier (where a reused block came from): src/cache/tier_source.h, shared with the tier manager. */

/* Called for each generated token with its text delta (UTF-8 complete; may be empty). Return false
 * to stop (finish = CANCELLED). */
typedef bool (*kvt_token_cb)(void *ctx, int32_t id, const char *text, size_t len);

/* Log-probabilities of one sampled token (kvt_gen_request.n_logprobs): the log-softmax of the
 * logits the sampler drew from (after penalties, logit bias and any constraint mask; temperature 1,
 * before top-k/top-p/min-p), for the drawn token and the n_top most likely ones (descending; ties
 * by lower id). */
#define KVT_MAX_TOP_LOGPROBS 20
typedef struct kvt_token_logprobs {
    int32_t id;
    float logprob;
    uint32_t n_top;
    int32_t top_ids[KVT_MAX_TOP_LOGPROBS];
    float top_lps[KVT_MAX_TOP_LOGPROBS];
} kvt_token_logprobs;
/* Called for each drawn token, before its on_token call. */
typedef void (*kvt_logprobs_cb)(void *ctx, const kvt_token_logprobs *lp);

/* A per-request logits processor (constrained decoding, src/text/json_schema.h): apply runs before
 * each draw and may set logits to -INFINITY (it must leave at least one finite logit, or the
 * end-of-generation token); accept runs with each drawn token (end-of-generation included) before
 * it is emitted. Both run on the generating thread and must not block. */
typedef struct kvt_logits_proc {
    void (*apply)(void *ctx, float *logits, uint32_t n_vocab);
    void (*accept)(void *ctx, int32_t id);
    void *ctx;
} kvt_logits_proc;

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
    bool render_special;      /* stream control tokens' text too (tool-call markers such as
                               * [TOOL_CALLS] or <|python_tag|>); end-of-generation tokens never are */
    uint32_t n_logprobs;      /* 0 = off; else on_logprobs gets 1 + (n_logprobs - 1) top entries */
    kvt_logprobs_cb on_logprobs;
    kvt_logits_proc proc;     /* apply == NULL: none */
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
 * id out of range), KVT_ERR_POOL_EXHAUSTED ("out of KV memory" after evicting cache-only data),
 * KVT_ERR_STALE (the model file changed after it was loaded: refused, or stopped mid-generation;
 * the message names the file and the change; kvt_engine_model_changed). */
kvt_status kvt_engine_generate(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res,
                               char *err, size_t errlen);

/* Asynchronous generate (the server: one queue, no thread waits for a row). Validates as
 * kvt_engine_generate does and returns such an error at once (done is not called); otherwise queues
 * the request on the batching scheduler, also with parallel == 1 (rows then run one at a time), and
 * returns KVT_OK. done(ctx, st) is called exactly once, on the scheduler thread, after the row ended
 * (res filled as kvt_engine_generate fills it; err set when st != KVT_OK); the request's callbacks
 * run on that thread too. req (and what it points to), res and err are borrowed until done was
 * called. A request cancelled (req->cancel) while it waits ends with KVT_ERR_CANCELLED before its
 * lookup. follow_up: queue ahead of every waiting request (the next choice of an n > 1 request runs
 * right after the previous one). --batch-queue does not bound these submissions: the caller does.
 * KVT_ERR_CANCELLED once kvt_engine_free began. */
typedef void (*kvt_gen_done_cb)(void *ctx, kvt_status st);
kvt_status kvt_engine_submit(kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen,
                             bool follow_up, kvt_gen_done_cb done, void *ctx);

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

/* What GET /stats and /metrics report. The numbers are generated from the tables of
 * engine/stats_table.h (one row per counter: field, /stats key, metric); the rest are not numbers. */
typedef struct kvt_engine_stats {
    /* the model file (model/file_watch.h): changed since it was loaded? then every request fails
     * with KVT_ERR_STALE and nothing more is cached (engine.c [watch]) */
    char model_path[512];
    bool model_changed;
    char model_change[256]; /* what changed ("" while unchanged) */
    bool pc_enabled, ssd_enabled, ckpt_enabled, shared_enabled; /* which tiers are on */
    char ssd_dir[512];
    int shared_fetch_breaker, shared_publish_breaker; /* kvt_breaker_state: 0 closed, 1 open, 2 half-open */
    char shared_last_error[200]; /* latest shared-tier connect failure ("" after a success) */
    char scheme[128];
    bool spec_enabled; /* --draft-model: the "speculative" section */
    KVT_STATS_ALL(KVT_STATS_FIELD_)
} kvt_engine_stats;
void kvt_engine_stats_get(kvt_engine *e, kvt_engine_stats *out);

typedef struct kvt_flush_result {
    bool durable;
    uint64_t entries, pending_blocks, dropped, failed;
    uint64_t records_written, longest_durable_prefix_tokens;
    double elapsed_ms;
    char reason[160]; /* why not durable; empty when durable */
    uint64_t shared_pending; /* the shared tier's publishes still queued (not part of durable) */
    uint64_t demoted;        /* kvt_engine_drain: RAM-tier blocks and snapshots moved to the SSD tier */
} kvt_flush_result;
/* Durability boundary (kvt_tiers_flush: blocks, snapshots, checkpoint records): waits (up to timeout_ms) until nothing the tiers hold is
 * still owed to disk (with --ssd-writeback off it first writes what the RAM tier holds). durable is
 * never true over a dropped or failed record. Without an SSD tier: durable = true, entries = 0. */
void kvt_engine_flush(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out);
/* The `max` longest prefixes the RAM tier holds, longest first (the admin table); *n_prefixes (may
 * be NULL) gets how many it holds. Any thread. */
uint32_t kvt_engine_cache_prefixes(kvt_engine *e, kvt_cached_prefix *out, uint32_t max, uint64_t *n_prefixes);
/* Drain (kvt_tiers_drain): every RAM-tier entry (but pinned ones) moves to the SSD tier now, then
 * the flush above; out->demoted counts what moved. KVT_ERR_UNSUPPORTED (out zeroed) without the SSD
 * tier. */
kvt_status kvt_engine_drain(kvt_engine *e, uint32_t timeout_ms, kvt_flush_result *out);
/* ---- pinned prefixes (docs/tiers.md, "Pinned prefixes") ---- */
typedef struct kvt_pin_info {
    uint64_t id;              /* names the pin (DELETE by id): the prompt's tokens under its namespace */
    uint32_t n_tokens;        /* the pinned prompt */
    uint32_t tokens_in_ram;   /* the prefix held in RAM for it (0 while a restart still warms it) */
    uint32_t cached_tokens;   /* kvt_engine_pin: the tokens the pin's own pass found in the tiers */
    uint64_t bytes;           /* RAM bytes of the pinned units */
    uint64_t budget;          /* the pin budget */
    int64_t created, expires; /* unix seconds; expires 0 = no ttl */
    bool warm;                /* pinned in RAM */
} kvt_pin_info;
/* Pins a prompt prefix under namespace ns (NULL = ""): computes it if absent — one generated token
 * through the normal path (kvt_engine_submit), so its blocks enter the tiers by the one put path —
 * then pins what the RAM tier holds of it (never evicted while pinned), persists it to the SSD tier
 * and the pin list. expires: unix seconds, 0 = none. Errors (message in err): KVT_ERR_UNSUPPORTED
 * (no RAM tier), KVT_ERR_RANGE (over the pin budget: out->bytes / out->budget; or the prompt does
 * not fit the context), the generation's errors (KVT_ERR_POOL_EXHAUSTED, KVT_ERR_STALE, ...), and
 * KVT_ERR_NOT_FOUND when the prefix left RAM again before it could be pinned (retried first). */
kvt_status kvt_engine_pin(kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns, int64_t expires,
                          kvt_pin_info *out, char *err, size_t errlen);
/* The id kvt_engine_pin gives this prompt. */
uint64_t kvt_engine_pin_id(const kvt_engine *e, const int32_t *prompt, uint32_t n, const char *ns);
/* KVT_ERR_NOT_FOUND: no pin of that id. */
kvt_status kvt_engine_unpin(kvt_engine *e, uint64_t id);
/* The pins (*out malloc'd, caller frees). */
kvt_status kvt_engine_pins(kvt_engine *e, kvt_pin_info **out, uint32_t *n);

/* Wait (up to timeout_ms) until the shared tier's publish queues (the target's and the draft's) are empty;
 * true if they are (or no tier). */
bool kvt_engine_shared_flush(kvt_engine *e, uint32_t timeout_ms);
/* Whether the model file changed after it was loaded (checks now; the state is sticky). If so and
 * what != NULL, a description of the change is copied into what. Any thread. */
bool kvt_engine_model_changed(kvt_engine *e, char *what, size_t len);
/* Periodic maintenance: idle demotion to the SSD tier, and a check of the model file. Cheap; call
 * from a timer. */
void kvt_engine_tick(kvt_engine *e);

#endif
