/*
 * breaker.h — a circuit breaker with exponential back-off, for calls to a remote service that may
 * be down or slow (the shared tier's Redis). A plain value type: the owner embeds it and serialises
 * access (one thread, or its own lock). Time is passed in (monotonic ms) so tests drive it.
 *
 *   CLOSED ──threshold consecutive failures──▶ OPEN ──retry_at reached, allow()──▶ HALF_OPEN
 *     ▲                                          ▲                                     │
 *     └───────────────success────────────────────┼─────────────────────────────────────┤
 *                                                └──failure (back-off doubles, capped)──┘
 *
 * allow() answers whether one call may be attempted now: always in CLOSED, never in OPEN before
 * retry_at, and exactly one probe (the call that moved it to HALF_OPEN) until that probe reports.
 */
#ifndef KVT_BREAKER_H
#define KVT_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

typedef enum kvt_breaker_state {
    KVT_BREAKER_CLOSED = 0,
    KVT_BREAKER_OPEN = 1,
    KVT_BREAKER_HALF_OPEN = 2,
} kvt_breaker_state;

typedef struct kvt_breaker {
    kvt_breaker_state state;
    uint32_t threshold;   /* consecutive failures that open a CLOSED breaker (>= 1) */
    uint32_t failures;    /* consecutive failures while CLOSED */
    uint64_t base_ms, max_ms;
    uint64_t backoff_ms;  /* the current OPEN period; doubles on every failed probe, capped */
    uint64_t retry_at_ms; /* OPEN until this time */
    uint64_t opens;       /* times it went to OPEN (stats) */
} kvt_breaker;

void kvt_breaker_init(kvt_breaker *b, uint32_t threshold, uint64_t base_ms, uint64_t max_ms);
bool kvt_breaker_allow(kvt_breaker *b, uint64_t now_ms);
void kvt_breaker_success(kvt_breaker *b);
void kvt_breaker_failure(kvt_breaker *b, uint64_t now_ms);
const char *kvt_breaker_state_name(kvt_breaker_state s); /* "closed" | "open" | "half-open" */

#endif
