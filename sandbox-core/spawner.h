/* The spawner: a small process, forked when the daemon starts (before the
 * sandboxes' state fills its heap), that forks the sandboxes' inits and the
 * children that empty a spare memory cgroup on the daemon's behalf. They
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
 * When the spawner is gone (killed), the daemon forks for itself that once
 * and starts a new one: nothing but the speed depends on it. */
#pragma once
#include "rootfs.h"

#include <stdbool.h>
#include <sys/types.h>

/* Forks the spawner; false (and the daemon forks for itself) if it
 * cannot. Call once, early. */
bool sbx_spawner_start(void);
void sbx_spawner_stop(void);

/* Clones a sandbox's init into new namespaces (flags), running
 * sbx_rootfs_init_main(a) with init_sock (the init's end of its socket,
 * which the caller still closes). As root, euid is the effective uid and
 * gid the namespace is created with (its per-user kernel counts are the
 * sandbox's, see clone_init in sandbox.c); rootless callers pass
 * (uid_t)-1. The pid, with a pidfd in *pidfd; -1 with errno. */
pid_t sbx_spawn_init(const sbx_init_args *a, int init_sock, unsigned long flags, uid_t euid, int *pidfd);

/* A child that writes text to path and exits 0 if the whole of it was
 * written (1 if not): a write that may take long, like memory.force_empty.
 * It holds none of the daemon's descriptors. Its pid, or -1 with errno. */
pid_t sbx_spawn_write(const char *path, const char *text, const char *name);
