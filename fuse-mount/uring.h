/* FUSE over io_uring (kernel 6.14+, with the fuse module's enable_uring on):
 * after INIT the kernel hands each request to a ring of the CPU its caller
 * runs on, and takes the reply from the same ring entry. The view keeps a
 * several threads per CPU, each pinned there with its own ring and one entry:
 * a request wakes a thread on the caller's own CPU, and the reply wakes the
 * caller there, where /dev/fuse wakes whichever server thread sleeps on it,
 * most often on the other CPU (a halted vCPU to wake, twice a request).
 * After a reply, one thread of the CPU looks for the next request a while
 * before it sleeps, as the /dev/fuse reader does (passthrough.c).
 * libfuse 3.14 predates it: requests are handed to fuse_session_process_buf
 * as if read from /dev/fuse, and the session's writev (passthrough.c) gives
 * replies to sbx_uring_reply first. FORGETs, interrupts and notifications
 * still go through /dev/fuse, as the kernel wants. */
#pragma once
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

/* FUSE_OVER_IO_URING, bit 41 of INIT's flags: bit 9 of flags2. */
#define SBX_FUSE_OVER_IO_URING_FLAG2 (1u << (41 - 32))

/* Whether the kernel allows FUSE over io_uring for new sessions (the fuse
 * module's enable_uring); as root, turn_on sets it first. */
bool sbx_uring_enabled(bool turn_on);
/* Sets enable_uring back off if sbx_uring_enabled turned it on: once the
 * view's INIT is answered its session needs it no more, so the host has it
 * on for as long as a view takes to mount (a view mounting meanwhile may
 * find it off at its INIT, and reads /dev/fuse). */
void sbx_uring_restore(void);
/* While a view mounts (from sbx_uring_enabled to its loop, whose own
 * handlers end it cleanly): SIGINT, SIGTERM and SIGHUP set enable_uring
 * back off before they end the process (on), or are left to the loop
 * (off). */
void sbx_uring_guard(bool on);
/* Called with the INIT reply about to go out, on a loop thread, when the
 * kernel's INIT offered io_uring: makes the rings and their threads (which
 * wait for sbx_uring_start). False when it could not: the reply must then
 * not ask for io_uring (the kernel would hold every request until all
 * queues are registered). */
bool sbx_uring_prepare(struct fuse_session *se, int fuse_fd, uint32_t max_write);
/* The INIT reply (asking for io_uring) went out: the threads register. */
void sbx_uring_start(void);
/* A reply on its way out: taken into this thread's ring entry if it answers
 * the request the thread is handling from its ring (then true). */
bool sbx_uring_reply(const struct iovec *iov, int count);
/* The session is ending (its loop returned): waits for the requests being
 * handled on the rings (10 s at most), and answers later ones ENOTCONN
 * without libfuse, so that the session and what its handlers use can go.
 * False when a handler is still running: the session must then be left
 * alone (the process ends without freeing it). The ring threads end with
 * the process. */
bool sbx_uring_stop(void);
