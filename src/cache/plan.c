/* plan.c — the usable-prefix planner and the supersession rule (see plan.h). Pure functions. */
#include "plan.h"

#include <string.h>

void kvt_plan_geom_init(kvt_plan_geom *g, const kvt_kv_layout *l) {
    memset(g, 0, sizeof(*g));
    g->bt = kvt_kv_layout_block_tokens(l);
    g->n_groups = KVT_MIN(kvt_kv_layout_n_groups(l), (uint32_t)KVT_MAX_GROUPS);
    for (uint32_t i = 0; i < g->n_groups; i++)
        g->window[i] = kvt_kv_layout_group_kind(l, i) == KVT_KIND_WINDOW ? kvt_kv_layout_group_window(l, i) : 0;
    g->recurrent = kvt_kv_layout_state_bytes(l) > 0;
}

uint32_t kvt_plan_window_lo(uint32_t L, uint32_t w, uint32_t bt) { return L > w ? (L - w) / bt : 0; }

uint32_t kvt_plan_need_mask(const kvt_plan_geom *g, uint32_t L, uint32_t i, uint32_t held_mask) {
    uint32_t need = 0;
    for (uint32_t gi = 0; gi < g->n_groups; gi++) {
        uint32_t bit = 1u << gi;
        if (!(held_mask & bit)) continue;
        if (!g->window[gi] || i >= kvt_plan_window_lo(L, g->window[gi], g->bt)) need |= bit;
    }
    if (!need && held_mask) need = held_mask & (~held_mask + 1u); /* lowest held group carries the tokens */
    return need;
}

typedef struct plan_run {
    const kvt_plan_geom *g;
    const kvt_plan_index *ix;
    uint32_t full_ok;  /* every FULL group holds path blocks [0, full_ok) */
    uint32_t carry_ok; /* some group holds each of path blocks [0, carry_ok) */
} plan_run;

/* Can a sequence of length L be built? On success *last = the unit supplying the last block. */
static bool usable(const plan_run *r, uint32_t L, const void **last) {
    const kvt_plan_geom *g = r->g;
    const kvt_plan_index *ix = r->ix;
    const uint32_t bt = g->bt;
    const uint32_t li = (L + bt - 1) / bt - 1, m = L - li * bt;
    if (li > ix->k || li > r->full_ok || li > r->carry_ok) return false;
    for (uint32_t gi = 0; gi < g->n_groups; gi++) {
        if (!g->window[gi]) continue; /* FULL groups: full_ok */
        for (uint32_t i = kvt_plan_window_lo(L, g->window[gi], bt); i < li; i++)
            if (!(ix->held(ix->ctx, i) & (1u << gi))) return false;
    }
    const void *u = ix->rows(ix->ctx, li, m);
    if (!u) return false;
    *last = u;
    return true;
}

void kvt_plan_usable_prefix(const kvt_plan_geom *g, const kvt_plan_index *ix, uint32_t n, kvt_plan_prefix *out) {
    memset(out, 0, sizeof(*out));
    if (n < 2 || !g->bt) return;
    const uint32_t bt = g->bt, cap = n - 1;
    const uint32_t lmax = KVT_MIN(ix->match, cap);
    out->match = lmax;
    if (lmax == 0) return;
    uint32_t full_mask = 0;
    for (uint32_t gi = 0; gi < g->n_groups; gi++)
        if (!g->window[gi]) full_mask |= 1u << gi;
    plan_run r = {g, ix, ix->k, ix->k};
    for (uint32_t i = 0; i < ix->k; i++) {
        uint32_t h = ix->held(ix->ctx, i);
        if ((h & full_mask) != full_mask && r.full_ok == ix->k) r.full_ok = i;
        if (!h && r.carry_ok == ix->k) r.carry_ok = i;
        if (r.full_ok < ix->k && r.carry_ok < ix->k) break;
    }
    uint32_t L = 0;
    const void *last = NULL, *snap = NULL;
    if (g->recurrent) {
        /* the recurrent state cannot be cut: only exact snapshot positions, longest usable wins */
        for (uint32_t s = 0; s < ix->n_snaps; s++) {
            uint32_t pos = ix->snap_pos[s];
            const void *u = NULL;
            if (pos == 0 || pos > lmax || pos <= L || !usable(&r, pos, &u)) continue;
            L = pos;
            last = u;
            snap = ix->snap[s];
        }
    } else if (usable(&r, lmax, &last)) {
        L = lmax;
    } else {
        /* a shorter cut can only help at a block boundary (it needs fewer old window blocks) */
        uint32_t j = (lmax - 1) / bt;
        j = KVT_MIN(j, KVT_MIN(r.full_ok, r.carry_ok) + 1);
        for (; j >= 1; j--)
            if (usable(&r, j * bt, &last)) {
                L = j * bt;
                break;
            }
    }
    if (!L) return;
    out->len = L;
    out->n_full = (L + bt - 1) / bt - 1;
    out->last_m = L - out->n_full * bt;
    out->last = last;
    out->snap = snap;
}

bool kvt_plan_supersedes(const kvt_plan_unit *older, const kvt_plan_unit *newer) {
    if (!older->tail || older->pinned || older == newer) return false;
    if (older->parent != newer->parent || older->index != newer->index) return false;
    if (newer->n_tokens <= older->n_tokens) return false;
    if (older->n_tokens && memcmp(older->tokens, newer->tokens, (size_t)older->n_tokens * sizeof(int32_t)) != 0)
        return false;
    return older->groups != 0 && (older->groups & ~newer->groups) == 0;
}
