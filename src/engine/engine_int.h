/*
 * engine_int.h — internal to src/engine: the engine's state, for the files that implement one of its
 * concerns (row.c: the row phases; engine.c: create/free/generate/score, the cache wiring). Not a
 * public header; sched.c does not include it (it sees the engine through row.h only).
 *
 * Ownership: every field is owned by the engine (engine.c creates and frees them); row.c reads
 * them, and writes only what the comments below name, under the locks they name.
 */
#ifndef KVT_ENGINE_INT_H
#define KVT_ENGINE_INT_H

#include <pthread.h>

#include "../cache/tier.h" /* the one cache header the engine needs: it names every backend */
#include "../model/file_watch.h"
#include "budget.h"
#include "companion.h"
#include "row.h"
#include "sched.h"

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
    kvt_file_watch *watch; /* [watch] the model file, held open since before it was mapped */
    uint64_t stale_dropped; /* [watch] hand-offs refused after the model file changed (atomic) */
    kvt_tiers *tier; /* the tier manager: every cache policy (lookup, put, flush, tick, checkpoints) */
    kvt_ckpt_store *ckpt; /* generation checkpoints (--generation-checkpoint), NULL = off */
    kvt_spec *spec;       /* speculative decoding's draft (--draft-model, spec.h), NULL = off */
    kvt_companion *companion; /* the draft's tier set (companion.h), with spec and the RAM tier; else NULL */
    /* the checkpoint request key's compatibility part: compat, and with a draft its companion key
     * (the draft's proposals shape the RNG's use, so a record of another configuration would not
     * resume byte-identically) */
    char ckpt_compat[1024 + KVT_SSD_COMPAT_KEY_MAX + 16];
    kvt_ctx *ctx;
    uint32_t n_ctx, n_vocab;
    uint32_t min_window; /* smallest sliding window of any layer group; 0 = none */
    bool recurrent;      /* the layout has RECURRENT layers (state snapshots instead of trimming) */
    char compat[1024];
    char scheme[128];
    char name[160];
    pthread_mutex_t gen_mu;   /* the compute context: one generation (--parallel 1) or one step at a time */
    kvt_sched *sched;         /* the batching scheduler (sched.h): every submitted row, and generate's with --parallel > 1 */
    uint32_t parallel;
    int inline_active;        /* --parallel 1: a generation runs (atomic; /stats rows_active) */
    bool decoding;            /* some row decodes: the SSD/shared writers defer (kvt_engine_set_decoding) */
    pthread_mutex_t stats_mu; /* request counters */
    pthread_mutex_t lookup_mu; /* one tier lookup at a time (rows begin on their own threads) */
    uint64_t requests, prompt_tokens, generated_tokens, cached_tokens;
    bool mem_on;              /* a memory budget split the memory (set at create, then read-only) */
    kvt_mem_split_in mem_in;  /* its inputs: the budget and its parts */
    kvt_mem_split mem;        /* its split */
    kvt_progress_cb progress; /* kvt_engine_set_progress */
    void *progress_ctx;
    /* pins.c: the restart's warm-up of the pin list (one thread, joined by kvt_engine_free) */
    pthread_t warm_th;
    bool warm_started;
    volatile int warm_stop; /* atomic: also the cancel flag of the warm-up's generation */
};

/* pins.c: starts the warm-up of the pins the tier manager read from the pin list (none: no
 * thread); stop cancels it and joins (before the scheduler goes). */
void kvt_engine_pins_warm_start(kvt_engine *e);
void kvt_engine_pins_warm_stop(kvt_engine *e);

/* Progress callback (kvt_engine_set_progress), when one is set. */
static inline void kvt_engine_report(kvt_engine *e, kvt_progress_phase ph, uint32_t done, uint32_t total) {
    if (e->progress) e->progress(e->progress_ctx, ph, done, total);
}

/* The cache wiring and the [watch] checks the row phases use (engine.c). */
/* Lookup after the local tiers: extend *seq / *reused with the shared tier's blocks (lookup_mu held). */
/* A finished or boundary sequence into the tiers; a growing sequence's sealed blocks. */
void kvt_engine_cache_put(kvt_engine *e, kvt_seq *seq);
void kvt_engine_cache_put_local(kvt_engine *e, kvt_seq *seq); /* kvt_tiers_put_local */
void kvt_engine_put_blocks(kvt_engine *e, kvt_seq *seq);
/* W1 (engine.c [watch]): the weights are unchanged since the computation; else counts a refusal. */
bool kvt_engine_weights_ok(kvt_engine *e);
/* W2/W3: KVT_ERR_STALE with the message every refusal carries. */
kvt_status kvt_engine_stale(kvt_engine *e, char *err, size_t errlen);
/* The bytes of KV a request of n prompt tokens and max_new new tokens may need (no reuse). */
uint64_t kvt_engine_row_reserve(const kvt_engine *e, uint32_t n, uint32_t max_new);
/* SSD/shared writers defer while any row decodes: called when that changes. */
void kvt_engine_set_decoding(kvt_engine *e, bool any);

#endif
