/*
 * layout.c — the KV layout: groups layers by (kind, window), resolves block variants (base codec
 * before quant_start, configured codec after), computes 64-byte aligned section offsets and block
 * sizes, and produces the stable scheme key. Also the chain/root hashes.
 */
#define XXH_STATIC_LINKING_ONLY
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#include "kv_int.h"

#define SECTION_ALIGN 64

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static const char *kind_name(kvt_layer_kind k) {
    switch (k) {
    case KVT_KIND_FULL: return "full";
    case KVT_KIND_WINDOW: return "window";
    case KVT_KIND_RECURRENT: return "recurrent";
    case KVT_KIND_MLA: return "mla";
    }
    return "?";
}

static bool codec_eq(kvt_codec a, kvt_codec b) {
    if (a.kind != b.kind) return false;
    if (a.kind == KVT_CODEC_TURBO) return a.bits == b.bits && a.vbits == b.vbits;
    if (a.kind != KVT_CODEC_AFFINE) return true;
    return a.bits == b.bits && a.group_size == b.group_size && !a.scale_bf16 == !b.scale_bf16;
}

void kvt_kv_layout_free(kvt_kv_layout *l) {
    if (!l) return;
    for (uint32_t g = 0; g < l->n_groups; g++) free(l->groups[g].layers);
    free(l->layers);
    free(l->info);
    free(l);
}

/* Compact codec text used by the key: "8g64", "8g64b" (bf16 scales), "f16", "bf16", and
 * "turbo-k8v3-r<seed>" (the rotation seed is part of what a TURBO block's bytes mean). */
static void codec_compact(kvt_codec c, char *buf, size_t n) {
    if (c.kind == KVT_CODEC_TURBO)
        snprintf(buf, n, "turbo-k%uv%u-r%08x", (unsigned)c.bits, (unsigned)c.vbits, (unsigned)(KVT_TURBO_SEED & 0xffffffffu));
    else if (c.kind == KVT_CODEC_AFFINE)
        snprintf(buf, n, "%ug%u%s", (unsigned)c.bits, (unsigned)c.group_size, c.scale_bf16 ? "b" : "");
    else
        kvt_codec_name(c, buf, n);
}

static void build_key(kvt_kv_layout *l) {
    /* Key = block tokens + base codec, plus the per-layer codecs and quant_start when any layer
     * differs from the base. Identical layouts produce identical keys; kinds/windows/dims belong
     * to the model part of compatibility. */
    char base[16];
    kvt_codec_name(l->base, base, sizeof base);
    /* a latent (MLA) cache holds different bytes than expanded K/V of the same model: mark it */
    bool mla = false;
    for (uint32_t i = 0; i < l->n_layers; i++) mla |= l->layers[i].kind == KVT_KIND_MLA;
    if (mla) snprintf(base + strlen(base), sizeof base - strlen(base), "-mla");
    bool any_attn = false, all_same = true, all_base = true;
    kvt_codec first = l->base;
    for (uint32_t i = 0; i < l->n_layers; i++) {
        if (l->layers[i].kind == KVT_KIND_RECURRENT) continue;
        kvt_codec c = l->layers[i].codec;
        if (!any_attn) first = c;
        else if (!codec_eq(c, first)) all_same = false;
        any_attn = true;
        if (!codec_eq(c, l->base)) all_base = false;
    }
    if (!any_attn || all_base) {
        snprintf(l->key, sizeof l->key, "bt%u-%s", l->block_tokens, base);
        return;
    }
    if (all_same) {
        char cc[40];
        codec_compact(first, cc, sizeof cc);
        snprintf(l->key, sizeof l->key, first.kind == KVT_CODEC_TURBO ? "bt%u-%s-%s-s%u" : "bt%u-%s-kv%s-s%u",
                 l->block_tokens, base, cc, l->quant_start);
        return;
    }
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < l->n_layers; i++) {
        char cc[40] = "r";
        if (l->layers[i].kind != KVT_KIND_RECURRENT) codec_compact(l->layers[i].codec, cc, sizeof cc);
        XXH3_64bits_update(&st, cc, strlen(cc));
        XXH3_64bits_update(&st, ",", 1);
    }
    snprintf(l->key, sizeof l->key, "bt%u-%s-cfg-%016llx-s%u", l->block_tokens, base,
             (unsigned long long)XXH3_64bits_digest(&st), l->quant_start);
}

kvt_status kvt_kv_layout_create(const kvt_layer_desc *layers, uint32_t n_layers, uint32_t block_tokens,
                                kvt_codec base, uint32_t quant_start, kvt_kv_layout **out, char *err,
                                size_t errlen) {
    *out = NULL;
    if (!layers || n_layers == 0 || n_layers > KVT_MAX_LAYERS)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "kv layout: n_layers %u not in 1..%u", n_layers,
                        KVT_MAX_LAYERS);
    if (block_tokens == 0 || block_tokens > (1u << 20))
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "kv layout: block_tokens %u not in 1..%u",
                        block_tokens, 1u << 20);
    if (base.kind != KVT_CODEC_F16 && base.kind != KVT_CODEC_BF16)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "kv layout: base codec must be f16 or bf16");

    kvt_kv_layout *l = calloc(1, sizeof *l);
    if (!l) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "kv layout: out of memory");
    l->n_layers = n_layers;
    l->block_tokens = block_tokens;
    l->base = (kvt_codec){.kind = base.kind};
    l->quant_start = quant_start;
    uint64_t qb = ((uint64_t)quant_start + block_tokens - 1) / block_tokens;
    l->quant_block = qb > UINT32_MAX ? UINT32_MAX : (uint32_t)qb;
    l->layers = calloc(n_layers, sizeof *l->layers);
    l->info = calloc(n_layers, sizeof *l->info);
    kvt_status st = KVT_OK;
    if (!l->layers || !l->info) {
        st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "kv layout: out of memory");
        goto fail;
    }

    /* Validate and assign groups in first-appearance order. */
    for (uint32_t i = 0; i < n_layers; i++) {
        kvt_layer_desc d = layers[i];
        l->info[i].group = UINT32_MAX;
        if (d.kind == KVT_KIND_RECURRENT) {
            if (d.state_bytes == 0 || d.state_bytes > (1u << 30)) {
                st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                              "kv layout: layer %u: recurrent state_bytes %u not in 1..2^30", i, d.state_bytes);
                goto fail;
            }
            d.window = 0;
            d.n_kv_heads = d.head_dim_k = d.head_dim_v = 0;
            d.codec = (kvt_codec){0};
            l->layers[i] = d;
            l->info[i].state_offset = l->state_bytes;
            l->state_bytes += align_up(d.state_bytes, SECTION_ALIGN);
            continue;
        }
        if (d.kind != KVT_KIND_FULL && d.kind != KVT_KIND_WINDOW && d.kind != KVT_KIND_MLA) {
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                          "kv layout: layer %u: kind %d is not FULL, WINDOW, RECURRENT or MLA", i, (int)d.kind);
            goto fail;
        }
        if (d.kind == KVT_KIND_MLA && (d.n_kv_heads != 1 || d.head_dim_v >= d.head_dim_k)) {
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                          "kv layout: layer %u: MLA needs 1 latent head and latent dims %u < row dims %u", i,
                          d.head_dim_v, d.head_dim_k);
            goto fail;
        }
        if (d.kind == KVT_KIND_WINDOW && d.window == 0) {
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "kv layout: layer %u: window layer with window 0", i);
            goto fail;
        }
        if (d.kind != KVT_KIND_WINDOW) d.window = 0;
        if (d.n_kv_heads == 0 || d.head_dim_k == 0 || d.head_dim_v == 0 || d.n_kv_heads > 4096 ||
            d.head_dim_k > 65536 || d.head_dim_v > 65536) {
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                          "kv layout: layer %u: bad dims (n_kv_heads %u, head_dim_k %u, head_dim_v %u)", i,
                          d.n_kv_heads, d.head_dim_k, d.head_dim_v);
            goto fail;
        }
        if (!kvt_codec_valid(d.codec, d.head_dim_k) ||
            (d.kind != KVT_KIND_MLA && !kvt_codec_valid(d.codec, d.head_dim_v))) {
            char cn[32];
            kvt_codec_name(d.codec, cn, sizeof cn);
            st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                          "kv layout: layer %u: codec %s invalid for head dims %u/%u%s", i, cn, d.head_dim_k,
                          d.head_dim_v,
                          d.codec.kind == KVT_CODEC_TURBO ? " (turbo needs a power-of-two head_dim in 8..1024)" : "");
            goto fail;
        }
        if (d.codec.kind == KVT_CODEC_TURBO) {
            d.codec = (kvt_codec){.kind = KVT_CODEC_TURBO, .bits = d.codec.bits, .vbits = d.codec.vbits};
        } else if (d.codec.kind != KVT_CODEC_AFFINE) {
            d.codec = (kvt_codec){.kind = d.codec.kind};
        } else {
            d.codec.scale_bf16 = d.codec.scale_bf16 ? 1 : 0;
        }
        l->layers[i] = d;
        uint32_t g;
        for (g = 0; g < l->n_groups; g++)
            if (l->groups[g].kind == d.kind && l->groups[g].window == d.window) break;
        if (g == l->n_groups) {
            if (l->n_groups == KVT_MAX_GROUPS) {
                st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                              "kv layout: more than %u distinct (kind, window) layer groups", KVT_MAX_GROUPS);
                goto fail;
            }
            l->groups[g].kind = d.kind;
            l->groups[g].window = d.window;
            l->groups[g].layers = calloc(n_layers, sizeof(uint32_t));
            if (!l->groups[g].layers) {
                st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "kv layout: out of memory");
                goto fail;
            }
            l->n_groups++;
        }
        l->groups[g].layers[l->groups[g].n_layers++] = i;
        l->info[i].group = g;
        l->info[i].codec[0] = l->base;
        l->info[i].codec[1] = d.codec;
        if (d.head_dim_k > l->max_head_dim) l->max_head_dim = d.head_dim_k;
        if (d.head_dim_v > l->max_head_dim) l->max_head_dim = d.head_dim_v;
    }

    /* Token blocks carry the chain that names every cached thing, snapshots included, and the
     * sequence sizes its block table from them: a layout of recurrent layers only has no blocks
     * (a GGUF whose every layer is recurrent would otherwise reach seq.c's invariants). */
    if (l->n_groups == 0) {
        st = kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                      "kv layout: all %u layers are recurrent; at least one attention layer (full, window or "
                      "latent) is needed",
                      n_layers);
        goto fail;
    }

    /* Section offsets per group and variant, in increasing layer order: K then V (MLA: K only, the
     * V "section" is the K section read as its c prefix). */
    for (uint32_t g = 0; g < l->n_groups; g++) {
        for (int var = 0; var < KVT_N_VARIANTS; var++) {
            size_t off = 0;
            for (uint32_t j = 0; j < l->groups[g].n_layers; j++) {
                uint32_t li = l->groups[g].layers[j];
                const kvt_layer_desc *d = &l->layers[li];
                for (int kv = 0; kv < 2; kv++) {
                    if (kv && d->kind == KVT_KIND_MLA) {
                        l->info[li].row_bytes[var][1] = 0;
                        l->info[li].offset[var][1] = l->info[li].offset[var][0];
                        continue;
                    }
                    uint32_t hd = kv ? d->head_dim_v : d->head_dim_k;
                    size_t rb = kvt_codec_row_bytes(kvt_codec_side(l->info[li].codec[var], kv), hd);
                    l->info[li].row_bytes[var][kv] = rb;
                    off = align_up(off, SECTION_ALIGN);
                    l->info[li].offset[var][kv] = off;
                    off += rb * d->n_kv_heads * block_tokens;
                }
            }
            l->groups[g].block_bytes[var] = align_up(off, SECTION_ALIGN);
        }
    }
    build_key(l);
    *out = l;
    return KVT_OK;
fail:
    kvt_kv_layout_free(l);
    return st;
}

uint32_t kvt_kv_layout_n_layers(const kvt_kv_layout *l) { return l->n_layers; }
uint32_t kvt_kv_layout_block_tokens(const kvt_kv_layout *l) { return l->block_tokens; }
uint32_t kvt_kv_layout_n_groups(const kvt_kv_layout *l) { return l->n_groups; }

const kvt_layer_desc *kvt_kv_layout_layer(const kvt_kv_layout *l, uint32_t layer) {
    return layer < l->n_layers ? &l->layers[layer] : NULL;
}

uint32_t kvt_kv_layout_layer_group(const kvt_kv_layout *l, uint32_t layer) {
    return layer < l->n_layers ? l->info[layer].group : UINT32_MAX;
}

kvt_layer_kind kvt_kv_layout_group_kind(const kvt_kv_layout *l, uint32_t group) {
    return group < l->n_groups ? l->groups[group].kind : (kvt_layer_kind)0;
}

uint32_t kvt_kv_layout_group_window(const kvt_kv_layout *l, uint32_t group) {
    return group < l->n_groups ? l->groups[group].window : 0;
}

uint32_t kvt_kv_layout_group_n_layers(const kvt_kv_layout *l, uint32_t group) {
    return group < l->n_groups ? l->groups[group].n_layers : 0;
}

uint32_t kvt_kv_layout_group_layer(const kvt_kv_layout *l, uint32_t group, uint32_t i) {
    if (group >= l->n_groups || i >= l->groups[group].n_layers) return UINT32_MAX;
    return l->groups[group].layers[i];
}

kvt_codec kvt_kv_layout_codec_at(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index) {
    if (layer >= l->n_layers || l->info[layer].group == UINT32_MAX) return (kvt_codec){0};
    return l->info[layer].codec[kvt_layout_variant(l, block_index)];
}

size_t kvt_kv_layout_block_bytes(const kvt_kv_layout *l, uint32_t group, uint32_t block_index) {
    if (group >= l->n_groups) return 0;
    return l->groups[group].block_bytes[kvt_layout_variant(l, block_index)];
}

size_t kvt_kv_layout_section_offset(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv) {
    if (layer >= l->n_layers || l->info[layer].group == UINT32_MAX) return 0;
    return l->info[layer].offset[kvt_layout_variant(l, block_index)][kv ? 1 : 0];
}

size_t kvt_kv_layout_row_bytes(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv) {
    if (layer >= l->n_layers || l->info[layer].group == UINT32_MAX) return 0;
    return l->info[layer].row_bytes[kvt_layout_variant(l, block_index)][kv ? 1 : 0];
}

size_t kvt_kv_layout_row_offset(const kvt_kv_layout *l, uint32_t layer, uint32_t block_index, int kv, uint32_t token,
                                uint32_t head) {
    if (layer >= l->n_layers || l->info[layer].group == UINT32_MAX) return 0;
    const int var = kvt_layout_variant(l, block_index), k = kv ? 1 : 0;
    const size_t rb = l->info[layer].row_bytes[var][k];
    return l->info[layer].offset[var][k] + ((size_t)head * l->block_tokens + token) * rb;
}

double kvt_kv_layout_layer_bytes_per_token(const kvt_kv_layout *l, uint32_t layer) {
    if (layer >= l->n_layers || l->layers[layer].kind == KVT_KIND_RECURRENT) return 0;
    /* an MLA layer's V row_bytes is 0: the latent row alone */
    return (double)l->layers[layer].n_kv_heads *
           (double)(l->info[layer].row_bytes[1][0] + l->info[layer].row_bytes[1][1]);
}

double kvt_kv_layout_bytes_per_token(const kvt_kv_layout *l) {
    double s = 0;
    for (uint32_t i = 0; i < l->n_layers; i++) s += kvt_kv_layout_layer_bytes_per_token(l, i);
    return s;
}

size_t kvt_kv_layout_state_bytes(const kvt_kv_layout *l) { return l->state_bytes; }
size_t kvt_kv_layout_state_offset(const kvt_kv_layout *l, uint32_t layer) {
    return layer < l->n_layers && l->layers[layer].kind == KVT_KIND_RECURRENT ? l->info[layer].state_offset : 0;
}

void kvt_kv_layout_describe_layer(const kvt_kv_layout *l, uint32_t layer, char *buf, size_t n) {
    if (!buf || n == 0) return;
    if (layer >= l->n_layers) {
        snprintf(buf, n, "?");
        return;
    }
    const kvt_layer_desc *d = &l->layers[layer];
    char cn[32];
    switch (d->kind) {
    case KVT_KIND_RECURRENT: snprintf(buf, n, "recurrent(%uB)", d->state_bytes); break;
    case KVT_KIND_WINDOW:
        kvt_codec_name(d->codec, cn, sizeof cn);
        snprintf(buf, n, "window(%u)/%s", d->window, cn);
        break;
    case KVT_KIND_MLA:
        kvt_codec_name(d->codec, cn, sizeof cn);
        snprintf(buf, n, "mla(%u+%u)/%s", d->head_dim_v, d->head_dim_k - d->head_dim_v, cn);
        break;
    default:
        kvt_codec_name(d->codec, cn, sizeof cn);
        snprintf(buf, n, "%s/%s", kind_name(d->kind), cn);
        break;
    }
}

void kvt_kv_layout_key(const kvt_kv_layout *l, char *buf, size_t n) {
    if (!buf || n == 0) return;
    snprintf(buf, n, "%s", l->key);
}

/* ------------------------------------------------------------------ hashing */
static _Atomic uint64_t g_chain_hash_calls;
uint64_t kvt_chain_hash_calls(void) { return atomic_load_explicit(&g_chain_hash_calls, memory_order_relaxed); }

uint64_t kvt_chain_hash(uint64_t parent, const int32_t *tokens, uint32_t n_tokens) {
    atomic_fetch_add_explicit(&g_chain_hash_calls, 1, memory_order_relaxed);
    /* XXH3-64 over the byte string: parent (8 bytes LE) || tokens (4 bytes LE each). */
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint8_t p[8];
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(parent >> (8 * i));
    XXH3_64bits_update(&st, p, 8);
    if (n_tokens) XXH3_64bits_update(&st, tokens, (size_t)n_tokens * sizeof(int32_t));
    return XXH3_64bits_digest(&st);
}

uint64_t kvt_root_hash(const char *compat_key, const char *ns) {
    /* Both strings are length-prefixed (8-byte LE lengths) so ("ab","c") != ("a","bc"). */
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    if (!compat_key) compat_key = "";
    if (!ns) ns = "";
    const char *parts[2] = {compat_key, ns};
    XXH3_64bits_update(&st, "kvt-root", 8);
    for (int k = 0; k < 2; k++) {
        uint64_t n = strlen(parts[k]);
        uint8_t lb[8];
        for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(n >> (8 * i));
        XXH3_64bits_update(&st, lb, 8);
        XXH3_64bits_update(&st, parts[k], (size_t)n);
    }
    return XXH3_64bits_digest(&st);
}
