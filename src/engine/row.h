/*
 * row.h — one generation as a row (docs/batching.md): begin / plan / advance / end phases and the
 * row state machine (drawn and enforced in row.c). A row is driven either inline by
 * kvt_engine_generate (--parallel 1) or, one forward pass per step over all active rows, by the
 * scheduler (sched.c; every kvt_engine_submit), which needs nothing of the engine beyond this header.
 *
 * Ownership: a kvt_row lives on the stack of the kvt_engine_generate call that made it (and
 * outlives its time in the scheduler: kvt_sched_run returns only after the row was ended), or on
 * the heap for kvt_engine_submit, freed by the engine after the row's done callback. Every
 * phase runs on one thread at a time: kvt_row_begin on the submitting thread (so a slow SSD
 * restore or shared-tier fetch never pauses the other rows; lookups are serialised among
 * themselves by the engine), the others on the driver; the request, result and error buffer are
 * the caller's (borrowed until kvt_row_end returned) and are written only by the phases.
 */
#ifndef KVT_ROW_H
#define KVT_ROW_H

#include "../kv/kv.h"
#include "../model/model.h"
#include "../util/strbuf.h"
#include "checkpoint.h"
#include "engine.h"
#include "sampler.h"
#include "spec.h"

/* Row states; the legal transitions are drawn at the top of row.c (kvt_row_set_state). */
typedef enum kvt_row_state {
    KVT_ROW_QUEUED = 0,  /* submitted, waiting for a row slot and its KV reservation */
    KVT_ROW_PREFILL = 1, /* begun: prompt tokens remain to be forwarded */
    KVT_ROW_DECODE = 2,  /* one sampled token (next) waits to be forwarded */
    KVT_ROW_DONE = 3,    /* finished (any reason): only kvt_row_end remains */
    KVT_ROW_N_STATES = 4,
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
    kvt_row_state state; /* read anywhere; written only by kvt_row_set_state */
    bool begun;    /* got past lookup and admission: end puts back and counts the request */
    bool decoding; /* entered decode: end flushes text and reports decode figures */
    volatile int abort; /* set by the scheduler at shutdown (atomic access) */
    /* generation state */
    uint32_t n, max_new, reused, done_tok, chunk, every, n_gen;
    uint32_t snap_at; /* recurrent layouts: the prefill stops at n-1 for a state snapshot there (0 = none) */
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
    /* speculative decoding (spec.h, docs/speculative.md; row.c "Speculative rounds") */
    kvt_spec_row *sp;  /* the row's draft state; NULL: the row decodes one token per step */
    uint32_t n_verify; /* DECODE: draft tokens the planned forward carries after next (0: a plain step) */
    bool in_verify;    /* a speculative round's tokens are being emitted (checkpoints wait for its end) */
    int ck_owed;       /* a checkpoint fell due inside the round: 1 regular point, 2 a retry; 0 none */
    /* scheduler bookkeeping (sched.c, under its mutex) */
    bool batched;     /* driven by the scheduler (it reports decoding for all rows), not inline */
    uint64_t reserve; /* KV bytes this row may need (admission) */
    double t_enq;
    bool mem_waited;
    bool admitted; /* given a slot: kvt_row_begin runs (submitter, or the begin thread when async) */
    bool ready;    /* kvt_row_begin returned: the scheduler may step (or end) the row */
    bool done;     /* ended: the submitting thread may return */
    void (*on_done)(struct kvt_row *r, void *ctx); /* async rows: called once after the row ended */
    void *done_ctx;
    struct kvt_row *qnext; /* the wait queue, then the begin queue (async rows) */
} kvt_row;

/* A fresh row (state QUEUED) for a validated request of n prompt tokens and at most max_new new
 * ones; reserve is the KV bytes it may need (admission). */
void kvt_row_init(kvt_row *r, kvt_engine *e, const kvt_gen_request *req, kvt_gen_result *res, char *err, size_t errlen,
                  uint32_t n, uint32_t max_new);

/* The state machine (row.c). True when from -> to is a drawn transition. */
bool kvt_row_transition_legal(kvt_row_state from, kvt_row_state to);
/* The only writer of r->state. An illegal transition is refused: the state stays, the row's
 * status becomes KVT_ERR_INVALID_ARG (when it was OK) with a message, and false is returned. */
bool kvt_row_set_state(kvt_row *r, kvt_row_state to);
const char *kvt_row_state_name(kvt_row_state s);
/* A queued row that will never begin (shutdown): DONE, cancelled, with msg. */
void kvt_row_cancel_queued(kvt_row *r, const char *msg);

/* Phases. begin: lookup + admission + sampler/prefill setup; state PREFILL, or DONE with st on an
 * error. plan: the tokens this row forwards in the next step (at most budget; PREFILL: a chunk,
 * DECODE: 1, or 1 + k when the row speculates: next and k draft tokens, kvt_row_verifies), or 0
 * and state DONE when it was cancelled. advance: after the forward of those m tokens (fst its
 * status; logits its last token's row, or all m rows, one after another, when the row verifies).
 * end: put back into the tiers, fill res, free the row's resources. */
void kvt_row_begin(kvt_row *r);
uint32_t kvt_row_plan(kvt_row *r, uint32_t budget, const int32_t **tokens);
void kvt_row_advance(kvt_row *r, uint32_t m, kvt_status fst, float *logits);
void kvt_row_end(kvt_row *r);
/* The planned forward is a verify pass: its caller must return the logits of all m rows
 * (kvt_model_forward with all_logits; m <= ubatch). */
static inline bool kvt_row_verifies(const kvt_row *r) { return r->n_verify > 0; }

/* What a driver of many rows needs of the engine. forward: one kvt_model_forward_batch over the
 * items under the engine's context mutex (steps, scoring and maintenance never overlap); logits
 * stay valid until the next forward. set_decoding: the SSD/shared writers defer while any row
 * decodes; the driver calls it when that changes. */
kvt_status kvt_rows_forward(kvt_engine *e, kvt_batch_item *items, uint32_t n_items, float **logits);
void kvt_rows_set_decoding(kvt_engine *e, bool any);
/* A verify pass (kvt_row_verifies) of one row on its own: kvt_model_forward with all logits, under
 * the same mutex as kvt_rows_forward. The n rows are copied into *buf (grown to n * n_vocab floats
 * as needed; the caller owns it and frees it with free()), where no other thread's forward (an
 * inline --parallel 1 generation) can overwrite them before the row's advance reads them. */
kvt_status kvt_rows_forward_verify(kvt_engine *e, kvt_seq *seq, const int32_t *tokens, uint32_t n, float **buf,
                                   size_t *cap);

#endif
