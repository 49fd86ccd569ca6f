#define _GNU_SOURCE
#include "util.h"

#include <arpa/inet.h>
#include <linux/openat2.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <time.h>

int sbx_err(sbx_error *err, const char *code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return -1;
}

int sbx_err_errno(sbx_error *err, const char *code, int errnum, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err->message)
      snprintf(err->message + n, sizeof err->message - n, ": %s", strerror(errnum));
  }
  return -1;
}

const char *sbx_errno_code(int errnum) {
  switch (errnum) {
  case ENOENT: return "FILE_NOT_FOUND";
  case EEXIST: return "FILE_EXISTS";
  case EISDIR: return "IS_DIRECTORY";
  case ENOTDIR: return "NOT_DIRECTORY";
  case EACCES:
  case EPERM:
  case EROFS:
  case EXDEV:
  case ELOOP: return "PERMISSION_DENIED";
  case EFBIG:
  case ENOSPC:
  case EDQUOT: return "RESOURCE_LIMIT";
  case EINVAL:
  case ENAMETOOLONG:
  case ENOTEMPTY: return "VALIDATION_FAILED";
  default: return "INTERNAL";
  }
}

int sbx_strv_add(sbx_strv *l, const char *s) {
  char *c = strdup(s);
  char **nv = c ? realloc(l->v, (l->n + 2) * sizeof *nv) : NULL;
  if (!nv) {
    free(c);
    return -ENOMEM;
  }
  l->v = nv;
  l->v[l->n++] = c;
  l->v[l->n] = NULL;
  return 0;
}

int sbx_strv_copy(sbx_strv *dst, const sbx_strv *src) {
  for (size_t i = 0; i < src->n; i++) {
    int r = sbx_strv_add(dst, src->v[i]);
    if (r < 0) return r;
  }
  return 0;
}

void sbx_strv_clear(sbx_strv *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  *l = (sbx_strv){0};
}

int sbx_buf_append(sbx_buf *b, const void *p, size_t n) {
  if (n == 0) return 0;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -ENOMEM;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

void sbx_buf_free(sbx_buf *b) {
  free(b->data);
  *b = (sbx_buf){0};
}

void sbx_headtail_init_split(sbx_headtail *h, size_t head, size_t tail) {
  *h = (sbx_headtail){.head_cap = head, .tail_cap = tail};
}

void sbx_headtail_init(sbx_headtail *h, size_t limit) { sbx_headtail_init_split(h, limit / 2, limit - limit / 2); }

void sbx_headtail_add(sbx_headtail *h, const char *p, size_t n) {
  h->total += n;
  size_t head_room = h->head_cap > h->head.len ? h->head_cap - h->head.len : 0;
  size_t take = n < head_room ? n : head_room;
  if (take) {
    sbx_buf_append(&h->head, p, take);
    p += take;
    n -= take;
  }
  if (!n || !h->tail_cap) return;
  if (!h->tail) {
    h->tail = malloc(h->tail_cap);
    if (!h->tail) return;
  }
  if (n >= h->tail_cap) { /* only the last tail_cap bytes matter */
    p += n - h->tail_cap;
    n = h->tail_cap;
  }
  /* into the ring, in at most two pieces */
  size_t first = h->tail_cap - h->tail_pos < n ? h->tail_cap - h->tail_pos : n;
  memcpy(h->tail + h->tail_pos, p, first);
  memcpy(h->tail, p + first, n - first);
  h->tail_pos = (h->tail_pos + n) % h->tail_cap;
  h->tail_len = h->tail_len + n > h->tail_cap ? h->tail_cap : h->tail_len + n;
}

bool sbx_headtail_truncated(const sbx_headtail *h) {
  return h->total > h->head.len + h->tail_len;
}

char *sbx_headtail_render(const sbx_headtail *h, size_t *len_out) {
  sbx_buf out = {0};
  sbx_buf_append(&out, h->head.data ? h->head.data : "", h->head.len);
  if (sbx_headtail_truncated(h)) {
    char mark[128];
    int m = snprintf(mark, sizeof mark, "\n[... %llu bytes omitted ...]\n",
                     (unsigned long long)(h->total - h->head.len - h->tail_len));
    sbx_buf_append(&out, mark, m);
  }
  sbx_headtail_tail(h, &out);
  if (!out.data) out.data = strdup("");
  if (len_out) *len_out = out.len;
  return out.data;
}

void sbx_headtail_tail(const sbx_headtail *h, sbx_buf *out) {
  if (!h->tail_len) return;
  size_t start = (h->tail_pos + h->tail_cap - h->tail_len) % h->tail_cap;
  size_t first = h->tail_cap - start < h->tail_len ? h->tail_cap - start : h->tail_len;
  sbx_buf_append(out, h->tail + start, first);
  sbx_buf_append(out, h->tail, h->tail_len - first);
}

void sbx_headtail_free(sbx_headtail *h) {
  sbx_buf_free(&h->head);
  free(h->tail);
  h->tail = NULL;
}

/* Length of the valid UTF-8 sequence at p (1-4), or 0 when invalid, or -1
 * when it is valid so far but cut off by the end of the buffer. */
static int utf8_seq(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  int len;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
  else return 0;
  unsigned cp = c & (0x3f >> (len - 1));
  for (int i = 1; i < len; i++) {
    if ((size_t)i >= n) return -1;
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

char *sbx_utf8_repair(const char *s, size_t n, size_t *len_out) {
  const unsigned char *p = (const unsigned char *)s;
  sbx_buf out = {0};
  size_t i = 0, run = 0;
  while (i < n) {
    int l = p[i] == 0 ? 0 : utf8_seq(p + i, n - i);
    if (l > 0) {
      i += l;
      run += l;
      continue;
    }
    sbx_buf_append(&out, p + i - run, run);
    run = 0;
    sbx_buf_append(&out, "\xef\xbf\xbd", 3);
    i++;
  }
  sbx_buf_append(&out, p + i - run, run);
  if (!out.data) out.data = strdup("");
  if (len_out) *len_out = out.len;
  return out.data;
}

size_t sbx_utf8_complete_prefix(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  /* look back at most 3 bytes for the start of a cut sequence */
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    unsigned c = p[n - back];
    if ((c & 0xc0) == 0x80) continue; /* continuation byte */
    if (c >= 0xc0 && utf8_seq(p + n - back, back) == -1) return n - back;
    break;
  }
  return n;
}

bool sbx_utf8_valid(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    int l = utf8_seq(p + i, n - i);
    if (l <= 0) return false;
    i += l;
  }
  return true;
}

size_t sbx_utf8_part(const char *s, size_t pre, size_t n, bool at_end, size_t *lead) {
  const unsigned char *p = (const unsigned char *)s;
  *lead = 0;
  if (n && (p[0] & 0xc0) == 0x80) { /* inside a character: is it one begun just before? */
    size_t back = 1;
    while (back <= pre && (p[-(ssize_t)back] & 0xc0) == 0x80) back++;
    int l = back <= pre ? utf8_seq(p - back, back + n) : 0;
    if (l <= 0 || (size_t)l <= back) return 0; /* not a character's tail: not text here */
    *lead = (size_t)l - back;
  }
  size_t keep = at_end ? n - *lead : sbx_utf8_complete_prefix(s + *lead, n - *lead);
  return keep && !memchr(s + *lead, 0, keep) && sbx_utf8_valid(s + *lead, keep) ? keep : 0;
}

int sbx_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    c += w;
    n -= w;
  }
  return 0;
}

int sbx_fuse_uring_param(void) {
  char v[8] = "";
  FILE *f = fopen(SBX_FUSE_ENABLE_URING, "re");
  if (!f) return -1;
  if (!fgets(v, sizeof v, f)) v[0] = 0;
  fclose(f);
  return v[0] == 'Y';
}

int sbx_write_string(const char *path, const char *s) {
  _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  return sbx_write_all(fd, s, strlen(s));
}

int sbx_write_string_create(const char *path, const char *s) {
  _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  return sbx_write_all(fd, s, strlen(s));
}

void sbx_path_clean(const char *in, char *out, size_t len) {
  char tmp[2 * PATH_MAX + 2];
  snprintf(tmp, sizeof tmp, "%s", in);
  size_t o = 0;
  out[0] = 0;
  char *save = NULL;
  for (char *c = strtok_r(tmp, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (!strcmp(c, ".")) continue;
    if (!strcmp(c, "..")) {
      while (o > 0 && out[o - 1] != '/') o--;
      if (o > 0) o--;
      out[o] = 0;
      continue;
    }
    int n = snprintf(out + o, len - o, "/%s", c);
    if (n < 0 || (size_t)n >= len - o) break;
    o += n;
  }
  if (!o) snprintf(out, len, "/");
}

int sbx_mkdir_p(const char *path, mode_t mode) {
  char buf[4096];
  if (strlen(path) >= sizeof buf) return -ENAMETOOLONG;
  strcpy(buf, path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, mode) < 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(buf, mode) < 0 && errno != EEXIST) return -errno;
  return 0;
}

char *sbx_strdup_printf(const char *fmt, ...) {
  va_list ap;
  char *s = NULL;
  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

uint64_t sbx_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
uint64_t sbx_now_ms(void) { return sbx_now_us() / 1000; }

/* Read again every 10 s at most: sysinfo(2) walks every block device (the
 * loop device of each sandbox's disk), and this is asked at every create
 * and command. */
uint64_t sbx_host_ram(void) {
  static uint64_t ram, at;
  uint64_t now = sbx_now_ms();
  if (!at || now - at >= 10000) {
    struct sysinfo si;
    ram = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit : UINT64_MAX;
    at = now;
  }
  return ram;
}

int64_t sbx_parse_duration_ms(const char *s, int64_t bare) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) return -1;
  double mult;
  if (!*end) mult = (double)bare;
  else if (!strcmp(end, "ms")) mult = 1;
  else if (!strcmp(end, "s")) mult = 1000;
  else if (!strcmp(end, "m")) mult = 60000;
  else if (!strcmp(end, "h")) mult = 3600000;
  else if (!strcmp(end, "d")) mult = 86400000;
  else return -1;
  double ms = v * mult;
  if (ms > 1e15) return -1;
  return (int64_t)ms;
}

bool sbx_valid_id(const char *id) {
  size_t n = id ? strlen(id) : 0;
  if (n < 1 || n > 63) return false;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '-'))
      return false;
  return true;
}

int sbx_loopback_connect(uint16_t port, bool v6) {
  int s = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  if ((v6 ? connect(s, (struct sockaddr *)&a6, sizeof a6) : connect(s, (struct sockaddr *)&a, sizeof a)) < 0 &&
      errno != EINPROGRESS) {
    int e = errno;
    close(s);
    errno = e;
    return -1;
  }
  return s;
}

uint64_t sbx_fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

void sbx_default_id(const char *dir, char out[64]) {
  uint64_t h = sbx_fnv1a(dir);
  const char *base = strrchr(dir, '/');
  base = base && base[1] ? base + 1 : (base ? "root" : dir);
  char slug[48];
  size_t n = 0;
  bool dash = false;
  for (const char *p = base; *p && n < 40; p++) {
    char c = *p;
    if (c >= 'A' && c <= 'Z') c += 32;
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      slug[n++] = c;
      dash = false;
    } else if (!dash && n) {
      slug[n++] = '-';
      dash = true;
    }
  }
  while (n && slug[n - 1] == '-') n--;
  slug[n] = 0;
  snprintf(out, 64, "%s%s%08x", slug, n ? "-" : "", (unsigned)(h ^ (h >> 32)));
}

pid_t sbx_fork_child(unsigned long flags, int *pidfd) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  pid_t pid = (pid_t)syscall(SYS_clone, flags | (pidfd ? CLONE_PIDFD : 0) | SIGCHLD, NULL, pidfd, NULL, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* nothing the daemon starts outlives it */
    for (int s = 1; s < NSIG; s++)
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    return 0;
  }
  int e = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  errno = e;
  return pid;
}

void sbx_child_unblock(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

int sbx_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

ssize_t sbx_send_fds(int sock, const void *data, size_t len, const int *fds, int nfds, int flags) {
  if (nfds < 0 || nfds > SBX_FDS_MAX) {
    errno = EINVAL;
    return -1;
  }
  struct iovec iov = {(void *)data, len};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * SBX_FDS_MAX)];
  } u;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  return sendmsg(sock, &m, flags | MSG_NOSIGNAL);
}

ssize_t sbx_recv_fds(int sock, void *data, size_t len, int *fds, int max, int *nfds, int flags) {
  struct iovec iov = {data, len};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * SBX_FDS_MAX)];
  } u;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
  int got = 0;
  for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (got < max) fds[got++] = fd;
        else close(fd);
      }
  if (nfds) *nfds = got;
  return n;
}
int sbx_pidfd_send_signal(int pidfd, int sig) {
  return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *sbx_base64_encode(const void *data, size_t len, size_t *out_len) {
  const unsigned char *p = data;
  size_t n = 4 * ((len + 2) / 3);
  char *o = malloc(n + 1);
  if (!o) return NULL;
  size_t j = 0;
  for (size_t i = 0; i < len; i += 3) {
    unsigned v = p[i] << 16 | (i + 1 < len ? p[i + 1] << 8 : 0) | (i + 2 < len ? p[i + 2] : 0);
    o[j++] = b64[v >> 18 & 63];
    o[j++] = b64[v >> 12 & 63];
    o[j++] = i + 1 < len ? b64[v >> 6 & 63] : '=';
    o[j++] = i + 2 < len ? b64[v & 63] : '=';
  }
  o[j] = 0;
  if (out_len) *out_len = j;
  return o;
}

int sbx_base64_decode(const char *s, size_t len, char **out, size_t *out_len) {
  unsigned char *o = malloc(len / 4 * 3 + 4);
  if (!o) return -1;
  size_t j = 0;
  unsigned v = 0;
  int bits = 0, pad = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      pad++;
      continue;
    }
    const char *q = c ? strchr(b64, c) : NULL;
    if (!q || pad) {
      free(o);
      return -1;
    }
    v = v << 6 | (unsigned)(q - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      o[j++] = (v >> bits) & 0xff;
    }
  }
  if (pad > 2 || bits >= 6) {
    free(o);
    return -1;
  }
  o[j] = 0;
  *out = (char *)o;
  *out_len = j;
  return 0;
}

uint64_t sbx_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sbx_iso_time(uint64_t wall_ms, char out[32]) {
  time_t t = wall_ms / 1000;
  struct tm tm;
  gmtime_r(&t, &tm);
  size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, 32 - n, ".%03uZ", (unsigned)(wall_ms % 1000));
}

/* Removes a tree without following symlinks or leaving its filesystem. */
static int remove_tree(int dfd, const char *name, bool one_fs, dev_t dev, int depth) {
  if (depth > 256) return -ELOOP;
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return -errno;
  if (!S_ISDIR(st.st_mode)) return unlinkat(dfd, name, 0) < 0 ? -errno : 0;
  if (one_fs && depth > 0 && st.st_dev != dev) return -EBUSY; /* a mount point */
  if (depth == 0) dev = st.st_dev;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -errno;
  }
  struct dirent *e;
  int r = 0;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      int q = remove_tree(dirfd(d), e->d_name, one_fs, dev, depth + 1);
      if (q < 0 && !r) r = q;
    }
  closedir(d);
  if (r < 0) return r;
  return unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

int sbx_remove_tree_at(int dfd, const char *name, bool one_fs) { return remove_tree(dfd, name, one_fs, 0, 0); }

bool sbx_daemon_alive(pid_t pid) {
  char path[64], st[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, st, sizeof st - 1);
  close(fd);
  if (n <= 0) return false;
  st[n] = 0;
  /* "pid (comm) S ...": a zombie nobody reaps, or a pid reused by another
   * program, is no daemon of ours */
  char *open_p = strchr(st, '('), *close_p = strrchr(st, ')');
  if (!open_p || !close_p || close_p[1] != ' ') return false;
  *close_p = 0;
  return strcmp(open_p + 1, "sbx") == 0 && close_p[2] != 'Z' && close_p[2] != 'X';
}

uint32_t sbx_crc32c(uint32_t crc, const void *data, size_t len) {
  static uint32_t table[256];
  if (!table[1])
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      table[i] = c;
    }
  const unsigned char *p = data;
  while (len--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

/* Not into another mount: not a bucket's, whose server could keep the
 * walk waiting. */
int sbx_walk_mkdir(int dfd, const char *path) {
  char copy[PATH_MAX];
  snprintf(copy, sizeof copy, "%s", path);
  for (char *save = NULL, *c = strtok_r(copy, "/", &save); c && dfd >= 0; c = strtok_r(NULL, "/", &save)) {
    if (mkdirat(dfd, c, 0755) < 0 && errno != EEXIST) {
      int e = errno;
      close(dfd);
      errno = e;
      return -1;
    }
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
    int nfd = (int)syscall(SYS_openat2, dfd, c, &how, sizeof how);
    int e = errno;
    if (nfd < 0) { /* O_PATH|O_NOFOLLOW|O_DIRECTORY on a symlink is ENOTDIR, not ELOOP */
      struct stat st;
      if (e == ENOTDIR && fstatat(dfd, c, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) e = ELOOP;
    }
    close(dfd);
    dfd = nfd;
    errno = e;
  }
  return dfd;
}
