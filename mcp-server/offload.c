#define _GNU_SOURCE
#include "offload.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct job {
  sbx_sandbox *sb; /* NULL once the sandbox went (mcp_offload_forget) */
  mcp_work_fn work;
  mcp_done_fn done;
  void *ud;
  bool started, answered; /* answered: done was called already (destroy, stop) */
  size_t bytes;           /* counted in q.bytes until it finishes */
  int pidfd;
  uv_poll_t exited; /* on pidfd: the child is gone (its pipe may live on in other children of the daemon) */
  uv_pipe_t out;    /* the child's result */
  int closing;      /* handles still to close */
  sbx_buf buf;
  bool too_big;
  struct job *next;
} job;

static struct {
  uv_loop_t *loop;
  job *jobs; /* waiting and running, oldest first */
  size_t bytes;
  bool stopped;
} q;

static void unlink_job(job *j) {
  for (job **pp = &q.jobs; *pp; pp = &(*pp)->next)
    if (*pp == j) {
      *pp = j->next;
      return;
    }
}

/* The child: the work, its result on fd `out`, and nothing else of the
 * daemon's (the rootfd is all the files API needs). */
static void child_main(job *j, int out) {
  int keep[2] = {j->sb->rootfd < out ? j->sb->rootfd : out, j->sb->rootfd < out ? out : j->sb->rootfd};
  unsigned from = 3;
  for (int i = 0; i < 2; i++) {
    if (keep[i] < 0) continue;
    if ((unsigned)keep[i] > from) close_range(from, (unsigned)keep[i] - 1, 0);
    from = (unsigned)keep[i] + 1;
  }
  close_range(from, ~0U, 0);
  sbx_child_unblock();
  json_t *r = j->work(j->ud, j->sb);
  char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
  if (s && sbx_write_all(out, s, strlen(s)) < 0) _exit(1);
  _exit(s ? 0 : 1);
}

static void start_next(sbx_sandbox *sb);

static void closed(uv_handle_t *h) {
  job *j = h->data;
  if (--j->closing) return;
  if (j->pidfd >= 0) close(j->pidfd);
  sbx_buf_free(&j->buf);
  free(j);
}

/* The child is gone (or never was): its result goes to done. */
static void finish(job *j) {
  uv_read_stop((uv_stream_t *)&j->out);
  if (j->pidfd >= 0) {
    waitid(P_PIDFD, j->pidfd, &(siginfo_t){0}, WEXITED); /* it exited: reaped at once */
    uv_poll_stop(&j->exited);
  }
  unlink_job(j);
  q.bytes -= j->bytes;
  sbx_sandbox *sb = j->sb;
  if (sb) {
    sb->running--;
    sbx_sandbox_touch(sb);
  }
  if (!j->answered) {
    json_t *r = NULL;
    sbx_error why = {0};
    if (j->too_big) sbx_err(&why, "INTERNAL", "the result was over %u MiB", MCP_OFFLOAD_RESULT_MAX >> 20);
    else if (!(r = json_loadb(j->buf.data ? j->buf.data : "", j->buf.len, 0, NULL)))
      sbx_err(&why, "INTERNAL", "the process doing this call ended without an answer");
    j->done(j->ud, r, r ? NULL : &why);
    json_decref(r);
  }
  j->closing = j->pidfd >= 0 ? 2 : 1;
  uv_close((uv_handle_t *)&j->out, closed);
  if (j->pidfd >= 0) uv_close((uv_handle_t *)&j->exited, closed);
  if (sb && !q.stopped) start_next(sb);
}

static void out_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  (void)h, (void)hint;
  static char chunk[65536];
  *b = uv_buf_init(chunk, sizeof chunk);
}

static bool take(job *j, const char *data, size_t n) {
  if (j->buf.len + n > MCP_OFFLOAD_RESULT_MAX || sbx_buf_append(&j->buf, data, n) < 0) {
    j->too_big = true;
    return false;
  }
  return true;
}

static void out_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  job *j = s->data;
  if (n > 0 && !take(j, b->base, (size_t)n)) {
    uv_read_stop(s); /* too much: finished when the child is gone */
    sbx_pidfd_send_signal(j->pidfd, SIGKILL);
  } else if (n < 0) {
    uv_read_stop(s); /* the end: finished when the child is gone */
  }
}

/* The child exited: what it wrote is in the pipe (it waited for us to
 * read as it wrote). */
static void on_exited(uv_poll_t *p, int status, int events) {
  (void)status, (void)events;
  job *j = p->data;
  int fd = -1;
  uv_fileno((uv_handle_t *)&j->out, &fd);
  char chunk[65536];
  for (ssize_t n; fd >= 0 && !j->too_big && (n = read(fd, chunk, sizeof chunk)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || !take(j, chunk, (size_t)n)) break;
  }
  finish(j);
}

static void start(job *j) {
  j->started = true;
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) goto fail;
  pid_t pid = sbx_fork_child(0, &j->pidfd);
  if (pid == 0) child_main(j, p[1]);
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    goto fail;
  }
  uv_pipe_init(q.loop, &j->out, 0);
  j->out.data = j;
  uv_pipe_open(&j->out, p[0]);
  uv_read_start((uv_stream_t *)&j->out, out_alloc, out_read);
  uv_poll_init(q.loop, &j->exited, j->pidfd);
  j->exited.data = j;
  uv_poll_start(&j->exited, UV_READABLE, on_exited);
  return;
fail:
  /* no child to be had: answered at once, as a child that failed */
  j->pidfd = -1;
  uv_pipe_init(q.loop, &j->out, 0);
  j->out.data = j;
  finish(j);
}

static void start_next(sbx_sandbox *sb) {
  for (job *j = q.jobs; j; j = j->next)
    if (j->sb == sb) {
      if (!j->started) start(j);
      return;
    }
}

bool mcp_offload_wanted(sbx_sandbox *sb) {
  if (sb->buckets) return true;
  for (job *j = q.jobs; j; j = j->next)
    if (j->sb == sb) return true; /* after those, in order */
  return false;
}

int mcp_offload(uv_loop_t *loop, sbx_sandbox *sb, size_t bytes, mcp_work_fn work, mcp_done_fn done, void *ud,
                sbx_error *err) {
  q.loop = loop;
  int waiting = 0;
  bool busy = false;
  size_t held = 0;
  job **tail = &q.jobs;
  for (; *tail; tail = &(*tail)->next)
    if ((*tail)->sb == sb) {
      busy = true;
      waiting += !(*tail)->started;
      held += (*tail)->bytes;
    }
  if (waiting >= MCP_OFFLOAD_QUEUED)
    return sbx_err(err, "RESOURCE_LIMIT", "sandbox '%s' already has %d file calls waiting; wait for their answers",
                   sb->id, waiting);
  if (busy && (held + bytes > MCP_OFFLOAD_SANDBOX_BYTES || q.bytes + bytes > MCP_OFFLOAD_BYTES))
    return sbx_err(err, "RESOURCE_LIMIT", "file calls waiting on bucket mounts hold %zu MiB already (%zu MiB of them sandbox "
                   "'%s''s); wait for their answers", q.bytes >> 20, held >> 20, sb->id);
  job *j = calloc(1, sizeof *j);
  if (!j) return sbx_err(err, "INTERNAL", "out of memory");
  j->sb = sb;
  j->work = work;
  j->done = done;
  j->ud = ud;
  j->pidfd = -1;
  j->bytes = bytes;
  q.bytes += bytes;
  *tail = j;
  sb->running++; /* not idle while its files are being worked on */
  if (!busy) start(j);
  return 0;
}

void mcp_offload_forget(sbx_sandbox *sb) {
  for (job **pp = &q.jobs; *pp;) {
    job *j = *pp;
    if (j->sb != sb) {
      pp = &j->next;
      continue;
    }
    j->sb = NULL;
    sb->running--;
    sbx_error why;
    sbx_err(&why, "SANDBOX_NOT_FOUND", "sandbox '%s' was destroyed %s this call ran", sb->id,
            j->started ? "while" : "before");
    j->done(j->ud, NULL, &why);
    if (j->started) {
      /* its child is killed, and goes once the file system lets it (a
       * request a bucket server holds is waited out, even by SIGKILL) */
      j->answered = true;
      sbx_pidfd_send_signal(j->pidfd, SIGKILL);
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    q.bytes -= j->bytes;
    free(j);
  }
}

void mcp_offload_stop(void) {
  q.stopped = true;
  for (job *j = q.jobs; j; j = j->next) {
    j->sb = NULL; /* the sandboxes go before the children may */
    if (j->started) {
      j->answered = true; /* never: the daemon is going */
      sbx_pidfd_send_signal(j->pidfd, SIGKILL);
    }
  }
}
