/*
 * ssd_io.h — the SSD tier's file-mutation layer. Every operation of the SSD tier that changes the
 * disk (create a temporary, write, truncate, fsync, rename, fsync a directory, unlink, mkdir) goes
 * through one kvt_ssd_io handle, so that one place holds:
 *   - normal mode: the real syscalls;
 *   - fault injection (kvt_ssd_fault, scheduled per-mille write faults, KVT_SSD_FAULT env);
 *   - a write throttle (KVT_IO_THROTTLE_MBPS: payload bytes per second, for benchmarks that model
 *     a slow disk; 0 or unset = off);
 *   - recording mode (tests): the real syscalls still run, and every mutation is also appended to a
 *     trace (with a copy of the written bytes). From a trace, kvt_ssd_io_crash_* enumerate the
 *     crash states POSIX allows at any point of it and materialize each one into a directory: data
 *     written after a file's last fsync may be lost, torn or garbage, and directory entries
 *     created, renamed or removed after their directory's last fsync may be lost (any subset while
 *     few are pending; single drops and ordered prefixes otherwise). The model follows SQLite's
 *     crash-simulation VFS and the ALICE / CrashMonkey studies.
 * Reads are not traced (they do not change the disk); kvt_ssd_io_read_fault reports an injected
 * read error.
 *
 * Ownership / threading: a handle is created with kvt_ssd_io_create and freed with
 * kvt_ssd_io_free after every tier that uses it; a trace likewise (kvt_ssd_io_trace_create/_free),
 * and it must outlive the handle that records into it. All functions are thread-safe.
 * kvt_ssd_io_plain() is a process-wide handle (no faults, no recording; throttle from the env)
 * for the few writes made without a tier (the model-identity memo); never free it.
 */
#ifndef KVT_SSD_IO_H
#define KVT_SSD_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ssd_cache.h"

typedef struct kvt_ssd_io kvt_ssd_io;
typedef struct kvt_ssd_io_trace kvt_ssd_io_trace;

/* rec: NULL for normal mode, else every mutation is also recorded into it. Fault mode starts from
 * the KVT_SSD_FAULT env (enospc | short-write | eio-read | eio-write | fsync-dir |
 * dir-check). */
kvt_ssd_io *kvt_ssd_io_create(kvt_ssd_io_trace *rec);
void kvt_ssd_io_free(kvt_ssd_io *io);
kvt_ssd_io *kvt_ssd_io_plain(void);

void kvt_ssd_io_set_fault(kvt_ssd_io *io, kvt_ssd_fault f);
void kvt_ssd_io_set_fault_rate(kvt_ssd_io *io, uint64_t seed, uint32_t permille);
/* Test knob for the crash tests' negative control: fsync and directory fsync report success but are
 * not recorded as durability points (a store that lies about fsync). */
void kvt_ssd_io_set_lying_fsync(kvt_ssd_io *io, bool lie);
bool kvt_ssd_io_read_fault(kvt_ssd_io *io); /* true (errno = EIO) when reads must fail */

/* Every operation on a path has an _at twin that works relative to an open directory fd (the SSD
 * tier's compat directory, held from startup: a path swapped for a symlink cannot redirect it). dir
 * is that directory's path, used only to name the operation in a trace; name is one component.
 * The path forms are the _at forms with AT_FDCWD. */
/* Creates path exclusively (O_CREAT|O_EXCL|O_NOFOLLOW: never a planted file or symlink), mode 0600
 * regardless of umask, open for writing. Returns the fd or -1 (errno). */
int kvt_ssd_io_create_excl(kvt_ssd_io *io, const char *path);
int kvt_ssd_io_create_excl_at(kvt_ssd_io *io, int dfd, const char *dir, const char *name);
/* Writes all len bytes at off (retries short writes). payload: subject to the short-write fault and
 * the throttle. False with errno on failure. */
bool kvt_ssd_io_pwrite(kvt_ssd_io *io, int fd, const void *p, uint64_t len, uint64_t off, bool payload);
bool kvt_ssd_io_truncate(kvt_ssd_io *io, int fd, uint64_t size);
bool kvt_ssd_io_fsync(kvt_ssd_io *io, int fd);
bool kvt_ssd_io_close(kvt_ssd_io *io, int fd); /* close (false with errno if close reports an error) */
bool kvt_ssd_io_rename(kvt_ssd_io *io, const char *from, const char *to);
bool kvt_ssd_io_rename_at(kvt_ssd_io *io, int dfd, const char *dir, const char *from, const char *to);
bool kvt_ssd_io_fsync_dir(kvt_ssd_io *io, const char *dir); /* fails under KVT_SSD_FAULT_FSYNC_DIR */
bool kvt_ssd_io_fsync_dirfd(kvt_ssd_io *io, int dfd, const char *dir); /* likewise */
bool kvt_ssd_io_unlink(kvt_ssd_io *io, const char *path);  /* never follows a symlink */
bool kvt_ssd_io_unlink_at(kvt_ssd_io *io, int dfd, const char *dir, const char *name);
/* True (errno = EIO) when the writer's check that the directory path still names the held
 * directory must fail (KVT_SSD_FAULT_DIR_CHECK). */
bool kvt_ssd_io_dir_check_fault(kvt_ssd_io *io);
/* mkdir 0700 (chmod after, regardless of umask). 0 if created, 1 if it already existed, -1 error. */
int kvt_ssd_io_mkdir(kvt_ssd_io *io, const char *path);

/* ---- recording mode and crash states ---- */
kvt_ssd_io_trace *kvt_ssd_io_trace_create(void);
void kvt_ssd_io_trace_free(kvt_ssd_io_trace *t);
/* Number of recorded operations so far: a crash "at k" keeps operations [0, k). */
uint32_t kvt_ssd_io_trace_len(kvt_ssd_io_trace *t);
/* Number of distinct crash states for a crash at k (>= 1; state 0 = every pending operation
 * reached the disk, state 1 = none did). */
uint32_t kvt_ssd_io_crash_states(kvt_ssd_io_trace *t, uint32_t k);
/* Builds crash state `state` of a crash at k under dst: every recorded path under src_root is
 * re-rooted at dst (which must exist and be empty); others are ignored. Files get mode 0600,
 * directories 0700. Returns false (errno) on a local I/O error. */
bool kvt_ssd_io_crash_materialize(kvt_ssd_io_trace *t, uint32_t k, uint32_t state, const char *src_root,
                                  const char *dst);

#endif
