/* `sbx doctor`: probes what the kernel offers and says which path sbx
 * takes for each feature. Probes try the feature; they never trust version
 * numbers. */
#define _GNU_SOURCE
#include "doctor.h"
#include "network.h"
#include "cgroup.h"
#include "config.h"
#include "seccomp.h"
#include "util.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <linux/sched.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Runs fn in a forked child; true when it exits 0. */
static bool in_child(int (*fn)(void)) {
  pid_t p = fork();
  if (p == 0) _exit(fn() == 0 ? 0 : 1);
  int st;
  return p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int probe_userns(void) { return unshare(CLONE_NEWUSER); }

static int probe_overlay(void) {
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
  if (mount("t", "/tmp", "tmpfs", 0, NULL) < 0) return -1;
  if (mkdir("/tmp/u", 0755) < 0 || mkdir("/tmp/w", 0755) < 0 || mkdir("/tmp/m", 0755) < 0) return -1;
  return mount("overlay", "/tmp/m", "overlay", 0, "lowerdir=/usr,upperdir=/tmp/u,workdir=/tmp/w,userxattr");
}

/* Whether the kernel offers FUSE passthrough (the view's open files then
 * bypass its server): a FUSE mount in a private mount namespace, whose
 * INIT request says so; never answered, it goes with the child. */
static int probe_fuse_passthrough(void) {
  if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
  int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  char opts[96];
  snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
  if (mount("sbx-probe", "/tmp", "fuse.sbx-probe", MS_NOSUID | MS_NODEV, opts) < 0) return -1;
  static char buf[16384];
  ssize_t n = read(fd, buf, sizeof buf);
  const struct fuse_in_header *h = (const void *)buf;
  const struct fuse_init_in *in = (const void *)(h + 1);
  if (n < (ssize_t)(sizeof *h + sizeof *in) || h->opcode != FUSE_INIT) return -1;
  return (in->flags & FUSE_INIT_EXT) && (in->flags2 & (1u << (37 - 32))) ? 0 : -1; /* FUSE_PASSTHROUGH */
}

/* A child in new user and mount namespaces, mapped as sandboxes are (our
 * uid as its root). With fn it runs fn there and reports; without it waits
 * to be killed, so the caller can use its user namespace. */
static pid_t userns_child(int (*fn)(void)) {
  int go[2], ready[2];
  if (pipe(go) < 0 || pipe(ready) < 0) return -1;
  pid_t c = fork();
  if (c == 0) {
    char b;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) _exit(1);
    (void)!write(ready[1], "x", 1);
    if (read(go[0], &b, 1) != 1) _exit(1);
    if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) _exit(1);
    if (!fn) pause();
    _exit(fn() == 0 ? 0 : 1);
  }
  char b;
  close(ready[1]);
  if (c < 0 || read(ready[0], &b, 1) != 1) return -1;
  char path[64], map[64];
  snprintf(path, sizeof path, "/proc/%d/setgroups", c);
  sbx_write_string(path, "deny");
  snprintf(map, sizeof map, "0 %u 1\n", (unsigned)geteuid());
  snprintf(path, sizeof path, "/proc/%d/uid_map", c);
  sbx_write_string(path, map);
  snprintf(map, sizeof map, "0 %u 1\n", (unsigned)getegid());
  snprintf(path, sizeof path, "/proc/%d/gid_map", c);
  sbx_write_string(path, map);
  (void)!write(go[1], "g", 1);
  close(go[0]), close(go[1]), close(ready[0]);
  return c;
}

static bool probe_in_userns(int (*fn)(void)) {
  pid_t c = userns_child(fn);
  int st;
  return c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static bool probe_idmap(void) {
  pid_t c = userns_child(NULL);
  if (c < 0) return false;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/user", c);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  int fd = open_tree(AT_FDCWD, "/usr", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr a = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = ns};
  int r = (ns >= 0 && fd >= 0) ? mount_setattr(fd, "", AT_EMPTY_PATH, &a, sizeof a) : -1;
  if (ns >= 0) close(ns);
  if (fd >= 0) close(fd);
  kill(c, SIGKILL);
  waitpid(c, NULL, 0);
  return r == 0;
}

static bool probe_pidfd(void) {
  int fd = sbx_pidfd_open(getpid());
  if (fd < 0) return false;
  close(fd);
  return true;
}

static bool probe_clone3(void) {
  /* a zero-sized argument is refused with EINVAL when clone3 exists */
  return syscall(SYS_clone3, NULL, 0) < 0 && errno == EINVAL;
}

int sbx_doctor(FILE *out) {
  int problems = 0;
  bool root = geteuid() == 0;
#define LINE(ok, what, path)                                                   \
  do {                                                                         \
    fprintf(out, "%-4s %-22s %s\n", (ok) ? "ok" : "--", what, path);            \
    if (!(ok)) problems++;                                                     \
  } while (0)
  fprintf(out, "sbx doctor: running as %s (uid %u)\n", root ? "root" : "an unprivileged user", (unsigned)geteuid());
  bool userns = in_child(probe_userns);
  LINE(userns, "user namespaces", userns ? "each sandbox gets its own user namespace" : "unavailable: sbx cannot run");
  bool idmap = root && probe_idmap();
  LINE(idmap || !root, "idmapped mounts",
       idmap ? "host /usr, /opt, package dbs idmapped under a writable overlay"
             : root ? "unavailable: system dirs would stay read-only"
                    : "not for unprivileged users: /usr, /opt stay read-only in sandboxes (copy-up needs root)");
  bool ovl = probe_in_userns(probe_overlay);
  LINE(ovl, "overlayfs in userns", ovl ? "writable layers over the host's dirs" : "unavailable");
  int cg = sbx_cg_init();
  LINE(cg == 0, "cgroups", cg == 0 ? sbx_cg_describe() : root ? "unavailable: memoryMB and cpus cannot be enforced"
                                                               : "no writable cgroup: memoryMB and cpus are NOT enforced, "
                                                                 "pids holds through RLIMIT_NPROC (delegate a cgroup, e.g. "
                                                                 "systemd-run --user -p Delegate=yes sbx daemon)");
  if (cg == 0) sbx_cg_shutdown();
  bool sc = sbx_seccomp_compile() == 0;
  char scdesc[96];
  snprintf(scdesc, sizeof scdesc, "libseccomp API %u, %zu rules compiled to BPF", seccomp_api_get(),
           sbx_seccomp_rule_count());
  LINE(sc, "seccomp", sc ? scdesc : "cannot compile the policy");
  int fusefd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  bool fuse_open = fusefd >= 0;
  if (fusefd >= 0) close(fusefd);
  struct stat fst;
  bool fusermount = stat("/usr/bin/fusermount3", &fst) == 0 && (fst.st_mode & S_ISUID) && fst.st_uid == 0;
  bool fuse = access("/dev/fuse", F_OK) == 0 && fuse_open && (root || fusermount);
  LINE(fuse, "FUSE",
       !access("/dev/fuse", F_OK) ? (root ? (fuse_open ? "usable: sbx mount and bucket mounts work"
                                                       : "/dev/fuse cannot be opened: no FUSE view, no bucket mounts")
                                          : fusermount ? (fuse_open ? "usable through fusermount3 (sbx mount) and /dev/fuse"
                                                                    : "/dev/fuse is root's only here (mode 0600): no sbx "
                                                                      "mount, no bucket mounts rootless")
                                                       : "no setuid fusermount3 (Debian package fuse3): no sbx mount")
                                   : "no /dev/fuse: no FUSE view, no bucket mounts");
  if (fuse) {
    bool pt = root && in_child(probe_fuse_passthrough);
    /* optional: without it the view serves reads and writes itself */
    fprintf(out, "%-4s %-22s %s\n", pt ? "ok" : "--", "FUSE passthrough",
            pt ? "offered: files opened through sbx mount are read and written by the kernel, not the view's server"
               : root ? "not offered by this kernel (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH): the view's server "
                        "reads and writes"
                      : "needs root (CAP_SYS_ADMIN): the view's server reads and writes");
    /* optional: without it requests go through /dev/fuse */
    int on = sbx_fuse_uring_param();
    fprintf(out, "%-4s %-22s %s\n", on == 1 || (on == 0 && root) ? "ok" : "--", "FUSE over io_uring",
            on == 1   ? "on (the fuse module's enable_uring): the view takes requests on rings of the CPUs their "
                        "callers run on"
            : on < 0  ? "not in this kernel (Linux 6.14+ with CONFIG_FUSE_IO_URING): the view reads /dev/fuse"
            : root    ? "available: sbx mount turns the fuse module's enable_uring on while it mounts (off again "
                        "once mounted) and takes requests on rings of the CPUs their callers run on; -o nouring does not"
                      : "off: root can turn it on (echo Y > " SBX_FUSE_ENABLE_URING "); the view reads /dev/fuse");
  }
  /* optional: local buckets work without it */
  void *curl = dlopen(SBX_LIBCURL, RTLD_LAZY | RTLD_LOCAL);
  char curl_says[300] = SBX_LIBCURL " loads: S3/R2 bucket mounts work";
  if (curl) dlclose(curl);
  else snprintf(curl_says, sizeof curl_says, SBX_LIBCURL " cannot be loaded (Debian package libcurl4): no S3 bucket "
                "mounts, local buckets work (%s)", dlerror());
  fprintf(out, "%-4s %-22s %s\n", curl ? "ok" : "--", "S3 client", curl_says);
  bool pidfd = probe_pidfd();
  LINE(pidfd, "pidfd", pidfd ? "processes supervised by pidfd on the event loop" : "missing: sbx needs Linux >= 5.3");
  const char *why = NULL;
  bool egress = sbx_net_egress_available(&why);
  /* optional: "none" works without it */
  fprintf(out, "%-4s %-22s %s\n", egress ? "ok" : "--", "network egress",
          egress ? "pasta + an nftables filter (no private, link-local or host-loopback destinations)" : why);
  bool c3 = probe_clone3();
  LINE(true, "clone3", c3 ? "available (sandbox commands get ENOSYS for it, so glibc uses clone)"
                          : "absent: clone is used");
  bool loop = root && access("/dev/loop-control", R_OK | W_OK) == 0;
  LINE(loop || !root, "disk quota",
       loop ? "each sandbox's disk is an ext4 image on a loop device: diskMB is a hard quota"
            : root ? "no /dev/loop-control: disks are directories and diskMB is not enforced"
                   : "rootless: disks are directories in the state dir and diskMB is not enforced");
  sbx_config conf;
  char err[600];
  if (sbx_config_load(&conf, err, sizeof err) < 0) {
    LINE(false, "configuration", err);
  } else {
    LINE(true, "configuration", conf.found ? conf.path : "defaults (no file)");
    json_t *j = sbx_config_json(&conf);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fprintf(out, "configuration in force (%s%s, secrets masked):\n%s\n", conf.path, conf.found ? "" : ": absent",
            text);
    free(text);
    json_decref(j);
    sbx_config_free(&conf);
  }
  return problems;
}
