/* sbx cp: files between the host and a sandbox, as docker cp copies them:
 * modes, mtimes and symlinks kept, directories whole, `-` a tar stream.
 * tar runs inside the sandbox on a socket the daemon hands over
 * (sbx/cp/open). What comes out of a sandbox is untrusted: the host side
 * unpacks it with the small reader below, which makes only directories,
 * regular files, symlinks and hard links, under the destination alone,
 * never follows a link on its way there and drops set-id bits. */
#define _GNU_SOURCE
#include "cp.h"

#include <fcntl.h>
#include <libgen.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ---- the tar reader ------------------------------------------------------ */

typedef struct reader {
  int fd;
  bool eof;
} reader;

static int read_full(reader *r, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(r->fd, (char *)p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    got += k;
  }
  return 0;
}

static int skip(reader *r, uint64_t n) {
  char buf[65536];
  while (n > 0) {
    size_t k = n < sizeof buf ? n : sizeof buf;
    if (read_full(r, buf, k) < 0) return -1;
    n -= k;
  }
  return 0;
}

static uint64_t number(const char *f, size_t len) {
  if ((unsigned char)f[0] & 0x80) { /* base-256, for sizes past 8 GiB */
    uint64_t v = (unsigned char)f[0] & 0x7f;
    for (size_t i = 1; i < len; i++) v = v << 8 | (unsigned char)f[i];
    return v;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < len && f[i]; i++)
    if (f[i] >= '0' && f[i] <= '7') v = v * 8 + (f[i] - '0');
  return v;
}

/* A GNU long name or a pax value: the data of a header entry, bounded. */
static char *read_text(reader *r, uint64_t size) {
  if (size > 1 << 20) return NULL;
  char *t = malloc(size + 1);
  uint64_t padded = (size + 511) & ~511ull;
  if (!t || read_full(r, t, size) < 0 || skip(r, padded - size) < 0) {
    free(t);
    return NULL;
  }
  t[size] = 0;
  return t;
}

static void pax_get(const char *t, const char *key, char **out) {
  size_t kl = strlen(key);
  for (const char *p = t; *p;) {
    char *sp;
    long len = strtol(p, &sp, 10);
    if (len <= 0 || *sp != ' ') return;
    if (!strncmp(sp + 1, key, kl) && sp[1 + kl] == '=') {
      const char *v = sp + 2 + kl, *end = p + len - 1; /* the record ends with \n */
      if (end < v) return;
      free(*out);
      *out = strndup(v, end - v);
    }
    if ((size_t)len > strlen(p)) return;
    p += len;
  }
}

typedef struct extract {
  const char *dest; /* the host path the archive's top entry becomes */
  const char *top;  /* that entry's name in the archive */
  int rootfd;       /* dest, once it is a directory */
  sbx_strv dirs;    /* directories whose mode and mtime are set at the end */
  sbx_strv dir_meta;
  bool warned;
  bool top_failed; /* said once: what would go inside it is skipped quietly */
} extract;

/* The archive name, made relative to the top entry: "" for the top entry,
 * NULL when it is not under it or has a `..`. */
static char *relative(const extract *e, const char *name) {
  while (!strncmp(name, "./", 2)) name += 2;
  size_t tl = strlen(e->top);
  if (strncmp(name, e->top, tl) || (name[tl] && name[tl] != '/')) return NULL;
  sbx_buf b = {0};
  const char *p = name + tl;
  while (*p) {
    while (*p == '/') p++;
    const char *q = strchrnul(p, '/');
    size_t n = q - p;
    if (n == 2 && !strncmp(p, "..", 2)) {
      sbx_buf_free(&b);
      return NULL;
    }
    if (n && !(n == 1 && *p == '.')) {
      if (b.len) sbx_buf_append(&b, "/", 1);
      sbx_buf_append(&b, p, n);
    }
    p = q;
  }
  sbx_buf_append(&b, "", 1);
  return b.data;
}

/* The directory holding rel's last component, walked from the root without
 * following any symlink; *last points into rel. */
static int parent_of(const extract *e, char *rel, const char **last) {
  int fd = fcntl(e->rootfd, F_DUPFD_CLOEXEC, 0);
  char *p = rel, *slash;
  while (fd >= 0 && (slash = strchr(p, '/'))) {
    *slash = 0;
    int next = openat(fd, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    *slash = '/';
    close(fd);
    fd = next;
    p = slash + 1;
  }
  *last = p;
  return fd;
}

/* A file's data, with its holes kept: blocks of zeros are skipped, not
 * written, so a sparse file (a sandbox's 300 MB of nothing) takes no more
 * of the host's disk than of the sandbox's. */
static int write_data(reader *r, int fd, uint64_t size, bool sparse) {
  char buf[65536];
  int rc = 0;
  uint64_t left = size;
  while (left > 0) {
    size_t k = left < sizeof buf ? left : sizeof buf;
    if (read_full(r, buf, k) < 0) return -1;
    bool hole = sparse && k == sizeof buf && !buf[0] && !memcmp(buf, buf + 1, k - 1);
    if (rc == 0 && (hole ? lseek(fd, (off_t)k, SEEK_CUR) < 0 : sbx_write_all(fd, buf, k) < 0))
      rc = -2; /* keep reading the archive */
    left -= k;
  }
  if (rc == 0 && sparse && ftruncate(fd, (off_t)size) < 0) rc = -2; /* a hole at the end */
  if (skip(r, ((size + 511) & ~511ull) - size) < 0) return -1;
  return rc;
}

/* Text from the sandbox (its names, its tar's words), as the terminal
 * may show it: control characters (an escape sequence that clears the
 * screen or writes a line of its own) as \xNN; newlines kept in lines. */
static const char *shown(const char *s, bool lines) {
  static char out[2][4096];
  static int which;
  char *o = out[which ^= 1];
  size_t n = 0;
  for (; s && *s && n + 5 < sizeof out[0]; s++) {
    unsigned char ch = (unsigned char)*s;
    if ((ch < 0x20 && !(lines && (ch == '\n' || ch == '\t'))) || ch == 0x7f) n += (size_t)sprintf(o + n, "\\x%02x", ch);
    else o[n++] = (char)ch;
  }
  o[n] = 0;
  return o;
}

static int fail(const char *what, const char *path) {
  int e = errno;
  fprintf(stderr, "sbx cp: %s %s: %s\n", what, shown(path, false), strerror(e));
  return 1;
}

/* One entry; 0, 1 for an error that lets the rest go on, -1 when the
 * archive cannot be read on. */
static int entry(extract *e, reader *r, char type, const char *name, const char *link, uint64_t size, mode_t mode,
                 int64_t mtime) {
  mode &= 07777 & ~(S_ISUID | S_ISGID); /* a sandbox makes no set-id file here */
  struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
  char *rel = relative(e, name);
  bool data = type == '0' || type == '\0' || type == '7';
  if (!rel) {
    fprintf(stderr, "sbx cp: skipping %s: not under %s\n", shown(name, false), shown(e->top, false));
    return data && skip(r, (size + 511) & ~511ull) < 0 ? -1 : 1;
  }
  int rc = 0;
  if (!*rel) { /* the top entry: the destination itself */
    if (type == '5') {
      char meta[64];
      snprintf(meta, sizeof meta, "%o %lld", mode, (long long)mtime);
      bool made = mkdir(e->dest, 0700) == 0;
      if (!made && errno != EEXIST) rc = fail("making", e->dest), e->top_failed = true;
      else if (e->rootfd < 0 && (e->rootfd = open(e->dest, O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        rc = fail("opening", e->dest), e->top_failed = true;
      else if (made) sbx_strv_add(&e->dirs, ""), sbx_strv_add(&e->dir_meta, meta);
      /* one of the host's that was there keeps its mode: the sandbox's
       * archive does not open a directory of the host's (1777 on 0700) */
    } else if (data) {
      int fd = open(e->dest, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) rc = fail("writing", e->dest);
      /* a destination that is not a regular file (/dev/null, a FIFO) gets
       * the data alone: neither the sandbox's mode, nor its mtime, nor holes */
      struct stat ds;
      bool regular = fd >= 0 && fstat(fd, &ds) == 0 && S_ISREG(ds.st_mode);
      int w = write_data(r, fd, size, regular);
      if (w == -1) rc = -1;
      else if (fd >= 0 && (w < 0 || (regular && (fchmod(fd, mode) < 0 || futimens(fd, ts) < 0))))
        rc = fail("writing", e->dest);
      if (fd >= 0) close(fd);
    } else if (type == '2') {
      unlink(e->dest);
      if (symlink(link, e->dest) < 0) rc = fail("making", e->dest);
      else utimensat(AT_FDCWD, e->dest, ts, AT_SYMLINK_NOFOLLOW);
    } else {
      fprintf(stderr, "sbx cp: %s is neither a file, a directory nor a symlink\n", shown(name, false));
      rc = 1;
    }
    free(rel);
    return rc;
  }
  if (e->rootfd < 0) {
    free(rel);
    if (!e->top_failed) fprintf(stderr, "sbx cp: %s: not in a directory\n", shown(name, false));
    return data && skip(r, (size + 511) & ~511ull) < 0 ? -1 : 1;
  }
  const char *last;
  int dir = parent_of(e, rel, &last);
  if (dir < 0) {
    rc = fail("reaching", name);
    if (data && skip(r, (size + 511) & ~511ull) < 0) rc = -1;
    free(rel);
    return rc;
  }
  /* what stands there already goes unless both are directories */
  struct stat st;
  bool exists = fstatat(dir, last, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && !(type == '5' && S_ISDIR(st.st_mode)) && unlinkat(dir, last, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
    rc = fail("replacing", name);
  if (rc) {
  } else if (type == '5') {
    if (!exists && mkdirat(dir, last, 0700) < 0) rc = fail("making", name);
    else if (!exists) { /* (as the top one) */
      char meta[64];
      snprintf(meta, sizeof meta, "%o %lld", mode, (long long)mtime);
      sbx_strv_add(&e->dirs, rel);
      sbx_strv_add(&e->dir_meta, meta);
    }
  } else if (data) {
    int fd = openat(dir, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) rc = fail("writing", name);
    int w = write_data(r, fd, size, true); /* made here: a regular file */
    if (w == -1) rc = -1;
    else if (fd >= 0 && (w < 0 || fchmod(fd, mode) < 0 || futimens(fd, ts) < 0)) rc = fail("writing", name);
    if (fd >= 0) close(fd);
    data = false; /* read */
  } else if (type == '2') {
    if (symlinkat(link, dir, last) < 0) rc = fail("making", name);
    else utimensat(dir, last, ts, AT_SYMLINK_NOFOLLOW);
  } else if (type == '1') {
    char *trel = relative(e, link);
    const char *tlast;
    int tdir = trel && *trel ? parent_of(e, trel, &tlast) : -1;
    if (tdir < 0 || linkat(tdir, tlast, dir, last, 0) < 0) rc = fail("linking", name);
    if (tdir >= 0) close(tdir);
    free(trel);
  } else {
    if (!e->warned) fprintf(stderr, "sbx cp: skipping %s and other devices, fifos or sockets\n", shown(name, false));
    e->warned = true;
  }
  close(dir);
  free(rel);
  if (data && rc >= 0 && skip(r, (size + 511) & ~511ull) < 0) rc = -1;
  return rc;
}

/* Unpacks the archive on fd so that its top entry `top` becomes dest. */
static int untar(int fd, const char *dest, const char *top) {
  reader r = {.fd = fd};
  extract e = {.dest = dest, .top = top, .rootfd = -1};
  char *longname = NULL, *longlink = NULL, *paxpath = NULL, *paxlink = NULL;
  int rc = 0, zeros = 0;
  for (;;) {
    unsigned char h[512];
    if (read_full(&r, h, sizeof h) < 0) break; /* the end, or tar failed: done says */
    bool zero = true;
    for (int i = 0; i < 512 && zero; i++) zero = !h[i];
    if (zero) {
      if (++zeros == 2) break;
      continue;
    }
    zeros = 0;
    char type = h[156];
    uint64_t size = number((char *)h + 124, 12);
    if (type == 'L' || type == 'K' || type == 'x') {
      char *t = read_text(&r, size);
      if (!t) {
        rc = 1;
        break;
      }
      if (type == 'L') free(longname), longname = t;
      else if (type == 'K') free(longlink), longlink = t;
      else pax_get(t, "path", &paxpath), pax_get(t, "linkpath", &paxlink), free(t);
      continue;
    }
    if (type == 'g') {
      if (skip(&r, (size + 511) & ~511ull) < 0) break;
      continue;
    }
    char name[260] = "", link[101];
    if (!memcmp(h + 257, "ustar\0", 6) && h[345]) /* POSIX: a prefix */
      snprintf(name, sizeof name, "%.155s/", (char *)h + 345);
    snprintf(name + strlen(name), sizeof name - strlen(name), "%.100s", (char *)h);
    snprintf(link, sizeof link, "%.100s", (char *)h + 157);
    const char *n = paxpath ? paxpath : longname ? longname : name;
    const char *l = paxlink ? paxlink : longlink ? longlink : link;
    int k = entry(&e, &r, type, n, l, size, (mode_t)number((char *)h + 100, 8), (int64_t)number((char *)h + 136, 12));
    free(longname), free(longlink), free(paxpath), free(paxlink);
    longname = longlink = paxpath = paxlink = NULL;
    if (k < 0) {
      rc = 1;
      break;
    }
    rc |= k;
  }
  free(longname), free(longlink), free(paxpath), free(paxlink);
  /* directories last, deepest first: their mtimes stay as in the sandbox */
  for (size_t i = e.dirs.n; i-- > 0;) {
    unsigned mode;
    long long mtime;
    if (sscanf(e.dir_meta.v[i], "%o %lld", &mode, &mtime) != 2) continue;
    struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
    int fd;
    if (!*e.dirs.v[i]) {
      fd = fcntl(e.rootfd, F_DUPFD_CLOEXEC, 0);
    } else {
      const char *last;
      int dir = parent_of(&e, e.dirs.v[i], &last);
      fd = dir < 0 ? -1 : openat(dir, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir >= 0) close(dir);
    }
    if (fd >= 0) {
      fchmod(fd, mode);
      futimens(fd, ts);
      close(fd);
    }
  }
  sbx_strv_clear(&e.dirs);
  sbx_strv_clear(&e.dir_meta);
  if (e.rootfd >= 0) close(e.rootfd);
  return rc;
}

/* ---- talking to the daemon ----------------------------------------------- */

static int cp_open(sbx_client *c, const char *id, const char *op, const char *path, const char *name) {
  char err[600];
  json_t *p = json_pack("{s:s, s:s, s:s}", "sandboxId", id, "op", op, "path", path);
  if (name) json_object_set_new(p, "name", json_string(name));
  json_t *r = sbx_client_request(c, "sbx/cp/open", p, err, sizeof err);
  if (!r) {
    fprintf(stderr, "sbx cp: %s\n", err);
    return -1;
  }
  json_decref(r);
  int fd = c->passed_fd;
  c->passed_fd = -1;
  if (fd < 0) fprintf(stderr, "sbx cp: the daemon sent no stream\n");
  return fd;
}

/* How the sandbox's tar ended: 0, or 1 with what it said of id:what. */
static int cp_done(sbx_client *c, const char *id, const char *path) {
  char what[1200];
  snprintf(what, sizeof what, "%s:%s", id, path);
  for (;;) {
    json_t *m = sbx_client_next(c);
    if (!m) {
      fprintf(stderr, "sbx cp: the daemon closed the connection\n");
      return 1;
    }
    const char *method = json_string_value(json_object_get(m, "method"));
    if (method && !strcmp(method, "sbx/cp/done")) {
      json_t *p = json_object_get(m, "params");
      int code = (int)json_integer_value(json_object_get(p, "exitCode"));
      if (code) {
        const char *text = json_string_value(json_object_get(p, "stderr"));
        if (text && (strstr(text, "No space left on device") || strstr(text, ": Wrote only ")))
          fprintf(stderr, "sbx cp: %s: no space left on the sandbox's disk (its diskMB)\n", what);
        else if (text && strstr(text, "No such file or directory")) /* tar's or cd's words for it */
          fprintf(stderr, "sbx cp: %s: No such file or directory\n", what);
        else
          fprintf(stderr, "sbx cp: %s: %s", shown(what, false), text && *text ? shown(text, true) : "tar failed\n");
      }
      json_decref(m);
      return code ? 1 : 0;
    }
    json_decref(m);
  }
}

static int pump(int from, int to) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(from, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return 0;
    if (sbx_write_all(to, buf, n) < 0) return -1;
  }
}

/* The last component, without trailing slashes ("a/b/" is "b"). */
static char *last_name(const char *path) {
  char *copy = strdup(path);
  size_t l = strlen(copy);
  while (l > 1 && copy[l - 1] == '/') copy[--l] = 0;
  char *b = strdup(basename(copy));
  free(copy);
  return b;
}

static int upload(sbx_client *c, const char *id, const char *host, const char *dst) {
  if (!strcmp(host, "-")) { /* a tar stream on stdin, unpacked in dst */
    int fd = cp_open(c, id, "into", dst, NULL);
    if (fd < 0) return 1;
    int r = pump(0, fd);
    shutdown(fd, SHUT_WR);
    int rc = cp_done(c, id, dst);
    close(fd);
    return rc || r < 0;
  }
  struct stat st;
  if (lstat(host, &st) < 0) return fail("reading", host);
  char *name = last_name(host), *copy = strdup(host), *parent = dirname(copy);
  int rc = 1, fd = cp_open(c, id, "extract", dst, name);
  if (fd >= 0) {
    pid_t pid = fork();
    if (pid == 0) { /* the host's own tar reads the host's files */
      dup2(fd, 1);
      execlp("tar", "tar", "--format=gnu", "-C", parent, "-cf", "-", "--", name, (char *)NULL);
      perror("sbx cp: tar");
      _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    shutdown(fd, SHUT_WR);
    rc = cp_done(c, id, dst);
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
    close(fd);
  }
  free(name);
  free(copy);
  return rc;
}

static int download(sbx_client *c, const char *id, const char *src, const char *host) {
  int fd = cp_open(c, id, "create", src, NULL);
  if (fd < 0) return 1;
  int rc;
  if (!strcmp(host, "-")) {
    rc = pump(fd, 1) < 0;
  } else {
    /* into an existing directory, or as that name */
    char *top = last_name(src), *dest;
    struct stat st;
    if (stat(host, &st) == 0 && S_ISDIR(st.st_mode)) dest = sbx_strdup_printf("%s/%s", host, top);
    else dest = strdup(host);
    rc = untar(fd, dest, top);
    free(top);
    free(dest);
  }
  close(fd);
  return cp_done(c, id, src) | rc;
}

/* "ID:PATH" names a sandbox path; anything else is a host path (one with a
 * colon can be written ./a:b). */
static bool split_remote(const char *arg, char id[64], const char **path) {
  const char *colon = strchr(arg, ':'), *slash = strchr(arg, '/');
  if (!colon || colon == arg || (size_t)(colon - arg) >= 64 || (slash && slash < colon)) return false;
  memcpy(id, arg, colon - arg);
  id[colon - arg] = 0;
  if (!sbx_valid_id(id)) return false;
  *path = colon + 1;
  return true;
}

int sbx_cp_main(int argc, char **argv, int (*open_client)(sbx_client *, const char *)) {
  if (argc != 3) {
    fprintf(stderr, "usage: sbx cp SRC DST   (ID:PATH names a sandbox path; - is a tar stream)\n");
    return 2;
  }
  char ids[64], idd[64];
  const char *ps, *pd;
  bool rs = split_remote(argv[1], ids, &ps), rd = split_remote(argv[2], idd, &pd);
  for (int i = 1; i <= 2; i++) { /* ID:PATH with an id that is not one: said, not taken as a host path */
    const char *colon = strchr(argv[i], ':'), *slash = strchr(argv[i], '/');
    if (colon && (!slash || colon < slash) && !(i == 1 ? rs : rd)) {
      int n = (int)(colon - argv[i]);
      fprintf(stderr, "sbx cp: invalid sandbox id '%.*s': ids are 1-63 of [a-z0-9-]\n", n > 100 ? 100 : n, argv[i]);
      return 2;
    }
  }
  if (rs == rd) {
    fprintf(stderr, "sbx cp: exactly one of SRC and DST must be ID:PATH\n");
    return 2;
  }
  if (!*(rs ? ps : pd)) {
    fprintf(stderr, "sbx cp: %s names no path\n", argv[rs ? 1 : 2]);
    return 2;
  }
  sbx_client c;
  if (open_client(&c, NULL) < 0) return 1;
  int rc = rs ? download(&c, ids, ps, argv[2]) : upload(&c, idd, argv[1], pd);
  sbx_client_close(&c);
  return rc;
}
