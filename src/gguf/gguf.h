/*
 * gguf.h — GGUF v2/v3 reader (over mmap) and writer.
 *
 * The file is untrusted: every count, length, offset, shape and type is validated in
 * kvt_gguf_open before any use; failures return a status and a one-line message naming the
 * problem, never a crash and never an allocation sized by an unchecked field.
 *
 * Ownership: kvt_gguf owns the mapping; every pointer it hands out (strings, arrays, tensor data,
 * tensor infos) is borrowed and valid until kvt_gguf_free. Strings are NOT NUL-terminated in the
 * file; accessors return (pointer, length). kvt_gguf_writer owns its buffered metadata until
 * kvt_gguf_writer_finish / _free.
 */
#ifndef KVT_GGUF_H
#define KVT_GGUF_H

#include "../util/common.h"

typedef enum kvt_gguf_vtype {
    KVT_GGUF_U8 = 0, KVT_GGUF_I8 = 1, KVT_GGUF_U16 = 2, KVT_GGUF_I16 = 3, KVT_GGUF_U32 = 4,
    KVT_GGUF_I32 = 5, KVT_GGUF_F32 = 6, KVT_GGUF_BOOL = 7, KVT_GGUF_STRING = 8, KVT_GGUF_ARRAY = 9,
    KVT_GGUF_U64 = 10, KVT_GGUF_I64 = 11, KVT_GGUF_F64 = 12,
} kvt_gguf_vtype;

typedef struct kvt_gguf kvt_gguf;

typedef struct kvt_gguf_tensor {
    const char *name; /* NUL-terminated copy owned by kvt_gguf */
    uint32_t n_dims;
    int64_t ne[4];    /* ne[0] fastest; unused dims = 1 */
    uint32_t type;    /* ggml type id (kernels/quant.h) */
    uint64_t offset;  /* relative to the data section */
    const void *data; /* inside the mapping, bounds-checked */
    uint64_t nbytes;
} kvt_gguf_tensor;

kvt_status kvt_gguf_open(const char *path, kvt_gguf **out, char *err, size_t errlen);
/* Same validation over a caller-owned memory buffer (fuzz tests); the buffer must outlive g. */
kvt_status kvt_gguf_open_buffer(const void *buf, size_t len, kvt_gguf **out, char *err, size_t errlen);
void kvt_gguf_free(kvt_gguf *g);

uint32_t kvt_gguf_version(const kvt_gguf *g);
uint64_t kvt_gguf_file_size(const kvt_gguf *g);

/* metadata */
int64_t kvt_gguf_n_kv(const kvt_gguf *g);
int64_t kvt_gguf_find_key(const kvt_gguf *g, const char *key); /* -1 if absent */
const char *kvt_gguf_key_name(const kvt_gguf *g, int64_t i);   /* NUL-terminated copy */
kvt_gguf_vtype kvt_gguf_key_type(const kvt_gguf *g, int64_t i);
/* Typed getters: return false if absent or of an incompatible type / out of range.
 * get_u32 accepts any integer type whose value fits; get_f32 accepts f32/f64. */
bool kvt_gguf_get_u32(const kvt_gguf *g, const char *key, uint32_t *out);
bool kvt_gguf_get_i64(const kvt_gguf *g, const char *key, int64_t *out);
bool kvt_gguf_get_f32(const kvt_gguf *g, const char *key, float *out);
bool kvt_gguf_get_bool(const kvt_gguf *g, const char *key, bool *out);
bool kvt_gguf_get_str(const kvt_gguf *g, const char *key, const char **s, uint64_t *len);
/* Arrays: element type and count; raw element pointer for fixed-size element types. */
bool kvt_gguf_get_arr(const kvt_gguf *g, const char *key, kvt_gguf_vtype *elem, uint64_t *n,
                      const void **data);
/* i-th string of a string array (O(1): offsets are indexed at open). */
bool kvt_gguf_get_arr_str(const kvt_gguf *g, const char *key, uint64_t i, const char **s,
                          uint64_t *len);
/* Integer array element i (any integer element type) as int64. */
bool kvt_gguf_get_arr_i64(const kvt_gguf *g, const char *key, uint64_t i, int64_t *out);
bool kvt_gguf_get_arr_f32(const kvt_gguf *g, const char *key, uint64_t i, float *out);

/* tensors */
int64_t kvt_gguf_n_tensors(const kvt_gguf *g);
const kvt_gguf_tensor *kvt_gguf_tensor_at(const kvt_gguf *g, int64_t i);
const kvt_gguf_tensor *kvt_gguf_find_tensor(const kvt_gguf *g, const char *name);

/* ------------------------------------------------------------------ writer */
typedef struct kvt_gguf_writer kvt_gguf_writer;
kvt_gguf_writer *kvt_gguf_writer_create(void);
void kvt_gguf_writer_free(kvt_gguf_writer *w);
void kvt_gguf_w_u32(kvt_gguf_writer *w, const char *key, uint32_t v);
void kvt_gguf_w_i32(kvt_gguf_writer *w, const char *key, int32_t v);
void kvt_gguf_w_f32(kvt_gguf_writer *w, const char *key, float v);
void kvt_gguf_w_bool(kvt_gguf_writer *w, const char *key, bool v);
void kvt_gguf_w_str(kvt_gguf_writer *w, const char *key, const char *s, uint64_t len);
/* array of fixed-size elements (copied) */
void kvt_gguf_w_arr(kvt_gguf_writer *w, const char *key, kvt_gguf_vtype elem, const void *data, uint64_t n);
/* array of strings (copied) */
void kvt_gguf_w_arr_str(kvt_gguf_writer *w, const char *key, const char *const *s, const uint64_t *lens, uint64_t n);
/* Copy a metadata entry verbatim from another file (used to copy a vocabulary). */
bool kvt_gguf_w_copy_kv(kvt_gguf_writer *w, const kvt_gguf *src, const char *key);
/* Tensor: data is copied at add time (nbytes must match the type and shape). */
kvt_status kvt_gguf_w_tensor(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                             const int64_t *ne, const void *data, uint64_t nbytes);
/* Writes the file (v3, alignment 32, ggml-strict tensor layout) atomically (tmp + rename). */
kvt_status kvt_gguf_writer_finish(kvt_gguf_writer *w, const char *path, char *err, size_t errlen);

/* ------------------------------------------------------------------ additions (gguf owner) */
uint32_t kvt_gguf_alignment(const kvt_gguf *g);
uint64_t kvt_gguf_data_offset(const kvt_gguf *g); /* absolute file offset of the data section */
/* Element type of array key i, or -1 when key i is not an array. */
kvt_gguf_vtype kvt_gguf_arr_type(const kvt_gguf *g, int64_t i);
void kvt_gguf_w_u64(kvt_gguf_writer *w, const char *key, uint64_t v);
/* Any fixed-size scalar type (u8 … f64, bool); v points at a value of that type. */
void kvt_gguf_w_scalar(kvt_gguf_writer *w, const char *key, kvt_gguf_vtype type, const void *v);
/* Lazily generated tensor: fill is called during kvt_gguf_writer_finish with a scratch buffer of
 * exactly nbytes (the size of type/shape) to fill; ctx must stay valid until finish returns. Keeps
 * memory at one tensor for huge generated models. */
typedef kvt_status (*kvt_gguf_fill_fn)(void *ctx, const char *name, uint32_t type, uint32_t n_dims,
                                       const int64_t *ne, void *dst, uint64_t nbytes);
kvt_status kvt_gguf_w_tensor_fill(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, kvt_gguf_fill_fn fill, void *ctx);
/* Fault injection for tests: writes fail with ENOSPC after nbytes bytes (-1 = off). Process-wide. */
void kvt_gguf_test_fail_write_after(int64_t nbytes);

#endif
