/*
 * budget.h — the memory budget (--memory-budget SIZE|auto, docs/tiers.md "Memory budget"): what a
 * live row's KV really holds (admission), the size parser, the automatic probe of the machine's
 * memory, and the split of a budget into its parts.
 *
 * Ownership: nothing here allocates or keeps state; every function is pure except the probe, which
 * reads /proc/meminfo and the cgroup files (bounded reads; their content is untrusted).
 */
#ifndef KVT_BUDGET_H
#define KVT_BUDGET_H

#include "../kv/kv.h"

/* The most KV bytes one live sequence of `tokens` tokens holds at once, processed in forward chunks
 * of at most `chunk` tokens (0 = all at once), the way the pool bills them (whole blocks):
 *   FULL and MLA groups: every block of the tokens (an MLA block holds the latent rows only);
 *   WINDOW(w) groups: at most (chunk + w - 2) / block_tokens + 2 blocks (kvt_seq releases a block
 *     once no later query sees it; the chunk being written is held on top), never more than the
 *     tokens need;
 *   RECURRENT layers: their state once (kvt_kv_layout_state_bytes; heap, not pool).
 * Blocks are billed at the largest variant first (the base 16-bit codec before quant_start), so the
 * figure is an upper bound whatever blocks the window holds. */
uint64_t kvt_row_kv_bytes(const kvt_kv_layout *l, uint64_t tokens, uint32_t chunk);

/* "8G", "512M", "1.5GiB", "4096k", "1073741824": a byte count. Suffixes K, M, G, T (optionally
 * followed by "B" or "iB", any case) are binary (1024^n); no suffix = bytes. Strict: no sign, no
 * spaces, no trailing text, > 0, < 2^62. */
kvt_status kvt_size_parse(const char *s, uint64_t *out, char *err, size_t errlen);

/* What `auto` found. Sources: $KVT_MEMINFO_PATH (default /proc/meminfo) for MemAvailable and
 * $KVT_CGROUP_DIR (default /sys/fs/cgroup) for the cgroup: v2 memory.max / memory.current, else v1
 * memory/memory.limit_in_bytes / memory/memory.usage_in_bytes. "max", a missing file and values of
 * 2^60 or more (v1's "unlimited") mean no cgroup limit. */
typedef struct kvt_mem_probe {
    uint64_t mem_available;  /* MemAvailable */
    uint64_t cgroup_limit;   /* 0 = none */
    uint64_t cgroup_usage;
    uint64_t available;      /* min(MemAvailable, cgroup_limit - cgroup_usage) */
    uint64_t margin;         /* max(available / 10, KVT_MEM_MARGIN_MIN) */
    uint64_t budget;         /* available - margin */
    int cgroup_version;      /* 0 none, 1, 2 */
} kvt_mem_probe;
#define KVT_MEM_MARGIN_MIN (256ull << 20)
/* The margin `auto` keeps out of `available` (also the slack the e2e test allows over a budget). */
uint64_t kvt_mem_margin(uint64_t available);
kvt_status kvt_mem_probe_auto(kvt_mem_probe *out, char *err, size_t errlen);

/* The parts of a budget that are not KV. */
typedef struct kvt_mem_parts {
    uint64_t weights;         /* the model file's mapping: its size (every page may become resident) */
    uint64_t weight_copies;   /* kvt_model_private_bytes: packed / bf16x copies, f32 vectors */
    uint64_t compute;         /* kvt_ctx_bytes + the batched logits rows of --parallel rows */
    uint64_t spill_queue;     /* --ssd-spill-queue-mb (0 without the SSD tier) */
    uint64_t text;            /* tokenizer and request parse buffers */
    uint64_t draft;           /* --draft-model: its mapping, copies, compute context and live rows' KV
                                 (kvt_spec_fixed_bytes); its RAM tier is a share of ram_tier */
} kvt_mem_parts;

typedef struct kvt_mem_split_in {
    uint64_t budget;
    kvt_mem_parts parts;
    uint64_t row_bytes;       /* kvt_row_kv_bytes of one full-context row */
    uint32_t parallel;        /* live rows */
    uint64_t kv_pool;         /* --kv-pool-gb given: that many bytes; 0 = derive */
    bool ram_tier_set;        /* --prompt-cache given (0 = off is honoured) */
    uint64_t ram_tier;        /* its bytes when set; else the default cap */
} kvt_mem_split_in;

typedef struct kvt_mem_split {
    uint64_t fixed;           /* sum of the parts */
    uint64_t kv_pool;         /* the block pool's budget: live rows + the RAM tier */
    uint64_t ram_tier;        /* the RAM tier's cap (inside the pool) */
    uint64_t live_rows;       /* min(parallel * row_bytes, kv_pool) */
} kvt_mem_split;

/* Splits in->budget. Errors (KVT_ERR_INVALID_ARG, the message names every part and its size): the
 * parts plus one full-context row do not fit; an explicit --kv-pool-gb does not fit; an explicit
 * --prompt-cache does not leave one row in the pool. Derived: ram_tier = min(default, KV room - one
 * row); kv_pool = min(KV room, parallel rows + ram_tier). */
kvt_status kvt_mem_split_plan(const kvt_mem_split_in *in, kvt_mem_split *out, char *err, size_t errlen);
/* The startup line: "memory budget 4.00 GB (auto: …): weights …, KV pool … (RAM tier …)". */
void kvt_mem_split_describe(const kvt_mem_split_in *in, const kvt_mem_split *out, const char *source, char *buf,
                            size_t n);

#endif
