/*
 * progress.h — the one-line terminal progress indicator of `run`, `chat` and `bench` for long
 * prefills and SSD restores: "prefill 1536/3000 tokens  190 tok/s  ETA 7.7s", redrawn in place on
 * stderr and erased when the phase ends. It appears only for a phase that has run for about a
 * second (env KVTIER_PROGRESS_AFTER_MS overrides the 1000 ms, for tests), and only when both
 * stdout and stderr are terminals and the output is not --json (kvt_progress_wanted).
 *
 * Ownership: kvt_progress borrows the FILE and the engine it is attached to; free it after the
 * last generation (kvt_progress_free detaches nothing: free the engine or call
 * kvt_engine_set_progress(e, NULL, NULL) first if the engine lives on). Single-threaded: updates
 * arrive on the generating thread.
 */
#ifndef KVT_PROGRESS_H
#define KVT_PROGRESS_H

#include <stdio.h>

#include "../engine/engine.h"

typedef struct kvt_progress kvt_progress;

/* True when an indicator belongs on this terminal: not json, stdout and stderr are TTYs, TERM is
 * not "dumb". */
bool kvt_progress_wanted(bool json);
/* NULL when !kvt_progress_wanted(json) or out of memory (then there is simply no indicator). */
kvt_progress *kvt_progress_create(FILE *out, bool json);
void kvt_progress_free(kvt_progress *p);
/* Routes e's progress into p (NULL p: no-op). */
void kvt_progress_attach(kvt_progress *p, kvt_engine *e);

#endif
