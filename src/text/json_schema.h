/*
 * json_schema.h — structured output by constrained decoding (docs/server.md, "Structured output").
 *
 * A JSON schema is compiled into a tree of nodes that a byte-level pushdown matcher walks: the
 * matcher holds up to KVT_JS_MAX_THREADS alternative stacks (anyOf) of at most KVT_JS_MAX_DEPTH
 * frames and says, byte by byte, whether the text so far is still a prefix of a JSON text the schema
 * accepts, and whether it is complete. The token-level constraint walks a trie of the vocabulary's
 * token bytes (built once per tokenizer) with the matcher and masks every token that would leave the
 * accepted language, so even a random-weight model emits valid JSON; the end-of-generation tokens
 * are allowed only where the text is complete.
 *
 * Supported keywords: type (string or list), properties, required, additionalProperties (false,
 * true or absent), items, minItems, maxItems, enum, const, anyOf, oneOf (treated as anyOf),
 * minLength, maxLength, and the annotations title, description, default, examples, $schema, $id,
 * strict, format (not enforced). Anything else (pattern, $ref, allOf, not, minimum, ...) is refused
 * with KVT_ERR_UNSUPPORTED and a message naming the keyword. Whitespace between tokens is limited
 * to one byte, numbers to 16 digits per part, so a constrained generation always ends.
 *
 * Ownership: a compiled kvt_json_schema is immutable and reference-counted (shared through a small
 * cache keyed by the schema text's hash; thread-safe). A kvt_json_constraint is one generation's
 * state (one thread at a time) and holds a reference to its schema; the vocabulary trie is shared
 * and lives until kvt_json_vocab_cache_clear (process end).
 */
#ifndef KVT_JSON_SCHEMA_H
#define KVT_JSON_SCHEMA_H

#include <cjson/cJSON.h>

#include "tokenizer.h"

#define KVT_JS_MAX_THREADS 16
#define KVT_JS_MAX_DEPTH 24
#define KVT_JS_MAX_NODES 4096
#define KVT_JS_MAX_PROPS 64

typedef struct kvt_json_schema kvt_json_schema;

/* Compiles schema (NULL = any JSON object, for response_format json_object), or takes it from the
 * cache. prefix / suffix (NULL = none): literal text required before / after the JSON value (a
 * tool-call syntax). Errors: KVT_ERR_UNSUPPORTED / KVT_ERR_INVALID_ARG with the keyword and its path
 * in err. The caller releases the reference. */
kvt_status kvt_json_schema_get(const cJSON *schema, const char *prefix, const char *suffix, kvt_json_schema **out,
                               char *err, size_t errlen);
void kvt_json_schema_release(kvt_json_schema *s);
/* Byte-level checks (tests, fuzzing): is text a prefix of an accepted text; is it a whole one. */
bool kvt_json_schema_prefix_ok(const kvt_json_schema *s, const char *text, size_t n);
bool kvt_json_schema_accepts(const kvt_json_schema *s, const char *text, size_t n);

typedef struct kvt_json_constraint kvt_json_constraint;
/* A constraint for generations with tokenizer tok (borrowed: outlives the constraint). Takes its
 * own reference to s. */
kvt_status kvt_json_constraint_create(const kvt_tokenizer *tok, kvt_json_schema *s, kvt_json_constraint **out);
void kvt_json_constraint_free(kvt_json_constraint *c);
/* Back to the start (a new generation). */
void kvt_json_constraint_reset(kvt_json_constraint *c);
/* kvt_logits_proc callbacks (engine.h): ctx is the constraint. */
void kvt_json_constraint_apply(void *ctx, float *logits, uint32_t n_vocab);
void kvt_json_constraint_accept(void *ctx, int32_t id);
/* Tokens the last apply left allowed (benchmarks, tests). */
uint32_t kvt_json_constraint_n_allowed(const kvt_json_constraint *c);

#endif
