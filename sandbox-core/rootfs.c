#define _GNU_SOURCE
#include "rootfs.h"
#include "aside.h"
#include "util.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* ---- the /etc allowlist ------------------------------------------------ */

/* What of the host's /etc a sandbox sees. Never shadow, gshadow, ssh host
 * keys, ssl/private or credentials: an idmapped /etc would hand them to
 * sandbox root. */
static const char *const etc_allow[] = {
    "passwd", "group", "nsswitch.conf", "ld.so.conf", "ld.so.conf.d", "ld.so.cache",
    "ssl", "ca-certificates", "ca-certificates.conf", "alternatives", "apt", "dpkg",
    "profile", "profile.d", "bash.bashrc", "environment", "localtime", "timezone",
    "os-release", "debian_version", "issue", "mime.types", "services", "protocols",
    "host.conf", "gai.conf", "inputrc", "skel", "shells", "login.defs", "python3",
    "python3.11", "mailcap", "magic", "magic.mime", "networks", "ethertypes",
    "xattr.conf", "gitconfig", "vim", "fonts", "locale.alias", "locale.gen",
    "debconf.conf", "deluser.conf", "adduser.conf", "mke2fs.conf", "ucf.conf",
    "libaudit.conf", "pam.conf", "pam.d", "security", "default", "selinux",
    "matplotlibrc", /* Debian keeps matplotlib's defaults here (runCode plots) */
};
static const char *const etc_deny[] = {
    "ssl/private", "apt/auth.conf", "apt/auth.conf.d", "security/opasswd",
};

static bool denied(const char *rel) {
  for (size_t i = 0; i < SBX_ARRAY_SIZE(etc_deny); i++)
    if (!strcmp(rel, etc_deny[i])) return true;
  return false;
}

/* Copies src (relative name rel under /etc) into dst, recursively, without
 * following symlinks and keeping only files, dirs and symlinks. */
static int copy_tree(int sdir, int ddir, const char *name, const char *rel, int depth) {
  if (depth > 12 || denied(rel)) return 0;
  struct stat st;
  if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -errno;
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = readlinkat(sdir, name, target, sizeof target - 1);
    if (n < 0) return -errno;
    target[n] = 0;
    if (symlinkat(target, ddir, name) < 0 && errno != EEXIST) return -errno;
    return 0;
  }
  if (S_ISREG(st.st_mode)) {
    if (!(st.st_mode & S_IROTH)) return 0; /* root-only files stay on the host */
    _cleanup_close_ int in = openat(sdir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0) return -errno;
    _cleanup_close_ int out = openat(ddir, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                                     st.st_mode & 07777);
    if (out < 0) return -errno;
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
      if (sbx_write_all(out, buf, n) < 0) return -EIO;
    fchmod(out, st.st_mode & 07777);
    return 0;
  }
  if (!S_ISDIR(st.st_mode)) return 0;
  if (!(st.st_mode & S_IXOTH)) return 0;
  if (mkdirat(ddir, name, st.st_mode & 07777) < 0 && errno != EEXIST) return -errno;
  _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  _cleanup_close_ int d = openat(ddir, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (s < 0 || d < 0) return -errno;
  DIR *dir = fdopendir(dup(s));
  if (!dir) return -errno;
  struct dirent *e;
  int r = 0;
  while ((e = readdir(dir)) && r == 0) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name);
    r = copy_tree(s, d, e->d_name, sub, depth + 1);
  }
  closedir(dir);
  return r;
}

int sbx_rootfs_build_etc(const char *dir) {
  int r = sbx_mkdir_p(dir, 0755);
  if (r < 0) return r;
  _cleanup_close_ int s = open("/etc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  _cleanup_close_ int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s < 0 || d < 0) return -errno;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(etc_allow); i++)
    if ((r = copy_tree(s, d, etc_allow[i], etc_allow[i], 0)) < 0) return r;
  if (symlinkat("../proc/self/mounts", d, "mtab") < 0 && errno != EEXIST) return -errno;
  return 0;
}

/* Where lower layers go, in this order (the image's or the host's). */
static const char *const layer_dirs[] = {"usr", "opt", "var/lib/dpkg", "var/lib/apt", "etc"};

/* The standard directories of a sandbox's /, made on its disk. */
static const struct {
  const char *path;
  mode_t mode;
} root_dirs[] = {{"usr", 0755},         {"etc", 0755},       {"var", 0755},       {"var/lib", 0755},
                 {"var/lib/dpkg", 0755}, {"var/lib/apt", 0755}, {"var/tmp", 01777}, {"var/cache", 0755},
                 {"var/log", 0755},     {"opt", 0755},       {"tmp", 01777},      {"root", 0700},
                 {"home", 0755},        {"run", 0755},       {"proc", 0555},      {"sys", 0555},
                 {"dev", 0755},         {"workspace", 0755}, {"mnt", 0755},       {".oldroot", 0700}};

static int mkdirat_ok(int dfd, const char *path, mode_t mode) {
  if (mkdirat(dfd, path, mode) == 0) return fchmodat(dfd, path, mode, 0); /* umask */
  return errno == EEXIST ? 0 : -errno;
}

/* A standard directory of the sandbox's / (path, under stage), made a real
 * one: what the sandbox left in its place (a symlink, /var -> /host/dir,
 * or a file) is moved aside to path.sbx-N. sbx-init lays out and mounts
 * before its root is the sandbox's, so a symlink on the way would lead
 * into the host's /; root_dirs lists parents first, so every path is
 * reached through real directories only. */
static int real_dir(int stage, const char *path, mode_t mode) {
  struct stat st;
  int r;
  if (fstatat(stage, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode) &&
      (r = sbx_move_aside(stage, path)) < 0)
    return r;
  return mkdirat_ok(stage, path, mode);
}

int sbx_rootfs_layout(int stage) {
  static const char *const tops[] = {"root", "upper", "work", "lower"};
  char path[256];
  int r;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(tops); i++)
    if ((r = mkdirat_ok(stage, tops[i], 0755)) < 0) return r;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(root_dirs); i++) {
    snprintf(path, sizeof path, "root/%s", root_dirs[i].path);
    if ((r = real_dir(stage, path, root_dirs[i].mode)) < 0) return r;
  }
  /* "empty": what masks /proc's sensitive directories, read-only (one
   * directory of a filesystem the sandbox has anyway, instead of a tmpfs
   * each: every filesystem costs the kernel a shrinker, and every memory
   * cgroup on the host a counter for each shrinker). A full disk made
   * before it has none: its masks stay tmpfs. */
  mkdirat_ok(stage, "empty", 0555);
  for (size_t i = 0; i < SBX_ARRAY_SIZE(layer_dirs); i++)
    for (size_t t = 1; t < SBX_ARRAY_SIZE(tops); t++) {
      char name[64];
      snprintf(name, sizeof name, "%s", layer_dirs[i]);
      for (char *c = name; *c; c++)
        if (*c == '/') *c = '-';
      snprintf(path, sizeof path, "%s/%s", tops[t], name);
      if ((r = mkdirat_ok(stage, path, 0755)) < 0) return r;
    }
  return 0;
}

/* The names NAME of root's usr/lib/NAME/EXTERNALLY-MANAGED (pip's marker
 * of each Python), at most SBX_PYTHONS_MAX: how many. */
static int find_pythons(const char *root, char out[SBX_PYTHONS_MAX][32]) {
  char pat[1100];
  snprintf(pat, sizeof pat, "%s/usr/lib/python3*/EXTERNALLY-MANAGED", root);
  glob_t g;
  if (glob(pat, GLOB_NOSORT, NULL, &g) != 0) return 0;
  size_t skip = strlen(root) + strlen("/usr/lib/");
  int n = 0;
  for (size_t i = 0; i < g.gl_pathc && n < SBX_PYTHONS_MAX; i++) {
    const char *name = g.gl_pathv[i] + skip;
    size_t len = strcspn(name, "/");
    if (len < sizeof out[0]) snprintf(out[n++], sizeof out[0], "%.*s", (int)len, name);
  }
  globfree(&g);
  return n;
}

int sbx_rootfs_prime(int stage) {
  /* /etc is written at every start (hostname, hosts): its upper directory
   * is there from the first */
  int r = mkdirat_ok(stage, "upper/etc/", 0755);
  if (r < 0) return r;
  /* pip's EXTERNALLY-MANAGED marker of the host's Pythons, whited out as
   * the sandbox's init would (a whiteout is a 0:0 character device) */
  char pythons[SBX_PYTHONS_MAX][32];
  int n = find_pythons("", pythons);
  for (int i = 0; i < n && r == 0; i++) {
    char up[640], wh[700];
    snprintf(up, sizeof up, "upper/usr/lib/%s", pythons[i]);
    snprintf(wh, sizeof wh, "%s/EXTERNALLY-MANAGED", up);
    if ((r = mkdirat_ok(stage, "upper/usr/lib", 0755)) == 0 && (r = mkdirat_ok(stage, up, 0755)) == 0 &&
        mknodat(stage, wh, S_IFCHR | 0000, makedev(0, 0)) < 0 && errno != EEXIST)
      r = -errno;
  }
  return r;
}

int sbx_rootfs_layers(const char *image_dir, const char *etc_template, sbx_layer out[SBX_LAYERS_MAX]) {
  const char *const *dirs = layer_dirs;
  int n = 0;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(layer_dirs); i++) {
    bool etc = !strcmp(dirs[i], "etc");
    if (etc && !image_dir) snprintf(out[n].host, sizeof out[n].host, "%s", etc_template);
    else snprintf(out[n].host, sizeof out[n].host, "%s/%s", image_dir ? image_dir : "", dirs[i]);
    out[n].target = dirs[i];
    struct stat st;
    /* an image's symlinked dirs (usr/lib64...) are its business; a layer must be a real directory */
    if (lstat(out[n].host, &st) == 0 && S_ISDIR(st.st_mode)) n++;
  }
  return n;
}

void sbx_rootfs_scan(const char *root, sbx_init_args *a) {
  static const char *const names[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};
  a->nlinks = 0;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++) {
    char host[1100], target[64];
    snprintf(host, sizeof host, "%s/%s", root, names[i]);
    ssize_t n = readlink(host, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    snprintf(a->links[a->nlinks].name, sizeof a->links[0].name, "%s", names[i]);
    snprintf(a->links[a->nlinks].target, sizeof a->links[0].target, "%s", target);
    a->nlinks++;
  }
  a->npythons = find_pythons(root, a->pythons);
}

/* ---- inside the new namespaces ----------------------------------------- */

#define STAGE "/tmp"           /* where the sandbox's disk is mounted, in its own mount ns */
#define NEWROOT STAGE "/root"

static void report(int sock, const char *fmt, ...) SBX_PRINTF(2, 3);
static void report(int sock, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  (void)!send(sock, msg, strlen(msg), MSG_NOSIGNAL);
}

#define TRY(expr, what)                                                        \
  do {                                                                         \
    if ((expr) < 0) {                                                          \
      report(a->sock, "%s: %s", what, strerror(errno));                        \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

static int bind_ro(const char *src, const char *dst) {
  if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0) return -1;
  struct statvfs sv;
  unsigned long keep = 0;
  if (statvfs(dst, &sv) == 0) { /* remount must keep the locked flags */
    if (sv.f_flag & ST_NOSUID) keep |= MS_NOSUID;
    if (sv.f_flag & ST_NODEV) keep |= MS_NODEV;
    if (sv.f_flag & ST_NOEXEC) keep |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME) keep |= MS_NOATIME;
    if (sv.f_flag & ST_RELATIME) keep |= MS_RELATIME;
  }
  return mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | keep, NULL);
}

/* A detached mount (root), or a file opened here bound read-only. */
static int mount_over(int fd, bool detached, const char *target) {
  int r;
  if (detached) {
    r = move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
  } else {
    char held[64];
    snprintf(held, sizeof held, "/proc/self/fd/%d", fd);
    r = bind_ro(held, target);
  }
  close(fd);
  return r;
}

static int touch(const char *path, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

/* Receives up to max fds sent with the daemon's "go". */
static int recv_go(int sock, int *fds, int max) {
  char byte;
  int count = 0;
  ssize_t n = sbx_recv_fds(sock, &byte, 1, fds, max, &count, 0);
  return n == 1 && byte == 'g' ? count : -1;
}

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
/* Kernel files that tell about or act on the host: masked as in the
 * container default. */
static const char *const proc_masked_files[] = {"kcore", "keys", "timer_list", "sched_debug",
                                                "latency_stats", "sysrq-trigger", "kallsyms",
                                                "kmsg", "config.gz", "vmallocinfo", "pagetypeinfo"};
static const char *const proc_masked_dirs[] = {"acpi", "scsi", "asound", "firmware", "driver"};
static const char *const proc_ro[] = {"sys", "irq", "bus", "fs"};

/* written by sbx-init with the sandbox's name */
static const char *const named_files[] = {"/etc/hostname", "/etc/hosts"};

static int symlink_ok(const char *target, const char *path) {
  return symlink(target, path) == 0 || errno == EEXIST ? 0 : -1;
}

_Noreturn void sbx_rootfs_init_main(const sbx_init_args *a) {
  char path[4096], opts[8192];
  pid_t parent = getppid(); /* the daemon: it started us, directly or through CLONE_PARENT */
  int exe = a->init_exe_fd; /* the static sbx-init, executed once the root is built */
  int fds[SBX_LAYERS_MAX + SBX_INIT_MOUNTS_MAX + 3];
  int nfds = recv_go(a->sock, fds, SBX_LAYERS_MAX + SBX_INIT_MOUNTS_MAX + 3);
  if (nfds < 0) _exit(1);
  int extra = a->idmapped ? a->meminfo + a->cpu_online : 0; /* the /proc files come last */
  if (nfds < extra) _exit(1);
  int meminfo = a->meminfo && extra ? fds[nfds - extra] : -1;
  int online = a->cpu_online && extra ? fds[nfds - 1] : -1;
  nfds -= extra;
  if (!a->idmapped) { /* rootless: held before the stage hides the state dir */
    snprintf(path, sizeof path, "%s/meminfo", a->procdir);
    if (a->meminfo) TRY(meminfo = open(path, O_PATH | O_CLOEXEC), path);
    snprintf(path, sizeof path, "%s/cpu-online", a->procdir);
    if (a->cpu_online) TRY(online = open(path, O_PATH | O_CLOEXEC), path);
  }
  TRY(setresgid(0, 0, 0), "setresgid");
  TRY(setresuid(0, 0, 0), "setresuid");
  /* a change of credentials clears the parent-death signal: set it again */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  TRY(unshare(CLONE_NEWCGROUP), "cgroup namespace");
  TRY(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "making mounts private");

  const sbx_layer *layers = a->layers;
  int nl = a->nlayers;
  int *lfds = fds + (a->idmapped ? 1 : 0); /* root mode: the disk comes first */
  int nm = a->idmapped ? a->nmounts : 0, *mfds = lfds + nl;
  if (a->idmapped && nfds != nl + nm + 1) {
    report(a->sock, "expected %d mount fds, got %d", nl + nm + 1, nfds);
    _exit(1);
  }
  if (!a->idmapped) /* hold the host dirs before the stage hides any of them */
    for (int i = 0; i < nl; i++) TRY(lfds[i] = open(layers[i].host, O_PATH | O_DIRECTORY | O_CLOEXEC), layers[i].host);

  /* the sandbox's disk: its writable layers, /workspace, /tmp, /root... */
  if (a->idmapped) {
    TRY(move_mount(fds[0], "", AT_FDCWD, STAGE, MOVE_MOUNT_F_EMPTY_PATH), "attaching the sandbox disk");
    close(fds[0]);
  } else {
    TRY(mount(a->disk_dir, STAGE, NULL, MS_BIND, NULL), "binding the sandbox disk");
    mount(NULL, STAGE, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL);
  }
  /* its layout is made with the template and checked here (a disk made
   * before a layout change gets what is new) */
  int stage = open(STAGE, O_PATH | O_DIRECTORY | O_CLOEXEC);
  TRY(stage, "opening the sandbox disk");
  errno = -sbx_rootfs_layout(stage);
  TRY(errno ? -1 : 0, "laying out the sandbox disk");
  close(stage);
  TRY(mount(NEWROOT, NEWROOT, NULL, MS_BIND, NULL), "binding the new root");

  /* the merged-usr symlinks of the host (or the image) */
  for (int i = 0; i < a->nlinks; i++) {
    snprintf(path, sizeof path, NEWROOT "/%s", a->links[i].name);
    TRY(symlink_ok(a->links[i].target, path), "symlink");
  }

  for (int i = 0; i < nl; i++) {
    char held[64];
    snprintf(held, sizeof held, "/proc/self/fd/%d", lfds[i]);
    char target[512];
    snprintf(target, sizeof target, NEWROOT "/%s", layers[i].target);
    bool writable = a->idmapped || !strcmp(layers[i].target, "etc");
    if (!writable) { /* rootless: the host's system dirs stay read-only */
      TRY(bind_ro(held, target), layers[i].host);
      close(lfds[i]);
      continue;
    }
    /* upper and work dirs are named for their target, so a restart finds
     * each layer's changes whatever layers exist now */
    char name[128], lower[512], upper[512], work[512];
    snprintf(name, sizeof name, "%s", layers[i].target);
    for (char *c = name; *c; c++)
      if (*c == '/') *c = '-';
    snprintf(lower, sizeof lower, STAGE "/lower/%s", name);
    snprintf(upper, sizeof upper, STAGE "/upper/%s", name);
    snprintf(work, sizeof work, STAGE "/work/%s", name);
    if (a->idmapped) {
      TRY(move_mount(lfds[i], "", AT_FDCWD, lower, MOVE_MOUNT_F_EMPTY_PATH), "attaching idmapped layer");
      close(lfds[i]);
    } else {
      snprintf(lower, sizeof lower, "%s", held);
    }
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, upper, work);
    TRY(mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, opts), target);
    if (!a->idmapped) close(lfds[i]);
  }

  /* /dev */
  /* one tmpfs for /dev and /dev/shm (a filesystem fewer: see "empty") */
  snprintf(opts, sizeof opts, "size=%um,mode=0755", a->dev_mb ? a->dev_mb : SBX_DEV_MB);
  TRY(mount("sbx-dev", NEWROOT "/dev", "tmpfs", MS_NOSUID | MS_NODEV, opts), "mounting /dev");
  for (size_t i = 0; i < SBX_ARRAY_SIZE(dev_nodes); i++) {
    char host[64];
    snprintf(host, sizeof host, "/dev/%s", dev_nodes[i]);
    snprintf(path, sizeof path, NEWROOT "/dev/%s", dev_nodes[i]);
    TRY(touch(path, 0666), path);
    TRY(mount(host, path, NULL, MS_BIND, NULL), path);
  }
  TRY(mkdir(NEWROOT "/dev/pts", 0755), "mkdir /dev/pts");
  TRY(mount("devpts", NEWROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
            a->idmapped ? "newinstance,ptmxmode=0666,mode=0620,gid=5" : "newinstance,ptmxmode=0666,mode=0620"),
      "mounting devpts");
  TRY(symlink("pts/ptmx", NEWROOT "/dev/ptmx"), "ptmx");
  TRY(mkdir(NEWROOT "/dev/shm", 01777), "mkdir /dev/shm");
  TRY(chmod(NEWROOT "/dev/shm", 01777), "chmod /dev/shm"); /* umask */
  symlink("/proc/self/fd", NEWROOT "/dev/fd");
  symlink("/proc/self/fd/0", NEWROOT "/dev/stdin");
  symlink("/proc/self/fd/1", NEWROOT "/dev/stdout");
  symlink("/proc/self/fd/2", NEWROOT "/dev/stderr");

  /* /proc: fresh, with the kernel's sensitive files masked */
  TRY(mount("proc", NEWROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mounting /proc");
  for (size_t i = 0; i < SBX_ARRAY_SIZE(proc_masked_files); i++) {
    snprintf(path, sizeof path, NEWROOT "/proc/%s", proc_masked_files[i]);
    if (access(path, F_OK) == 0) TRY(mount(NEWROOT "/dev/null", path, NULL, MS_BIND, NULL), path);
  }
  bool has_empty = access(STAGE "/empty", F_OK) == 0;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(proc_masked_dirs); i++) {
    snprintf(path, sizeof path, NEWROOT "/proc/%s", proc_masked_dirs[i]);
    if (access(path, F_OK) < 0) continue;
    if (has_empty) TRY(bind_ro(STAGE "/empty", path), path);
    else TRY(mount("masked", path, "tmpfs", MS_RDONLY, "size=0"), path);
  }
  for (size_t i = 0; i < SBX_ARRAY_SIZE(proc_ro); i++) {
    snprintf(path, sizeof path, NEWROOT "/proc/%s", proc_ro[i]);
    if (access(path, F_OK) == 0) TRY(bind_ro(path, path), path);
  }
  /* /sys: fresh and read-only (allowed because the sandbox owns its netns) */
  if (mount("sysfs", NEWROOT "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    TRY(mount("sys", NEWROOT "/sys", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0"), "/sys");
  /* the sandbox's own size where programs read the machine's */
  if (meminfo >= 0) TRY(mount_over(meminfo, a->idmapped, NEWROOT "/proc/meminfo"), "/proc/meminfo");
  if (online >= 0 && access(NEWROOT "/sys/devices/system/cpu/online", F_OK) == 0)
    TRY(mount_over(online, a->idmapped, NEWROOT "/sys/devices/system/cpu/online"), "cpu/online");

  TRY(chdir(NEWROOT), "chdir new root");
  TRY(syscall(SYS_pivot_root, ".", ".oldroot"), "pivot_root");
  TRY(chdir("/"), "chdir /");
  TRY(umount2("/.oldroot", MNT_DETACH), "detaching the host root");
  rmdir("/.oldroot");

  /* the bucket mounts: one that cannot go here is left to the daemon,
   * which tries again with a helper and says why */
  char attached[SBX_INIT_MOUNTS_MAX + 1] = "";
  for (int i = 0; i < nm; i++) {
    int d = sbx_walk_mkdir(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), a->mount_paths[i]);
    bool in = d >= 0 && move_mount(mfds[i], "", d, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) == 0;
    attached[i] = in ? '1' : '0';
    if (d >= 0) close(d);
    close(mfds[i]);
  }

  /* pip's marker: in the sandbox's / (a symlink it made on the way leads
   * there, not into the host's) */
  unlink("/etc/resolv.conf");
  if (a->idmapped)
    for (int i = 0; i < a->npythons; i++) {
      snprintf(path, sizeof path, "/usr/lib/%s/EXTERNALLY-MANAGED", a->pythons[i]);
      unlink(path);
    }

  /* loopback up: the only interface of network "none" */
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr = {0};
  strcpy(ifr.ifr_name, "lo");
  TRY(s, "socket");
  TRY(ioctl(s, SIOCGIFFLAGS, &ifr), "SIOCGIFFLAGS lo");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  TRY(ioctl(s, SIOCSIFFLAGS, &ifr), "bringing lo up");
  close(s);

  /* sbx-init names the sandbox (hostname, /etc/hostname, /etc/hosts):
   * made ahead, once a create has taken it; its files are copied up to
   * the disk now, so that wait ends in two small writes */
  if (a->ahead)
    for (size_t i = 0; i < SBX_ARRAY_SIZE(named_files); i++) {
      int fd = open(named_files[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      TRY(fd, named_files[i]);
      close(fd);
    }

  /* Become init by executing sbx-init (static: it runs on any image): an
   * exec makes the sandbox's user namespace own init's memory, so the
   * daemon (even rootless) may join it while processes inside, without
   * CAP_SYS_PTRACE, may not touch it. */
  if (exe < 0) {
    report(a->sock, "sbx-init was not found beside sbx");
    _exit(1);
  }
  if (exe == 3) TRY(exe = fcntl(exe, F_DUPFD_CLOEXEC, 4), "dup exe");
  if (a->sock != 3) TRY(dup2(a->sock, 3), "dup2");
  TRY(fcntl(3, F_SETFD, 0), "keeping the socket");
  int null = open("/dev/null", O_RDWR);
  if (null >= 0 && null != 0) dup2(null, 0);
  char *argv[] = {"sbx-init", a->ahead ? NULL : (char *)a->id, nm ? attached : NULL, NULL}, *envp[] = {NULL};
  syscall(SYS_execveat, exe, "", argv, envp, AT_EMPTY_PATH);
  report(a->sock, "executing init: %s", strerror(errno));
  _exit(1);
}

