#define _GNU_SOURCE
#include "disk.h"
#include "rootfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>

#define MAX_STALE 1024
#define LOOP_MAJOR 7
#define EXT4_SUPER_MAGIC 0xEF53
#define EXT4_IOC_SHUTDOWN _IOR('X', 125, uint32_t)
#define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2
#define EXT4_IOC_CHECKPOINT _IOW('f', 43, uint32_t)
#define POOL_SIZE 2
#define RECYCLE_MAX 256

static struct {
  char *state;
  bool rootless;
  bool loop; /* images on loop devices (else directories) */
  /* loop devices bound to images of ours when we started */
  struct {
    dev_t dev;
    ino_t ino;
    char loop[64];
  } stale[MAX_STALE];
  int nstale;
  /* fresh disks of the default size, made ahead by a helper process */
  struct {
    int sock;
    pid_t pid;
    uv_poll_t poll;
    uint64_t mb;
    struct {
      int fd;
      char path[1200];
    } ready[POOL_SIZE];
    int n;
    int owed; /* disks asked for whose request did not fit in the socket yet */
    void (*on_fresh)(void);
  } pool;
  /* directories of destroyed sandboxes, oldest first, kept for the next
   * disks made ahead (see recycle) */
  struct {
    unsigned long long seq[RECYCLE_MAX];
    int n;
    unsigned long long next;
  } recycle;
} dk;

bool sbx_disk_quota_enforced(void) { return dk.loop; }

void sbx_disk_dir(const char *id, char *out, size_t len) { snprintf(out, len, "%s/sandboxes/%s", dk.state, id); }

static void image_path(const char *id, char *out, size_t len) {
  snprintf(out, len, "%s/sandboxes/%s/disk.img", dk.state, id);
}

void sbx_disk_path(const char *id, char *out, size_t len) { snprintf(out, len, "%s/sandboxes/%s/disk", dk.state, id); }

static int read_line(const char *path, char *out, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, out, len - 1);
  close(fd);
  if (n < 0) return -errno;
  while (n > 0 && out[n - 1] == '\n') n--;
  out[n] = 0;
  return 0;
}

/* Removes a tree in a process of its own (it may be large, and it is the
 * sandbox's making: no symlink is followed, no mount crossed). */
static void remove_in_background(const char *path) {
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid == 0) {
    if (fork() == 0) { /* reparented: nobody waits for it */
      setsid();
      close_range(3, ~0U, 0); /* nothing of the daemon's held meanwhile: its lock above all */
      sbx_remove_tree_at(AT_FDCWD, path, true);
    }
    _exit(0);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
}

/* Shuts a filesystem down: nothing of it is written again, every file
 * open on it gives EIO. Some milliseconds (a journal's abort). */
static void shut_down(int fd) {
  uint32_t how = EXT4_GOING_FLAGS_NOLOGFLUSH; /* nothing of it is kept */
  ioctl(fd, EXT4_IOC_SHUTDOWN, &how);
}

/* The directories kept to serve again (see recycle) go to the trash
 * (named in to) and the list starts empty: at start, and when the helper
 * that would have emptied their images is gone. */
static int recycle_to_trash(char *to, size_t len) {
  char from[1200];
  snprintf(from, sizeof from, "%s/recycle", dk.state);
  snprintf(to, len, "%s/trash/recycle-%llu", dk.state, (unsigned long long)sbx_now_us());
  dk.recycle.n = 0;
  if (rename(from, to) < 0) return -errno;
  if (dk.loop) mkdir(from, 0700); /* at start, made again below */
  return 0;
}

int sbx_disk_init(const char *state_dir, bool rootless, sbx_error *err) {
  free(dk.state);
  dk.state = strdup(state_dir);
  dk.rootless = rootless;
  char path[1200];
  static const char *const dirs[] = {"sandboxes", "templates", "trash"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(dirs); i++) {
    snprintf(path, sizeof path, "%s/%s", state_dir, dirs[i]);
    int r = sbx_mkdir_p(path, 0700);
    if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "creating %s", path);
  }
  dk.loop = !rootless && access("/dev/loop-control", R_OK | W_OK) == 0;
  /* what a dead daemon kept to serve again (see recycle), with what it
   * left to delete */
  recycle_to_trash(path, sizeof path);
  snprintf(path, sizeof path, "%s/trash", state_dir);
  DIR *d = opendir(path);
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') {
      char sub[1500];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      remove_in_background(sub);
    }
  if (d) closedir(d);
  dk.nstale = 0;
  dk.pool.sock = -1;
  if (!dk.loop) return 0;
  snprintf(path, sizeof path, "%s/recycle", state_dir);
  sbx_mkdir_p(path, 0700);
  /* disks made ahead by a daemon that died */
  snprintf(path, sizeof path, "%s/pool", state_dir);
  sbx_mkdir_p(path, 0700);
  d = opendir(path);
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') sbx_remove_tree_at(dirfd(d), e->d_name, true);
  if (d) closedir(d);
  d = opendir("/sys/block");
  /* the kernel shows a loop device's backing file by its real path */
  char real[PATH_MAX];
  size_t pl = snprintf(path, sizeof path, "%s/", realpath(state_dir, real) ? real : state_dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strncmp(e->d_name, "loop", 4) || dk.nstale >= MAX_STALE) continue;
    char f[512], back[1200];
    snprintf(f, sizeof f, "/sys/block/%s/loop/backing_file", e->d_name);
    if (read_line(f, back, sizeof back) < 0 || strncmp(back, path, pl)) continue;
    /* by device and inode: an image made ahead is bound under another name */
    snprintf(f, sizeof f, "/dev/%s", e->d_name);
    int l = open(f, O_RDONLY | O_CLOEXEC);
    struct loop_info64 info;
    if (l < 0) continue;
    if (ioctl(l, LOOP_GET_STATUS64, &info) == 0) {
      dk.stale[dk.nstale].dev = (dev_t)info.lo_device;
      dk.stale[dk.nstale].ino = (ino_t)info.lo_inode;
      snprintf(dk.stale[dk.nstale].loop, sizeof dk.stale[0].loop, "%.60s", e->d_name);
      dk.nstale++;
    }
    close(l);
  }
  if (d) closedir(d);
  return 0;
}

/* An image bound to a loop device for a sandbox holds an OFD lock on the
 * open file the device keeps: however long the device outlives the
 * sandbox (a host process holding a file of the view in passthrough mode),
 * the image is seen to be in use, and is never attached twice. */
static int lock_image(int img) {
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  return fcntl(img, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

/* The loop device dev, opened (held: autoclear cannot unbind it meanwhile)
 * if it is bound to the file st names; else -1. */
static int loop_bound_to(const char *dev, const struct stat *st) {
  int l = open(dev, O_RDONLY | O_CLOEXEC);
  struct loop_info64 info;
  if (l >= 0 && ioctl(l, LOOP_GET_STATUS64, &info) == 0 && (dev_t)info.lo_device == st->st_dev &&
      (ino_t)info.lo_inode == st->st_ino)
    return l;
  if (l >= 0) close(l);
  return -1;
}

/* The loop device bound to img, held, with its name in dev; -1 when there
 * is none. */
static int find_bound(int img, char *dev, size_t len) {
  struct stat st;
  if (fstat(img, &st) < 0) return -1;
  DIR *d = opendir("/sys/block");
  int found = -1;
  for (struct dirent *e; d && found < 0 && (e = readdir(d));) {
    if (strncmp(e->d_name, "loop", 4)) continue;
    snprintf(dev, len, "/dev/%.48s", e->d_name);
    found = loop_bound_to(dev, &st);
  }
  if (d) closedir(d);
  return found;
}

/* A sandbox of a daemon that died may still hold its mount of this image
 * (its teardown is not over, or a host process keeps one of its files
 * open through the view's passthrough): mounting the image through another
 * loop device would put two filesystems on one disk. Its loop device is
 * taken instead, so the new mount shares that filesystem. Returns an open
 * fd of it (held: autoclear cannot unbind it meanwhile) with its name in
 * dev, or -1 when the image is bound nowhere. */
static int take_stale(const char *img, char *dev, size_t len) {
  struct stat st;
  if (!dk.nstale || stat(img, &st) < 0) return -1;
  for (int i = 0; i < dk.nstale; i++) {
    if (dk.stale[i].dev != st.st_dev || dk.stale[i].ino != st.st_ino) continue;
    snprintf(dev, len, "/dev/%.48s", dk.stale[i].loop);
    dk.stale[i] = dk.stale[--dk.nstale];
    return loop_bound_to(dev, &st); /* -1: it let go, the image is free */
  }
  return -1;
}

static int run_mkfs(const char *path, uint64_t mb) {
  static const char *const tools[] = {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4", "/usr/sbin/mke2fs", "/sbin/mke2fs"};
  const char *tool = NULL;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(tools) && !tool; i++)
    if (access(tools[i], X_OK) == 0) tool = tools[i];
  if (!tool) return -ENOENT;
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid < 0) return -errno;
  if (pid == 0) {
    sbx_child_unblock();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) dup2(null, 0), dup2(null, 1);
    close_range(3, ~0U, 0);
    /* inode tables and journal zeroed now (as unwritten extents: holes to
     * a sparse copy), no reserved blocks (sandbox root is not the
     * filesystem's root), no resize reservation; small disks skip the
     * journal, which would take a good part of them */
    /* metadata_csum_seed: each copy gets its own UUID without rewriting
     * every checksum (see new_uuid) */
    char *argv[] = {(char *)tool, "-q", "-F", "-t", "ext4", "-m", "0", "-b", "4096", "-E",
                    "lazy_itable_init=0,lazy_journal_init=0,nodiscard", "-O",
                    mb < 256 ? "^resize_inode,^has_journal,metadata_csum_seed" : "^resize_inode,metadata_csum_seed",
                    (char *)path, NULL};
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    execve(tool, argv, envp);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -errno;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static int attach_loop(int img, char *dev, size_t len);
static int fsmount_ext4(const char *dev);

/* Every copy of the template starts with the sandbox's directory layout. */
static int lay_out(int img) {
  char dev[64];
  _cleanup_close_ int loop = attach_loop(img, dev, sizeof dev);
  if (loop < 0) return loop;
  _cleanup_close_ int m = fsmount_ext4(dev);
  if (m < 0) return m;
  int r = sbx_rootfs_layout(m);
  return r < 0 ? r : sbx_rootfs_prime(m);
}

static void template_path(uint64_t mb, char *out, size_t len) {
  snprintf(out, len, "%s/templates/ext4-%lluM.img", dk.state, (unsigned long long)mb);
}

/* A sparse ext4 image of mb at path (made under a temporary name, then
 * renamed), with the sandbox's directory layout or empty. */
static int make_image(const char *path, uint64_t mb, bool layout, sbx_error *err) {
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return sbx_err_errno(err, "INTERNAL", errno, "creating %s", tmp);
  int r = ftruncate(fd, (off_t)mb << 20) < 0 ? -errno : 0;
  if (r == 0) r = run_mkfs(tmp, mb);
  if (r == 0 && layout) r = lay_out(fd);
  /* written and out of the page cache: zeroed extents that are not cached
   * read as holes to SEEK_DATA, so copies take only the metadata */
  if (r == 0 && fsync(fd) < 0) r = -errno;
  if (r == 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  /* and what reads as a hole need not hold host disk blocks */
  for (off_t off = 0; r == 0;) {
    off_t hole = lseek(fd, off, SEEK_HOLE), data = hole < 0 ? -1 : lseek(fd, hole, SEEK_DATA);
    if (hole < 0 || hole >= (off_t)mb << 20) break;
    off_t end = data < 0 ? (off_t)mb << 20 : data;
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, hole, end - hole);
    if (data < 0) break;
    off = data;
  }
  close(fd);
  if (r == 0 && rename(tmp, path) < 0) r = -errno;
  if (r < 0) {
    unlink(tmp);
    return sbx_err_errno(err, r == -ENOSPC ? "RESOURCE_LIMIT" : "INTERNAL", -r,
                         "formatting a %llu MB disk (mkfs.ext4, from e2fsprogs)", (unsigned long long)mb);
  }
  return 0;
}

int sbx_disk_template(uint64_t mb, sbx_error *err) {
  if (!dk.loop) return 0;
  char path[1200];
  template_path(mb, path, sizeof path);
  if (access(path, F_OK) == 0) return 0;
  return make_image(path, mb, true, err);
}

int sbx_disk_make_image(const char *path, uint64_t mb, sbx_error *err) {
  if (access(path, F_OK) == 0) return 0;
  return make_image(path, mb, false, err);
}

/* Copies the data of a sparse file and leaves its holes as holes. */
static int sparse_copy(const char *src, const char *dst) {
  _cleanup_close_ int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -errno;
  struct stat st;
  if (fstat(in, &st) < 0) return -errno;
  _cleanup_close_ int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) return -errno;
  if (ftruncate(out, st.st_size) < 0) return -errno;
  off_t off = 0;
  while (off < st.st_size) {
    off_t data = lseek(in, off, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break; /* only a hole is left */
      return -errno;
    }
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0) return -errno;
    off_t o_in = data, o_out = data;
    while (o_in < hole) {
      ssize_t n = copy_file_range(in, &o_in, out, &o_out, hole - o_in, 0);
      if (n < 0) return -errno;
      if (n == 0) break;
    }
    off = hole;
  }
  return 0;
}

/* A copy's own filesystem UUID (the kernel's fsid, which tells sandboxes
 * apart to fanotify): the superblock's s_uuid, and its checksum. */
static int new_uuid(const char *path) {
  _cleanup_close_ int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -errno;
  unsigned char sb[1024];
  if (pread(fd, sb, sizeof sb, 1024) != sizeof sb) return -EIO;
  if (sb[0x38] != 0x53 || sb[0x39] != 0xef) return -EINVAL; /* not ext4 */
  uint32_t ro_compat, incompat;
  memcpy(&ro_compat, sb + 0x64, 4);
  memcpy(&incompat, sb + 0x60, 4);
  bool csum = ro_compat & 0x400;     /* metadata_csum */
  bool seeded = incompat & 0x2000;   /* metadata_csum_seed */
  if (csum && !seeded) return 0;      /* a template from before: keep its UUID */
  if (getrandom(sb + 0x68, 16, 0) != 16) return -EIO;
  sb[0x68 + 6] = (sb[0x68 + 6] & 0x0f) | 0x40; /* version 4 */
  sb[0x68 + 8] = (sb[0x68 + 8] & 0x3f) | 0x80;
  if (csum) {
    uint32_t c = sbx_crc32c(~0u, sb, 0x3fc);
    memcpy(sb + 0x3fc, &c, 4);
  }
  return pwrite(fd, sb, sizeof sb, 1024) == sizeof sb ? 0 : -EIO;
}

bool sbx_disk_exists(const char *id) {
  char path[1200];
  if (dk.loop) image_path(id, path, sizeof path);
  else sbx_disk_path(id, path, sizeof path);
  return access(path, F_OK) == 0;
}

int sbx_disk_ensure(const char *id, uint64_t mb, sbx_error *err) {
  char dir[1200], path[1200];
  sbx_disk_dir(id, dir, sizeof dir);
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) return sbx_err_errno(err, "INTERNAL", errno, "creating %s", dir);
  if (!dk.loop) {
    sbx_disk_path(id, path, sizeof path);
    if (mkdir(path, 0755) < 0 && errno != EEXIST) return sbx_err_errno(err, "INTERNAL", errno, "creating %s", path);
    return 0;
  }
  image_path(id, path, sizeof path);
  if (access(path, F_OK) == 0) return 0;
  if (sbx_disk_template(mb, err) < 0) return -1;
  char tpl[1200], tmp[1300];
  template_path(mb, tpl, sizeof tpl);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int r = sparse_copy(tpl, tmp);
  if (r == 0) r = new_uuid(tmp);
  if (r == 0 && rename(tmp, path) < 0) r = -errno;
  if (r < 0) {
    unlink(tmp);
    return sbx_err_errno(err, r == -ENOSPC ? "RESOURCE_LIMIT" : "INTERNAL", -r, "making the disk of sandbox '%s'", id);
  }
  return 0;
}

/* Returns an open fd of the loop device now bound to img: it must stay
 * open until the filesystem holds the device, or autoclear unbinds it. */
static int attach_loop(int img, char *dev, size_t len) {
  _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) return -errno;
  for (int attempt = 0; attempt < 16; attempt++) {
    int nr = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (nr < 0) return -errno;
    snprintf(dev, len, "/dev/loop%d", nr);
    int l = open(dev, O_RDWR | O_CLOEXEC);
    if (l < 0) return -errno;
    /* autoclear: the device lets go of the image once the filesystem does;
     * direct I/O: the image's pages are not cached twice */
    struct loop_config c = {.fd = img, .block_size = 4096,
                            .info = {.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO}};
    if (ioctl(l, LOOP_CONFIGURE, &c) == 0) return l;
    if (errno == EINVAL) { /* no direct I/O on this host filesystem */
      c.info.lo_flags &= ~LO_FLAGS_DIRECT_IO;
      c.block_size = 0;
      if (ioctl(l, LOOP_CONFIGURE, &c) == 0) return l;
    }
    int e = errno;
    close(l);
    if (e != EBUSY) return -e; /* EBUSY: another process took it first */
  }
  return -EBUSY;
}

static int fsmount_ext4(const char *dev) {
  _cleanup_close_ int fs = (int)syscall(SYS_fsopen, "ext4", FSOPEN_CLOEXEC);
  if (fs < 0) return -errno;
  if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0) return -errno;
  /* deleted files give their space back to the host */
  syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "discard", NULL, 0);
  if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) return -errno;
  int m = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  return m < 0 ? -errno : m;
}

int sbx_disk_mount(const char *id, sbx_error *err) {
  char path[1200];
  if (!dk.loop) { /* root without loop devices: the directory, as a detached bind */
    sbx_disk_path(id, path, sizeof path);
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (fd < 0) return sbx_err_errno(err, "INTERNAL", errno, "binding %s", path);
    return fd;
  }
  image_path(id, path, sizeof path);
  char what[100];
  snprintf(what, sizeof what, "the disk of sandbox '%s'", id);
  return sbx_disk_mount_image(path, what, err);
}

int sbx_disk_mount_image(const char *path, const char *what, sbx_error *err) {
  char dev[64];
  _cleanup_close_ int stale = take_stale(path, dev, sizeof dev);
  if (stale >= 0) {
    int m = fsmount_ext4(dev);
    if (m < 0) return sbx_err_errno(err, "INTERNAL", -m, "mounting %s (%s, still bound)", what, dev);
    return m;
  }
  _cleanup_close_ int img = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
  if (img < 0 && errno == EINVAL) img = open(path, O_RDWR | O_CLOEXEC);
  if (img < 0) return sbx_err_errno(err, "INTERNAL", errno, "opening %s", path);
  for (int attempt = 0;; attempt++) {
    int r = lock_image(img);
    if (r == 0) break;
    if (r != -EAGAIN && r != -EACCES) return sbx_err_errno(err, "INTERNAL", -r, "locking %s", path);
    _cleanup_close_ int bound = find_bound(img, dev, sizeof dev);
    if (bound >= 0) {
      int m = fsmount_ext4(dev);
      if (m < 0) return sbx_err_errno(err, "INTERNAL", -m, "mounting %s (%s, in use)", what, dev);
      return m;
    }
    if (attempt == 2) return sbx_err(err, "INTERNAL", "%s is in use, yet bound to no loop device", path);
  }
  _cleanup_close_ int loop = attach_loop(img, dev, sizeof dev);
  if (loop < 0) return sbx_err_errno(err, "INTERNAL", -loop, "attaching %s to a loop device", path);
  int m = fsmount_ext4(dev);
  if (m < 0) {
    /* the loop device clears itself once its last opener is gone */
    return sbx_err_errno(err, "INTERNAL", -m, "mounting %s (%s)", what, dev);
  }
  return m;
}

/* ---- disks made ahead -------------------------------------------------- */

/* A directory of the pool and what it holds. */
static void pool_entry_remove(const char *dir) { sbx_remove_tree_at(AT_FDCWD, dir, true); }

/* A fresh copy of the template, read in through its loop device (its
 * data: the filesystem's metadata, a few hundred KiB) in a few large reads
 * not waited for, so that the mount and the sandbox's init find it cached:
 * the loop device does direct I/O, and each would otherwise wait for a
 * chain of small reads of the host's disk. */
#define READ_AHEAD_MAX (8 << 20)
static void read_ahead(int img, int loop) {
  off_t end = lseek(img, 0, SEEK_END), data = 0, total = 0;
  while (total < READ_AHEAD_MAX && (data = lseek(img, data, SEEK_DATA)) >= 0 && data < end) {
    off_t hole = lseek(img, data, SEEK_HOLE);
    if (hole <= data) break;
    off_t len = hole - data < READ_AHEAD_MAX - total ? hole - data : READ_AHEAD_MAX - total;
    posix_fadvise(loop, data, len, POSIX_FADV_WILLNEED);
    total += len;
    data = hole;
  }
}

/* A fresh disk in the helper: a copy of the template, bound to a loop
 * device and mounted detached; the mount fd goes to the daemon. It is made
 * in a directory that becomes the new sandbox's, with the other files that
 * directory gets at create already there: a new inode can take a
 * millisecond on a host's filesystem (an ext4 without a journal, after
 * many deletions), four of them a create's time. */
static int pool_make(int sock, uint64_t mb, unsigned long long seq, const char *recycled) {
  char tpl[1200], dir[1200], path[1300];
  template_path(mb, tpl, sizeof tpl);
  snprintf(dir, sizeof dir, "%s/pool/%llu", dk.state, seq);
  /* a destroyed sandbox's directory, and its files but the image, serve
   * again (see recycle) */
  snprintf(path, sizeof path, "%s/recycle/%s", dk.state, recycled ? recycled : "");
  bool kept = recycled && *recycled && !strchr(recycled, '/');
  if (kept) { /* an image a loop device still holds is left to it, emptied, before the directory serves */
    char img[1400];
    snprintf(img, sizeof img, "%s/disk.img", path);
    _cleanup_close_ int old = open(img, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (old < 0 ? errno != ENOENT : lock_image(old) < 0) {
      if (old >= 0) (void)!ftruncate(old, 0);
      unlink(img);
    }
  }
  bool reused = kept && rename(path, dir) == 0;
  if (!reused && mkdir(dir, 0700) < 0) return -errno;
  static const struct {
    const char *name;
    mode_t mode;
  } files[] = {{SBX_FILE_MEMINFO, 0644}, {SBX_FILE_CPU_ONLINE, 0644}, {SBX_FILE_RECORD ".tmp", 0600}};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(files); i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
    int f = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, files[i].mode);
    if (f >= 0) close(f);
  }
  snprintf(path, sizeof path, "%s/disk.img", dir);
  int r = sparse_copy(tpl, path);
  if (r == 0) r = new_uuid(path);
  if (r < 0) {
    pool_entry_remove(dir);
    return r;
  }
  _cleanup_close_ int img = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
  if (img < 0 && errno == EINVAL) img = open(path, O_RDWR | O_CLOEXEC);
  if (img < 0) return -errno;
  char dev[64];
  _cleanup_close_ int loop = lock_image(img) < 0 ? -EBUSY : attach_loop(img, dev, sizeof dev);
  if (loop < 0) {
    pool_entry_remove(dir);
    return loop;
  }
  read_ahead(img, loop);
  int m = fsmount_ext4(dev);
  if (m < 0) {
    pool_entry_remove(dir);
    return m;
  }
  /* reads the layout in and writes once (the journal and the allocation
   * bitmaps are loaded), so the sandbox's init finds its disk warm */
  sbx_rootfs_layout(m);
  int t = openat(m, "work", O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
  if (t >= 0) close(t);
  r = sbx_send_fds(sock, dir, strlen(dir), &m, 1, 0) < 0 ? -errno : 0;
  close(m);
  if (r < 0) pool_entry_remove(dir);
  return r;
}

/* The helper: a disk for each "n" or "r<seq>" the daemon sends, a shut
 * down or checkpoint for each fd, until it hangs up. The image of a disk
 * shut down for good ("s<seq>": kept, see recycle) is truncated once the
 * helper has had nothing to do for TRIM_QUIET_MS, the oldest first, or
 * once it has waited TRIM_LATE_MS: on a host filesystem mounted with
 * discard, freeing an image's blocks sends the host's disk discards that
 * the disks being made and the sandboxes starting wait behind (creates
 * back to back right after many destroys took twice as long). */
#define TRIM_QUIET_MS 20
#define TRIM_LATE_MS 3000
typedef struct {
  unsigned long long seq;
  uint64_t at;
} trim_entry;

/* Truncates the oldest of the n waiting and takes it off the list. */
static void trim_kept(trim_entry *trim, int *n) {
  unsigned long long seq = trim[0].seq;
  memmove(&trim[0], &trim[1], (size_t)--*n * sizeof trim[0]);
  char path[1300];
  snprintf(path, sizeof path, "%s/recycle/%llu/disk.img", dk.state, seq);
  (void)!truncate(path, 0); /* gone already when the directory served again */
  /* its record was written over with zeros (see recycle): on the disk too
   * from here on, not only in the cache */
  snprintf(path, sizeof path, "%s/recycle/%llu/" SBX_FILE_RECORD ".tmp", dk.state, seq);
  _cleanup_close_ int rec = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (rec >= 0) fdatasync(rec);
}

/* How long the helper may wait for a message before the next truncation
 * (-1: none is due). quiet: it has had nothing to do for a while. */
static int trim_wait(int ntrim, uint64_t oldest, bool quiet) {
  if (!ntrim) return -1;
  uint64_t age = sbx_now_ms() - oldest;
  if (quiet || age >= TRIM_LATE_MS) return 0;
  return (int)(TRIM_LATE_MS - age < TRIM_QUIET_MS ? TRIM_LATE_MS - age : TRIM_QUIET_MS);
}

static _Noreturn void pool_main(int sock, uint64_t mb) {
  sbx_child_unblock();
  prctl(PR_SET_NAME, "sbx-disks");
  /* nothing of the daemon's held but its socket: the daemon's lock above
   * all, which a daemon started after a kill -9 must be able to take */
  if (sock != 3) {
    dup2(sock, 3);
    sock = 3;
  }
  close_range(4, ~0U, 0);
  trim_entry trim[RECYCLE_MAX]; /* oldest first */
  unsigned long long seq = 0;
  int ntrim = 0;
  bool quiet = false, late_done = false;
  char msg[32];
  int fd, nfds;
  for (;;) {
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int wait = trim_wait(ntrim, ntrim ? trim[0].at : 0, quiet), r = 1;
    /* one late is truncated before each message while messages wait */
    bool late = !quiet && wait == 0 && !late_done;
    if (late || (wait >= 0 && (r = poll(&p, 1, wait)) == 0)) {
      trim_kept(trim, &ntrim);
      quiet = !late; /* the rest follow while nothing comes */
      late_done = late;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    quiet = late_done = false;
    ssize_t n = sbx_recv_fds(sock, msg, sizeof msg - 1, &fd, 1, &nfds, 0);
    if (n < 1) break;
    msg[n] = 0;
    if (nfds == 1) { /* "s" and a discarded disk: shut it down; "c": checkpoint it */
      uint32_t none = 0;
      if (msg[0] == 'c') ioctl(fd, EXT4_IOC_CHECKPOINT, &none);
      else shut_down(fd);
      close(fd);
      char *end;
      unsigned long long kept = msg[0] == 's' && msg[1] ? strtoull(msg + 1, &end, 10) : 0;
      if (kept && !*end) {
        if (ntrim == RECYCLE_MAX) trim_kept(trim, &ntrim);
        trim[ntrim].seq = kept;
        trim[ntrim++].at = sbx_now_ms();
      }
    } else if (pool_make(sock, mb, ++seq, msg[0] == 'r' ? msg + 1 : NULL) < 0) {
      (void)!send(sock, "", 0, MSG_NOSIGNAL); /* an empty message: none this time */
    }
  }
  _exit(0);
}

/* Asks the helper for a disk, and for any whose request found its socket
 * full (checkpoints queued there too): a request lost would leave the pool
 * short for good. "n" makes one in a new directory, "r<seq>" in a kept one. */
static void pool_ask(int more) {
  dk.pool.owed += more;
  while (dk.pool.owed > 0) {
    char msg[32] = "n";
    int len = dk.recycle.n ? snprintf(msg, sizeof msg, "r%llu", dk.recycle.seq[0]) : 1;
    if (send(dk.pool.sock, msg, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT) != len) break;
    if (dk.recycle.n) memmove(dk.recycle.seq, dk.recycle.seq + 1, --dk.recycle.n * sizeof dk.recycle.seq[0]);
    dk.pool.owed--;
  }
}

/* Hands a disk thrown away to the helper (msg "s" or "s<seq>", see
 * pool_main), which shuts the filesystem of shut down, so no reply waits
 * for a journal's abort; done here when it cannot. True: the helper took
 * it. */
static bool hand_over(const char *msg, int shut) {
  bool sent = dk.pool.sock >= 0 && sbx_send_fds(dk.pool.sock, msg, strlen(msg), &shut, 1, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0;
  if (!sent) shut_down(shut);
  close(shut);
  return sent;
}

/* A destroyed sandbox's directory, kept for a disk made ahead: on a host
 * filesystem where a new inode is slow (an ext4 without a journal, after
 * many deletions: each one skips the inodes deleted in the last 30 s), a
 * create and a destroy each cost a directory and four files made and
 * deleted. Its record is emptied and whatever else it holds deleted, but
 * its image when its filesystem is shut down (shut, an fd on it, is
 * closed): the helper does that, and truncates the image to nothing as
 * soon as no other work waits (its space given back within milliseconds,
 * where it used to wait for the loop device to let go of it); the image
 * is only used again once no loop device holds it (pool_make). False:
 * nothing was done. */
static bool recycle(const char *dir, int shut) {
  if (dk.pool.sock < 0 || dk.recycle.n >= RECYCLE_MAX) return false;
  /* moved first: a daemon killed from here on leaves it where the next
   * one deletes it at start */
  unsigned long long seq = dk.recycle.next + 1;
  char to[1300], msg[32];
  snprintf(to, sizeof to, "%s/recycle/%llu", dk.state, seq);
  if (rename(dir, to) < 0) return false;
  _cleanup_close_ int d = open(to, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  bool ok = d >= 0;
  if (ok) {
    renameat(d, SBX_FILE_RECORD, d, SBX_FILE_RECORD ".tmp");
    /* written over with zeros, not truncated: a block freed on a host
     * filesystem mounted with discard is a discard the loop waits for,
     * and the next record is written over it (sbx_write_atomic) */
    _cleanup_close_ int rec = openat(d, SBX_FILE_RECORD ".tmp", O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    ok = rec < 0 ? errno == ENOENT : fstat(rec, &st) == 0;
    static const char zeros[4096];
    for (off_t at = 0, n; ok && rec >= 0 && at < st.st_size; at += n) {
      n = st.st_size - at < (off_t)sizeof zeros ? st.st_size - at : (off_t)sizeof zeros;
      ok = pwrite(rec, zeros, (size_t)n, at) == n;
    }
  }
  int dd = ok ? dup(d) : -1;
  DIR *list = dd >= 0 ? fdopendir(dd) : NULL;
  if (!list && dd >= 0) close(dd);
  ok = list != NULL;
  for (struct dirent *e; ok && (e = readdir(list));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, SBX_FILE_MEMINFO) &&
        strcmp(e->d_name, SBX_FILE_CPU_ONLINE) && strcmp(e->d_name, SBX_FILE_RECORD ".tmp") &&
        (shut < 0 || strcmp(e->d_name, "disk.img")))
      ok = unlinkat(d, e->d_name, 0) == 0;
  if (list) closedir(list);
  dk.recycle.next = seq;
  if (!ok) { /* not fit to serve again: deleted as before */
    remove_in_background(to);
    return false;
  }
  dk.recycle.seq[dk.recycle.n++] = seq;
  if (shut < 0) return true;
  snprintf(msg, sizeof msg, "s%llu", seq);
  if (!hand_over(msg, shut)) {
    snprintf(to + strlen(to), sizeof to - strlen(to), "/disk.img");
    (void)!truncate(to, 0);
  }
  return true;
}

static void pool_readable(uv_poll_t *p, int status, int events) {
  (void)p;
  char path[1200];
  struct iovec iov = {path, sizeof path - 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t n = status < 0 ? -1 : recvmsg(dk.pool.sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  int fd = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); n > 0 && c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
  if (n < 0 || (n == 0 && fd < 0 && msg.msg_flags == 0 && (status < 0 || (events & UV_DISCONNECT)))) {
    /* the helper is gone: no pool */
    sbx_disk_pool_stop();
    return;
  }
  pool_ask(0);
  if (fd < 0) return; /* it could not make one; the next take asks again */
  path[n] = 0;
  if (dk.pool.n >= POOL_SIZE) { /* never asked for: cannot happen, but do not leak it */
    close(fd);
    pool_entry_remove(path);
    return;
  }
  dk.pool.ready[dk.pool.n].fd = fd;
  snprintf(dk.pool.ready[dk.pool.n].path, sizeof dk.pool.ready[0].path, "%s", path);
  dk.pool.n++;
  if (dk.pool.on_fresh) dk.pool.on_fresh();
}

int sbx_disk_pool_start(uv_loop_t *loop, uint64_t mb, void (*on_fresh)(void)) {
  if (!dk.loop || dk.pool.sock >= 0) return 0;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -errno;
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid < 0) {
    close(sv[0]), close(sv[1]);
    return -errno;
  }
  if (pid == 0) {
    close(sv[0]);
    pool_main(sv[1], mb);
  }
  close(sv[1]);
  dk.pool.sock = sv[0];
  dk.pool.pid = pid;
  dk.pool.mb = mb;
  dk.pool.n = 0;
  dk.pool.owed = 0;
  dk.pool.on_fresh = on_fresh;
  uv_poll_init(loop, &dk.pool.poll, sv[0]);
  uv_poll_start(&dk.pool.poll, UV_READABLE | UV_DISCONNECT, pool_readable);
  pool_ask(POOL_SIZE);
  return 0;
}

void sbx_disk_pool_stop(void) {
  if (dk.pool.sock < 0) return;
  uv_poll_stop(&dk.pool.poll);
  uv_close((uv_handle_t *)&dk.pool.poll, NULL);
  close(dk.pool.sock); /* the helper sees the hang-up and exits */
  dk.pool.sock = -1;
  for (int i = 0; i < dk.pool.n; i++) {
    close(dk.pool.ready[i].fd);
    pool_entry_remove(dk.pool.ready[i].path);
  }
  dk.pool.n = 0;
  if (dk.pool.pid > 0) {
    kill(dk.pool.pid, SIGKILL);
    waitpid(dk.pool.pid, NULL, 0);
  }
  dk.pool.pid = 0;
  char trash[1300]; /* it may not have emptied the kept images yet */
  if (recycle_to_trash(trash, sizeof trash) == 0) remove_in_background(trash);
}

bool sbx_disk_fresh_ready(uint64_t mb) { return dk.pool.sock >= 0 && dk.pool.mb == mb && dk.pool.n > 0; }

int sbx_disk_take_fresh(const char *id, uint64_t mb) {
  if (dk.pool.sock >= 0) pool_ask(0);
  if (!sbx_disk_fresh_ready(mb)) return -1;
  char dir[1200], path[1300], img[1300];
  sbx_disk_dir(id, dir, sizeof dir);
  image_path(id, path, sizeof path);
  int i = --dk.pool.n;
  const char *from = dk.pool.ready[i].path;
  pool_ask(1);
  /* a new sandbox: the whole directory (the loop device keeps the image's
   * inode: a rename does not disturb it); one woken after a reset has its
   * directory: the image alone */
  if (rename(from, dir) == 0) return dk.pool.ready[i].fd;
  snprintf(img, sizeof img, "%s/disk.img", from);
  if ((mkdir(dir, 0700) < 0 && errno != EEXIST) || rename(img, path) < 0) {
    close(dk.pool.ready[i].fd);
    pool_entry_remove(from);
    return -1;
  }
  if (!recycle(from, -1)) pool_entry_remove(from);
  return dk.pool.ready[i].fd;
}

static void move_to_trash(const char *path, const char *id) {
  char trash[1300];
  snprintf(trash, sizeof trash, "%s/trash/%s-%llu", dk.state, id, (unsigned long long)sbx_now_us());
  if (rename(path, trash) == 0) remove_in_background(trash);
  else if (errno != ENOENT) remove_in_background(path);
}

/* The filesystem of an fd, if it is this sandbox's image on its loop
 * device (never anything else: the host's own filesystem may be an ext4 on
 * a loop device too). */
static bool on_image(int fd, const char *img) {
  struct stat st, ist;
  struct statfs sf;
  if (fstat(fd, &st) < 0 || fstatfs(fd, &sf) < 0 || sf.f_type != EXT4_SUPER_MAGIC || major(st.st_dev) != LOOP_MAJOR ||
      stat(img, &ist) < 0)
    return false;
  char dev[64];
  snprintf(dev, sizeof dev, "/dev/loop%u", minor(st.st_dev));
  _cleanup_close_ int l = loop_bound_to(dev, &ist);
  return l >= 0;
}

int sbx_disk_fd(const char *id, int rootfd) {
  if (!dk.loop) return -1;
  char path[1200], dev[64];
  image_path(id, path, sizeof path);
  _cleanup_close_ int m = -1;
  if (rootfd < 0) { /* not running: only if something still holds its image */
    _cleanup_close_ int img = open(path, O_RDWR | O_CLOEXEC); /* a write lock needs a writer */
    if (img < 0 || lock_image(img) == 0) return -1;
    _cleanup_close_ int bound = find_bound(img, dev, sizeof dev);
    if (bound < 0 || (m = fsmount_ext4(dev)) < 0) return -1;
    rootfd = m;
  }
  int fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0 && !on_image(fd, path)) close(fd), fd = -1;
  return fd;
}

void sbx_disk_discard(const char *id, int shut) {
  char path[1200];
  image_path(id, path, sizeof path);
  unlink(path);
  sbx_disk_path(id, path, sizeof path);
  move_to_trash(path, id);
  if (shut >= 0) hand_over("s", shut);
}

void sbx_disk_settle(const char *id, int rootfd) {
  if (dk.pool.sock < 0 || rootfd < 0) return;
  _cleanup_close_ int fd = sbx_disk_fd(id, rootfd);
  if (fd >= 0) (void)sbx_send_fds(dk.pool.sock, "c", 1, &fd, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void sbx_disk_remove(const char *id, int shut) {
  char dir[1200];
  sbx_disk_dir(id, dir, sizeof dir);
  if (recycle(dir, shut)) return;
  sbx_disk_discard(id, shut);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
  if (d) closedir(d);
  rmdir(dir);
}
