/* budget.c — see budget.h and docs/tiers.md "Memory budget". */
#include "budget.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ABSURD (1ull << 60) /* a memory figure this large means "no limit" (cgroup v1) or garbage */

uint64_t kvt_row_kv_bytes(const kvt_kv_layout *l, uint64_t tokens, uint32_t chunk) {
    const uint64_t bt = kvt_kv_layout_block_tokens(l);
    const uint64_t nblk = (tokens + bt - 1) / bt;
    const uint64_t c = chunk && chunk < tokens ? chunk : tokens;
    uint64_t total = kvt_kv_layout_state_bytes(l);
    for (uint32_t g = 0; g < kvt_kv_layout_n_groups(l); g++) {
        uint64_t held = nblk;
        if (kvt_kv_layout_group_kind(l, g) == KVT_KIND_WINDOW) {
            const uint64_t w = kvt_kv_layout_group_window(l, g);
            const uint64_t win = (c + w >= 2 ? (c + w - 2) / bt : 0) + 2;
            if (win < held) held = win;
        }
        /* block bytes never grow with the index (base codec first), so the first `held` blocks
         * bound any `held` blocks the sequence holds at once */
        const uint64_t b0 = kvt_kv_layout_block_bytes(l, g, 0);
        if (held == 0) continue;
        if (kvt_kv_layout_block_bytes(l, g, (uint32_t)(held - 1)) == b0) {
            total += held * b0; /* one variant throughout */
            continue;
        }
        for (uint64_t i = 0; i < held; i++) total += kvt_kv_layout_block_bytes(l, g, (uint32_t)i);
    }
    return total;
}

kvt_status kvt_size_parse(const char *s, uint64_t *out, char *err, size_t errlen) {
    *out = 0;
    if (!s || !*s) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "empty size (use e.g. 8G, 512M or a byte count)");
    const char *p = s;
    double v = 0, frac = 0.1;
    bool digits = false, dot = false;
    for (; (*p >= '0' && *p <= '9') || (*p == '.' && !dot); p++) {
        if (*p == '.') {
            dot = true;
            continue;
        }
        digits = true;
        if (dot) {
            v += (*p - '0') * frac;
            frac /= 10;
        } else {
            v = v * 10 + (*p - '0');
        }
        if (v > 1e20) v = 1e20; /* too large either way (checked below) */
    }
    if (!digits) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "'%s' is not a size (use e.g. 8G, 512M or a byte count)", s);
    uint64_t mul = 1;
    switch (*p) {
    case 'k': case 'K': mul = 1ull << 10; p++; break;
    case 'm': case 'M': mul = 1ull << 20; p++; break;
    case 'g': case 'G': mul = 1ull << 30; p++; break;
    case 't': case 'T': mul = 1ull << 40; p++; break;
    default: break;
    }
    if (mul > 1 && (*p == 'i' || *p == 'I')) {
        p++;
        if (*p != 'b' && *p != 'B') p--; /* "Gi" alone is not accepted: the check below fails on 'i' */
    }
    if (*p == 'b' || *p == 'B') p++;
    if (*p) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "'%s' is not a size: unexpected '%s' (use e.g. 8G, 512M or a byte count)", s, p);
    if (dot && mul == 1) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "'%s': a byte count must be whole (or use a K/M/G/T suffix)", s);
    const double bytes = v * (double)mul;
    if (bytes >= (double)(1ull << 62)) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "'%s' is too large", s);
    if (bytes < 1) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "'%s': the size must be above 0", s);
    *out = (uint64_t)bytes;
    return KVT_OK;
}

uint64_t kvt_mem_margin(uint64_t available) { return KVT_MAX(available / 10, KVT_MEM_MARGIN_MIN); }

/* Reads at most cap-1 bytes of path into buf (NUL-terminated). False when it cannot be read. */
static bool read_small(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    return true;
}

/* A decimal u64 at s (leading blanks allowed), ending at a blank, newline or NUL; *end after it. */
static bool parse_u64(const char *s, uint64_t *v, const char **end) {
    while (*s == ' ' || *s == '\t') s++;
    if (*s < '0' || *s > '9') return false;
    uint64_t x = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (x > (UINT64_MAX - 9) / 10) return false;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    if (*s && *s != ' ' && *s != '\t' && *s != '\n') return false;
    *v = x;
    if (end) *end = s;
    return true;
}

/* One cgroup file: its value, or 0 for "max" / absurd / unreadable (no limit). False when the file
 * is there but malformed. */
static bool cgroup_value(const char *path, uint64_t *v, bool *present) {
    char buf[64];
    *v = 0;
    *present = read_small(path, buf, sizeof buf);
    if (!*present) return true;
    if (!strncmp(buf, "max", 3) && (buf[3] == 0 || buf[3] == '\n')) return true;
    uint64_t x;
    if (!parse_u64(buf, &x, NULL)) return false;
    *v = x >= ABSURD ? 0 : x;
    return true;
}

kvt_status kvt_mem_probe_auto(kvt_mem_probe *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const char *mi = getenv("KVT_MEMINFO_PATH");
    if (!mi || !*mi) mi = "/proc/meminfo";
    char buf[16384];
    if (!read_small(mi, buf, sizeof buf))
        return kvt_errf(err, errlen, KVT_ERR_IO, "--memory-budget auto: cannot read %s (%s); give --memory-budget SIZE",
                        mi, strerror(errno));
    const char *p = strstr(buf, "MemAvailable:");
    uint64_t kb = 0;
    const char *end = NULL;
    if (!p || (p != buf && p[-1] != '\n') || !parse_u64(p + 13, &kb, &end) || strncmp(end, " kB", 3) != 0 ||
        kb == 0 || kb >= ABSURD >> 10)
        return kvt_errf(err, errlen, KVT_ERR_FORMAT,
                        "--memory-budget auto: %s has no valid MemAvailable line; give --memory-budget SIZE", mi);
    out->mem_available = kb << 10;
    out->available = out->mem_available;

    const char *cg = getenv("KVT_CGROUP_DIR");
    if (!cg || !*cg) cg = "/sys/fs/cgroup";
    char path[4096];
    static const char *const files[2][2] = {{"memory.max", "memory.current"},
                                            {"memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"}};
    for (int ver = 0; ver < 2 && !out->cgroup_version; ver++) {
        uint64_t lim = 0, use = 0;
        bool lp = false, up = false;
        snprintf(path, sizeof path, "%s/%s", cg, files[ver][0]);
        if (!cgroup_value(path, &lim, &lp))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "--memory-budget auto: %s is malformed; give --memory-budget SIZE", path);
        if (!lp) continue;
        out->cgroup_version = ver == 0 ? 2 : 1;
        if (!lim) break; /* no limit */
        snprintf(path, sizeof path, "%s/%s", cg, files[ver][1]);
        if (!cgroup_value(path, &use, &up))
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "--memory-budget auto: %s is malformed; give --memory-budget SIZE", path);
        out->cgroup_limit = lim;
        out->cgroup_usage = use;
        const uint64_t room = use < lim ? lim - use : 0;
        if (room < out->available) out->available = room;
    }
    out->margin = kvt_mem_margin(out->available);
    if (out->available <= out->margin) {
        char a[32], m[32];
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "--memory-budget auto: only %s of memory is available, not more than the %s margin; give "
                        "--memory-budget SIZE",
                        kvt_fmt_bytes((double)out->available, a, sizeof a), kvt_fmt_bytes((double)out->margin, m, sizeof m));
    }
    out->budget = out->available - out->margin;
    return KVT_OK;
}

#define FB(v, b) kvt_fmt_bytes((double)(v), b, sizeof b)

/* "weights 1.00 GB + weight copies … + compute … + spill queue … + text buffers …" */
static void parts_text(const kvt_mem_parts *p, char *buf, size_t n) {
    char a[32], b[32], c[32], d[32], e[32], f[32];
    int k = snprintf(buf, n, "model weights %s + weight copies %s + compute buffers %s + SSD spill queue %s + text buffers %s",
                     FB(p->weights, a), FB(p->weight_copies, b), FB(p->compute, c), FB(p->spill_queue, d), FB(p->text, e));
    if (p->draft && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " + draft model %s", FB(p->draft, f));
}

kvt_status kvt_mem_split_plan(const kvt_mem_split_in *in, kvt_mem_split *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const kvt_mem_parts *p = &in->parts;
    out->fixed = p->weights + p->weight_copies + p->compute + p->spill_queue + p->text + p->draft;
    char parts[400], a[32], b[32], c[32], d[32];
    if (out->fixed + in->row_bytes > in->budget) {
        parts_text(p, parts, sizeof parts);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "--memory-budget %s is too small: %s + KV of one full context %s = %s",
                        FB(in->budget, a), parts, FB(in->row_bytes, b), FB(out->fixed + in->row_bytes, c));
    }
    const uint64_t room = in->budget - out->fixed; /* for KV: live rows and the RAM tier */
    if (in->kv_pool > room) {
        parts_text(p, parts, sizeof parts);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "--kv-pool-gb %s does not fit the memory budget %s: %s leave %s for KV",
                        FB(in->kv_pool, a), FB(in->budget, b), parts, FB(room, c));
    }
    const uint64_t kv = in->kv_pool ? in->kv_pool : room;
    if (in->ram_tier_set) {
        if (in->ram_tier && (kv < in->row_bytes || in->ram_tier > kv - in->row_bytes))
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "--prompt-cache %s does not fit the memory budget %s: the KV pool %s must also hold one "
                            "full context (%s) for a live row",
                            FB(in->ram_tier, a), FB(in->budget, b), FB(kv, c), FB(in->row_bytes, d));
        out->ram_tier = in->ram_tier;
    } else {
        const uint64_t most = kv > in->row_bytes ? kv - in->row_bytes : 0;
        out->ram_tier = KVT_MIN(in->ram_tier, most);
    }
    const uint64_t rows = (uint64_t)(in->parallel ? in->parallel : 1) * in->row_bytes;
    out->kv_pool = in->kv_pool ? in->kv_pool : KVT_MIN(room, rows + out->ram_tier);
    out->live_rows = KVT_MIN(rows, out->kv_pool);
    return KVT_OK;
}

void kvt_mem_split_describe(const kvt_mem_split_in *in, const kvt_mem_split *out, const char *source, char *buf,
                            size_t n) {
    char parts[400], a[32], b[32], c[32], d[32], e[32];
    parts_text(&in->parts, parts, sizeof parts);
    const uint64_t used = out->fixed + out->kv_pool;
    snprintf(buf, n,
             "memory budget %s (%s): %s + KV pool %s (live rows %s for --parallel %u, RAM tier %s); %s left unassigned",
             FB(in->budget, a), source, parts, FB(out->kv_pool, b), FB(out->live_rows, c), in->parallel ? in->parallel : 1,
             FB(out->ram_tier, d), FB(used < in->budget ? in->budget - used : 0, e));
}
