/*
 * scheme.h — internal to src/engine: resolve the KV scheme of a loaded model. The codec of every
 * layer comes from --kv-quant (off, a uniform mode through kvt_engine_uniform_codec, or "config":
 * kv_config.json beside the model file); quantized MLA latents are refused (docs/models.md). The
 * layout is built from those codecs and logged, one line per distinct layer declaration.
 *
 * Ownership: o and m are borrowed for the call; *out (NULL on an error) is the caller's, freed with
 * kvt_kv_layout_free. Errors: kvt_status plus a message in err.
 */
#ifndef KVT_SCHEME_H
#define KVT_SCHEME_H

#include "../kv/kv.h"
#include "../model/model.h"
#include "engine.h"

kvt_status kvt_scheme_layout(const kvt_engine_opts *o, const kvt_model *m, kvt_kv_layout **out, char *err, size_t errlen);

#endif
