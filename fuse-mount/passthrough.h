/* The view's own /dev/fuse I/O: requests are read by one leading thread
 * that looks for the next one a while before it sleeps (see lead_read), and
 * FUSE passthrough (kernel 6.9+) for a libfuse that predates it: a regular
 * file's reads, writes and mmap go from the kernel straight to the file the
 * server opened, with no round trip. libfuse 3.14 knows neither the INIT flag
 * nor the open reply's backing id, so the session's replies pass through
 * sbx_fuse_io_attach's writev, which amends them on their way out. */
#pragma once
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Takes over the session's I/O on its /dev/fuse fd (after mounting, before
 * the loop); with passthrough, the INIT reply asks for it when the kernel
 * offers it. Returns 0 or -errno. */
int sbx_fuse_io_attach(struct fuse_session *se, bool passthrough, bool uring);
/* Looking for the next request a while before sleeping (see passthrough.c):
 * one thread of a looker at a time, for as long as the looker's adaptive
 * window says. */
typedef struct {
  atomic_bool looking;
  _Atomic uint32_t window; /* ns */
  atomic_uint shut_reads;  /* requests while the window was shut, since the last try */
  atomic_uint probe_every; /* a shut window is tried after this many: doubles while tries miss */
} sbx_looker;
#define SBX_LOOKER_INIT {.probe_every = 8}
/* How long this thread looks (ns), or 0: it does not (another does, or the
 * window is shut); then nothing else to call. Otherwise sbx_look, then
 * sbx_look_end with what it gave. */
uint32_t sbx_look_begin(sbx_looker *l, bool *probe);
/* Calls poll (1: found, 0: nothing yet, -1: an error) until it finds, fails
 * or w ns passed, yielding the CPU between calls; returns its last answer. */
int sbx_look(uint32_t w, int (*poll)(void *), void *ud);
void sbx_look_end(sbx_looker *l, uint32_t w, bool probe, int found);
/* Marks a name's cached entry expired, without dropping it (FUSE_EXPIRE_ONLY,
 * kernel 6.2+; libfuse 3.14 cannot say it): the next use of the name asks
 * the server again, and a process whose current directory is below it keeps
 * it (an invalidation cuts such a directory off: getcwd fails). 0 or -errno. */
int sbx_fuse_notify_expire_entry(fuse_ino_t parent, const char *name);
/* Whether the kernel offered passthrough and this server asked for it (known
 * once INIT was answered). */
bool sbx_passthrough_on(void);
/* A backing id for fd (a regular file open for I/O, with the caller's
 * credentials: the kernel opens it anew as them for each open file), or
 * -errno (EPERM without CAP_SYS_ADMIN). */
int sbx_passthrough_open(int fd);
void sbx_passthrough_close(int backing_id);
/* fuse_reply_open / fuse_reply_create with the file in passthrough mode. */
int sbx_passthrough_reply_open(fuse_req_t req, const struct fuse_file_info *fi, int backing_id);
int sbx_passthrough_reply_create(fuse_req_t req, const struct fuse_entry_param *e, const struct fuse_file_info *fi,
                                 int backing_id);
