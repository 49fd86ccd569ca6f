#define _GNU_SOURCE
#include "cgroup.h"
#include "spawner.h"
#include "util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <linux/magic.h>

static int for_each_pid(const char *dir, int depth, void (*fn)(pid_t, void *), void *ud);
static void kill_pid(pid_t pid, void *ud);
static int rm_tree(const char *dir, int depth);

static const char *const v1_ctrls[SBX_CG_MAX] = {"memory", "pids", "cpu", "freezer"};

#define SPARE_MAX 8
/* What an emptied memory cgroup may still hold to be kept (kernel objects
 * in use elsewhere that force_empty cannot reclaim). */
#define SPARE_LEFT_MAX (1024 * 1024)

static struct {
  bool ready, v2;
  int n;
  const char *ctrl[SBX_CG_MAX];
  char *base[SBX_CG_MAX]; /* the daemon's sbx subtree per hierarchy */
  char desc[256];
  /* Memory cgroups of sandboxes that are gone, emptied and kept for the
   * next ones (v1, where a cgroup can be renamed). Removing a memory cgroup
   * makes the kernel walk the LRU lists of every superblock on the host
   * (memcg_reparent_list_lrus), a dozen per sandbox: with a thousand
   * sandboxes alive that walk, and the mounts waiting for its lock, made
   * each create + destroy 1.7-2x slower than with none (bench.py many).
   * A spare with a pid is still being emptied by that child. */
  struct {
    char *dir;
    pid_t pid;
  } spare[SPARE_MAX];
  int nspare;
  unsigned spare_seq;
  char swappiness[16]; /* what a spare goes back to */
} cg;

int sbx_cg_limit_settings(bool v2, const sbx_limits *l, sbx_cg_setting *out, int max) {
  int n = 0;
#define ADD(c, f, opt, ...)                                                    \
  do {                                                                         \
    if (n >= max) return -ENOSPC;                                              \
    out[n].ctrl = (c);                                                         \
    out[n].file = (f);                                                         \
    out[n].optional = (opt);                                                   \
    snprintf(out[n].value, sizeof out[n].value, __VA_ARGS__);                  \
    n++;                                                                       \
  } while (0)
  unsigned long long mem = (unsigned long long)l->memory_mb * 1024 * 1024;
  if (v2) {
    if (l->memory_mb) {
      ADD("memory", "memory.max", false, "%llu", mem);
      ADD("memory", "memory.swap.max", true, "0");
    }
    if (l->pids) ADD("pids", "pids.max", false, "%llu", (unsigned long long)l->pids);
    if (l->cpus > 0) ADD("cpu", "cpu.max", false, "%llu 100000", (unsigned long long)(l->cpus * 100000));
  } else {
    if (l->memory_mb) {
      ADD("memory", "memory.limit_in_bytes", false, "%llu", mem);
      ADD("memory", "memory.memsw.limit_in_bytes", true, "%llu", mem);
      ADD("memory", "memory.swappiness", true, "0");
    }
    if (l->pids) ADD("pids", "pids.max", false, "%llu", (unsigned long long)l->pids);
    if (l->cpus > 0) {
      ADD("cpu", "cpu.cfs_period_us", false, "100000");
      ADD("cpu", "cpu.cfs_quota_us", false, "%llu", (unsigned long long)(l->cpus * 100000));
    }
  }
#undef ADD
  return n;
}

/* The daemon's own cgroup path in a hierarchy, from /proc/self/cgroup. */
static int own_path(const char *ctrl, char *out, size_t len) {
  _cleanup_fclose_ FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f) return -errno;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    char *nl = strchr(c2 + 1, '\n');
    if (nl) *nl = 0;
    const char *list = c1 + 1;
    bool match = false;
    if (!ctrl) match = *list == 0 && line[0] == '0';
    else {
      char tmp[256];
      snprintf(tmp, sizeof tmp, "%s", list);
      for (char *s, *t = strtok_r(tmp, ",", &s); t; t = strtok_r(NULL, ",", &s))
        if (!strcmp(t, ctrl)) match = true;
    }
    if (match) {
      snprintf(out, len, "%s", c2 + 1);
      return 0;
    }
  }
  return -ENOENT;
}

static bool is_cgroupfs(const char *path, bool v2) {
  struct statfs s;
  if (statfs(path, &s) < 0) return false;
  return v2 ? s.f_type == CGROUP2_SUPER_MAGIC : s.f_type == CGROUP_SUPER_MAGIC;
}

/* Removes what daemons that died without cleaning up left beside us: the
 * sbx-PID (and, on v2, sbx-daemon-PID) cgroups of pids that are gone. */
static void remove_stale(const char *parent) {
  DIR *d = opendir(parent);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int pid;
    char tail;
    if (e->d_type != DT_DIR || sscanf(e->d_name, "sbx-%d%c", &pid, &tail) != 1 || pid == getpid()) continue;
    if (sbx_daemon_alive(pid)) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
    for_each_pid(path, 0, kill_pid, NULL);
    rm_tree(path, 0);
  }
  closedir(d);
}

int sbx_cg_init(void) {
  if (cg.ready) return 0;
  char own[1024];
  int r;
  if (is_cgroupfs("/sys/fs/cgroup", true)) {
    cg.v2 = true;
    if ((r = own_path(NULL, own, sizeof own)) < 0) return r;
    /* v2 forbids processes in a cgroup that delegates controllers: move the
     * daemon into a leaf beside its sandboxes. */
    char *ownd = sbx_strdup_printf("/sys/fs/cgroup%s", own);
    char *leaf = sbx_strdup_printf("%s/sbx-daemon-%d", ownd, getpid());
    char *procs = sbx_strdup_printf("%s/cgroup.procs", leaf);
    char *stc = sbx_strdup_printf("%s/cgroup.subtree_control", ownd);
    r = 0;
    if (mkdir(leaf, 0755) < 0 && errno != EEXIST) r = -errno;
    if (!r) r = sbx_write_string(procs, "0");
    if (!r) {
      sbx_write_string(stc, "+memory");
      sbx_write_string(stc, "+pids");
      sbx_write_string(stc, "+cpu");
    }
    cg.n = 1;
    cg.ctrl[0] = "unified";
    remove_stale(ownd);
    cg.base[0] = sbx_strdup_printf("%s/sbx-%d", ownd, getpid());
    free(ownd), free(leaf), free(procs), free(stc);
    if (r < 0) return r;
    if (mkdir(cg.base[0], 0755) < 0 && errno != EEXIST) return -errno;
    char *sub = sbx_strdup_printf("%s/cgroup.subtree_control", cg.base[0]);
    sbx_write_string(sub, "+memory +pids +cpu");
    free(sub);
  } else {
    for (int i = 0; i < SBX_CG_MAX; i++) {
      char mnt[256];
      snprintf(mnt, sizeof mnt, "/sys/fs/cgroup/%s", v1_ctrls[i]);
      if (!is_cgroupfs(mnt, false)) continue;
      if (own_path(v1_ctrls[i], own, sizeof own) < 0) continue;
      char *parent = sbx_strdup_printf("%s%s", mnt, strcmp(own, "/") ? own : "");
      remove_stale(parent);
      free(parent);
      char *base = sbx_strdup_printf("%s%s/sbx-%d", mnt, strcmp(own, "/") ? own : "", getpid());
      if (mkdir(base, 0755) < 0 && errno != EEXIST) {
        r = -errno;
        free(base);
        for (int j = 0; j < cg.n; j++) rmdir(cg.base[j]), free(cg.base[j]);
        cg.n = 0;
        return r;
      }
      if (!strcmp(v1_ctrls[i], "memory")) {
        char *h = sbx_strdup_printf("%s/memory.use_hierarchy", base);
        sbx_write_string(h, "1");
        free(h);
        h = sbx_strdup_printf("%s/memory.swappiness", base);
        _cleanup_fclose_ FILE *f = fopen(h, "re");
        if (!f || !fgets(cg.swappiness, sizeof cg.swappiness, f)) cg.swappiness[0] = 0;
        cg.swappiness[strcspn(cg.swappiness, "\n")] = 0;
        free(h);
      }
      cg.ctrl[cg.n] = v1_ctrls[i];
      cg.base[cg.n++] = base;
    }
    if (!cg.n) return -ENOENT;
  }
  cg.ready = true;
  /* all sandboxes together: the host keeps a quarter of its tasks */
  for (int i = 0; i < cg.n; i++)
    if (cg.v2 || !strcmp(cg.ctrl[i], "pids")) {
      char *max = sbx_strdup_printf("%s/pids.max", cg.base[i]), v[32];
      snprintf(v, sizeof v, "%llu", (unsigned long long)sbx_host_tasks_cap());
      sbx_write_string(max, v);
      free(max);
    }
  int o = 0;
  o += snprintf(cg.desc, sizeof cg.desc, "%s:", cg.v2 ? "v2" : "v1");
  for (int i = 0; i < cg.n && o < (int)sizeof cg.desc; i++)
    o += snprintf(cg.desc + o, sizeof cg.desc - o, " %s", cg.ctrl[i]);
  return 0;
}

static int read_u64(const char *dir, const char *file, uint64_t *out);

uint64_t sbx_host_tasks_cap(void) {
  uint64_t pid_max = 0, threads = 0;
  read_u64("/proc/sys/kernel", "pid_max", &pid_max);
  read_u64("/proc/sys/kernel", "threads-max", &threads);
  uint64_t n = pid_max ? pid_max : threads ? threads : 32768; /* (0: not read) */
  if (threads && threads < n) n = threads;
  return n - n / 4;
}

bool sbx_cg_available(void) { return cg.ready; }
bool sbx_cg_is_v2(void) { return cg.v2; }
const char *sbx_cg_describe(void) { return cg.ready ? cg.desc : "unavailable"; }

/* A top-level v1 memory cgroup: what the spares are made of. */
static bool spare_kind(int i, const char *dir) {
  if (cg.v2 || strcmp(cg.ctrl[i], "memory")) return false;
  size_t b = strlen(cg.base[i]);
  return !strncmp(dir, cg.base[i], b) && dir[b] == '/' && !strchr(dir + b + 1, '/');
}

/* Forgets spare k; remove: its cgroup too (not when it was taken). */
static void spare_drop(int k, bool remove) {
  if (remove) rmdir(cg.spare[k].dir);
  free(cg.spare[k].dir);
  cg.spare[k] = cg.spare[--cg.nspare];
}

/* The number a cgroup file dir/file starts with: 0 or -EIO. */
static int read_u64(const char *dir, const char *file, uint64_t *out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  unsigned long long v;
  if (!f || fscanf(f, "%llu", &v) != 1) return -EIO;
  *out = v;
  return 0;
}

/* Spares whose emptying child has ended: kept if it emptied them. Never
 * waits (hang: true, at shutdown, kills and waits). */
static void spare_reap(bool hang) {
  for (int k = cg.nspare - 1; k >= 0; k--) {
    if (!cg.spare[k].pid) continue;
    if (hang) kill(cg.spare[k].pid, SIGKILL);
    int st;
    pid_t r;
    while ((r = waitpid(cg.spare[k].pid, &st, hang ? 0 : WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == 0) continue;
    cg.spare[k].pid = 0;
    uint64_t left;
    if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || read_u64(cg.spare[k].dir, "memory.usage_in_bytes", &left) < 0 ||
        left > SPARE_LEFT_MAX)
      spare_drop(k, true);
  }
}

void sbx_cg_reap(void) {
  if (cg.ready) spare_reap(false);
}

/* An emptied spare renamed to dir, with no limit and nothing of its last
 * sandbox's settings or counters that a reader could take for the new
 * one's (the OOM kill count stays: readers take differences). */
static bool spare_take(const char *dir) {
  spare_reap(false);
  for (int k = cg.nspare - 1; k >= 0; k--) {
    if (cg.spare[k].pid) continue;
    bool ok = rename(cg.spare[k].dir, dir) == 0;
    spare_drop(k, !ok);
    if (!ok) continue;
    const char *const reset[][2] = {{"memory.memsw.limit_in_bytes", "-1"}, {"memory.limit_in_bytes", "-1"},
                                    {"memory.max_usage_in_bytes", "0"},    {"memory.memsw.max_usage_in_bytes", "0"},
                                    {"memory.failcnt", "0"},               {"memory.memsw.failcnt", "0"},
                                    {"memory.swappiness", cg.swappiness}};
    for (size_t j = 0; j < SBX_ARRAY_SIZE(reset); j++) {
      if (!*reset[j][1]) continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dir, reset[j][0]);
      sbx_write_string(path, reset[j][1]);
    }
    return true;
  }
  return false;
}

/* Keeps the memory cgroup of a sandbox that is gone as a spare: renamed at
 * once (its name is never seen again) and emptied by a child of its own,
 * since the kernel drains every CPU's page lists for it, milliseconds the
 * daemon's loop does not wait for. A child, not a thread (see
 * sbx_fork_child), of the spawner's (spawner.h). false: remove it as usual. */
static bool spare_keep(int i, const char *dir) {
  spare_reap(false);
  if (cg.nspare >= SPARE_MAX || for_each_pid(dir, 0, NULL, NULL) != 0) return false;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool children = false;
  for (struct dirent *e; !children && (e = readdir(d));) children = e->d_type == DT_DIR && e->d_name[0] != '.';
  closedir(d);
  if (children) return false;
  char *to = sbx_strdup_printf("%s/spare-%u", cg.base[i], ++cg.spare_seq);
  if (rename(dir, to) < 0) {
    free(to);
    return false;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/memory.force_empty", to);
  pid_t pid = sbx_spawn_write(path, "0", "sbx-cg-empty");
  if (pid < 0) {
    rmdir(to);
    free(to);
    return true;
  }
  cg.spare[cg.nspare].dir = to;
  cg.spare[cg.nspare++].pid = pid;
  return true;
}

int sbx_cg_create(const sbx_cgroup *parent, const char *name, bool memory, sbx_cgroup *out) {
  if (!cg.ready) return -ENOTSUP;
  *out = (sbx_cgroup){.n = cg.n};
  for (int i = 0; i < cg.n; i++) {
    /* a memory cgroup costs the kernel some 170 KiB: only where a limit
     * is; the others' processes join their parent's */
    if (!cg.v2 && !memory && parent && !strcmp(cg.ctrl[i], "memory")) {
      out->dirs[i] = strdup(parent->dirs[i]);
      out->joined |= 1u << i;
      continue;
    }
    out->dirs[i] = sbx_strdup_printf("%s/%s", parent ? parent->dirs[i] : cg.base[i], name);
    if (spare_kind(i, out->dirs[i]) && spare_take(out->dirs[i])) continue;
    if (mkdir(out->dirs[i], 0755) < 0 && errno != EEXIST) {
      int r = -errno;
      sbx_cg_remove(out);
      sbx_cg_free(out);
      return r;
    }
  }
  /* v2: what this cgroup's children get (no memory controller for them) */
  if (cg.v2 && memory) {
    char *sub = sbx_strdup_printf("%s/cgroup.subtree_control", out->dirs[0]);
    sbx_write_string(sub, "+pids +cpu");
    free(sub);
  }
  return 0;
}

static int dir_for(const sbx_cgroup *c, const char *ctrl) {
  if (cg.v2) return c->n && c->dirs[0] ? 0 : -1;
  for (int i = 0; i < c->n; i++)
    if (c->dirs[i] && !(c->joined & (1u << i)) && !strcmp(cg.ctrl[i], ctrl)) return i;
  return -1;
}

/* Every hierarchy it owns holds the same tasks: any one of them tells. */
static const char *any_dir(const sbx_cgroup *c) {
  for (int i = 0; i < c->n; i++)
    if (c->dirs[i] && !(c->joined & (1u << i))) return c->dirs[i];
  return NULL;
}

int sbx_cg_reapply(const sbx_cgroup *c, const sbx_limits *l) {
  int d = cg.v2 ? -1 : dir_for(c, "memory");
  if (d >= 0 && l->memory_mb) { /* v1 refuses a memory limit above the memory+swap one: that goes first */
    char path[4096];
    snprintf(path, sizeof path, "%s/memory.memsw.limit_in_bytes", c->dirs[d]);
    sbx_write_string(path, "-1");
  }
  return sbx_cg_apply(c, l);
}

int sbx_cg_apply(const sbx_cgroup *c, const sbx_limits *l) {
  sbx_cg_setting s[16];
  int n = sbx_cg_limit_settings(cg.v2, l, s, 16);
  if (n < 0) return n;
  for (int i = 0; i < n; i++) {
    int d = dir_for(c, s[i].ctrl);
    if (d < 0) {
      if (s[i].optional) continue;
      return -ENOTSUP;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dirs[d], s[i].file);
    int r = sbx_write_string(path, s[i].value);
    if (r < 0 && !(s[i].optional && (r == -ENOENT || r == -EINVAL || r == -EACCES))) return r;
  }
  return 0;
}

int sbx_cg_open_procs(const sbx_cgroup *c, int fds[SBX_CG_MAX]) {
  int n = 0;
  for (int i = 0; i < c->n; i++) {
    if (!c->dirs[i]) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", c->dirs[i]);
    fds[n] = open(path, O_WRONLY | O_CLOEXEC);
    if (fds[n] < 0) {
      int r = -errno;
      while (n--) close(fds[n]);
      return r;
    }
    n++;
  }
  return n;
}

int sbx_cg_add_pid(const sbx_cgroup *c, pid_t pid) {
  char v[32];
  snprintf(v, sizeof v, "%d", pid);
  for (int i = 0; i < c->n; i++) {
    if (!c->dirs[i]) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", c->dirs[i]);
    int r = sbx_write_string(path, v);
    if (r < 0) return r;
  }
  return 0;
}

/* Calls fn for each pid in dir and every cgroup below it. */
static int for_each_pid(const char *dir, int depth, void (*fn)(pid_t, void *), void *ud) {
  if (depth > 16) return 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  int count = 0;
  if (f) {
    long pid;
    while (fscanf(f, "%ld", &pid) == 1) {
      if (fn) fn((pid_t)pid, ud);
      count++;
    }
  }
  DIR *d = opendir(dir);
  if (!d) return count;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    count += for_each_pid(path, depth + 1, fn, ud);
  }
  closedir(d);
  return count;
}

static void kill_pid(pid_t pid, void *ud) {
  (void)ud;
  kill(pid, SIGKILL);
}

int sbx_cg_kill(const sbx_cgroup *c) {
  if (!any_dir(c)) return -ENOTSUP;
  char path[4096];
  if (cg.v2) {
    snprintf(path, sizeof path, "%s/cgroup.kill", c->dirs[0]);
    if (sbx_write_string(path, "1") == 0) return 0;
    for_each_pid(c->dirs[0], 0, kill_pid, NULL);
    return 0;
  }
  int fz = dir_for(c, "freezer");
  if (fz >= 0) {
    snprintf(path, sizeof path, "%s/freezer.state", c->dirs[fz]);
    sbx_write_string(path, "FROZEN");
  }
  /* Frozen tasks cannot fork, so one pass over every hierarchy catches all. */
  for (int i = 0; i < c->n; i++)
    if (c->dirs[i] && !(c->joined & (1u << i))) for_each_pid(c->dirs[i], 0, kill_pid, NULL);
  if (fz >= 0) sbx_write_string(path, "THAWED");
  return 0;
}

struct kill_other {
  pid_t keep;
  int killed;
};

static void kill_other(pid_t pid, void *ud) {
  struct kill_other *k = ud;
  if (pid != k->keep) kill(pid, SIGKILL), k->killed++;
}

int sbx_cg_kill_except(const sbx_cgroup *c, pid_t keep) {
  const char *d = any_dir(c);
  if (!d) return 0;
  int found = 0;
  /* mostly there is nothing but `keep`; a few passes catch what forks
   * meanwhile, and freezing (slow on v1: milliseconds) is the last resort */
  struct kill_other k = {keep, 0};
  for (int pass = 0; pass < 4; pass++) {
    k.killed = 0;
    for_each_pid(d, 0, kill_other, &k);
    if (!pass) found = k.killed;
    if (!k.killed) return found;
  }
  int fz = cg.v2 ? -1 : dir_for(c, "freezer");
  char path[4096];
  if (fz >= 0) {
    snprintf(path, sizeof path, "%s/freezer.state", c->dirs[fz]);
    sbx_write_string(path, "FROZEN");
  }
  for_each_pid(fz >= 0 ? c->dirs[fz] : d, 0, kill_other, &k);
  if (fz >= 0) sbx_write_string(path, "THAWED");
  return found;
}

int sbx_cg_each_pid(const sbx_cgroup *c, void (*fn)(pid_t pid, void *ud), void *ud) {
  const char *d = any_dir(c);
  return d ? for_each_pid(d, 0, fn, ud) : 0;
}

bool sbx_cg_populated(const sbx_cgroup *c) {
  const char *d = any_dir(c);
  return d && for_each_pid(d, 0, NULL, NULL) > 0;
}

uint64_t sbx_cg_oom_kills(const sbx_cgroup *c) {
  int d = dir_for(c, "memory");
  if (d < 0) return 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", c->dirs[d], cg.v2 ? "memory.events" : "memory.oom_control");
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  if (!f) return 0;
  char key[64];
  unsigned long long v;
  while (fscanf(f, "%63s %llu", key, &v) == 2)
    if (!strcmp(key, "oom_kill")) return v;
  return 0;
}

int sbx_cg_memory(const sbx_cgroup *c, uint64_t *usage, uint64_t *cache, uint64_t *shmem) {
  int d = dir_for(c, "memory");
  if (d < 0) return -ENOENT;
  if (read_u64(c->dirs[d], cg.v2 ? "memory.current" : "memory.usage_in_bytes", usage) < 0) return -EIO;
  *cache = *shmem = 0;
  char path[4096];
  unsigned long long v;
  snprintf(path, sizeof path, "%s/memory.stat", c->dirs[d]);
  _cleanup_fclose_ FILE *st = fopen(path, "re");
  char key[64];
  while (st && fscanf(st, "%63s %llu", key, &v) == 2) {
    if (!strcmp(key, cg.v2 ? "file" : "total_cache")) *cache = v;
    else if (!strcmp(key, cg.v2 ? "shmem" : "total_shmem")) *shmem = v;
  }
  return 0;
}

static int rm_tree(const char *dir, int depth) {
  if (depth > 16) return -ELOOP;
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      rm_tree(path, depth + 1);
    }
    closedir(d);
  }
  return rmdir(dir) < 0 && errno != ENOENT ? -errno : 0;
}

int sbx_cg_rename(sbx_cgroup *c, const char *name) {
  for (int i = 0; i < c->n; i++) {
    if (!c->dirs[i] || (c->joined & (1u << i))) continue;
    const char *slash = strrchr(c->dirs[i], '/');
    char *to = sbx_strdup_printf("%.*s/%s", (int)(slash - c->dirs[i]), c->dirs[i], name);
    if (rename(c->dirs[i], to) < 0) {
      int r = -errno;
      free(to);
      return r;
    }
    free(c->dirs[i]);
    c->dirs[i] = to;
  }
  return 0;
}

int sbx_cg_remove(sbx_cgroup *c) {
  int r = 0;
  for (int i = 0; i < c->n; i++)
    if (c->dirs[i] && !(c->joined & (1u << i))) {
      /* kept for reuse, unless the cgroups are shut down (a bucket
       * server can end after that) */
      if (cg.ready && spare_kind(i, c->dirs[i]) && spare_keep(i, c->dirs[i])) continue;
      int q = rm_tree(c->dirs[i], 0);
      if (q < 0) r = q;
    }
  return r;
}

void sbx_cg_free(sbx_cgroup *c) {
  for (int i = 0; i < c->n; i++) free(c->dirs[i]);
  *c = (sbx_cgroup){0};
}

void sbx_cg_shutdown(void) {
  if (!cg.ready) return;
  spare_reap(true);
  while (cg.nspare) spare_drop(0, true);
  for (int i = 0; i < cg.n; i++) {
    rm_tree(cg.base[i], 0);
    free(cg.base[i]);
  }
  cg.ready = false;
  cg.n = 0;
}
