/* Sandbox cgroups: v1 (memory, pids, cpu, freezer hierarchies) or v2, under
 * the daemon's own cgroup. Library code: returns -errno, never logs. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SBX_CG_MAX 4

typedef struct sbx_limits {
  uint64_t memory_mb; /* 0 = none */
  double cpus;        /* 0 = none */
  uint64_t pids;      /* 0 = none */
  uint64_t disk_mb;   /* enforced by the sandbox's filesystem, not cgroups */
} sbx_limits;

typedef struct sbx_cgroup {
  int n;
  char *dirs[SBX_CG_MAX]; /* one directory per hierarchy (v2: one) */
  unsigned joined;        /* hierarchies where dirs[i] is the parent's own:
                             joined by its processes, never killed or removed */
} sbx_cgroup;

/* One file to write to apply a limit: in hierarchy `ctrl` (v1) or the
 * unified one (v2). Pure: the mapping is unit-tested on both versions. */
typedef struct sbx_cg_setting {
  const char *ctrl;
  const char *file;
  char value[64];
  bool optional; /* missing file is fine (e.g. memsw without swap accounting) */
} sbx_cg_setting;
int sbx_cg_limit_settings(bool v2, const sbx_limits *l, sbx_cg_setting *out, int max);

/* Detects the cgroup layout and makes the daemon's own sbx subtree.
 * Returns 0, or -errno when cgroups cannot be used (rootless, read-only). */
int sbx_cg_init(void);
/* How many tasks all sandboxes together may have (the pids limit of their
 * parent cgroup): three quarters of the host's (kernel.pid_max or
 * threads-max, the smaller). Tasks are counted host-wide: sandboxes that
 * each stay within their own limit could otherwise use them all up. */
uint64_t sbx_host_tasks_cap(void);
bool sbx_cg_available(void);
bool sbx_cg_is_v2(void);
const char *sbx_cg_describe(void); /* for doctor */

/* Reaps the children that empty kept memory cgroups (see cgroup.c) and
 * keeps what they emptied; the daemon calls it once a second, so none of
 * them stays a zombie. */
void sbx_cg_reap(void);

/* Creates `parent`/`name` (parent NULL = the daemon's subtree). Without
 * `memory` it joins no memory cgroup of its own (its memory counts in the
 * parent's): commands' cgroups, which only need to be killed as a tree. */
int sbx_cg_create(const sbx_cgroup *parent, const char *name, bool memory, sbx_cgroup *out);
int sbx_cg_apply(const sbx_cgroup *cg, const sbx_limits *l);
/* The same on a cgroup that has limits already, in an order the kernel
 * takes whether they go up or down (every limit of l set). */
int sbx_cg_reapply(const sbx_cgroup *cg, const sbx_limits *l);
/* Opens cgroup.procs of every hierarchy (O_WRONLY|O_CLOEXEC): writing "0"
 * to each moves the writer in. Returns the count, fds[] filled. */
int sbx_cg_open_procs(const sbx_cgroup *cg, int fds[SBX_CG_MAX]);
int sbx_cg_add_pid(const sbx_cgroup *cg, pid_t pid);
/* Kills every process in the cgroup and below (v2 cgroup.kill; v1 freeze,
 * SIGKILL each task, thaw). */
int sbx_cg_kill(const sbx_cgroup *cg);
/* Kills every process in the cgroup and below but one; how many there
 * were besides it. */
int sbx_cg_kill_except(const sbx_cgroup *cg, pid_t keep);
bool sbx_cg_populated(const sbx_cgroup *cg);
/* fn for every process in the cgroup and below; how many. */
int sbx_cg_each_pid(const sbx_cgroup *cg, void (*fn)(pid_t pid, void *ud), void *ud);
uint64_t sbx_cg_oom_kills(const sbx_cgroup *cg);
/* Memory charged to it (bytes) and how much of that is page cache. */
int sbx_cg_memory(const sbx_cgroup *cg, uint64_t *usage, uint64_t *cache, uint64_t *shmem);
/* Removes the directories (children first); keeps them when busy. */
/* Renames the cgroup's own directories (not those it joined) to name,
 * beside where they are; -errno (cgroup v2 refuses) leaves the rest. */
int sbx_cg_rename(sbx_cgroup *c, const char *name);
int sbx_cg_remove(sbx_cgroup *cg);
void sbx_cg_free(sbx_cgroup *cg);
/* Removes the daemon's own subtree at shutdown. */
void sbx_cg_shutdown(void);
