/* breaker.c — see breaker.h for the state machine.
 *
 * Invariants
 *   (1) OPEN ⇒ retry_at_ms was set by the failure that opened it; allow() is false before it.
 *   (2) base_ms <= backoff_ms <= max_ms once it has opened; a success resets it to base_ms.
 *   (3) HALF_OPEN admits no second call: allow() returns false until success() or failure().
 */
#include "breaker.h"

void kvt_breaker_init(kvt_breaker *b, uint32_t threshold, uint64_t base_ms, uint64_t max_ms) {
    b->state = KVT_BREAKER_CLOSED;
    b->threshold = threshold ? threshold : 1;
    b->failures = 0;
    b->base_ms = base_ms ? base_ms : 1;
    b->max_ms = max_ms < b->base_ms ? b->base_ms : max_ms;
    b->backoff_ms = b->base_ms;
    b->retry_at_ms = 0;
    b->opens = 0;
}

bool kvt_breaker_allow(kvt_breaker *b, uint64_t now_ms) {
    switch (b->state) {
    case KVT_BREAKER_CLOSED:
        return true;
    case KVT_BREAKER_OPEN:
        if (now_ms < b->retry_at_ms) return false;
        b->state = KVT_BREAKER_HALF_OPEN; /* this caller is the probe */
        return true;
    case KVT_BREAKER_HALF_OPEN:
    default:
        return false;
    }
}

void kvt_breaker_success(kvt_breaker *b) {
    b->state = KVT_BREAKER_CLOSED;
    b->failures = 0;
    b->backoff_ms = b->base_ms;
}

static void open_for(kvt_breaker *b, uint64_t now_ms, uint64_t ms) {
    b->state = KVT_BREAKER_OPEN;
    b->backoff_ms = ms;
    b->retry_at_ms = now_ms + ms;
    b->opens++;
}

void kvt_breaker_failure(kvt_breaker *b, uint64_t now_ms) {
    if (b->state == KVT_BREAKER_HALF_OPEN) { /* the probe failed: back off longer */
        uint64_t next = b->backoff_ms > b->max_ms / 2 ? b->max_ms : b->backoff_ms * 2;
        open_for(b, now_ms, next);
        return;
    }
    if (b->state == KVT_BREAKER_OPEN) return; /* a call admitted before it opened */
    if (++b->failures >= b->threshold) {
        b->failures = 0;
        open_for(b, now_ms, b->base_ms);
    }
}

const char *kvt_breaker_state_name(kvt_breaker_state s) {
    switch (s) {
    case KVT_BREAKER_CLOSED: return "closed";
    case KVT_BREAKER_OPEN: return "open";
    case KVT_BREAKER_HALF_OPEN: return "half-open";
    }
    return "?";
}
