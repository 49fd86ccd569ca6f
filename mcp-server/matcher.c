#define _GNU_SOURCE
#include "matcher.h"

#include <errno.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* The child first says whether the pattern compiled: 'R', or 'E' and
 * regerror's words up to a newline (and it ends). Then a line on its way:
 * [u32 length][u8 stream][text], answered by one byte, '1' it matched, '0'
 * it did not. Lines go in batches, one write each
 * (mcp_matcher_flush): a chatty process's short lines cost no system call
 * each. */
typedef struct frame {
  struct frame *next;
  bool written, answered;
  unsigned char head[5];
  size_t len;
  char text[];
} frame;

/* What a queued line holds of the daemon: its text and what carries it
 * (an empty line is not free). */
static size_t frame_cost(size_t len) { return len + sizeof(frame) + 1 + sizeof(frame *) + 2 * sizeof(uv_buf_t); }

typedef struct batch {
  uv_write_t req;
  struct mcp_matcher *m; /* NULL once the matcher is let go */
  size_t n;
  frame *f[];
} batch;

struct mcp_matcher {
  uv_pipe_t to, from;
  uv_poll_t exit;
  uv_timer_t soon;   /* an answer found within a call of the caller's, told on the loop's next turn */
  sbx_error soon_err;
  int pidfd;
  int open_handles;
  frame *first, **last; /* not answered yet, oldest first */
  frame *unsent;        /* the first of them not in a batch yet */
  size_t behind;        /* their bytes */
  batch *writing;       /* the batch being written, if any */
  bool ended, done, freed, answering;
  bool compiled;    /* the child said 'R' */
  bool broken;      /* a write to it failed */
  sbx_buf refused;  /* what it said after 'E' */
  mcp_match_cb cb;
  void *ud;
};

/* ---- the child ---------------------------------------------------------- */

static bool read_all(int fd, void *p, size_t n) {
  for (char *c = p; n;) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= (size_t)r;
  }
  return true;
}

static void say(int out, const char *s, size_t n) {
  while (n) {
    ssize_t w = write(out, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(0);
    s += w, n -= (size_t)w;
  }
}

#define COMPILE_CPU_S 10 /* a pattern that takes longer to compile ends its matcher (SIGXCPU) */

static _Noreturn void child_main(const char *pattern, int in, int out) {
  regex_t re[1];
  struct rlimit cpu;
  getrlimit(RLIMIT_CPU, &cpu);
  struct rlimit compile = {COMPILE_CPU_S, cpu.rlim_max};
  if (cpu.rlim_cur == RLIM_INFINITY || cpu.rlim_cur > COMPILE_CPU_S) setrlimit(RLIMIT_CPU, &compile);
  int rc = regcomp(re, pattern, REG_EXTENDED | REG_NOSUB);
  setrlimit(RLIMIT_CPU, &cpu); /* matching: as long as the wait lasts */
  if (rc) {
    char why[200] = "E";
    regerror(rc, re, why + 1, sizeof why - 2);
    strcat(why, "\n");
    say(out, why, strlen(why));
    _exit(0);
  }
  say(out, "R", 1);
  char *buf = NULL;
  size_t cap = 0;
  for (;;) {
    unsigned char h[5];
    if (!read_all(in, h, sizeof h)) _exit(0);
    size_t len = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
    if (len + 1 > cap && !(buf = realloc(buf, cap = len + 1))) _exit(1);
    if (!read_all(in, buf, len)) _exit(0);
    buf[len] = 0;
    say(out, regexec(re, buf, 0, NULL, 0) == 0 ? "1" : "0", 1);
  }
}

/* ---- the daemon's side -------------------------------------------------- */

static void handle_closed(uv_handle_t *h) {
  mcp_matcher *m = h->data;
  if (--m->open_handles == 0) {
    close(m->pidfd);
    sbx_buf_free(&m->refused);
    free(m);
  }
}

static void frame_drop(frame *f) {
  if (f->written && f->answered) free(f);
}

/* The answer, once: the matcher tells no more after it. */
static void finish(mcp_matcher *m, const frame *hit, const sbx_error *err) {
  if (m->done) return;
  m->done = true;
  if (!m->freed) m->cb(m->ud, hit ? hit->head[4] : 0, hit ? hit->text : NULL, hit ? hit->len : 0, err);
}

static void fail(mcp_matcher *m, const char *code, const char *msg) {
  sbx_error err = {0};
  sbx_err(&err, code, "%s", msg);
  finish(m, NULL, &err);
}

static void soon_cb(uv_timer_t *t) {
  mcp_matcher *m = t->data;
  finish(m, NULL, m->soon_err.code ? &m->soon_err : NULL);
}

/* The answer from within feed, flush or end (code NULL: no line matched):
 * never told from inside them, where the caller goes on with the matcher. */
static void answer_soon(mcp_matcher *m, const char *code, const char *msg) {
  if (m->done || m->answering) return;
  m->answering = true;
  if (code) sbx_err(&m->soon_err, code, "%s", msg);
  uv_timer_start(&m->soon, soon_cb, 0, 0);
}

void mcp_matcher_flush(mcp_matcher *m);

static void written(uv_write_t *req, int status) {
  batch *b = req->data;
  for (size_t i = 0; i < b->n; i++) {
    b->f[i]->written = true;
    frame_drop(b->f[i]);
  }
  mcp_matcher *m = b->m;
  free(b);
  if (!m) return;
  m->writing = NULL;
  /* the child is gone: what it said last (a pattern that does not
   * compile), or that it ended, comes from its answers' end */
  if (status < 0) {
    m->broken = true;
    if (status != UV_EPIPE) fail(m, "INTERNAL", "the pattern's matcher went away");
    return;
  }
  mcp_matcher_flush(m);
}

/* What the child said of the pattern, from what it wrote (at *i on). */
static void compile_answer(mcp_matcher *m, const char *data, ssize_t n, ssize_t *i, bool eof) {
  if (!m->refused.len && *i < n && data[*i] == 'R') {
    m->compiled = true;
    ++*i;
    return;
  }
  for (; *i < n && m->refused.len < 200; ++*i) sbx_buf_append(&m->refused, &data[*i], 1);
  *i = n;
  const char *nl = m->refused.len ? memchr(m->refused.data, '\n', m->refused.len) : NULL;
  if (!nl && !eof) return;
  sbx_error err = {0};
  if (m->refused.len && m->refused.data[0] == 'E')
    sbx_err(&err, "VALIDATION_FAILED", "pattern is not a valid regular expression: %.*s",
            (int)((nl ? nl : m->refused.data + m->refused.len) - m->refused.data - 1), m->refused.data + 1);
  else
    sbx_err(&err, "RESOURCE_LIMIT", "the pattern's matcher ended while compiling it (over %d s of CPU, or the "
            "sandbox's memory or pids limit): a simpler pattern", COMPILE_CPU_S);
  finish(m, NULL, &err);
}

static void answers(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  mcp_matcher *m = s->data;
  ssize_t i = 0;
  if (!m->compiled) compile_answer(m, b->base, n < 0 ? 0 : n, &i, n < 0);
  if (n < 0) {
    uv_read_stop(s);
    return fail(m, "INTERNAL", "the pattern's matcher ended (the sandbox's memory or pids limit, or it was killed)");
  }
  for (; i < n && !m->done; i++) {
    frame *f = m->first;
    if (!f) return fail(m, "INTERNAL", "the pattern's matcher answered a line it was not given");
    m->first = f->next;
    if (!m->first) m->last = &m->first;
    m->behind -= frame_cost(f->len);
    f->answered = true;
    if (b->base[i] == '1') finish(m, f, NULL);
    frame_drop(f);
  }
  if (!m->done && m->ended && !m->first) finish(m, NULL, NULL);
}

static void exited(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  mcp_matcher *m = p->data;
  siginfo_t si = {0};
  if (waitid(P_PIDFD, m->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid) {
    uv_poll_stop(p);
    uv_close((uv_handle_t *)p, handle_closed);
  }
}

bool mcp_matcher_compiled(const mcp_matcher *m) { return m->compiled; }

mcp_matcher *mcp_matcher_start(uv_loop_t *loop, sbx_sandbox *sb, const char *pattern, mcp_match_cb cb, void *ud,
                               sbx_error *err) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) < 0) return sbx_err_errno(err, "INTERNAL", errno, "pipe"), NULL;
  if (pipe2(from, O_CLOEXEC) < 0) {
    close(to[0]), close(to[1]);
    return sbx_err_errno(err, "INTERNAL", errno, "pipe"), NULL;
  }
  mcp_matcher *m = calloc(1, sizeof *m);
  int pidfd = -1;
  pid_t pid = m ? sbx_fork_child(0, &pidfd) : -1;
  if (pid == 0) {
    /* into the sandbox's cgroups first: what it uses from here on is the
     * sandbox's (a sandbox without cgroups: a nice process of the host) */
    if (sb->cg.n && sbx_cg_add_pid(&sb->cg, getpid()) < 0) _exit(1);
    if (!sb->cg.n && setpriority(PRIO_PROCESS, 0, 19) < 0) _exit(1);
    /* it reads what a sandbox printed: as nobody, never root */
    if (getuid() == 0 && (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
                          setresuid(65534, 65534, 65534) < 0))
      _exit(1);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) _exit(1);
    int in = to[0], out = from[1];
    if (in < 3 && (in = fcntl(in, F_DUPFD_CLOEXEC, 3)) < 0) _exit(1);
    if (out < 3 && (out = fcntl(out, F_DUPFD_CLOEXEC, 3)) < 0) _exit(1);
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0) _exit(1);
    close_range(2, ~0U, 0);
    sbx_child_unblock();
    child_main(pattern, 0, 1);
  }
  close(to[0]);
  close(from[1]);
  if (pid < 0) {
    int e = errno;
    close(to[1]), close(from[0]);
    free(m);
    return sbx_err_errno(err, "INTERNAL", e, "starting the pattern's matcher"), NULL;
  }
  m->pidfd = pidfd;
  m->cb = cb;
  m->ud = ud;
  m->last = &m->first;
  uv_pipe_init(loop, &m->to, 0);
  uv_pipe_init(loop, &m->from, 0);
  uv_poll_init(loop, &m->exit, pidfd);
  uv_timer_init(loop, &m->soon);
  m->to.data = m->from.data = m->exit.data = m->soon.data = m;
  m->open_handles = 4;
  uv_pipe_open(&m->to, to[1]);
  uv_pipe_open(&m->from, from[0]);
  uv_read_start((uv_stream_t *)&m->from, sbx_read_alloc, answers);
  uv_poll_start(&m->exit, UV_READABLE, exited);
  return m;
}

void mcp_matcher_feed(mcp_matcher *m, int stream, const char *line, size_t len) {
  if (m->done || m->ended || m->answering) return;
  if (m->behind + frame_cost(len) > MCP_MATCH_BEHIND)
    return answer_soon(m, "RESOURCE_LIMIT", "the pattern is too slow to match for what the process prints: its matcher "
                "fell 4 MiB behind (a simpler pattern, or one that cannot match so much of a line, keeps up)");
  frame *f = malloc(sizeof *f + len + 1);
  if (!f) return answer_soon(m, "INTERNAL", "out of memory");
  *f = (frame){.len = len};
  memcpy(f->text, line, len);
  f->text[len] = 0;
  f->head[0] = (unsigned char)len, f->head[1] = (unsigned char)(len >> 8), f->head[2] = (unsigned char)(len >> 16);
  f->head[3] = (unsigned char)(len >> 24), f->head[4] = (unsigned char)stream;
  *m->last = f;
  m->last = &f->next;
  if (!m->unsent) m->unsent = f;
  m->behind += frame_cost(len);
}

void mcp_matcher_flush(mcp_matcher *m) {
  if (m->done || m->answering || m->writing || m->broken || !m->unsent) return;
  size_t n = 0;
  for (frame *f = m->unsent; f; f = f->next) n++;
  batch *b = malloc(sizeof *b + n * sizeof b->f[0]);
  uv_buf_t *bufs = malloc(2 * n * sizeof *bufs);
  if (!b || !bufs) {
    free(b), free(bufs);
    return answer_soon(m, "INTERNAL", "out of memory");
  }
  b->m = m;
  b->n = n;
  b->req.data = b;
  n = 0;
  for (frame *f = m->unsent; f; f = f->next, n++) {
    b->f[n] = f;
    bufs[2 * n] = uv_buf_init((char *)f->head, sizeof f->head);
    bufs[2 * n + 1] = uv_buf_init(f->text, (unsigned)f->len);
  }
  m->unsent = NULL;
  m->writing = b;
  int r = uv_write(&b->req, (uv_stream_t *)&m->to, bufs, (unsigned)(2 * n), written);
  free(bufs); /* uv_write keeps its own copy of the array */
  if (r < 0) {
    m->writing = NULL;
    for (size_t i = 0; i < b->n; i++) b->f[i]->written = true;
    free(b);
    m->broken = true;
    /* a child gone is told by its answers' end, as in written() */
    if (r != UV_EPIPE) answer_soon(m, "INTERNAL", "the pattern's matcher went away");
  }
}

void mcp_matcher_end(mcp_matcher *m) {
  m->ended = true;
  mcp_matcher_flush(m);
  /* (not before the pattern is known to compile: answers() tells then) */
  if (!m->first && m->compiled) answer_soon(m, NULL, NULL);
}

void mcp_matcher_free(mcp_matcher *m) {
  if (!m) return;
  m->freed = m->done = true;
  sbx_pidfd_send_signal(m->pidfd, SIGKILL);
  if (m->writing) m->writing->m = NULL;
  for (frame *f = m->unsent; f; f = f->next) f->written = true; /* in no batch: nothing will write them */
  while (m->first) { /* one in the batch being written goes once it is */
    frame *f = m->first;
    m->first = f->next;
    f->answered = true;
    frame_drop(f);
  }
  uv_close((uv_handle_t *)&m->to, handle_closed);
  uv_close((uv_handle_t *)&m->from, handle_closed);
  uv_close((uv_handle_t *)&m->soon, handle_closed);
  /* the exit poll closes itself once the child is reaped */
}
