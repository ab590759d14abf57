/* progress.c — see progress.h. Per phase: the first update (done = 0) starts a clock; later
 * updates draw the line once the phase has run for after_ms; the update with done == total erases
 * a drawn line, so the generated text that follows starts on a clean line. */
#include "progress.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct kvt_progress {
    FILE *out;
    double after_ms;
    kvt_progress_phase phase;
    double t0;
    bool drawn;
};

bool kvt_progress_wanted(bool json) {
    if (json) return false;
    const char *term = getenv("TERM");
    if (term && !strcmp(term, "dumb")) return false;
    return isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
}

kvt_progress *kvt_progress_create(FILE *out, bool json) {
    if (!kvt_progress_wanted(json)) return NULL;
    kvt_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->out = out;
    p->after_ms = 1000;
    const char *env = getenv("KVTIER_PROGRESS_AFTER_MS");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end == '\0' && v >= 0 && v < 1e9) p->after_ms = v;
    }
    return p;
}

void kvt_progress_free(kvt_progress *p) { free(p); }

static void on_progress(void *ctx, kvt_progress_phase phase, uint32_t done, uint32_t total) {
    kvt_progress *p = ctx;
    double now = kvt_now_ms();
    if (done == 0 || phase != p->phase) {
        p->phase = phase;
        p->t0 = now;
    }
    double el = now - p->t0;
    if (done >= total) {
        if (p->drawn) fputs("\r\033[K", p->out);
        p->drawn = false;
        fflush(p->out);
        return;
    }
    if (done == 0 || el < p->after_ms) return;
    double rate = el > 0 ? done / (el / 1000.0) : 0;
    double eta = rate > 0 ? (total - done) / rate : 0;
    fprintf(p->out, "\r\033[K%s %u/%u tokens  %.0f tok/s  ETA %.1fs", phase == KVT_PROGRESS_RESTORE ? "restore" : "prefill",
            done, total, rate, eta);
    fflush(p->out);
    p->drawn = true;
}

void kvt_progress_attach(kvt_progress *p, kvt_engine *e) {
    if (p && e) kvt_engine_set_progress(e, on_progress, p);
}
