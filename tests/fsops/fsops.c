/* The file-semantics suite: each call programs make, its success cases and
 * the errnos it can give, run in a directory given on the command line.
 * Prints one line per check, "name<TAB>answer", where answer is "ok",
 * "errno NAME" or a value; the tests run it on a native directory and on a
 * view of a sandbox and compare the answers. With --tap it also prints TAP
 * against the answers a native Linux filesystem gives. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

static int n, failed;
static bool tap;

static const char *ename(int e) {
  switch (e) {
#define E(x) case x: return #x;
  E(ENOENT) E(EEXIST) E(ENOTDIR) E(EISDIR) E(ENOTEMPTY) E(EINVAL) E(EBADF) E(EPERM) E(EACCES) E(EXDEV) E(ELOOP)
  E(EAGAIN) E(ENODATA) E(EOPNOTSUPP) E(EFBIG) E(ENOSPC) E(ENAMETOOLONG) E(EBUSY) E(EMLINK) E(ESPIPE) E(EROFS) E(EIO)
#undef E
  default: return "E?";
  }
}

/* Records an answer and checks it against what native Linux says. */
static void answer(const char *name, const char *want, const char *fmt, ...) {
  char got[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(got, sizeof got, fmt, ap);
  va_end(ap);
  n++;
  if (tap) {
    bool ok = !strcmp(got, want);
    if (!ok) failed++;
    printf("%s %d - %s: %s%s%s\n", ok ? "ok" : "not ok", n, name, got, ok ? "" : ", want ", ok ? "" : want);
  } else {
    printf("%s\t%s\n", name, got);
  }
}

/* r < 0: the errno's name; else "ok". */
static void res(const char *name, const char *want, int r) {
  if (r < 0) answer(name, want, "errno %s", ename(errno));
  else answer(name, want, "ok");
}

static char *slurp(const char *path, size_t *len) {
  static char buf[1 << 16];
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k < 0) return NULL;
  buf[k] = 0;
  *len = (size_t)k;
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fsops [--tap] DIR\n");
    return 2;
  }
  const char *dir = argv[argc - 1];
  tap = !strcmp(argv[1], "--tap");
  if (chdir(dir) < 0) {
    perror(dir);
    return 2;
  }
  char buf[4096];
  size_t len;
  int fd, fd2, r;
  struct stat st;

  /* create, open flags */
  umask(022);
  fd = open("a", O_CREAT | O_EXCL | O_RDWR, 0640);
  res("create O_EXCL", "ok", fd);
  res("create O_EXCL again", "errno EEXIST", open("a", O_CREAT | O_EXCL | O_RDWR, 0640));
  res("open missing", "errno ENOENT", open("missing", O_RDONLY));
  res("open O_DIRECTORY of a file", "errno ENOTDIR", open("a", O_RDONLY | O_DIRECTORY));
  answer("write", "5", "%zd", write(fd, "hello", 5));
  answer("pwrite", "3", "%zd", pwrite(fd, "XYZ", 3, 10));
  fstat(fd, &st);
  answer("size after a hole", "13", "%lld", (long long)st.st_size);
  memset(buf, 0, sizeof buf);
  ssize_t got = pread(fd, buf, 13, 0);
  answer("pread across the hole", "13 hello|00000|XYZ", "%zd %.5s|%d%d%d%d%d|%.3s", got, buf, buf[5], buf[6], buf[7],
         buf[8], buf[9], buf + 10);
  close(fd);
  fstat(-1, &st);
  stat("a", &st);
  answer("create mode", "0640", "%04o", st.st_mode & 07777);
  fd = open("a", O_WRONLY | O_APPEND);
  write(fd, "++", 2);
  close(fd);
  char *s = slurp("a", &len);
  answer("O_APPEND writes at the end", "15 ++", "%zu %.2s", len, s ? s + 13 : "?");
  fd = open("a", O_WRONLY | O_TRUNC);
  fstat(fd, &st);
  answer("O_TRUNC", "0", "%lld", (long long)st.st_size);
  res("read from O_WRONLY", "errno EBADF", read(fd, buf, 1));
  close(fd);
  fd = open("a", O_RDONLY);
  res("write to O_RDONLY", "errno EBADF", write(fd, "x", 1));
  close(fd);

  /* truncate, fallocate, offsets past 4 GiB */
  res("truncate up", "ok", truncate("a", 100000));
  stat("a", &st);
  answer("size after truncate", "100000", "%lld", (long long)st.st_size);
  res("truncate down", "ok", truncate("a", 10));
  fd = open("a", O_RDWR);
  res("ftruncate", "ok", ftruncate(fd, 4));
  res("fallocate", "ok", fallocate(fd, 0, 0, 65536));
  fstat(fd, &st);
  answer("size after fallocate", "65536", "%lld", (long long)st.st_size);
  res("fallocate keep size", "ok", fallocate(fd, FALLOC_FL_KEEP_SIZE, 65536, 65536));
  fstat(fd, &st);
  answer("size after keep-size fallocate", "65536", "%lld", (long long)st.st_size);
  pwrite(fd, "data", 4, 8192);
  res("punch hole", "ok", fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 16384));
  memset(buf, 'x', 8);
  pread(fd, buf, 4, 8192);
  answer("punched bytes read as zero", "0000", "%d%d%d%d", buf[0], buf[1], buf[2], buf[3]);
  off_t big = 5ll << 30;
  answer("pwrite past 4 GiB", "3", "%zd", pwrite(fd, "end", 3, big));
  fstat(fd, &st);
  answer("size past 4 GiB", "5368709123", "%lld", (long long)st.st_size);
  memset(buf, 0, 4);
  pread(fd, buf, 3, big);
  answer("pread past 4 GiB", "end", "%.3s", buf);
  answer("SEEK_DATA past 4 GiB", "5368709120", "%lld", (long long)lseek(fd, 1ll << 30, SEEK_DATA));
  res("fsync", "ok", fsync(fd));
  res("fdatasync", "ok", fdatasync(fd));
  close(fd);
  res("truncate a directory", "errno EISDIR", truncate(".", 0));

  /* mmap, shared and private */
  fd = open("m", O_CREAT | O_RDWR, 0644);
  ftruncate(fd, 4096);
  char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  answer("mmap shared", "ok", p == MAP_FAILED ? "failed" : "ok");
  if (p != MAP_FAILED) {
    memcpy(p, "shared", 6);
    msync(p, 4096, MS_SYNC);
    memset(buf, 0, 8);
    pread(fd, buf, 6, 0);
    answer("a shared mapping's write is in the file", "shared", "%.6s", buf);
    munmap(p, 4096);
  }
  p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (p != MAP_FAILED) {
    memcpy(p, "privat", 6);
    memset(buf, 0, 8);
    pread(fd, buf, 6, 0);
    answer("a private mapping's write is not", "shared", "%.6s", buf);
    munmap(p, 4096);
  }
  close(fd);

  /* directories, rename */
  res("mkdir", "ok", mkdir("d", 0755));
  res("mkdir existing", "errno EEXIST", mkdir("d", 0755));
  res("mkdir under a file", "errno ENOTDIR", mkdir("a/x", 0755));
  fd = open("d/f1", O_CREAT | O_WRONLY, 0644);
  close(fd);
  res("rmdir non-empty", "errno ENOTEMPTY", rmdir("d"));
  res("unlink a directory", "errno EISDIR", unlink("d"));
  res("rmdir a file", "errno ENOTDIR", rmdir("a"));
  res("rename", "ok", rename("d/f1", "d/f2"));
  res("rename missing", "errno ENOENT", rename("d/nope", "d/x"));
  fd = open("b", O_CREAT | O_WRONLY, 0644);
  write(fd, "bee", 3);
  close(fd);
  res("RENAME_NOREPLACE onto an existing file", "errno EEXIST", renameat2(AT_FDCWD, "a", AT_FDCWD, "b", RENAME_NOREPLACE));
  res("RENAME_EXCHANGE", "ok", renameat2(AT_FDCWD, "a", AT_FDCWD, "b", RENAME_EXCHANGE));
  s = slurp("a", &len);
  answer("exchanged", "bee", "%.3s", s ? s : "?");
  res("rename a file over a directory", "errno EISDIR", rename("a", "d"));
  mkdir("e", 0755);
  res("rename a directory over a non-empty one", "errno ENOTEMPTY", rename("e", "d"));
  mkdir("e2", 0755);
  res("rename a directory over an empty one", "ok", rename("e", "e2"));
  res("rename a directory into itself", "errno EINVAL", rename("d", "d/sub"));
  res("rmdir", "ok", rmdir("e2"));

  /* unlink of an open file */
  fd = open("u", O_CREAT | O_RDWR, 0644);
  write(fd, "alive", 5);
  res("unlink an open file", "ok", unlink("u"));
  memset(buf, 0, 8);
  got = pread(fd, buf, 5, 0);
  answer("it stays readable", "5:alive", "%zd:%.5s", got, buf);
  res("and gone by name", "errno ENOENT", access("u", F_OK));
  close(fd);

  /* symlinks and hard links */
  res("symlink", "ok", symlink("b", "l"));
  r = (int)readlink("l", buf, sizeof buf);
  answer("readlink", "1:b", "%d:%.*s", r, r > 0 ? r : 0, buf);
  res("readlink of a file", "errno EINVAL", (int)readlink("a", buf, sizeof buf));
  lstat("l", &st);
  answer("lstat of a symlink", "symlink", "%s", S_ISLNK(st.st_mode) ? "symlink" : "other");
  res("open O_NOFOLLOW of a symlink", "errno ELOOP", open("l", O_RDONLY | O_NOFOLLOW));
  s = slurp("l", &len);
  answer("read through a symlink", "ok", "%s", s ? "ok" : "failed");
  res("link", "ok", link("a", "h"));
  stat("a", &st);
  answer("nlink after link", "2", "%lu", (unsigned long)st.st_nlink);
  res("link a directory", "errno EPERM", link("d", "dl"));
  res("link onto an existing name", "errno EEXIST", link("a", "b"));
  unlink("h");

  /* attributes */
  res("chmod", "ok", chmod("a", 0600));
  stat("a", &st);
  answer("mode after chmod", "0600", "%04o", st.st_mode & 07777);
  /* access(2) and its X_OK: for root, any x bit */
  res("access R_OK|W_OK", "ok", access("a", R_OK | W_OK));
  res("access X_OK without an x bit", "errno EACCES", access("a", X_OK));
  chmod("a", 0700);
  res("access X_OK with one", "ok", access("a", X_OK));
  chmod("a", 0600);
  res("access X_OK of a directory", "ok", access("d", X_OK));
  res("chown to its own owner", "ok", chown("a", st.st_uid, st.st_gid));
  res("chown leaving both", "ok", chown("a", -1, -1));
  struct timespec ts[2] = {{1000000000, 123456789}, {1200000000, 987654321}};
  res("utimensat", "ok", utimensat(AT_FDCWD, "a", ts, 0));
  stat("a", &st);
  answer("nanosecond times", "1000000000.123456789 1200000000.987654321", "%ld.%09ld %ld.%09ld", st.st_atim.tv_sec,
         st.st_atim.tv_nsec, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  struct timespec omit[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  res("utimensat UTIME_NOW", "ok", utimensat(AT_FDCWD, "a", omit, 0));
  struct statfs sf;
  res("statfs", "ok", statfs(".", &sf));
  answer("statfs has space", "yes", "%s", sf.f_blocks > 0 && sf.f_bavail > 0 ? "yes" : "no");

  /* extended attributes */
  res("setxattr user", "ok", setxattr("a", "user.sbx", "value", 5, 0));
  memset(buf, 0, 8);
  answer("getxattr", "5:value", "%zd:%.5s", getxattr("a", "user.sbx", buf, sizeof buf), buf);
  answer("getxattr size", "5", "%zd", getxattr("a", "user.sbx", NULL, 0));
  res("getxattr missing", "errno ENODATA", (int)getxattr("a", "user.nope", buf, sizeof buf));
  ssize_t ln = listxattr("a", buf, sizeof buf);
  answer("listxattr has it", "yes", "%s", ln > 0 && memmem(buf, ln, "user.sbx", 9) ? "yes" : "no");
  res("setxattr XATTR_CREATE on existing", "errno EEXIST", setxattr("a", "user.sbx", "v", 1, XATTR_CREATE));
  res("removexattr", "ok", removexattr("a", "user.sbx"));
  res("removexattr missing", "errno ENODATA", removexattr("a", "user.sbx"));

  /* locks */
  fd = open("a", O_RDWR);
  res("flock LOCK_EX", "ok", flock(fd, LOCK_EX | LOCK_NB));
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10};
  res("fcntl F_SETLK", "ok", fcntl(fd, F_SETLK, &fl));
  pid_t kid = fork();
  if (kid == 0) {
    int f2 = open("a", O_RDWR);
    int a = flock(f2, LOCK_EX | LOCK_NB) < 0 ? errno : 0;
    struct flock l2 = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10};
    int b = fcntl(f2, F_SETLK, &l2) < 0 ? errno : 0;
    _exit((a == EWOULDBLOCK ? 1 : 0) | (b == EAGAIN || b == EACCES ? 2 : 0));
  }
  int wst;
  waitpid(kid, &wst, 0);
  answer("another process meets both locks", "3", "%d", WEXITSTATUS(wst));
  close(fd);

  /* readdir with seek */
  mkdir("r", 0755);
  for (int i = 0; i < 50; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "r/e%02d", i);
    close(open(nm, O_CREAT | O_WRONLY, 0644));
  }
  DIR *dp = opendir("r");
  int count = 0;
  long mark = 0;
  char at_mark[256] = "";
  struct dirent *de;
  while ((de = readdir(dp))) {
    if (count == 20) mark = telldir(dp);
    if (count == 21) snprintf(at_mark, sizeof at_mark, "%s", de->d_name);
    count++;
  }
  answer("readdir sees every entry", "52", "%d", count);
  seekdir(dp, mark);
  de = readdir(dp);
  answer("seekdir returns to the same entry", "yes", "%s", de && !strcmp(de->d_name, at_mark) ? "yes" : "no");
  rewinddir(dp);
  count = 0;
  while (readdir(dp)) count++;
  answer("rewinddir", "52", "%d", count);
  closedir(dp);

  /* names */
  char longname[300];
  memset(longname, 'n', 256);
  longname[256] = 0;
  res("a name of 256 bytes", "errno ENAMETOOLONG", open(longname, O_CREAT | O_WRONLY, 0644));
  fd2 = open(".", O_RDONLY | O_DIRECTORY);
  res("O_DIRECTORY of a directory", "ok", fd2);
  close(fd2);
  if (tap) printf("1..%d\n", n);
  return tap && failed ? 1 : 0;
}
