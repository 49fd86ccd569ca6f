#define _GNU_SOURCE
#include "offload.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Workers that finished wait a while for the next job instead of ending:
 * a thread made for each call costs more than the call. */
#define IDLE_WORKERS 4
#define IDLE_SECONDS 10

typedef struct job {
  sbx_sandbox *sb; /* NULL once the sandbox went (mcp_offload_forget) */
  mcp_work_fn work;
  mcp_done_fn done;
  void *ud;
  sbx_sandbox view; /* the worker's: id, rootfd (its own), uid_base */
  bool started;
  struct job *next;   /* q.jobs: the loop's alone */
  struct job *next_q; /* q.finished or q.handed: under q.lock */
} job;

static struct {
  uv_async_t async;
  bool ready, stopped;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  job *finished; /* done, for the loop: under lock */
  job *handed;   /* for an idle worker to take: under lock */
  int idle, nhanded;
  job *jobs; /* waiting and running, oldest first */
} q = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *worker(void *arg) {
  job *j = arg;
  while (j) {
    j->work(j->ud, &j->view);
    pthread_mutex_lock(&q.lock);
    j->next_q = q.finished;
    q.finished = j;
    if (!q.stopped) uv_async_send(&q.async);
    j = NULL;
    if (!q.stopped && q.idle < IDLE_WORKERS) {
      q.idle++;
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_sec += IDLE_SECONDS;
      while (!q.handed && !q.stopped)
        if (pthread_cond_timedwait(&q.wake, &q.lock, &until) == ETIMEDOUT) break;
      if ((j = q.handed)) {
        q.handed = j->next_q;
        q.nhanded--;
      }
      q.idle--;
    }
    pthread_mutex_unlock(&q.lock);
  }
  return NULL;
}

static void start(job *j) {
  j->started = true;
  snprintf(j->view.id, sizeof j->view.id, "%s", j->sb->id);
  j->view.uid_base = j->sb->uid_base;
  j->view.state = j->sb->state;
  j->view.rootfd = j->sb->rootfd >= 0 ? fcntl(j->sb->rootfd, F_DUPFD_CLOEXEC, 3) : -1;
  pthread_mutex_lock(&q.lock);
  if (q.idle > q.nhanded) { /* a worker is waiting for it */
    job **tail = &q.handed;
    while (*tail) tail = &(*tail)->next_q;
    j->next_q = NULL;
    *tail = j;
    q.nhanded++;
    pthread_cond_signal(&q.wake);
    pthread_mutex_unlock(&q.lock);
    return;
  }
  pthread_mutex_unlock(&q.lock);
  /* the worker takes no signal: the loop's handlers stay the loop's */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int r = pthread_create(&t, &a, worker, j);
  pthread_attr_destroy(&a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) { /* no thread to be had: the work is done here, late rather than never */
    j->work(j->ud, &j->view);
    pthread_mutex_lock(&q.lock);
    j->next_q = q.finished;
    q.finished = j;
    uv_async_send(&q.async);
    pthread_mutex_unlock(&q.lock);
  }
}

static void unlink_job(job *j) {
  for (job **pp = &q.jobs; *pp; pp = &(*pp)->next)
    if (*pp == j) {
      *pp = j->next;
      return;
    }
}

static void start_next(sbx_sandbox *sb) {
  for (job *j = q.jobs; j; j = j->next)
    if (j->sb == sb) {
      if (!j->started) start(j);
      return;
    }
}

static void on_finished(uv_async_t *a) {
  (void)a;
  pthread_mutex_lock(&q.lock);
  job *list = q.finished;
  q.finished = NULL;
  pthread_mutex_unlock(&q.lock);
  for (job *j = list, *next; j; j = next) {
    next = j->next_q;
    if (j->view.rootfd >= 0) close(j->view.rootfd);
    unlink_job(j);
    sbx_sandbox *sb = j->sb;
    if (sb) {
      sb->running--;
      sbx_sandbox_touch(sb);
      start_next(sb);
    }
    j->done(j->ud, true);
    free(j);
  }
}

int mcp_offload_init(uv_loop_t *loop) {
  if (q.ready) return 0;
  /* The loop clones children with a raw clone (sbx_fork_child), which
   * takes none of malloc's locks first: a child that allocates finds the
   * arena of the thread that cloned it as it was. Workers must never hold
   * that arena's lock: with no limit on arenas worth reaching, each thread
   * gets an arena of its own instead of sharing the loop's (glibc shares
   * arenas only past M_ARENA_MAX, a limit it fixes at the first thread's
   * first allocation: so this runs before any thread exists), and workers
   * free nothing the loop allocated. */
  mallopt(M_ARENA_MAX, 1 << 20);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&q.wake, &ca);
  pthread_condattr_destroy(&ca);
  int r = uv_async_init(loop, &q.async, on_finished);
  if (r < 0) return r;
  uv_unref((uv_handle_t *)&q.async); /* pending work does not keep a stopping daemon up */
  q.ready = true;
  return 0;
}

int mcp_offload(uv_loop_t *loop, sbx_sandbox *sb, mcp_work_fn work, mcp_done_fn done, void *ud, sbx_error *err) {
  if (mcp_offload_init(loop) < 0) return sbx_err(err, "INTERNAL", "uv_async_init failed");
  int waiting = 0;
  bool busy = false;
  job **tail = &q.jobs;
  for (; *tail; tail = &(*tail)->next)
    if ((*tail)->sb == sb) {
      busy = true;
      waiting += !(*tail)->started;
    }
  if (waiting >= MCP_OFFLOAD_QUEUED)
    return sbx_err(err, "RESOURCE_LIMIT", "sandbox '%s' already has %d file calls waiting; wait for their answers",
                   sb->id, waiting);
  job *j = calloc(1, sizeof *j);
  if (!j) return sbx_err(err, "INTERNAL", "out of memory");
  j->sb = sb;
  j->work = work;
  j->done = done;
  j->ud = ud;
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
    if (j->started) {
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    j->done(j->ud, false);
    free(j);
  }
}

void mcp_offload_stop(void) {
  if (!q.ready) return;
  pthread_mutex_lock(&q.lock);
  q.stopped = true; /* a worker still blocked wakes to a loop that is gone */
  pthread_cond_broadcast(&q.wake);
  pthread_mutex_unlock(&q.lock);
  uv_close((uv_handle_t *)&q.async, NULL);
}
