/*
 * engine_int.h — internal to src/engine: one generation as a row with begin / plan / advance / end
 * phases (engine.c), driven either inline by kvt_engine_generate (--parallel 1) or, one forward
 * pass per step over all active rows, by the scheduler (sched.c). Not a public header.
 *
 * Ownership: a kvt_row lives on the stack of the kvt_engine_generate call that submitted it and
 * outlives its time in the scheduler (kvt_sched_run returns only after the row was ended). Every
 * phase runs on one thread at a time: kvt_row_begin on the submitting thread (so a slow SSD
 * restore or shared-tier fetch never pauses the other rows; lookups are serialised among
 * themselves by the engine), the others on the driver; the request, result and error buffer are
 * the caller's and are written only by the phases.
 */
#ifndef KVT_ENGINE_INT_H
#define KVT_ENGINE_INT_H

#include <pthread.h>

#include "../kv/kv.h"
#include "../model/model.h"
#include "../util/strbuf.h"
#include "engine.h"
#include "checkpoint.h"
#include "sampler.h"

/* Row states (sched.c enforces the transitions; see its invariants). */
typedef enum kvt_row_state {
    KVT_ROW_QUEUED = 0,  /* submitted, waiting for a row slot and its KV reservation */
    KVT_ROW_PREFILL = 1, /* begun: prompt tokens remain to be forwarded */
    KVT_ROW_DECODE = 2,  /* one sampled token (next) waits to be forwarded */
    KVT_ROW_DONE = 3,    /* finished (any reason): only kvt_row_end remains */
} kvt_row_state;

typedef struct kvt_row {
    /* the request (caller's, borrowed) */
    kvt_engine *e;
    const kvt_gen_request *req;
    kvt_gen_result *res;
    char *err;
    size_t errlen;
    /* outcome */
    kvt_status st;
    kvt_row_state state;
    bool begun;    /* got past lookup and admission: end puts back and counts the request */
    bool decoding; /* entered decode: end flushes text and reports decode figures */
    volatile int abort; /* set by the scheduler at shutdown (atomic access) */
    /* generation state */
    uint32_t n, max_new, reused, done_tok, chunk, every, n_gen;
    bool use_cache, keep_window, share_prefix;
    uint64_t root;
    double t0, tp0, td0;
    kvt_seq *seq;
    kvt_chain *chain; /* the prompt's chain hashes (owned; released in kvt_row_end) */
    kvt_ckpt_run ck;       /* generation checkpoint state ([ckpt]; freed in kvt_row_end) */
    const int32_t *pp;     /* what lookup and prefill cover: the prompt, or prompt ++ emitted on a resume */
    uint32_t pn;
    kvt_sampler *sampler;
    kvt_detok *dt;
    kvt_strbuf tb;
    size_t emitted;
    int32_t *gen;
    int32_t next; /* DECODE: the token to forward */
    /* scheduler bookkeeping (sched.c, under its mutex) */
    uint64_t reserve; /* KV bytes this row may need (admission) */
    double t_enq;
    bool mem_waited;
    bool admitted; /* given a slot: the submitter runs kvt_row_begin on its own thread */
    bool ready;    /* kvt_row_begin returned: the scheduler may step (or end) the row */
    bool done;     /* ended: the submitting thread may return */
    struct kvt_row *qnext;
} kvt_row;

/* Phases (engine.c). begin: lookup + admission + sampler/prefill setup; sets state PREFILL, or
 * DONE with st on an error. plan: the tokens this row forwards in the next step (at most budget;
 * PREFILL: a chunk, DECODE: 1), or 0 and state DONE when it was cancelled. advance: after the
 * forward of those m tokens (fst its status, logits its last token's row). end: put back into the
 * tiers, fill res, free the row's resources. */
void kvt_row_begin(kvt_row *r);
uint32_t kvt_row_plan(kvt_row *r, uint32_t budget, const int32_t **tokens);
void kvt_row_advance(kvt_row *r, uint32_t m, kvt_status fst, float *logits);
void kvt_row_end(kvt_row *r);
/* The bytes of KV a request of n prompt tokens and max_new new tokens may need (no reuse). */
uint64_t kvt_engine_row_reserve(const kvt_engine *e, uint32_t n, uint32_t max_new);
/* Serialises use of the engine's compute context (steps, scoring, maintenance). */
pthread_mutex_t *kvt_engine_ctx_mu(kvt_engine *e);
kvt_ctx *kvt_engine_ctx(kvt_engine *e);
/* SSD/shared writers defer while any row decodes: the driver calls this when that count changes. */
void kvt_engine_set_decoding(kvt_engine *e, bool any);

#endif
