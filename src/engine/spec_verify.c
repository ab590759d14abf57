/* spec_verify.c — see spec_verify.h. Sums run in double so a vocabulary of 10^5 float
 * probabilities loses nothing that matters to the draw. */
#include "spec_verify.h"

int32_t kvt_spec_draw(const float *w, uint32_t n, double u) {
    double tot = 0;
    for (uint32_t i = 0; i < n; i++) tot += w[i] > 0 ? w[i] : 0;
    if (!(tot > 0)) return -1;
    const double r = u * tot;
    double acc = 0;
    int32_t last = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (!(w[i] > 0)) continue;
        acc += w[i];
        last = (int32_t)i;
        if (r < acc) return (int32_t)i;
    }
    return last; /* u * tot rounded up to the total: the last token with weight */
}

int32_t kvt_spec_verify(const float *p, const float *q, uint32_t n, int32_t x, double u_accept, double u_resample,
                        bool *accepted) {
    *accepted = false;
    if (x < 0 || (uint32_t)x >= n) return -1;
    const double px = p[x] > 0 ? p[x] : 0, qx = q[x] > 0 ? q[x] : 0;
    /* accept with probability min(1, p/q); qx == 0 cannot come from a draw of q: never accepted */
    if (qx > 0 && (px >= qx || u_accept * qx < px)) {
        *accepted = true;
        return x;
    }
    /* the residual norm(max(0, p - q)), drawn without a buffer: two passes over p and q */
    double tot = 0;
    for (uint32_t i = 0; i < n; i++) {
        const double d = (double)p[i] - (double)q[i];
        if (d > 0) tot += d;
    }
    if (!(tot > 0)) return kvt_spec_draw(p, n, u_resample);
    const double r = u_resample * tot;
    double acc = 0;
    int32_t last = -1;
    for (uint32_t i = 0; i < n; i++) {
        const double d = (double)p[i] - (double)q[i];
        if (!(d > 0)) continue;
        acc += d;
        last = (int32_t)i;
        if (r < acc) return (int32_t)i;
    }
    return last;
}
