/*
 * scheme.h — internal to src/engine: resolve the KV scheme of a loaded model. The codec of every
 * layer comes from --kv-quant (off, a uniform mode through kvt_engine_uniform_codec, or "config":
 * kv_config.json beside the model file); quantized MLA latents are refused (docs/models.md). The
 * layout is built from those codecs and logged, one line per distinct layer declaration. The
 * compatibility key of a model's KV under a layout (kvt_scheme_compat_key) is made here too.
 *
 * Ownership: o and m are borrowed for the call; *out (NULL on an error) is the caller's, freed with
 * kvt_kv_layout_free. Errors: kvt_status plus a message in err.
 */
#ifndef KVT_SCHEME_H
#define KVT_SCHEME_H

#include "../kv/kv.h"
#include "../model/file_watch.h"
#include "../model/model.h"
#include "engine.h"

kvt_status kvt_scheme_layout(const kvt_engine_opts *o, const kvt_model *m, kvt_kv_layout **out, char *err, size_t errlen);

/* The compatibility key of a model's KV under layout l (the engine's target and a speculative
 * draft alike): with persist (a tier beyond this process: SSD or shared), kvt_ssd_compat_key over
 * the file held open by watch (its /proc/self/fd name, not whatever path names now; path if that
 * cannot be read), whose SHA-256 is memoized in cache_dir (may be NULL); otherwise a key private to
 * this process from path, size and mtime. tok_hash identifies the tokenizer, num the numerics
 * (kvt_kernels_numerics_id() plus any model tag). Every pointer is borrowed for the call; out gets
 * the key (KVT_ERR_RANGE when outlen is too small). */
kvt_status kvt_scheme_compat_key(const char *path, const kvt_file_watch *watch, const kvt_kv_layout *l, uint64_t tok_hash,
                                 const char *num, const char *cache_dir, bool persist, char *out, size_t outlen,
                                 char *err, size_t errlen);

#endif
