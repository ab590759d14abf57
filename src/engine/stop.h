/*
 * stop.h — stop strings over streamed text. While a row decodes with stop strings, the text made so
 * far is kept in a kvt_strbuf; `emitted` bytes of it went to the token callback. After each token
 * the row looks for a full match in what the token added (kvt_stop_find: the text ends before it),
 * and otherwise emits all but the tail that could still become the start of a stop string
 * (kvt_stop_holdback), so no byte of a stop string is ever streamed.
 *
 * Pure functions: the text and the strings are borrowed for the call. Empty stop strings never match.
 */
#ifndef KVT_STOP_H
#define KVT_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "../util/strbuf.h"

/* The byte offset of the earliest full match of any of the n_stop strings among the matches that
 * start at or after from - (that string's length), so every match reaching into the text appended
 * at from is seen; -1 when none. *match_len: the matched string's length (set only on a match). */
int64_t kvt_stop_find(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop, size_t from, size_t *match_len);
/* How many bytes at the end of t are a proper prefix of some stop string (the longest such). */
size_t kvt_stop_holdback(const kvt_strbuf *t, const char *const *stop, uint32_t n_stop);

#endif
