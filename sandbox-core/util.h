/* Small helpers shared by every part of sbx: cleanup attributes, errors,
 * bounded buffers, UTF-8 repair, syscall wrappers glibc lacks. */
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define SBX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define SBX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static inline void *sbx_steal_ptr(void *pp) {
  void **p = pp;
  void *v = *p;
  *p = NULL;
  return v;
}
#define steal_pointer(pp) sbx_steal_ptr(pp)

static inline int sbx_steal_fd(int *fd) {
  int v = *fd;
  *fd = -1;
  return v;
}

static inline void freep(void *p) { free(*(void **)p); }
static inline void closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
}
static inline void fclosep(FILE **f) {
  if (*f) fclose(*f);
}
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)

/* An error as the MCP layer reports it: a code from DESIGN's error table
 * and a message with context. */
typedef struct sbx_error {
  const char *code; /* static string, e.g. "FILE_NOT_FOUND" */
  char message[512];
} sbx_error;

/* Fills err and returns -1, so `return sbx_err(err, ...)` reads naturally. */
int sbx_err(sbx_error *err, const char *code, const char *fmt, ...) SBX_PRINTF(3, 4);
/* Same, appending ": strerror(errnum)". */
int sbx_err_errno(sbx_error *err, const char *code, int errnum, const char *fmt, ...)
    SBX_PRINTF(4, 5);
/* Maps an errno of a file operation to the error table's code. */
const char *sbx_errno_code(int errnum);

/* A list of strings (owned copies). */
typedef struct sbx_strv {
  char **v;
  size_t n;
} sbx_strv;
int sbx_strv_add(sbx_strv *l, const char *s);
int sbx_strv_copy(sbx_strv *dst, const sbx_strv *src);
void sbx_strv_clear(sbx_strv *l);

/* Growable byte buffer with a hard cap. */
typedef struct sbx_buf {
  char *data;
  size_t len, cap;
} sbx_buf;
int sbx_buf_append(sbx_buf *b, const void *p, size_t n);
void sbx_buf_free(sbx_buf *b);

/* Keeps the first and last `limit/2` bytes of a stream (or the first
 * `head` and the last `tail`) and counts the rest, so a flood of output
 * costs bounded memory. */
typedef struct sbx_headtail {
  size_t head_cap;
  sbx_buf head;
  char *tail; /* ring of limit - head bytes */
  size_t tail_cap, tail_len, tail_pos;
  uint64_t total;
} sbx_headtail;
void sbx_headtail_init(sbx_headtail *h, size_t limit);
void sbx_headtail_init_split(sbx_headtail *h, size_t head, size_t tail);
void sbx_headtail_add(sbx_headtail *h, const char *p, size_t n);
bool sbx_headtail_truncated(const sbx_headtail *h);
/* Returns malloc'd text: head, a marker line when bytes were dropped, tail. */
char *sbx_headtail_render(const sbx_headtail *h, size_t *len_out);
/* Appends the tail's bytes, oldest first, to out. */
void sbx_headtail_tail(const sbx_headtail *h, sbx_buf *out);
void sbx_headtail_free(sbx_headtail *h);

/* Returns a malloc'd, NUL-terminated copy of p[0..n) with invalid UTF-8
 * replaced by U+FFFD and NUL bytes kept as U+FFFD too (JSON strings may not
 * carry raw NULs through C strings). */
char *sbx_utf8_repair(const char *p, size_t n, size_t *len_out);
/* Length of the longest prefix of p[0..n) that does not end inside a
 * multi-byte sequence (for streaming chunks on code-point boundaries). */
size_t sbx_utf8_complete_prefix(const char *p, size_t n);
bool sbx_utf8_valid(const char *p, size_t n);
/* A part p[0..n) of a text, with the pre bytes before it at p[-pre..0):
 * its whole characters. *lead gets where the first starts (past the tail
 * of one begun before the part); returns how many bytes from there are
 * whole characters, one cut by the part's end left out unless at_end (the
 * text's own end); 0 when the part is not UTF-8 text without NULs there,
 * or holds no whole character. */
size_t sbx_utf8_part(const char *p, size_t pre, size_t n, bool at_end, size_t *lead);

int sbx_write_all(int fd, const void *p, size_t n);
int sbx_write_string(const char *path, const char *s); /* -errno */
#define SBX_FUSE_ENABLE_URING "/sys/module/fuse/parameters/enable_uring"
/* The fuse module's enable_uring (FUSE over io_uring for new sessions):
 * 1 on, 0 off, -1 not in this kernel. */
int sbx_fuse_uring_param(void);
/* Creates or truncates path (0644) and writes s. -errno. */
int sbx_write_string_create(const char *path, const char *s);
int sbx_mkdir_p(const char *path, mode_t mode);        /* -errno */
/* An absolute path made clean lexically into out: no empty or "."
 * components, ".." takes the one before away (at "/" it stays there, as the
 * kernel has it), no trailing slash. */
void sbx_path_clean(const char *in, char *out, size_t len);
/* Removes name (below dfd) and everything under it without following
 * symlinks; with one_fs, refuses to cross into another filesystem (-EBUSY). */
int sbx_remove_tree_at(int dfd, const char *name, bool one_fs);
char *sbx_strdup_printf(const char *fmt, ...) SBX_PRINTF(1, 2);
uint64_t sbx_now_ms(void);
uint64_t sbx_now_us(void);
/* The host's RAM in bytes (UINT64_MAX when unknown). */
uint64_t sbx_host_ram(void);
/* "10m" "30s" "1h" "250ms", or a number with no unit in units of bare ms,
 * → milliseconds; -1 when malformed. */
int64_t sbx_parse_duration_ms(const char *s, int64_t bare);

/* Sandbox ids: 1-63 of [a-z0-9-]. */
bool sbx_valid_id(const char *id);
/* Default sandbox id for a directory: slug of its basename + '-' + 8 hex of
 * a hash of the full path. Writes into out (at least 64 bytes). */
void sbx_default_id(const char *dir, char out[64]);
/* A non-blocking TCP socket connecting to 127.0.0.1:port, or [::1]:port
 * (v6), in the caller's network namespace: its fd, the connect done or
 * under way; -1 with errno. */
int sbx_loopback_connect(uint16_t port, bool v6);
/* FNV-1a of a string: for tables by name and names from a text. */
uint64_t sbx_fnv1a(const char *s);

/* fork() for the daemon's children (flags: extra clone flags, e.g. new
 * namespaces). The child dies with the daemon (PR_SET_PDEATHSIG) and starts
 * with every signal at its default
 * disposition and still blocked: no signal can run a handler inherited from
 * the daemon in between (libuv's would report it to the daemon's own loop).
 * The child unblocks with sbx_child_unblock() once it is ready.
 * A raw clone: glibc's fork bookkeeping does not run, so the daemon must
 * not start threads of its own. With one, a child that calls setresuid or
 * setresgid (commands, bucket helpers, a rootless init) goes through
 * glibc's all-threads path and can wait forever for a thread it does not
 * have; the spawner (spawner.c) relies on it too. */
pid_t sbx_fork_child(unsigned long flags, int *pidfd);
void sbx_child_unblock(void);
int sbx_pidfd_open(pid_t pid);

/* Descriptors over a unix socket (SCM_RIGHTS), with data. send: sendmsg
 * of len bytes and nfds (at most SBX_FDS_MAX) descriptors, MSG_NOSIGNAL
 * added to flags. recv: recvmsg of up to len bytes; up to max descriptors
 * (close-on-exec) into fds and their count into *nfds (may be NULL); any
 * past max are closed. Both return what sendmsg/recvmsg return. */
#define SBX_FDS_MAX 24
ssize_t sbx_send_fds(int sock, const void *data, size_t len, const int *fds, int nfds, int flags);
ssize_t sbx_recv_fds(int sock, void *data, size_t len, int *fds, int max, int *nfds, int flags);
/* The directories path names below dfd (which it takes), made (0755) where
 * missing, reached through no symlink and into no other mount: an O_PATH
 * fd of the last, or -1 with errno (ELOOP: a symlink, EXDEV: another
 * mount). */
int sbx_walk_mkdir(int dfd, const char *path);
/* S3 bucket servers load it when they first need it (fuse-mount/s3.c) */
#define SBX_LIBCURL "libcurl.so.4"
/* Whether pid is a live sbx daemon (not gone, not a zombie, not reused). */
bool sbx_daemon_alive(pid_t pid);
int sbx_pidfd_send_signal(int pidfd, int sig);

/* CRC-32C (Castagnoli) as the kernel's crc32c_le: no final inversion. */
uint32_t sbx_crc32c(uint32_t crc, const void *data, size_t len);

/* Standard base64 (RFC 4648, padded). encode: malloc'd NUL-terminated.
 * decode: -1 on malformed input (whitespace is skipped). */
char *sbx_base64_encode(const void *data, size_t len, size_t *out_len);
int sbx_base64_decode(const char *s, size_t len, char **out, size_t *out_len);
/* ISO 8601 UTC with milliseconds; out at least 32 bytes. */
void sbx_iso_time(uint64_t wall_ms, char out[32]);
uint64_t sbx_wall_ms(void);
