/* cmd_cache.c — `kvtier cache ls|inspect|verify|prune`: offline tools for an SSD cache directory
 * (format: docs/cache-format.md). Never run these against a directory a live server is pruning at
 * the same moment: ls/inspect/verify only read; prune deletes whole files (atomic for readers).
 * `kvtier cache drain` is the one subcommand that talks to a running server (POST /admin/drain,
 * through util/http_client.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cache/ssd_cache.h"
#include "args.h"
#include "cmds.h"
#include "../util/http_client.h"
#include "../cache/pin_file.h"
#include "../cache/ssd_ckpt.h"
#include <time.h>

static void usage(void) {
    printf("usage: kvtier cache <ls|inspect|verify|prune|drain> ...\n"
           "\n"
           "  kvtier cache ls DIR                 entries per compatibility key: files, bytes, longest prefix\n"
           "  kvtier cache ls DIR --pinned        the pinned prefixes of each compat dir's pin list (PINS)\n"
           "  kvtier cache inspect FILE           print one cache file's header fields\n"
           "  kvtier cache verify DIR             check every header and payload checksum (exit 1 if any bad)\n"
           "  kvtier cache prune DIR --max-gb X   delete least-recently-used files until DIR holds <= X GB\n"
           "  kvtier cache drain                  ask a running server to move every RAM entry to its SSD\n"
           "                                      tier and answer when the writes are durable (POST /admin/drain)\n"
           "\n"
           "DIR is the --ssd-cache root (holding one <compat-dir>/ per compatibility key) or one\n"
           "compat dir. prune options: --dry-run (list what would go). Format: docs/cache-format.md\n"
           "drain options: --host ADDR (default 127.0.0.1), --port N (default 8080), --api-key KEY\n"
           "(env KVTIER_API_KEY), --timeout SEC (default 120). Prints the server's JSON answer; exit 0\n"
           "when durable, 1 otherwise (not durable, no SSD tier, refused, unreachable).\n");
}

static bool is_cache_name(const char *n) {
    size_t l = strlen(n);
    return l > 4 && (!strcmp(n + l - 4, ".kvb") || !strcmp(n + l - 4, ".kvt") || !strcmp(n + l - 4, ".kvs"));
}
static bool is_hex_dir(const char *n) {
    if (strlen(n) != 32) return false;
    for (int i = 0; i < 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return true;
}

/* Compat dirs under root (or root itself if it directly holds cache files), each held open: every
 * later read, stat and delete is relative to fd[i] (never through a compat dir swapped for a
 * symlink meanwhile: prune never deletes outside the directories it listed). */
typedef struct dirlist {
    char **v;
    int *fd;
    int n;
} dirlist;

static void dl_push(dirlist *d, const char *p, int fd) { /* takes fd */
    char **nv = realloc(d->v, (size_t)(d->n + 1) * sizeof(char *));
    if (nv) d->v = nv;
    int *nf = nv ? realloc(d->fd, (size_t)(d->n + 1) * sizeof(int)) : NULL;
    if (nf) d->fd = nf;
    char *c = nf ? strdup(p) : NULL;
    if (!c) {
        close(fd);
        return;
    }
    d->fd[d->n] = fd;
    d->v[d->n++] = c;
}
static void dl_free(dirlist *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->v[i]);
        close(d->fd[i]);
    }
    free(d->v);
    free(d->fd);
}

static int list_compat_dirs(const char *root, dirlist *out) {
    DIR *d = opendir(root);
    if (!d) {
        fprintf(stderr, "kvtier cache: %s: %s\n", root, strerror(errno));
        return -1;
    }
    struct dirent *de;
    bool direct = false;
    char p[PATH_MAX];
    while ((de = readdir(d))) {
        if (is_cache_name(de->d_name)) direct = true;
        if (!is_hex_dir(de->d_name)) continue;
        snprintf(p, sizeof(p), "%s/%s", root, de->d_name);
        /* a compat dir is a real directory: a symlink in its place is skipped */
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) dl_push(out, p, fd);
    }
    if (direct) {
        int fd = fcntl(dirfd(d), F_DUPFD_CLOEXEC, 0); /* root itself: the user named it */
        if (fd >= 0) dl_push(out, root, fd);
    }
    closedir(d);
    return 0;
}

typedef struct finfo {
    char *path;     /* for messages */
    char *name;     /* relative to dfd */
    int dfd;        /* the held compat dir (the dirlist's; not owned) */
    kvt_ssd_file_info info;
    bool ok;
    uint64_t stamp; /* max(atime, mtime) in ns */
} finfo;

typedef struct flist {
    finfo *v;
    size_t n;
} flist;

static void scan_files(const char *dir, int dfd, bool verify, flist *fl) {
    int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0); /* fdopendir owns the duplicate */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *de;
    char p[PATH_MAX];
    while ((de = readdir(d))) {
        if (!is_cache_name(de->d_name)) continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        finfo *nv = realloc(fl->v, (fl->n + 1) * sizeof(*nv));
        if (!nv) break;
        fl->v = nv;
        finfo *f = &fl->v[fl->n++];
        memset(f, 0, sizeof(*f));
        f->path = strdup(p);
        f->name = strdup(de->d_name);
        f->dfd = dfd;
        char err[256] = "";
        f->ok = kvt_ssd_read_file_info_at(dfd, de->d_name, verify, &f->info, NULL, 0, err, sizeof(err)) == KVT_OK;
        if (!f->ok && verify) printf("BAD  %s: %s\n", p, err);
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            uint64_t m = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
            uint64_t a = (uint64_t)st.st_atim.tv_sec * 1000000000ull + (uint64_t)st.st_atim.tv_nsec;
            f->stamp = m > a ? m : a;
            f->info.file_bytes = (uint64_t)st.st_size;
        }
    }
    closedir(d);
}

static void fl_free(flist *fl) {
    for (size_t i = 0; i < fl->n; i++) {
        free(fl->v[i].path);
        free(fl->v[i].name);
    }
    free(fl->v);
    fl->v = NULL;
    fl->n = 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Longest contiguous chain (tokens) among block/tail files: an entry counts if every ancestor
 * block back to index 0 is present (any group). */
static uint64_t longest_prefix(const flist *fl) {
    uint64_t *full = malloc((fl->n + 1) * sizeof(uint64_t));
    size_t nf = 0;
    for (size_t i = 0; i < fl->n; i++)
        if (fl->v[i].ok && fl->v[i].info.kind == KVT_SSD_KIND_BLOCK) full[nf++] = fl->v[i].info.chain;
    qsort(full, nf, sizeof(uint64_t), cmp_u64);
    /* parent lookup: chain -> parent of that block */
    uint64_t best = 0;
    for (size_t i = 0; i < fl->n; i++) {
        const kvt_ssd_file_info *I = &fl->v[i].info;
        if (!fl->v[i].ok) continue;
        uint64_t end = I->kind == KVT_SSD_KIND_SNAPSHOT ? I->n_tokens : (uint64_t)I->block_index * I->block_tokens + I->n_tokens;
        if (end <= best) continue;
        if (I->kind == KVT_SSD_KIND_SNAPSHOT) { best = end; continue; }
        /* walk parents */
        uint64_t parent = I->parent;
        uint32_t idx = I->block_index;
        bool ok = true;
        while (idx > 0 && ok) {
            ok = bsearch(&parent, full, nf, sizeof(uint64_t), cmp_u64) != NULL;
            if (!ok) break;
            /* find that block's parent */
            bool found = false;
            for (size_t j = 0; j < fl->n && !found; j++)
                if (fl->v[j].ok && fl->v[j].info.kind == KVT_SSD_KIND_BLOCK && fl->v[j].info.chain == parent) {
                    parent = fl->v[j].info.parent;
                    found = true;
                }
            idx--;
        }
        if (ok) best = end;
    }
    free(full);
    return best;
}

/* The pin list of one compat dir (pin_file.h; untrusted: decode validates it), read relative to
 * the held directory. */
static void ls_pins(const char *dir, int dfd) {
    int fd = openat(dfd, KVT_PIN_FILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        printf("  pinned: none%s\n", errno == ENOENT ? "" : " (the pin list cannot be opened)");
        return;
    }
    struct stat sb;
    uint8_t *buf = NULL;
    size_t got = 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 && (uint64_t)sb.st_size <= KVT_PIN_FILE_MAX &&
        (buf = malloc((size_t)sb.st_size))) {
        while (got < (size_t)sb.st_size) {
            ssize_t r = pread(fd, buf + got, (size_t)sb.st_size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
    }
    close(fd);
    kvt_pin_rec *v = NULL;
    uint32_t n = 0;
    char err[256] = "not a regular file of a sane size";
    kvt_status st = buf && got == (size_t)sb.st_size ? kvt_pin_file_decode(buf, got, &v, &n, err, sizeof err) : KVT_ERR_FORMAT;
    free(buf);
    if (st != KVT_OK) {
        printf("  pinned: unreadable pin list %s/%s: %s\n", dir, KVT_PIN_FILE, err);
        return;
    }
    printf("  pinned: %u\n", n);
    const int64_t now = (int64_t)time(NULL);
    for (uint32_t i = 0; i < n; i++) {
        char ttl[64] = "no ttl";
        if (v[i].expires) {
            if (v[i].expires <= now) snprintf(ttl, sizeof ttl, "expired");
            else snprintf(ttl, sizeof ttl, "expires in %lld s", (long long)(v[i].expires - now));
        }
        printf("    %016llx  %u tokens  created %lld  %s%s%s\n", (unsigned long long)v[i].id, v[i].n_tokens,
               (long long)v[i].created, ttl, v[i].ns[0] ? "  namespace " : "", v[i].ns);
    }
    kvt_pin_recs_free(v, n);
}

static int do_ls(const char *root, bool pinned) {
    dirlist dl = {0};
    if (list_compat_dirs(root, &dl) != 0) return 1;
    if (dl.n == 0) printf("%s: no cache directories\n", root);
    for (int i = 0; i < dl.n; i++) {
        flist fl = {0};
        scan_files(dl.v[i], dl.fd[i], false, &fl);
        uint64_t bytes = 0, nb = 0, nt = 0, ns = 0, bad = 0;
        const char *key = NULL;
        for (size_t j = 0; j < fl.n; j++) {
            bytes += fl.v[j].info.file_bytes;
            if (!fl.v[j].ok) { bad++; continue; }
            if (!key) key = fl.v[j].info.compat_key;
            nb += fl.v[j].info.kind == KVT_SSD_KIND_BLOCK;
            nt += fl.v[j].info.kind == KVT_SSD_KIND_TAIL;
            ns += fl.v[j].info.kind == KVT_SSD_KIND_SNAPSHOT;
        }
        printf("%s\n  key: %s\n  files: %zu (blocks %llu, tails %llu, snapshots %llu, unreadable %llu)\n"
               "  bytes: %llu (%.3f GB)\n  longest prefix: %llu tokens\n",
               dl.v[i], key ? key : "(unknown)", fl.n, (unsigned long long)nb, (unsigned long long)nt,
               (unsigned long long)ns, (unsigned long long)bad, (unsigned long long)bytes, (double)bytes / 1e9,
               (unsigned long long)longest_prefix(&fl));
        if (pinned) ls_pins(dl.v[i], dl.fd[i]);
        fl_free(&fl);
    }
    dl_free(&dl);
    return 0;
}

static const char *kind_name(uint32_t k) {
    return k == KVT_SSD_KIND_BLOCK ? "block" : k == KVT_SSD_KIND_TAIL ? "tail" : k == KVT_SSD_KIND_SNAPSHOT ? "snapshot" : "?";
}

static int do_inspect(const char *path) {
    kvt_ssd_file_info I;
    int32_t toks[64];
    char err[256] = "";
    kvt_status st = kvt_ssd_read_file_info(path, false, &I, toks, 64, err, sizeof(err));
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier cache inspect: %s: %s\n", path, err);
        return 1;
    }
    printf("file:          %s\nversion:       %u\nkind:          %s\n", path, I.version, kind_name(I.kind));
    if (I.kind != KVT_SSD_KIND_SNAPSHOT) printf("group:         %u\n", I.group);
    printf("block index:   %u\nn_tokens:      %u\nblock_tokens:  %u\nlayers:        %u\nsections:      %u\n",
           I.block_index, I.n_tokens, I.block_tokens, I.n_layers, I.n_sections);
    printf("parent:        %016llx\nchain:         %016llx\nroot:          %016llx%s\n",
           (unsigned long long)I.parent, (unsigned long long)I.chain, (unsigned long long)I.root,
           I.root ? "" : " (unknown)");
    printf("compat key:    %s\ncompat hash:   %016llx\npayload bytes: %llu\nfile bytes:    %llu\n", I.compat_key,
           (unsigned long long)I.compat_hash, (unsigned long long)I.payload_bytes, (unsigned long long)I.file_bytes);
    if (I.kind != KVT_SSD_KIND_SNAPSHOT) {
        printf("tokens:       ");
        for (uint32_t i = 0; i < I.n_tokens && i < 64; i++) printf(" %d", toks[i]);
        printf("%s\n", I.n_tokens > 64 ? " …" : "");
    }
    return 0;
}

/* Generation checkpoint records (<compat-dir>/ckpt/NAME.kvc, src/cache/ssd_ckpt.h): full check, and
 * their compat key must belong to the directory. Temporaries are skipped (a live server's). */
static void verify_checkpoints(const char *cdir, size_t *n, size_t *bad) {
    char d[PATH_MAX];
    snprintf(d, sizeof(d), "%s/ckpt", cdir);
    DIR *dp = opendir(d);
    if (!dp) return;
    const char *base = strrchr(cdir, '/');
    base = base ? base + 1 : cdir;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".kvc")) continue;
        char p[PATH_MAX + 300], err[256] = "", compat[512] = "";
        snprintf(p, sizeof(p), "%s/%s", d, de->d_name);
        kvt_ckpt_rec r;
        (*n)++;
        if (kvt_ckpt_file_check(p, &r, compat, sizeof(compat), err, sizeof(err)) != KVT_OK) {
            printf("BAD  %s: %s\n", p, err);
            (*bad)++;
            continue;
        }
        free(r.emitted);
        char cd[33];
        kvt_ssd_compat_dir(compat, cd);
        if (is_hex_dir(base) && strcmp(cd, base) != 0) {
            printf("BAD  %s: compat key belongs to directory %s\n", p, cd);
            (*bad)++;
        }
    }
    closedir(dp);
}

static int do_verify(const char *root) {
    dirlist dl = {0};
    if (list_compat_dirs(root, &dl) != 0) return 1;
    size_t n = 0, bad = 0;
    for (int i = 0; i < dl.n; i++) {
        flist fl = {0};
        scan_files(dl.v[i], dl.fd[i], true, &fl);
        const char *base = strrchr(dl.v[i], '/');
        base = base ? base + 1 : dl.v[i];
        for (size_t j = 0; j < fl.n; j++) {
            n++;
            if (!fl.v[j].ok) { bad++; continue; }
            char cd[33];
            kvt_ssd_compat_dir(fl.v[j].info.compat_key, cd);
            if (is_hex_dir(base) && strcmp(cd, base) != 0) {
                printf("BAD  %s: compat key belongs to directory %s\n", fl.v[j].path, cd);
                bad++;
            }
        }
        fl_free(&fl);
        verify_checkpoints(dl.v[i], &n, &bad);
    }
    dl_free(&dl);
    printf("%zu files checked, %zu bad\n", n, bad);
    return bad ? 1 : 0;
}

static int cmp_stamp(const void *a, const void *b) {
    const finfo *x = a, *y = b;
    return x->stamp < y->stamp ? -1 : x->stamp > y->stamp;
}

static int do_prune(const char *root, double max_gb, bool dry) {
    dirlist dl = {0};
    if (list_compat_dirs(root, &dl) != 0) return 1;
    flist fl = {0};
    for (int i = 0; i < dl.n; i++) scan_files(dl.v[i], dl.fd[i], false, &fl);
    uint64_t total = 0;
    for (size_t j = 0; j < fl.n; j++) total += fl.v[j].info.file_bytes;
    uint64_t cap = (uint64_t)(max_gb * 1e9);
    qsort(fl.v, fl.n, sizeof(finfo), cmp_stamp);
    size_t removed = 0;
    uint64_t freed = 0;
    for (size_t j = 0; j < fl.n && total > cap; j++) {
        if (dry) printf("would remove %s\n", fl.v[j].path);
        else if (!fl.v[j].name || unlinkat(fl.v[j].dfd, fl.v[j].name, 0) != 0) {
            fprintf(stderr, "kvtier cache prune: %s: %s\n", fl.v[j].path, strerror(errno));
            continue;
        }
        total -= fl.v[j].info.file_bytes;
        freed += fl.v[j].info.file_bytes;
        removed++;
    }
    printf("%s %zu files (%.3f GB); %.3f GB remain\n", dry ? "would remove" : "removed", removed, (double)freed / 1e9,
           (double)total / 1e9);
    fl_free(&fl);
    dl_free(&dl);
    return 0;
}

/* POST /admin/drain on a running server; prints its answer. */
static int do_drain(const char *host, uint16_t port, const char *key, double timeout_s) {
    int status = 0;
    char *body = NULL, err[256] = "";
    /* the server bounds its own wait (at most 60 s); the client waits a little longer than asked */
    kvt_status st = kvt_http_request(host, port, "POST", "/admin/drain", key, NULL, (uint32_t)(timeout_s * 1000.0), &status,
                                     &body, err, sizeof err);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier cache drain: %s\n", err);
        return 1;
    }
    printf("%s\n", body);
    free(body);
    if (status == 200) return 0;
    fprintf(stderr, "kvtier cache drain: HTTP %d%s\n", status,
            status == 409 ? " (the server has no SSD tier)" : status == 401 ? " (wrong or missing --api-key)"
            : status == 503 ? " (not durable yet: see pending/failed/reason)" : "");
    return 1;
}

int cmd_cache(int argc, char **argv) {
    kvt_args a;
    kvt_args_init(&a, argc, argv, "cache", usage);
    double max_gb = -1, timeout_s = 120;
    bool dry = false, pinned = false;
    const char *host = "127.0.0.1", *key = getenv("KVTIER_API_KEY");
    uint32_t port = 8080;
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, NULL, "--max-gb")) max_gb = kvt_args_f64(&a, 0, 1e9);
        else if (kvt_args_flag(&a, NULL, "--dry-run")) dry = true;
        else if (kvt_args_flag(&a, NULL, "--pinned")) pinned = true;
        else if (kvt_args_is(&a, NULL, "--host")) host = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--port")) port = kvt_args_u32(&a, 1, 65535);
        else if (kvt_args_is(&a, NULL, "--api-key")) key = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--timeout")) timeout_s = kvt_args_f64(&a, 1, 3600);
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    if (a.n_positional == 1 && !strcmp(a.positional[0], "drain"))
        return do_drain(host, (uint16_t)port, key && key[0] ? key : NULL, timeout_s);
    if (a.n_positional != 2) {
        fprintf(stderr, "kvtier cache: expected a subcommand and a path (see kvtier cache --help)\n");
        return 2;
    }
    const char *sub = a.positional[0], *path = a.positional[1];
    if (!strcmp(sub, "ls")) return do_ls(path, pinned);
    if (!strcmp(sub, "inspect")) return do_inspect(path);
    if (!strcmp(sub, "verify")) return do_verify(path);
    if (!strcmp(sub, "prune")) {
        if (max_gb < 0) {
            fprintf(stderr, "kvtier cache prune: --max-gb is required\n");
            return 2;
        }
        return do_prune(path, max_gb, dry);
    }
    fprintf(stderr, "kvtier cache: unknown subcommand '%s' (see kvtier cache --help)\n", sub);
    return 2;
}
