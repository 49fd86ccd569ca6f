#define _GNU_SOURCE
#include "fuseutil.h"
#include "../sandbox-core/util.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>

void sbx_fuse_args_init(sbx_fuse_args *a, const char *subtype, bool allow_other, bool kernel_perms, bool debug) {
  a->args = (struct fuse_args)FUSE_ARGS_INIT(0, NULL);
  fuse_opt_add_arg(&a->args, "sbx");
  char opt[256];
  /* kernel_perms: the kernel checks mode bits and ACLs as everywhere
   * (with allow_other it must: others would otherwise get whatever the
   * server may do) */
  snprintf(opt, sizeof opt, "fsname=sbx,subtype=%s,nosuid,nodev%s%s", subtype, allow_other ? ",allow_other" : "",
           kernel_perms || allow_other ? ",default_permissions" : "");
  fuse_opt_add_arg(&a->args, "-o");
  fuse_opt_add_arg(&a->args, opt);
  if (debug) fuse_opt_add_arg(&a->args, "-d");
}

int sbx_fuse_unmount(const char *mountpoint, bool lazy, char *err, size_t errlen) {
  if (geteuid() == 0) {
    if (umount2(mountpoint, lazy ? MNT_DETACH : 0) == 0) return 0;
    snprintf(err, errlen, "unmounting %s: %s", mountpoint, strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) dup2(null, 1);
    execlp("fusermount3", "fusermount3", "-u", lazy ? "-z" : "-u", mountpoint, (char *)NULL);
    _exit(127);
  }
  int st;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    snprintf(err, errlen, "fusermount3 -u %s failed", mountpoint);
    return -1;
  }
  return 0;
}

/* fusermount3's protocol: it mounts, then sends the /dev/fuse fd back over
 * the socket named by _FUSE_COMMFD. */
static int fusermount(const char *mountpoint, char *err, size_t errlen) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) {
    snprintf(err, errlen, "socketpair: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    char fdnum[16];
    snprintf(fdnum, sizeof fdnum, "%d", sv[1]);
    setenv("_FUSE_COMMFD", fdnum, 1);
    execlp("fusermount3", "fusermount3", "-o", "nosuid,nodev,fsname=sbx,subtype=sbx-view", "--", mountpoint,
           (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  int fd = -1;
  char byte;
  if (pid > 0) sbx_recv_fds(sv[0], &byte, 1, &fd, 1, NULL, 0); /* fusermount3's fd, with a byte */
  close(sv[0]);
  int st;
  if (pid > 0) waitpid(pid, &st, 0);
  if (fd < 0) snprintf(err, errlen, "fusermount3 could not mount %s (see sbx doctor)", mountpoint);
  return fd;
}

bool sbx_fuse_each_mount(bool (*fn)(const char *mnt, const char *fstype, void *ud), void *ud) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  char line[8192];
  bool stop = false;
  while (f && !stop && fgets(line, sizeof line, f)) {
    char mnt[4096], fstype[64], *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 || sscanf(dash + 3, "%63s", fstype) != 1) continue;
    if (strncmp(fstype, "fuse.sbx", 8)) continue;
    char *w = mnt; /* the kernel writes space, tab, newline and \ as octal */
    for (char *r = mnt; *r; r++)
      if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] && r[3])
        *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0')), r += 3;
      else *w++ = *r;
    *w = 0;
    stop = fn(mnt, fstype, ud);
  }
  if (f) fclose(f);
  return stop;
}

static bool is_mountpoint(const char *mnt, const char *fstype, void *ud) {
  (void)fstype;
  return !strcmp(mnt, ud);
}

bool sbx_fuse_is_ours(const char *mountpoint) { return sbx_fuse_each_mount(is_mountpoint, (void *)mountpoint); }

bool sbx_fuse_dead(int err) { return err == ENOTCONN || err == ECONNABORTED || err == ECANCELED; }

int sbx_fuse_mount(struct fuse_session *se, const char *mountpoint, char *err, size_t errlen) {
  struct stat st;
  struct statfs sf;
  /* statfs always reaches a FUSE server (a stat may be answered from
   * cache): a dead one says so (sbx_fuse_dead) */
  if (statfs(mountpoint, &sf) < 0 || stat(mountpoint, &st) < 0) {
    if (!sbx_fuse_dead(errno)) {
      snprintf(err, errlen, "%s: %s", mountpoint, strerror(errno));
      return -1;
    }
    /* a server that was killed left its mount behind: take the place over */
    if (sbx_fuse_unmount(mountpoint, true, err, errlen) < 0) return -1;
    if (stat(mountpoint, &st) < 0) {
      snprintf(err, errlen, "%s: %s", mountpoint, strerror(errno));
      return -1;
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s is not a directory", mountpoint);
    return -1;
  }
  /* a live sbx filesystem already there: refuse rather than stack another */
  if (sbx_fuse_is_ours(mountpoint)) {
    snprintf(err, errlen, "%s is already an sbx mount (sbx umount %s first)", mountpoint, mountpoint);
    return -1;
  }
  if (geteuid() != 0) { /* through the setuid helper, which also opens /dev/fuse */
    int fd = fusermount(mountpoint, err, errlen);
    if (fd < 0) return -1;
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/fd/%d", fd);
    if (fuse_session_mount(se, dev) != 0) {
      snprintf(err, errlen, "taking over the FUSE fd of %s failed", mountpoint);
      return -1;
    }
    return 0;
  }
  if (fuse_session_mount(se, mountpoint) != 0) {
    snprintf(err, errlen, "mounting %s failed (is /dev/fuse usable? see sbx doctor)", mountpoint);
    return -1;
  }
  /* the kernel caps a FUSE mount's readahead at its default (128 KiB);
   * its device number comes from mountinfo (a stat would wait for the
   * session we have not started serving yet) */
  FILE *mi = fopen("/proc/self/mountinfo", "re");
  char l[4096];
  while (mi && fgets(l, sizeof l, mi)) {
    unsigned maj, min;
    char mnt[4096];
    if (sscanf(l, "%*s %*s %u:%u %*s %4095s", &maj, &min, mnt) == 3 && !strcmp(mnt, mountpoint)) {
      char bdi[128];
      snprintf(bdi, sizeof bdi, "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
      sbx_write_string(bdi, "1024");
    }
  }
  if (mi) fclose(mi);
  return 0;
}

int sbx_fuse_daemonize(int ready_fd) {
  (void)ready_fd;
  return fuse_daemonize(0) == 0 ? 0 : -1;
}

int sbx_fuse_loop(struct fuse_session *se, int ready_fd) {
  if (fuse_set_signal_handlers(se) != 0) return -1;
  if (ready_fd >= 0) {
    (void)!write(ready_fd, "1", 1);
    close(ready_fd);
  }
  struct fuse_loop_config *cfg = fuse_loop_cfg_create();
  /* one /dev/fuse for all threads: a thread acting as a sandbox's root
   * (its fsuid) may start the next one, which could not open it again */
  fuse_loop_cfg_set_clone_fd(cfg, 0);
  fuse_loop_cfg_set_idle_threads(cfg, 8);
  fuse_loop_cfg_set_max_threads(cfg, 64);
  int r = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  fuse_remove_signal_handlers(se);
  return r;
}
