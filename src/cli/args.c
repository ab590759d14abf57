/* args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvt_args_init(kvt_args *a, int argc, char **argv, const char *cmd, void (*usage)(void)) {
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->i = 0;
    a->cmd = cmd;
    a->usage = usage;
}

static void fail(kvt_args *a, const char *fmt, const char *x) {
    fprintf(stderr, "kvtier %s: ", a->cmd);
    fprintf(stderr, fmt, x);
    fprintf(stderr, " (see kvtier %s --help)\n", a->cmd);
    a->failed = true;
}

bool kvt_args_next(kvt_args *a) {
    if (a->failed || a->help) return false;
    for (;;) {
        a->i++;
        if (a->i >= a->argc) return false;
        const char *s = a->argv[a->i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            if (a->usage) a->usage();
            a->help = true;
            return false;
        }
        if (s[0] == '-' && s[1] != '\0' && !(s[1] >= '0' && s[1] <= '9')) {
            const char *eq = strchr(s, '=');
            if (eq && s[1] == '-') {
                size_t n = (size_t)(eq - s);
                if (n >= sizeof a->curbuf) n = sizeof a->curbuf - 1;
                memcpy(a->curbuf, s, n);
                a->curbuf[n] = '\0';
                a->cur = a->curbuf;
                a->inline_val = eq + 1;
            } else {
                a->cur = s;
                a->inline_val = NULL;
            }
            return true;
        }
        if (a->n_positional < (int)(sizeof a->positional / sizeof a->positional[0])) {
            a->positional[a->n_positional++] = s;
        } else {
            fail(a, "too many arguments at '%s'", s);
            return false;
        }
    }
}

bool kvt_args_is(kvt_args *a, const char *short_name, const char *long_name) {
    if (!a->cur) return false;
    return (short_name && !strcmp(a->cur, short_name)) || (long_name && !strcmp(a->cur, long_name));
}

bool kvt_args_flag(kvt_args *a, const char *short_name, const char *long_name) {
    if (!kvt_args_is(a, short_name, long_name)) return false;
    if (a->inline_val) fail(a, "flag %s takes no value", a->cur);
    return true;
}

const char *kvt_args_str(kvt_args *a) {
    if (a->inline_val) return a->inline_val;
    if (a->i + 1 >= a->argc) {
        fail(a, "flag %s needs a value", a->cur);
        return NULL;
    }
    a->i++;
    return a->argv[a->i];
}

int64_t kvt_args_i64(kvt_args *a, int64_t lo, int64_t hi) {
    const char *flag = a->cur;
    const char *v = kvt_args_str(a);
    if (!v) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char msg[256];
        snprintf(msg, sizeof msg, "bad value '%s' for %s: expected an integer in [%lld, %lld]", v, flag,
                 (long long)lo, (long long)hi);
        fail(a, "%s", msg);
        return 0;
    }
    return x;
}

uint32_t kvt_args_u32(kvt_args *a, uint32_t lo, uint32_t hi) { return (uint32_t)kvt_args_i64(a, lo, hi); }

double kvt_args_f64(kvt_args *a, double lo, double hi) {
    const char *flag = a->cur;
    const char *v = kvt_args_str(a);
    if (!v) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        char msg[256];
        snprintf(msg, sizeof msg, "bad value '%s' for %s: expected a number in [%g, %g]", v, flag, lo, hi);
        fail(a, "%s", msg);
        return 0;
    }
    return x;
}

void kvt_args_unknown(kvt_args *a) { fail(a, "unknown flag '%s'", a->cur); }
