/*
 * args.h — tiny shared flag parser for the subcommands. Flags are `--name value`, `--name=value`,
 * or the short alias `-x value`; booleans are `--name`. Unknown flags and bad values are usage
 * errors with a hint (exit 2). Everything is borrowed from argv.
 *
 * Usage:
 *   kvt_args a; kvt_args_init(&a, argc, argv, "run", usage_fn);
 *   while (kvt_args_next(&a)) {
 *       if (kvt_args_is(&a, "-m", "--model")) model = kvt_args_str(&a);
 *       else if (kvt_args_is(&a, "-n", "--n-predict")) n = kvt_args_u32(&a, 0, 1 << 20);
 *       else if (kvt_args_flag(&a, NULL, "--json")) json = true;
 *       else kvt_args_unknown(&a);
 *   }
 *   if (a.failed) return 2; if (a.help) return 0;
 */
#ifndef KVT_ARGS_H
#define KVT_ARGS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvt_args {
    int argc;
    char **argv;
    int i;              /* index of the current flag */
    const char *cmd;
    void (*usage)(void);
    const char *cur;    /* current flag text (without =value) */
    const char *inline_val;
    char curbuf[128];
    bool failed;        /* a usage error was printed */
    bool help;          /* --help was printed */
    const char *positional[8];
    int n_positional;
} kvt_args;

void kvt_args_init(kvt_args *a, int argc, char **argv, const char *cmd, void (*usage)(void));
/* Advances to the next flag; collects positional arguments; handles --help. False at the end or
 * after an error. */
bool kvt_args_next(kvt_args *a);
/* Matches the current flag against a short and/or long name (either may be NULL). */
bool kvt_args_is(kvt_args *a, const char *short_name, const char *long_name);
/* Boolean flag: matches and must not carry a value. */
bool kvt_args_flag(kvt_args *a, const char *short_name, const char *long_name);
/* Values for the current flag (consume the next argv element unless given as --x=v). On a bad
 * value they print an error, set failed, and return the fallback 0 / NULL. */
const char *kvt_args_str(kvt_args *a);
uint32_t kvt_args_u32(kvt_args *a, uint32_t lo, uint32_t hi);
int64_t kvt_args_i64(kvt_args *a, int64_t lo, int64_t hi);
double kvt_args_f64(kvt_args *a, double lo, double hi);
void kvt_args_unknown(kvt_args *a);

#endif
