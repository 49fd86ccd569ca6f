#define _GNU_SOURCE
#include "files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/fsuid.h>
#include <sys/vfs.h>

/* File operations run with the filesystem identity of sandbox root (and no
 * capabilities over its files, which a change of fsuid drops): what the
 * daemon creates is owned by sandbox root, and it can do no more than
 * sandbox root could. */
typedef struct fs_identity {
  bool switched;
} fs_identity;
static fs_identity as_sandbox(sbx_sandbox *sb) {
  if (geteuid() == sb->uid_base) return (fs_identity){false};
  setfsgid(sb->uid_base);
  setfsuid(sb->uid_base);
  return (fs_identity){true};
}
static void as_daemon(fs_identity *id) {
  if (!id->switched) return;
  setfsuid(geteuid());
  setfsgid(getegid());
}
#define AS_SANDBOX(sb) _cleanup_(as_daemon) __attribute__((unused)) fs_identity fs_id_ = as_sandbox(sb)

/* resolve: more RESOLVE_ flags. With RESOLVE_CACHED, EAGAIN means a name
 * is not in the kernel's caches (a file system would be asked): returned,
 * not tried again as a rename that raced the lookup is. */
static int openat2_how(int root, const char *path, int flags, mode_t mode, uint64_t resolve) {
  struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC),
                         .mode = (flags & O_CREAT) ? mode : 0,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve};
  int fd;
  do fd = (int)syscall(SYS_openat2, root, path, &how, sizeof how);
  while (fd < 0 && errno == EAGAIN && !(resolve & RESOLVE_CACHED));
  return fd;
}

static int openat2_in(int root, const char *path, int flags, mode_t mode) {
  return openat2_how(root, path, flags, mode, 0);
}

int sbx_fs_abspath(const char *path, char out[4096], sbx_error *err) {
  if (!path || !*path) return sbx_err(err, "VALIDATION_FAILED", "path must not be empty");
  char raw[4096];
  int n = path[0] == '/' ? snprintf(raw, sizeof raw, "%s", path) : snprintf(raw, sizeof raw, "/workspace/%s", path);
  if (n >= (int)sizeof raw) return sbx_err(err, "VALIDATION_FAILED", "path is longer than 4095 bytes");
  sbx_path_clean(raw, out, 4096);
  return 0;
}

/* Kernel interfaces are not files: never read or write them for a caller. */
static int refuse_special(int fd, const char *path, sbx_error *err) {
  struct statfs s;
  if (fstatfs(fd, &s) < 0) return sbx_err_errno(err, "INTERNAL", errno, "statfs %s", path);
  switch ((unsigned long)s.f_type) {
  case PROC_SUPER_MAGIC:
  case SYSFS_MAGIC:
  case DEVPTS_SUPER_MAGIC:
  case CGROUP_SUPER_MAGIC:
  case CGROUP2_SUPER_MAGIC:
  case DEBUGFS_MAGIC:
  case SECURITYFS_MAGIC:
    return sbx_err(err, "PERMISSION_DENIED", "%s is on a kernel filesystem; use exec for it", path);
  }
  return 0;
}

static int fail_errno(sbx_error *err, int e, const char *what, const char *path) {
  /* /proc/self and the like name the daemon's own processes from here, which
   * the sandbox does not have: what is there is the kernel's, for exec */
  if (e == ENOENT && (!strncmp(path, "/proc/", 6) || !strncmp(path, "/sys/", 5)))
    return sbx_err(err, "PERMISSION_DENIED", "%s is on a kernel filesystem; use exec for it", path);
  return sbx_err_errno(err, sbx_errno_code(e), e, "%s %s", what, path);
}

/* Splits an absolute path into its parent's fd and last component. */
static int open_parent(sbx_sandbox *sb, const char *abs, char **base, sbx_error *err) {
  const char *slash = strrchr(abs, '/');
  *base = (char *)slash + 1;
  if (!**base || !strcmp(*base, ".") || !strcmp(*base, ".."))
    return sbx_err(err, "VALIDATION_FAILED", "'%s' does not name an entry", abs);
  char parent[4096];
  size_t pl = slash == abs ? 1 : (size_t)(slash - abs);
  memcpy(parent, abs, pl);
  parent[pl] = 0;
  int fd = openat2_in(sb->rootfd, parent, O_PATH | O_DIRECTORY, 0);
  if (fd < 0) return fail_errno(err, errno, "opening", parent);
  if (refuse_special(fd, parent, err) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* 1 when it made abs, 0 when abs was a directory already, -1 on error;
 * for_file: abs is to hold a file (a file there is not a directory, where
 * for mkdir -p it exists). */
static int mkdir_p_in(sbx_sandbox *sb, const char *abs, bool for_file, sbx_error *err) {
  char cur[4096];
  size_t n = strlen(abs);
  int made = 0;
  for (size_t i = 1; i <= n; i++) {
    if (abs[i] != '/' && abs[i] != 0) continue;
    memcpy(cur, abs, i);
    cur[i] = 0;
    _cleanup_close_ int fd = openat2_in(sb->rootfd, cur, O_PATH | O_DIRECTORY, 0);
    if (fd >= 0) continue;
    /* the last name a file's: it exists, not a directory (mkdir -p says so) */
    if (errno == ENOTDIR && i == n)
      return for_file ? sbx_err(err, "NOT_DIRECTORY", "%s is a file, not a directory", cur)
                      : fail_errno(err, EEXIST, "creating", cur);
    if (errno != ENOENT) return fail_errno(err, errno, "opening", cur);
    char *base;
    _cleanup_close_ int pfd = open_parent(sb, cur, &base, err);
    if (pfd < 0) return -1;
    if (mkdirat(pfd, base, 0755) == 0) made = i == n;
    else if (errno != EEXIST) return fail_errno(err, errno, "creating", cur);
  }
  return made;
}

/* In a sandbox with a bucket mount, whose server may keep a lookup waiting
 * for minutes, the daemon's loop looks names up in the kernel's caches
 * alone (files.h: "nowait"). */
static uint64_t nowait_resolve(sbx_sandbox *sb) { return sb->buckets ? RESOLVE_CACHED : 0; }

/* 0, -1 + err, or 1 when resolve has RESOLVE_CACHED and the caches do not
 * know. */
static int check_dir(sbx_sandbox *sb, const char *path, uint64_t resolve, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  _cleanup_close_ int fd = openat2_how(sb->rootfd, abs, O_PATH | O_DIRECTORY, 0, resolve);
  if (fd >= 0) return 0;
  if (errno == EAGAIN && (resolve & RESOLVE_CACHED)) return 1;
  return fail_errno(err, errno, "directory", abs);
}

int sbx_fs_check_dir(sbx_sandbox *sb, const char *path, sbx_error *err) { return check_dir(sb, path, 0, err); }

int sbx_fs_check_dir_nowait(sbx_sandbox *sb, const char *path, sbx_error *err) {
  return check_dir(sb, path, nowait_resolve(sb), err);
}

int sbx_fs_open_dir(sbx_sandbox *sb, const char *path, sbx_error *err) {
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  if (sb->rootfd < 0) return sbx_err(err, "INTERNAL", "sandbox '%s' is not running", sb->id);
  int fd = openat2_how(sb->rootfd, abs, O_PATH | O_DIRECTORY, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV);
  if (fd < 0) return fail_errno(err, errno, "opening", abs);
  return fd;
}

/* Reopens an O_PATH fd of a regular file for real I/O: devices and FIFOs
 * are never opened at all. */
static int reopen_regular(sbx_sandbox *sb, int pfd, const char *abs, int flags, sbx_error *err) {
  struct stat st;
  if (fstat(pfd, &st) < 0) return fail_errno(err, errno, "stat", abs);
  if (S_ISDIR(st.st_mode)) return sbx_err(err, "IS_DIRECTORY", "%s is a directory", abs);
  if (!S_ISREG(st.st_mode)) return sbx_err(err, "PERMISSION_DENIED", "%s is not a regular file", abs);
  if (refuse_special(pfd, abs, err) < 0) return -1;
  int fd = openat2_in(sb->rootfd, abs, flags | O_NOCTTY | O_NONBLOCK, 0);
  if (fd < 0) return fail_errno(err, errno, "opening", abs);
  struct stat st2;
  if (fstat(fd, &st2) < 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) { /* swapped meanwhile */
    close(fd);
    return sbx_err(err, "PERMISSION_DENIED", "%s changed while it was opened", abs);
  }
  return fd;
}

int sbx_fs_create(sbx_sandbox *sb, const char *path, mode_t mode, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  char *slash = strrchr(abs, '/');
  if (slash != abs) {
    *slash = 0;
    int r = mkdir_p_in(sb, abs, true, err);
    *slash = '/';
    if (r < 0) return -1;
  }
  char *base;
  _cleanup_close_ int dfd = open_parent(sb, abs, &base, err);
  if (dfd < 0) return -1;
  /* create it if absent, as sandbox root */
  int fd = openat(dfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
  if (fd >= 0) return fd;
  if (errno != EEXIST) return fail_errno(err, errno, "creating", abs);
  _cleanup_close_ int pfd = openat2_in(sb->rootfd, abs, O_PATH, 0);
  if (pfd < 0) return fail_errno(err, errno, "opening", abs);
  fd = reopen_regular(sb, pfd, abs, O_WRONLY, err);
  if (fd < 0) return -1;
  if (ftruncate(fd, 0) < 0) {
    int e = errno;
    close(fd);
    return fail_errno(err, e, "truncating", abs);
  }
  return fd;
}

/* The directory dir of the sandbox's root filesystem, made if absent,
 * reached through no symlink and no other mount (a bucket mount's server
 * could keep the daemon's loop waiting): an O_DIRECTORY fd, or -1. */
static int own_dir(sbx_sandbox *sb, const char *dir, sbx_error *err) {
  const uint64_t strict = RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV;
  int fd = openat2_how(sb->rootfd, dir, O_RDONLY | O_DIRECTORY, 0, strict);
  if (fd >= 0 || errno != ENOENT) return fd >= 0 ? fd : fail_errno(err, errno, "opening", dir);
  const char *slash = strrchr(dir, '/');
  char parent[4096];
  snprintf(parent, sizeof parent, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
  _cleanup_close_ int pfd = openat2_how(sb->rootfd, parent, O_PATH | O_DIRECTORY, 0, strict);
  if (pfd < 0) return fail_errno(err, errno, "opening", parent);
  if (mkdirat(pfd, slash + 1, 0700) < 0 && errno != EEXIST) return fail_errno(err, errno, "creating", dir);
  fd = openat(pfd, slash + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  return fd >= 0 ? fd : fail_errno(err, errno, "opening", dir);
}

struct own_file {
  int64_t mtime_ns;
  char name[NAME_MAX + 1];
};

static int by_age(const void *a, const void *b) {
  int64_t x = ((const struct own_file *)a)->mtime_ns, y = ((const struct own_file *)b)->mtime_ns;
  return x < y ? -1 : x > y;
}

int sbx_fs_own_file(sbx_sandbox *sb, const char *dir, const char *name, int keep, sbx_error *err) {
  AS_SANDBOX(sb);
  if (sb->rootfd < 0) return sbx_err(err, "INTERNAL", "sandbox '%s' is not running", sb->id);
  _cleanup_close_ int dfd = own_dir(sb, dir, err);
  if (dfd < 0) return -1;
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) return fail_errno(err, errno, "creating", name);
  /* only regular files of the directory itself are looked at: a name
   * that is anything else is never followed; at most MAX_SEEN names are
   * read, whatever they are (the sandbox may fill the directory) */
  enum { MAX_SEEN = 256 };
  struct own_file *f = calloc(MAX_SEEN, sizeof *f);
  int ld = f ? openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  DIR *d = ld >= 0 ? fdopendir(ld) : NULL;
  if (!d && ld >= 0) close(ld);
  int n = 0, seen = 0;
  for (struct dirent *e; d && seen++ < MAX_SEEN && (e = readdir(d));) {
    struct stat st;
    if (e->d_type != DT_REG || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) continue;
    f[n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    snprintf(f[n].name, sizeof f[n].name, "%s", e->d_name);
    n++;
  }
  if (d) closedir(d);
  if (n > keep) {
    qsort(f, (size_t)n, sizeof *f, by_age);
    for (int i = 0; i < n - keep; i++)
      if (strcmp(f[i].name, name)) unlinkat(dfd, f[i].name, 0);
  }
  free(f);
  return fd;
}

int sbx_fs_write(sbx_sandbox *sb, const char *path, const void *data, size_t len, sbx_error *err) {
  if (len > SBX_MAX_WRITE) return sbx_err(err, "FILE_TOO_LARGE", "writeFile takes at most %d bytes", SBX_MAX_WRITE);
  _cleanup_close_ int fd = sbx_fs_create(sb, path, 0644, err);
  if (fd < 0) return -1;
  int r = sbx_write_all(fd, data, len);
  if (r < 0) return fail_errno(err, -r, "writing", path);
  return 0;
}

int sbx_fs_read(sbx_sandbox *sb, const char *path, size_t max, char **data, size_t *len, sbx_error *err) {
  return sbx_fs_read_part(sb, path, 0, 0, max, data, len, NULL, err);
}

int sbx_fs_read_part(sbx_sandbox *sb, const char *path, uint64_t offset, size_t length, size_t max, char **data,
                     size_t *len, uint64_t *size, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  _cleanup_close_ int pfd = openat2_in(sb->rootfd, abs, O_PATH, 0);
  if (pfd < 0) return fail_errno(err, errno, "opening", abs);
  _cleanup_close_ int fd = reopen_regular(sb, pfd, abs, O_RDONLY, err);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) < 0) return fail_errno(err, errno, "stat", abs);
  if (size) *size = (uint64_t)st.st_size;
  uint64_t from = offset < (uint64_t)st.st_size ? offset : (uint64_t)st.st_size, want = (uint64_t)st.st_size - from;
  if (length && want > length) want = length;
  if (want > max)
    return sbx_err(err, "FILE_TOO_LARGE", "%s is %lld bytes; readFile returns at most %zu at once (offset and length "
                   "read it in parts; or use exec to process it)", abs, (long long)st.st_size, max);
  char *buf = malloc(want + 1);
  if (!buf) return sbx_err(err, "INTERNAL", "out of memory");
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, buf + got, want - got, (off_t)(from + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  buf[got] = 0;
  *data = buf;
  *len = got;
  return 0;
}

int sbx_fs_mkdir(sbx_sandbox *sb, const char *path, bool recursive, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  if (recursive) return mkdir_p_in(sb, abs, false, err);
  char *base;
  _cleanup_close_ int dfd = open_parent(sb, abs, &base, err);
  if (dfd < 0) return -1;
  if (mkdirat(dfd, base, 0755) < 0) return fail_errno(err, errno, "creating", abs);
  return 1;
}

/* /workspace itself is where relative paths, commands and the FUSE view
 * start: deleting or moving it is refused (what is in it may go). */
static int refuse_workspace(const char *abs, const char *what, sbx_error *err) {
  if (strcmp(abs, "/workspace")) return 0;
  return sbx_err(err, "VALIDATION_FAILED", "/workspace is the sandbox's workspace and cannot be %s (%s what is in it instead)",
                 what, !strcmp(what, "deleted") ? "delete" : "move");
}

int sbx_fs_delete(sbx_sandbox *sb, const char *path, bool recursive, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0 || refuse_workspace(abs, "deleted", err) < 0) return -1;
  char *base;
  _cleanup_close_ int dfd = open_parent(sb, abs, &base, err);
  if (dfd < 0) return -1;
  struct stat st;
  if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) return fail_errno(err, errno, "deleting", abs);
  if (S_ISDIR(st.st_mode)) {
    if (!recursive) return sbx_err(err, "IS_DIRECTORY", "%s is a directory (pass recursive: true)", abs);
    int r = sbx_remove_tree_at(dfd, base, true);
    if (r < 0) return fail_errno(err, -r, "deleting", abs);
    return 0;
  }
  if (unlinkat(dfd, base, 0) < 0) return fail_errno(err, errno, "deleting", abs);
  return 0;
}

int sbx_fs_rename(sbx_sandbox *sb, const char *from, const char *to, bool into_dir, char moved_to[4096], sbx_error *err) {
  AS_SANDBOX(sb);
  char a[4096], b[4096];
  if (sbx_fs_abspath(from, a, err) < 0 || sbx_fs_abspath(to, b, err) < 0 || refuse_workspace(a, "moved", err) < 0)
    return -1;
  char *ba, *bb;
  _cleanup_close_ int fa = open_parent(sb, a, &ba, err);
  if (fa < 0) return -1;
  if (faccessat(fa, ba, F_OK, AT_SYMLINK_NOFOLLOW) < 0) return fail_errno(err, errno, "moving", a);
  if (into_dir) {
    _cleanup_close_ int d = openat2_in(sb->rootfd, b, O_PATH | O_DIRECTORY, 0);
    if (d >= 0 && strlen(b) + strlen(ba) + 2 < sizeof b) {
      if (strcmp(b, "/")) strcat(b, "/");
      strcat(b, ba);
    }
  }
  _cleanup_close_ int fb = open_parent(sb, b, &bb, err);
  if (fb < 0) return -1;
  if (renameat(fa, ba, fb, bb) < 0) {
    if (errno == EINVAL) /* rename(2)'s only EINVAL here: the target is inside what moves */
      return sbx_err(err, "VALIDATION_FAILED", "%s cannot be moved into itself (%s)", a, b);
    return fail_errno(err, errno, "moving", a);
  }
  if (moved_to) snprintf(moved_to, 4096, "%s", b); /* where it went: inside `to`, when that is a directory */
  return 0;
}

/* As check_dir, for any kind of file. */
static int exists_in(sbx_sandbox *sb, const char *path, uint64_t resolve, bool *exists, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  int fd = openat2_how(sb->rootfd, abs, O_PATH, 0, resolve);
  if (fd >= 0) {
    close(fd);
    *exists = true;
    return 0;
  }
  if (errno == ENOENT || errno == ENOTDIR) {
    *exists = false;
    return 0;
  }
  if (errno == EAGAIN && (resolve & RESOLVE_CACHED)) return 1;
  return fail_errno(err, errno, "looking up", abs);
}

int sbx_fs_exists(sbx_sandbox *sb, const char *path, bool *exists, sbx_error *err) {
  return exists_in(sb, path, 0, exists, err);
}

bool sbx_fs_has_bash(sbx_sandbox *sb) {
  bool bash = false;
  int r = exists_in(sb, "/bin/bash", nowait_resolve(sb), &bash, NULL);
  return r == 1 || (r == 0 && bash); /* not known: sandboxes have bash as a rule, and a missing one fails the command */
}

/* Entries read in one listing, shown or not (hidden names skipped): a
 * directory of millions of names the caller did not ask for is not read
 * to its end. */
#define MAX_READ (4 * SBX_MAX_LIST)

struct walk {
  sbx_fs_list_cb cb;
  void *ud;
  bool recursive, hidden, truncated;
  int count, read;
};

static void walk_dir(struct walk *w, int dfd, const char *dpath, int depth) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (++w->read > MAX_READ) {
      w->truncated = true;
      break;
    }
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (!w->hidden && e->d_name[0] == '.') continue;
    if (w->count >= SBX_MAX_LIST) {
      w->truncated = true;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", strcmp(dpath, "/") ? dpath : "", e->d_name);
    sbx_fs_entry ent = {.name = e->d_name, .path = path, .size = st.st_size,
                        .mtime_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000,
                        .mode = st.st_mode & 07777};
    ent.type = S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "directory" : S_ISLNK(st.st_mode) ? "symlink" : "other";
    w->cb(w->ud, &ent);
    w->count++;
    if (w->recursive && S_ISDIR(st.st_mode) && depth < 64) {
      int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) continue;
      if (refuse_special(sub, path, NULL) < 0) {
        close(sub);
        continue;
      }
      walk_dir(w, sub, path, depth + 1);
      if (w->truncated) break;
    }
  }
  closedir(d);
}

int sbx_fs_list(sbx_sandbox *sb, const char *path, bool recursive, bool hidden, sbx_fs_list_cb cb, void *ud,
                bool *truncated, sbx_error *err) {
  AS_SANDBOX(sb);
  char abs[4096];
  if (sbx_fs_abspath(path, abs, err) < 0) return -1;
  int fd = openat2_in(sb->rootfd, abs, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return fail_errno(err, errno, "listing", abs);
  struct walk w = {.cb = cb, .ud = ud, .recursive = recursive, .hidden = hidden};
  walk_dir(&w, fd, abs, 0);
  if (truncated) *truncated = w.truncated;
  return w.count;
}

const char *sbx_fs_mime(const char *path, bool text) {
  static const struct {
    const char *ext, *mime;
  } t[] = {{"txt", "text/plain"},       {"md", "text/markdown"},        {"html", "text/html"},
           {"htm", "text/html"},        {"css", "text/css"},            {"csv", "text/csv"},
           {"js", "text/javascript"},   {"mjs", "text/javascript"},     {"ts", "text/typescript"},
           {"json", "application/json"}, {"xml", "application/xml"},    {"yaml", "application/yaml"},
           {"yml", "application/yaml"}, {"py", "text/x-python"},        {"c", "text/x-c"},
           {"h", "text/x-c"},           {"sh", "text/x-shellscript"},   {"png", "image/png"},
           {"jpg", "image/jpeg"},       {"jpeg", "image/jpeg"},         {"gif", "image/gif"},
           {"svg", "image/svg+xml"},    {"webp", "image/webp"},         {"pdf", "application/pdf"},
           {"zip", "application/zip"},  {"gz", "application/gzip"},     {"tar", "application/x-tar"},
           {"wasm", "application/wasm"}};
  const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
  const char *unknown = text ? "text/plain" : "application/octet-stream";
  if (!dot || (slash && dot < slash)) return unknown;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(t); i++)
    if (!strcasecmp(dot + 1, t[i].ext)) return t[i].mime;
  return unknown;
}
