#define _GNU_SOURCE
#include "disk.h"
#include "procfiles.h"

#include <fcntl.h>
#include <sys/mount.h>

/* How many cpus the sandbox may use: its limit rounded up, at most the
 * daemon's own. */
static int cpus_for(double want, cpu_set_t *host) {
  if (sched_getaffinity(0, sizeof *host, host) < 0) return 0;
  int have = CPU_COUNT(host);
  if (want <= 0 || want >= have) return have;
  int n = (int)want;
  if (n < want) n++; /* 1.5 cpus: 2 to run on */
  return n < 1 ? 1 : n;
}

static int cpus_of(const sbx_sandbox *sb, cpu_set_t *host) { return cpus_for(sb->opts.limits.cpus, host); }

bool sbx_procfiles_pins(double cpus) {
  cpu_set_t host;
  int n = cpus_for(cpus, &host);
  return n > 0 && n < CPU_COUNT(&host);
}

bool sbx_procfiles_cpuset(const sbx_sandbox *sb, cpu_set_t *set) {
  cpu_set_t host;
  int n = cpus_of(sb, &host), have = CPU_COUNT(&host);
  if (n <= 0 || n >= have) return false;
  /* sandboxes are spread over the cpus by their slot */
  unsigned h = 0;
  for (const char *p = sb->id; *p; p++) h = h * 31 + (unsigned char)*p;
  int start = (int)((sb->slot >= 0 ? (unsigned)sb->slot : h) * (unsigned)n % (unsigned)have);
  CPU_ZERO(set);
  for (int cpu = 0, idx = 0, taken = 0; cpu < CPU_SETSIZE && taken < n; cpu++) {
    if (!CPU_ISSET(cpu, &host)) continue;
    if ((idx - start + have) % have < n) CPU_SET(cpu, set), taken++;
    idx++;
  }
  return true;
}

static int file_at(const sbx_sandbox *sb, const char *name, int flags) {
  char dir[1200], path[1300];
  snprintf(dir, sizeof dir, "%s/sandboxes/%s", sbx_engine_cfg()->state_dir, sb->id);
  int r = sbx_mkdir_p(dir, 0700);
  if (r < 0) return r;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0644);
  return fd < 0 ? -errno : fd;
}

static int rewrite(int fd, const char *text) {
  size_t len = strlen(text);
  if (pwrite(fd, text, len, 0) != (ssize_t)len) return -errno;
  return ftruncate(fd, len) < 0 ? -errno : 0;
}

/* cpu/online for n cpus: "0", "0-1"... */
static int rewrite_online(int fd, int n) {
  char text[32];
  snprintf(text, sizeof text, n <= 1 ? "0\n" : "0-%d\n", n - 1);
  return rewrite(fd, text);
}

void sbx_procfiles_refresh(sbx_sandbox *sb) {
  if (sb->meminfo_fd < 0) return;
  uint64_t host = sbx_host_ram();
  uint64_t total = (uint64_t)sb->opts.limits.memory_mb << 20, used = 0, cache = 0, shmem = 0;
  if (total > host) total = host;
  sbx_cg_memory(&sb->cg, &used, &cache, &shmem);
  if (used > total) used = total;
  if (cache > used) cache = used;
  if (shmem > cache) shmem = cache;
  /* files in /dev/shm and /tmp-like tmpfs are cache that cannot be given
   * back (no swap): not available, as the host's own meminfo says */
  uint64_t k = 1024, free_ = total - used, avail = free_ + cache - shmem;
  char text[1024];
  snprintf(text, sizeof text,
           "MemTotal:       %8llu kB\nMemFree:        %8llu kB\nMemAvailable:   %8llu kB\n"
           "Buffers:        %8llu kB\nCached:         %8llu kB\nSwapCached:     %8llu kB\n"
           "Active:         %8llu kB\nInactive:       %8llu kB\nSwapTotal:      %8llu kB\n"
           "SwapFree:       %8llu kB\nShmem:          %8llu kB\nSReclaimable:   %8llu kB\n",
           (unsigned long long)(total / k), (unsigned long long)(free_ / k), (unsigned long long)(avail / k), 0ull,
           (unsigned long long)(cache / k), 0ull, (unsigned long long)((used - cache) / k),
           (unsigned long long)(cache / k), 0ull, 0ull, (unsigned long long)(shmem / k), 0ull);
  rewrite(sb->meminfo_fd, text);
}

/* What the init mounts: as root, a detached read-only mount of the file
 * (the init cannot reach the state dir, and a file opened here is of
 * another mount namespace); rootless, the init opens the path itself. */
static int handout(const sbx_sandbox *sb, const char *name) {
  char path[1300];
  snprintf(path, sizeof path, "%s/sandboxes/%s/%s", sbx_engine_cfg()->state_dir, sb->id, name);
  if (sbx_engine_cfg()->rootless) return -EAGAIN;
  int fd = open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (fd < 0) return -errno;
  struct mount_attr a = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC};
  if (mount_setattr(fd, "", AT_EMPTY_PATH, &a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

int sbx_procfiles_open(sbx_sandbox *sb, sbx_procfiles *out) {
  *out = (sbx_procfiles){-1, -1, false, false};
  sbx_procfiles_close(sb);
  int r;
  if (sb->cg.n && sb->opts.limits.memory_mb > 0) {
    if ((sb->meminfo_fd = file_at(sb, SBX_FILE_MEMINFO, O_RDWR | O_CREAT)) < 0) {
      r = sb->meminfo_fd;
      sb->meminfo_fd = -1;
      return r;
    }
    sbx_procfiles_refresh(sb);
    out->meminfo = handout(sb, SBX_FILE_MEMINFO);
    if (out->meminfo < 0 && out->meminfo != -EAGAIN) return out->meminfo;
    out->has_meminfo = true;
  }
  cpu_set_t set;
  if (sbx_procfiles_cpuset(sb, &set)) {
    int fd = file_at(sb, SBX_FILE_CPU_ONLINE, O_RDWR | O_CREAT);
    if (fd < 0) return fd;
    r = rewrite_online(fd, CPU_COUNT(&set));
    close(fd);
    if (r < 0) return r;
    out->online = handout(sb, SBX_FILE_CPU_ONLINE);
    if (out->online < 0 && out->online != -EAGAIN) {
      if (out->meminfo >= 0) close(out->meminfo);
      return out->online;
    }
    out->has_online = true;
  }
  if (out->meminfo < 0) out->meminfo = -1;
  if (out->online < 0) out->online = -1;
  return 0;
}

int sbx_procfiles_resize(sbx_sandbox *sb) {
  sbx_procfiles_refresh(sb);
  _cleanup_close_ int fd = file_at(sb, SBX_FILE_CPU_ONLINE, O_RDWR);
  if (fd < 0) return fd == -ENOENT ? 0 : fd;
  cpu_set_t host;
  return rewrite_online(fd, cpus_of(sb, &host));
}

void sbx_procfiles_close(sbx_sandbox *sb) {
  if (sb->meminfo_fd >= 0) close(sb->meminfo_fd);
  sb->meminfo_fd = -1;
}
