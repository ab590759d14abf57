/*
 * file_watch.h — notices that the model file changed after it was loaded, so that nothing computed
 * from weights other than the ones the cache compatibility key names is ever published or served
 * (docs/architecture.md, "The model file while serving").
 *
 * The weights are read through a mapping of the GGUF at run time (decode GEMVs, embedding rows,
 * experts; only the norms and the prefill GEMM copies are private), and MAP_PRIVATE does not
 * protect a mapping from writes to the file: a file rewritten in place (`cp new.gguf model.gguf`,
 * `dd conv=notrunc`, same inode) changes the weights under a running forward pass.
 *
 * The watch holds the file open and records its identity at open: device, inode, size, link
 * count, mtime and ctime. kvt_file_watch_ok compares an fstat of the held descriptor with that
 * record. What an unchanged answer proves: the kernel's in-place write paths (write/pwrite/writev,
 * O_DIRECT, copy_file_range/reflink, the first store through a shared writable mapping to a clean
 * page) update the inode's ctime before the new bytes become visible, and ctime cannot be set by a
 * user (mtime can). So when a check at time t sees the recorded ctime, no change of the
 * file had begun by t, and every read of the weights that finished before the check read the bytes
 * the file held at open. A caller that checks after computing something and before handing it on
 * (the engine: before each tier hand-off and before emitting a token) therefore hands on only
 * results of the original bytes. The window left (the file's change and the check racing) is
 * closed by ordering: a write that begins after the check cannot have affected reads before it
 * (the compute threads' reads precede the check through the pool's barrier, and x86-64 does not
 * reorder a load with a later load, so the check's read of the ctime cannot pass them).
 *
 * What it cannot see (docs/architecture.md lists them): a process that held a shared writable
 * mapping of the file with already-dirty pages since before the open (its later stores to those
 * pages update no timestamp), writes that bypass the inode (the raw block device, another host on
 * a network filesystem whose attributes the client caches), a clock stepped back to exactly the
 * recorded ctime, and a computation racing a truncate or hole punch itself (whether those stamp
 * before dropping the pages is up to the filesystem; a check after they complete sees them).
 * Timestamp granularity is handled at open: a write within the same clock tick as the last change
 * before the open would keep the ctime, so open waits (at most ~1.1 s, only for a file changed
 * within the last second) until the clock has moved past the recorded ctime.
 *
 * Metadata-only changes (chmod, touch, a hard link, a rename over the file, unlinking it) also
 * change the ctime and count as changes: ctime is the one witness a user cannot forge, and it does
 * not say whether the bytes changed. Restarting reloads the file as it is (a new identity, a new
 * compatibility key when the bytes differ).
 *
 * State machine (enforced here): CLEAN -> CHANGED, once, never back.
 *   1. While CLEAN the recorded identity is that of the file at open.
 *   2. The first check that sees a difference (or cannot stat) moves to CHANGED, writes the
 *      description once and logs it once; every later check answers false without a syscall.
 *
 * Ownership / threading: kvt_file_watch owns its descriptor; the path is copied. All functions
 * are thread-safe; kvt_file_watch_ok is lock-free while CLEAN (one fstat) and after CHANGED
 * (one atomic load).
 */
#ifndef KVT_FILE_WATCH_H
#define KVT_FILE_WATCH_H

#include "../util/common.h"

typedef struct kvt_file_watch kvt_file_watch;

/* Opens path read-only (a symlink is followed, as the loader follows it) and records the identity
 * of the regular file it names. Errors: KVT_ERR_IO (cannot open / stat / not a regular file). */
kvt_status kvt_file_watch_open(const char *path, kvt_file_watch **out, char *err, size_t errlen);
void kvt_file_watch_free(kvt_file_watch *w); /* NULL is a no-op */

/* The held descriptor (valid until free): "/proc/self/fd/N" names exactly the watched file. */
int kvt_file_watch_fd(const kvt_file_watch *w);

/* True while the held file is unchanged (see above); NULL w: true. */
bool kvt_file_watch_ok(kvt_file_watch *w);
/* True while the path still names the held file and it is unchanged; a path that names another
 * file now (renamed over, symlink retargeted, deleted) moves to CHANGED. For start-up: call after
 * everything that opened the file by its path (the mapping, the identity hash) so they are known
 * to have read the watched file. */
bool kvt_file_watch_path_ok(kvt_file_watch *w);
/* Whether the watch is CHANGED; if so and what != NULL, the description ("size 123 -> 0, ctime
 * changed", ...) is copied into what. */
bool kvt_file_watch_changed(kvt_file_watch *w, char *what, size_t len);

#endif
