/* What a sandbox reads of its own size, as lxcfs gives containers:
 * /proc/meminfo shows its memory limit and use, /sys/devices/system/cpu/online
 * its cpus, and its commands run on that many cpus, so nproc, free, top,
 * make -j$(nproc) and runtimes that size their heaps or pools from these
 * see the sandbox and not the host. */
#pragma once
#include "sandbox.h"

#include <sched.h>

/* Files mounted over the sandbox's own, kept in its state dir
 * (sandboxes/ID/meminfo, cpu-online) and rewritten in place. */
typedef struct sbx_procfiles {
  int meminfo, online;          /* as root: detached read-only mounts of them for the init; else -1 */
  bool has_meminfo, has_online; /* meminfo when a memory limit is enforced; online when cpus < the host's */
} sbx_procfiles;

/* Writes the files for a starting sandbox (it keeps a writable fd of
 * meminfo). -errno. */
int sbx_procfiles_open(sbx_sandbox *sb, sbx_procfiles *out);
/* /proc/meminfo anew from the sandbox's cgroup (at each command's start). */
void sbx_procfiles_refresh(sbx_sandbox *sb);
/* The files anew after its limits changed (a create that takes a sandbox
 * made ahead with other limits): meminfo, and cpu-online when it has one.
 * -errno. */
int sbx_procfiles_resize(sbx_sandbox *sb);
void sbx_procfiles_close(sbx_sandbox *sb);
/* Whether a cpus limit runs commands on fewer cpus than the host's (the
 * sandbox then has a cpu-online file). */
bool sbx_procfiles_pins(double cpus);
/* The cpus its commands run on; false when all of the host's. */
bool sbx_procfiles_cpuset(const sbx_sandbox *sb, cpu_set_t *set);
