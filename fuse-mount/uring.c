#define _GNU_SOURCE
#include "uring.h"
#include "passthrough.h"
#include "../sandbox-core/util.h"

#include <errno.h>
#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* From the kernel's protocol 7.42, which Debian 12's headers predate. */
#define URING_HDR_SZ 128
#define URING_OP_SZ 128
struct uring_ent_in_out {
  uint64_t flags;
  uint64_t commit_id;
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
struct uring_req_header {
  char in_out[URING_HDR_SZ]; /* fuse_in_header in, fuse_out_header out */
  char op_in[URING_OP_SZ];   /* the request's first argument (its fixed part) */
  struct uring_ent_in_out ent;
};
struct uring_cmd_req {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
enum { CMD_REGISTER = 1, CMD_COMMIT_AND_FETCH = 2 };

/* Threads a CPU: one request each at a time, and a request waits for one
 * of its CPU's threads even while another CPU's are free, so a few
 * handlers that wait (on the daemon for a sandbox to wake, up to a minute)
 * must not hold up the other callers of that CPU: 8 a CPU on small
 * machines, 4 beyond (16 a CPU made creates no faster, maybe slower). */
static int per_cpu(long cpus) { return cpus <= 4 ? 8 : 4; }
/* When every thread of a CPU is handling a request, one more is started
 * for it (and stays), up to this many a CPU in all, as the /dev/fuse loop
 * grows: 8 handlers waiting on a stopped daemon (a minute each) held up
 * every request made on their CPU, a lookup in a sandbox already open
 * there too. */
#define PER_CPU_MAX 64
/* Room before the payload for the request's header and first argument:
 * they are copied there so that libfuse sees the request whole, as read
 * from /dev/fuse, without moving the payload. */
#define LEAD (sizeof(struct fuse_in_header) + URING_OP_SZ)

typedef struct {
  int fd; /* the ring */
  unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  uint16_t qid;
  struct uring_req_header hdr;
  struct iovec iov[2];
  char *buf; /* LEAD, then the payload */
  void *rings; /* the ring's mapping; it and the sqes' have these lengths once made */
  size_t rings_len, sqes_len;
  size_t payload_max;
  /* the request being handled */
  uint64_t unique;
  bool replied;
  bool spare; /* started while its CPU's threads were all busy */
} entry;

static struct {
  struct fuse_session *se;
  int fuse_fd;
  sbx_looker *lookers; /* a CPU's: one of its threads looks for the next request a while */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  _Atomic uint64_t arrivals; /* requests, on every ring */
  atomic_int busy;          /* requests being handled */
  atomic_int *qbusy, *qthreads; /* a CPU's: requests being handled, threads serving */
  atomic_int rings;             /* threads serving, every CPU's: an fd each */
  int rings_max;                /* an eighth of the fds at most */
  size_t payload;
  atomic_bool stopping;
  bool go, abandon;
  int ready, failed; /* threads whose ring is made, or could not be */
} U = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static __thread entry *cur;

static atomic_bool turned_on; /* enable_uring was off, and this view turned it on */

bool sbx_uring_enabled(bool turn_on) {
  int on = sbx_fuse_uring_param();
  if (on != 0) return on == 1;
  /* a setting of the whole host that the feature needs, asked for by root
   * starting the view (-o nouring does not), and only while it runs */
  bool on_now = turn_on && geteuid() == 0 && sbx_write_string(SBX_FUSE_ENABLE_URING, "Y") == 0;
  atomic_store(&turned_on, on_now);
  return on_now;
}

void sbx_uring_restore(void) {
  /* a session that has io_uring keeps it: the setting counts at INIT */
  if (atomic_exchange(&turned_on, false)) sbx_write_string(SBX_FUSE_ENABLE_URING, "N");
}

/* sbx_uring_restore is async-signal-safe: an atomic, open, write, close. */
static void restore_and_die(int sig) {
  sbx_uring_restore();
  signal(sig, SIG_DFL);
  raise(sig);
}

void sbx_uring_guard(bool on) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    signal(sigs[i], on && atomic_load(&turned_on) ? restore_and_die : SIG_DFL);
}

static int ring_setup(entry *e) {
  struct io_uring_params p = {.flags = IORING_SETUP_SQE128}; /* for the command's 24 bytes */
  e->fd = (int)syscall(__NR_io_uring_setup, 2, &p);
  if (e->fd < 0) return -errno;
  if (!(p.features & IORING_FEAT_SINGLE_MMAP)) return -ENOSYS;
  size_t sq = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  char *m = mmap(NULL, sq > cq ? sq : cq, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, e->fd, IORING_OFF_SQ_RING);
  if (m == MAP_FAILED) return -errno;
  e->rings = m;
  e->rings_len = sq > cq ? sq : cq;
  e->sq_tail = (unsigned *)(m + p.sq_off.tail);
  e->sq_mask = (unsigned *)(m + p.sq_off.ring_mask);
  e->sq_array = (unsigned *)(m + p.sq_off.array);
  e->cq_head = (unsigned *)(m + p.cq_off.head);
  e->cq_tail = (unsigned *)(m + p.cq_off.tail);
  e->cq_mask = (unsigned *)(m + p.cq_off.ring_mask);
  e->cqes = (struct io_uring_cqe *)(m + p.cq_off.cqes);
  /* SQE128: each entry is two io_uring_sqe long */
  e->sqes = mmap(NULL, p.sq_entries * 2 * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, e->fd, IORING_OFF_SQES);
  if (e->sqes == MAP_FAILED) return -errno;
  e->sqes_len = p.sq_entries * 2 * sizeof(struct io_uring_sqe);
  return 0;
}

/* An entry that serves no more (its ring never made, never registered, or
 * given up): its ring, mappings and memory go. */
static void entry_free(entry *e) {
  if (e->sqes_len) munmap(e->sqes, e->sqes_len);
  if (e->rings_len) munmap(e->rings, e->rings_len);
  if (e->fd >= 0) close(e->fd);
  free(e->buf);
  free(e);
}

/* How many windows in a row a look goes on while requests come to other
 * CPUs (see ring_cmd): 2 ms at most of the longest window. */
#define LOOK_BUSY_WINDOWS 20

/* A completion waits (the kernel posts it as this thread enters or leaves
 * a system call: the yields between looks do). */
static int cq_ready(void *ud) {
  entry *e = ud;
  return *e->cq_head != __atomic_load_n(e->cq_tail, __ATOMIC_ACQUIRE);
}

/* Queues the entry's one command (register, or commit and fetch), waits
 * for its completion: a request for this entry, or the end. */
static int ring_cmd(entry *e, uint32_t op, uint64_t commit_id) {
  unsigned tail = *e->sq_tail, i = tail & *e->sq_mask;
  struct io_uring_sqe *sqe = &e->sqes[i * 2];
  memset(sqe, 0, 2 * sizeof *sqe);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = U.fuse_fd;
  sqe->cmd_op = op;
  sqe->addr = (uint64_t)(uintptr_t)e->iov;
  sqe->len = 2;
  struct uring_cmd_req *req = (void *)sqe->cmd;
  req->qid = e->qid;
  req->commit_id = commit_id;
  e->sq_array[i] = i;
  __atomic_store_n(e->sq_tail, tail + 1, __ATOMIC_RELEASE);
  unsigned submit = 1;
  /* a reply given: look for the next request a while before sleeping (the
   * caller, woken, often sends it at once; see passthrough.c) */
  bool probe;
  uint32_t w = op == CMD_COMMIT_AND_FETCH ? sbx_look_begin(&U.lookers[e->qid], &probe) : 0;
  if (w) {
    uint64_t before = atomic_load_explicit(&U.arrivals, memory_order_relaxed);
    int found = -1;
    if (syscall(__NR_io_uring_enter, e->fd, 1, 0, 0, NULL, 0) >= 0) {
      submit = 0;
      /* requests that came to the other CPUs meanwhile keep it looking,
       * window after window while they come: a CPU kept awake is one a
       * woken caller is not moved to (the scheduler moves it to an idle
       * CPU, a halted one on a VM, as a create's replies did once this
       * CPU's look ended: 15-25 % more creates a second one by one) */
      for (int k = 0; k < LOOK_BUSY_WINDOWS; k++) {
        found = sbx_look(w, cq_ready, e);
        uint64_t now = atomic_load_explicit(&U.arrivals, memory_order_relaxed);
        if (found || now == before) break;
        found = 1;
        before = now;
      }
    }
    sbx_look_end(&U.lookers[e->qid], w, probe, found);
  }
  for (;;) {
    if (cq_ready(e)) {
      unsigned head = *e->cq_head;
      int res = e->cqes[head & *e->cq_mask].res;
      __atomic_store_n(e->cq_head, head + 1, __ATOMIC_RELEASE);
      return res;
    }
    long r = syscall(__NR_io_uring_enter, e->fd, submit, 1, IORING_ENTER_GETEVENTS, NULL, 0);
    if (r >= 0) submit = 0;
    else if (errno == EAGAIN || errno == ENOMEM) usleep(1000); /* a commit must go out: its caller waits */
    else if (errno != EINTR) return -errno;
  }
}

static void spare_for(uint16_t qid);

/* The request in the entry, as libfuse would have read it from /dev/fuse:
 * header and first argument copied in front of the payload. */
static void handle(entry *e) {
  const struct fuse_in_header *in = (const void *)e->hdr.in_out;
  uint32_t payload = e->hdr.ent.payload_sz;
  size_t lead = in->len >= sizeof *in + payload ? in->len - sizeof *in - payload : SIZE_MAX;
  e->unique = in->unique;
  e->replied = false;
  /* once the view stops, its session is going: nothing more reaches it */
  atomic_fetch_add(&U.busy, 1);
  if (atomic_fetch_add(&U.qbusy[e->qid], 1) + 1 >= atomic_load(&U.qthreads[e->qid])) spare_for(e->qid);
  bool stopping = atomic_load(&U.stopping);
  if (!stopping && lead <= URING_OP_SZ && payload <= e->payload_max) {
    char *start = e->buf + LEAD - sizeof *in - lead;
    memcpy(start, in, sizeof *in);
    memcpy(start + sizeof *in, e->hdr.op_in, lead);
    struct fuse_buf fb = {.mem = start, .size = in->len};
    atomic_fetch_add_explicit(&U.arrivals, 1, memory_order_relaxed);
    cur = e;
    fuse_session_process_buf(U.se, &fb);
    cur = NULL;
  }
  atomic_fetch_sub(&U.qbusy[e->qid], 1);
  if (atomic_fetch_sub(&U.busy, 1) == 1 && atomic_load(&U.stopping)) {
    pthread_mutex_lock(&U.lock);
    pthread_cond_broadcast(&U.cond);
    pthread_mutex_unlock(&U.lock);
  }
  if (!e->replied) { /* nothing answered it (or it made no sense): it must end */
    struct fuse_out_header oh = {.len = sizeof oh, .error = stopping ? -ENOTCONN : -EIO, .unique = e->unique};
    memcpy(e->hdr.in_out, &oh, sizeof oh);
    e->hdr.ent.payload_sz = 0;
  }
}

bool sbx_uring_reply(const struct iovec *iov, int count) {
  entry *e = cur;
  const struct fuse_out_header *oh = iov[0].iov_base;
  if (!e || e->replied || iov[0].iov_len < sizeof *oh || oh->unique != e->unique) return false;
  size_t n = 0;
  for (int i = 1; i < count; i++) n += iov[i].iov_len;
  struct fuse_out_header h = *oh;
  if (n > e->payload_max) { /* cannot be, with max_write the kernel's bound too */
    h = (struct fuse_out_header){.len = sizeof h, .error = -EIO, .unique = oh->unique};
    n = 0;
  } else {
    char *p = e->buf + LEAD;
    for (int i = 1; i < count; i++) {
      memmove(p, iov[i].iov_base, iov[i].iov_len); /* a reply may quote its request */
      p += iov[i].iov_len;
    }
  }
  memcpy(e->hdr.in_out, &h, sizeof h);
  e->hdr.ent.payload_sz = (uint32_t)n;
  e->replied = true;
  return true;
}

/* Makes the kernel give up io_uring for the session and serve /dev/fuse
 * instead: a registration it refuses does that (a queue that does not
 * exist). Once io_uring is asked for at INIT, every request waits until all
 * queues are registered, so a thread that cannot register must say so. */
static void give_up(entry *e) {
  e->qid = UINT16_MAX;
  ring_cmd(e, CMD_REGISTER, 0);
}

static void *ring_main(void *arg) {
  entry *e = arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(e->qid, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* an offline CPU refuses it: anywhere then */
  /* the ring is made here: its completions run on the thread that
   * submits, and on its CPU */
  int made = ring_setup(e);
  pthread_mutex_lock(&U.lock);
  U.ready += made == 0;
  U.failed += made != 0;
  pthread_cond_broadcast(&U.cond);
  while (!U.go && !U.abandon) pthread_cond_wait(&U.cond, &U.lock);
  bool abandon = U.abandon;
  pthread_mutex_unlock(&U.lock);
  int r = abandon ? -ECANCELED : made; /* abandoned: no io_uring for this session */
  bool registering = r == 0;
  if (registering)
    for (int tries = 0; (r = ring_cmd(e, CMD_REGISTER, 0)) == -EAGAIN && tries < 1000; tries++)
      usleep(1000); /* INIT's reply not taken yet */
  if (r < 0) { /* this thread does not serve: its CPU has one fewer */
    atomic_fetch_sub(&U.qthreads[e->qid], 1);
    atomic_fetch_sub(&U.rings, 1);
    /* a spare's refusal is its own (the ring serves without it) */
    if (registering && !e->spare && r != -ENOTCONN && r != -ECONNABORTED) give_up(e);
    entry_free(e);
    return NULL;
  }
  while (r >= 0) {
    handle(e);
    r = ring_cmd(e, CMD_COMMIT_AND_FETCH, e->hdr.ent.commit_id);
  }
  /* ENOTCONN or ECANCELED: the session ended */
  return NULL;
}

/* An entry of CPU qid and its thread (never joined: the threads end with
 * the process, see sbx_uring_stop); false when it could not be started. */
static bool entry_start(uint16_t qid, bool spare) {
  entry *e = calloc(1, sizeof *e);
  char *buf = e ? malloc(LEAD + U.payload) : NULL;
  if (!buf) {
    free(e);
    return false;
  }
  *e = (entry){.fd = -1, .qid = qid, .buf = buf, .payload_max = U.payload, .spare = spare};
  e->iov[0] = (struct iovec){&e->hdr, sizeof e->hdr};
  e->iov[1] = (struct iovec){buf + LEAD, U.payload};
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  bool ok = pthread_create(&t, &a, ring_main, e) == 0;
  pthread_attr_destroy(&a);
  if (!ok) entry_free(e);
  return ok;
}

static void spare_for(uint16_t qid) {
  int n = atomic_load(&U.qthreads[qid]);
  do
    if (n >= PER_CPU_MAX || atomic_load(&U.stopping)) return;
  while (!atomic_compare_exchange_weak(&U.qthreads[qid], &n, n + 1));
  if (atomic_fetch_add(&U.rings, 1) >= U.rings_max || !entry_start(qid, true)) {
    atomic_fetch_sub(&U.rings, 1);
    atomic_fetch_sub(&U.qthreads[qid], 1);
  }
}

bool sbx_uring_prepare(struct fuse_session *se, int fuse_fd, uint32_t max_write) {
  long cpus = 0;
  FILE *f = fopen("/sys/devices/system/cpu/possible", "re");
  unsigned a, b;
  char line[256];
  /* the kernel wants a queue for every possible CPU: "0-1", "0-3,5" */
  long count = 0;
  while (f && fgets(line, sizeof line, f)) {
    for (char *t = strtok(line, ",\n"); t; t = strtok(NULL, ",\n")) {
      int k = sscanf(t, "%u-%u", &a, &b);
      if (k == 1) b = a;
      if (k >= 1 && b >= a) count += b - a + 1;
      if (k >= 1 && b + 1 > (unsigned long)cpus) cpus = b + 1;
    }
  }
  if (f) fclose(f);
  /* the kernel makes as many queues as there are possible CPUs and takes a
   * request's queue by its CPU's number: with a gap in the numbers the
   * highest CPU's queue is refused, after the others made the ring ready */
  if (cpus <= 0 || cpus > 1024 || count != cpus) return false;
  size_t payload = max_write > 8192 ? max_write : 8192;
  payload = (payload + 4095) / 4096 * 4096;
  U.se = se;
  U.fuse_fd = fuse_fd;
  int per = per_cpu(cpus), n = (int)cpus * per, started = 0;
  /* every ring is an fd: at most an eighth of them, the rest are the
   * files the view opens (rings that took them all left it answering EIO) */
  struct rlimit rl;
  U.rings_max = PER_CPU_MAX * (int)cpus; /* spares included */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 8 < (rlim_t)U.rings_max)
    U.rings_max = (int)(rl.rlim_cur / 8);
  if (n > U.rings_max) return false;
  atomic_store(&U.rings, n);
  U.lookers = calloc((size_t)cpus, sizeof *U.lookers);
  U.qbusy = calloc((size_t)cpus, sizeof *U.qbusy);
  U.qthreads = calloc((size_t)cpus, sizeof *U.qthreads);
  if (!U.lookers || !U.qbusy || !U.qthreads) return false;
  U.payload = payload;
  for (long c = 0; c < cpus; c++) {
    U.lookers[c] = (sbx_looker)SBX_LOOKER_INIT;
    atomic_store(&U.qthreads[c], per);
  }
  for (; started < n; started++)
    if (!entry_start((uint16_t)(started / per), false)) break;
  pthread_mutex_lock(&U.lock);
  while (U.ready + U.failed < started) pthread_cond_wait(&U.cond, &U.lock);
  bool ok = started == n && U.failed == 0;
  if (!ok) { /* no start will come */
    U.abandon = true;
    pthread_cond_broadcast(&U.cond);
  }
  pthread_mutex_unlock(&U.lock);
  return ok;
}

void sbx_uring_start(void) {
  pthread_mutex_lock(&U.lock);
  U.go = true;
  pthread_cond_broadcast(&U.cond);
  pthread_mutex_unlock(&U.lock);
}

bool sbx_uring_stop(void) {
  atomic_store(&U.stopping, true);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10; /* a bound: a handler waiting on the daemon (up to a minute) is not waited for */
  pthread_mutex_lock(&U.lock);
  while (atomic_load(&U.busy) > 0 && pthread_cond_timedwait(&U.cond, &U.lock, &until) != ETIMEDOUT) {
  }
  bool settled = atomic_load(&U.busy) == 0;
  pthread_mutex_unlock(&U.lock);
  return settled;
}
