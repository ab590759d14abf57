/*
 * engine_flags.h — the model/cache/sampling flags shared by `run`, `chat`, `bench`, `serve` and
 * `demo`, parsed into kvt_engine_opts / kvt_sampling, and their help text.
 * Ownership: string options point into argv (borrowed; argv outlives the engine options).
 */
#ifndef KVT_ENGINE_FLAGS_H
#define KVT_ENGINE_FLAGS_H

#include "../engine/engine.h"
#include "args.h"

/* If the current flag is an engine flag, consume it into o and return true. */
bool kvt_parse_engine_flag(kvt_args *a, kvt_engine_opts *o);
/* If the current flag is a sampling flag, consume it into s and return true. */
bool kvt_parse_sampling_flag(kvt_args *a, kvt_sampling *s);
/* Post-parse checks (warn about SSD sub-flags without --ssd-cache, etc.). Returns false and prints
 * an error on a fatal combination. */
bool kvt_engine_flags_check(const char *cmd, kvt_engine_opts *o);
extern const char kvt_engine_flags_help[];
extern const char kvt_sampling_flags_help[];

#endif
