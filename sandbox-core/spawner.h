/* The spawner: a small process, forked when the daemon starts (before the
 * sandboxes' state fills its heap), that forks the sandboxes' inits, the
 * supervisors of their commands and the children that empty a spare
 * memory cgroup on the daemon's behalf. They
 * are still the daemon's own children (CLONE_PARENT): it waits for them,
 * signals them and sees them die as before.
 *
 * Why: a fork of the daemon copies the page tables of all its memory and
 * leaves every page of it write-protected, so each page the daemon writes
 * next takes a copy-on-write fault (a TLB shootdown each, costly on a
 * VM). With a thousand sandboxes' state on the heap, the few dozen
 * allocations of a create landed on as many pages and took 1-2 ms
 * (BENCHMARKS.md, "1,000 idle sandboxes"). The spawner's heap stays what
 * it was at the start.
 *
 * Each child tells the daemon it exists itself, on the spawner's socket
 * (its pid comes with the message, SO_PASSCRED): a spawner killed at any
 * moment leaves no child the daemon does not know, and one that is gone
 * with no child told means there is none, so the daemon forks that one
 * for itself. A new spawner replaces one that dies: nothing but the
 * speed depends on it. The daemon never waits for a spawner to die (one
 * may be frozen), and a child that tells after its request was given up
 * (after 5 + 2 s) is killed. */
#pragma once
#include "rootfs.h"
#include "sandbox.h"

#include <uv.h>

#include <sched.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/types.h>

/* Forks the spawner, watched on loop (a new one replaces one that dies);
 * false (and the daemon forks for itself) if it cannot. Call once, early. */
bool sbx_spawner_start(uv_loop_t *loop);
void sbx_spawner_stop(void);
/* Reaps what the spawner's failures left (a spawner given up, a child
 * killed after its request was); often, from the loop. */
void sbx_spawner_reap(void);

/* Clones a sandbox's init into new namespaces (flags), running
 * sbx_rootfs_init_main(a): a->sock is init's end of its socket, other
 * the daemon's end, which the child must not keep (the caller closes
 * both as before). As root, euid is the effective uid and gid the
 * namespace is created with, so that its per-user kernel counts are the
 * sandbox's (see start in sandbox.c); rootless callers pass (uid_t)-1.
 * The pid, with a pidfd in *pidfd; -1 with errno. */
pid_t sbx_spawn_init(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd);

/* What the supervisor of a command needs, all of it by value or by
 * descriptor (the spawner runs it from a copy). */
typedef struct sbx_command {
  const sbx_spawn *sp;
  int init_pidfd; /* the sandbox's init: whose namespaces it joins */
  const int *cgfds; /* cgroup.procs files to join */
  int ncg;
  rlim_t nproc; /* RLIM_INFINITY, or the pids limit where no cgroup holds it */
  uint64_t capmask;
  int cap_last;
  bool pin; /* run on the sandbox's cpus (procfiles.h), so nproc counts them */
  cpu_set_t cpus;
} sbx_command;
/* The supervisor, in a child of the daemon's (or of the spawner's): joins
 * the sandbox, runs the command, exits with its status. */
_Noreturn void sbx_supervise(const sbx_command *c);
/* Starts the supervisor of c->sp (sbx_supervise) in a child: its pid, a
 * pidfd in *pidfd; -1 with errno. */
pid_t sbx_spawn_command(const sbx_command *c, int *pidfd);

/* A child that writes text to path and exits 0 if the whole of it was
 * written (1 if not): a write that may take long, like memory.force_empty.
 * It holds none of the daemon's descriptors; name is its command name.
 * Its pid, or -1 with errno. */
pid_t sbx_spawn_write(const char *path, const char *text, const char *name);
