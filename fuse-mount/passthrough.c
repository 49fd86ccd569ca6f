#define _GNU_SOURCE
#include "passthrough.h"
#include "uring.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* From the kernel's protocol 7.40, which Debian 12's headers predate. */
#define SBX_FUSE_PASSTHROUGH_FLAG2 (1u << (37 - 32))
#define SBX_FOPEN_PASSTHROUGH (1u << 7)
struct sbx_fuse_backing_map {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
#define SBX_FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct sbx_fuse_backing_map)
#define SBX_FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
/* fuse_init_out's first unused word became max_stack_depth; a backing file
 * (the sandbox's ext4) stacks one level under the view */
#define MAX_STACK_DEPTH 1

static struct {
  int fd;
  bool wanted; /* passthrough asked for at attach */
  atomic_bool offered; /* the kernel's INIT said it can */
  atomic_bool killpriv_v2;
  atomic_bool on;
  bool uring_wanted;
  atomic_bool uring_offered;
  struct fuse_session *se;
  _Atomic uint64_t init_unique;
} pt = {.fd = -1};

/* The backing id for the open or create reply this thread is sending. */
static __thread int reply_backing;

/* ---- reading requests ---------------------------------------------------
 *
 * A request's time through the view is mostly two wakeups: of a server
 * thread asleep on /dev/fuse, then of the process asleep on the reply. On a
 * machine whose idle CPUs sleep deeply (a VM's vCPUs most of all) each
 * wakeup costs more than the work. So a thread that has answered a request
 * looks for the next one a while before it sleeps (non-blocking reads of a
 * clone of the session's fd), one thread at a time; the others sleep on the
 * session's fd as libfuse has them. Between reads it yields the CPU to
 * anything runnable there, so a client on the same CPU goes on at once (a
 * pause instead held it back: 9-11k creates/s against 11-14k, client and
 * view on one CPU). How long it looks adapts: a look that finds a request
 * opens the window whole, one that finds none halves it, and a shut window
 * is tried whole after 8 requests, then after twice as many as long as the
 * tries miss (up to 256). So requests that come close together keep it
 * open, a client whose requests come further apart than a look (every
 * 0.1-1 ms) costs a look every 256 requests, and an idle view looks at
 * nothing. Judging a look by how soon the next request came instead does
 * not work either way: a look that missed leaves the thread asleep, and
 * the next request then pays the wakeups the look saves, so requests that
 * came 100 us apart while looking come further apart once it stopped (the
 * window stayed shut: 5,000 creates after a 1 GiB read through the view,
 * which sends no request, ran at 2,500 a second instead of 6,000); and
 * "within 1 ms" kept it open for a client that a look never catches (28 %
 * of a CPU for a request every 0.3 ms).
 * The same look serves the rings of FUSE over io_uring (uring.c), one
 * looker per CPU; there a look also counts as found when a request came to
 * another CPU meanwhile, and goes on while they come (up to 2 ms): what it
 * saves is mostly a halted CPU for the woken caller, who the scheduler
 * moves to an idle CPU (20,000 lookups of new names one by one: 18-22 us
 * each with it, 45-57 without, 22-34 through /dev/fuse).
 * A reply goes to the fd its request was read from (the kernel matches
 * them per fd). */

#define LOOK_MAX_NS 100000u
#define LOOK_MIN_NS 10000u
#define LOOK_PROBE_MIN 8
#define LOOK_PROBE_MAX 256

/* The clone of the session's fd, non-blocking (-1: plain blocking reads). */
static int look_fd = -1;
static sbx_looker dev_looker = SBX_LOOKER_INIT;

/* The fd this thread read its request from: its reply goes there. */
static __thread int reply_fd = -1;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint32_t sbx_look_begin(sbx_looker *l, bool *probe) {
  *probe = false;
  if (atomic_exchange(&l->looking, true)) return 0; /* another thread looks */
  uint32_t w = atomic_load(&l->window);
  if (!w && atomic_fetch_add(&l->shut_reads, 1) + 1 >= atomic_load(&l->probe_every)) {
    atomic_store(&l->shut_reads, 0);
    *probe = true;
    w = LOOK_MAX_NS;
  }
  if (!w) atomic_store(&l->looking, false);
  return w;
}

void sbx_look_end(sbx_looker *l, uint32_t w, bool probe, int found) {
  if (found > 0) atomic_store(&l->window, LOOK_MAX_NS);
  else if (found == 0) atomic_store(&l->window, probe || w / 2 < LOOK_MIN_NS ? 0 : w / 2);
  if (probe && found >= 0) {
    unsigned every = atomic_load(&l->probe_every);
    atomic_store(&l->probe_every, found ? LOOK_PROBE_MIN : every * 2 > LOOK_PROBE_MAX ? LOOK_PROBE_MAX : every * 2);
  }
  atomic_store(&l->looking, false);
}

int sbx_look(uint32_t w, int (*poll)(void *), void *ud) {
  uint64_t t0 = now_ns();
  int r;
  while ((r = poll(ud)) == 0 && now_ns() - t0 < w) sched_yield();
  return r;
}

typedef struct {
  void *buf;
  size_t len;
  ssize_t n;
  int err;
} dev_read;

static int poll_dev(void *ud) {
  dev_read *d = ud;
  d->n = read(look_fd, d->buf, d->len);
  d->err = errno;
  return d->n >= 0 ? 1 : d->err == EAGAIN ? 0 : -1;
}

static ssize_t look_read(int fd, void *buf, size_t len) {
  reply_fd = fd;
  bool probe;
  uint32_t w = look_fd < 0 ? 0 : sbx_look_begin(&dev_looker, &probe);
  if (!w) return read(fd, buf, len);
  dev_read d = {.buf = buf, .len = len};
  int found = sbx_look(w, poll_dev, &d);
  sbx_look_end(&dev_looker, w, probe, found);
  if (found > 0) {
    reply_fd = look_fd;
    return d.n;
  }
  if (found < 0) { /* ENODEV at unmount, as the session's fd would say */
    errno = d.err;
    return -1;
  }
  return read(fd, buf, len);
}

static ssize_t pt_read(int fd, void *buf, size_t len, void *ud) {
  (void)ud;
  ssize_t n = look_read(fd, buf, len);
  if (n >= (ssize_t)(sizeof(struct fuse_in_header) + sizeof(struct fuse_init_in)) &&
      atomic_load(&pt.init_unique) == 0) {
    const struct fuse_in_header *h = buf;
    const struct fuse_init_in *in = (const void *)(h + 1);
    if (h->opcode == FUSE_INIT) {
      bool ext = in->flags & FUSE_INIT_EXT;
      atomic_store(&pt.offered, pt.wanted && ext && (in->flags2 & SBX_FUSE_PASSTHROUGH_FLAG2));
      atomic_store(&pt.uring_offered, pt.uring_wanted && ext && (in->flags2 & SBX_FUSE_OVER_IO_URING_FLAG2));
      atomic_store(&pt.killpriv_v2, in->flags & FUSE_HANDLE_KILLPRIV_V2);
      atomic_store(&pt.init_unique, h->unique);
    }
  }
  return n;
}

/* The INIT reply: passthrough and io_uring asked for where offered. True
 * when it asks for io_uring. */
static bool amend_init(struct fuse_init_out *o) {
  if (!(o->flags & FUSE_INIT_EXT)) return false;
  /* the kernel refuses passthrough beside the writeback cache */
  if (atomic_load(&pt.offered) && !(o->flags & FUSE_WRITEBACK_CACHE)) {
    o->flags2 |= SBX_FUSE_PASSTHROUGH_FLAG2;
    o->unused[0] = MAX_STACK_DEPTH;
    /* A passthrough write first asks whether the file has set-id bits
     * or file capabilities to drop: a getxattr round trip per write,
     * unless the kernel may remember the answer (SB_NOSEC), which it
     * does once the server says it drops them itself. The view's
     * server does: it writes, truncates and chowns as the sandbox's
     * root without CAP_FSETID, so the sandbox's filesystem drops them,
     * as it does for the kernel's passthrough writes. */
    if (atomic_load(&pt.killpriv_v2)) o->flags |= FUSE_HANDLE_KILLPRIV_V2;
    atomic_store(&pt.on, true);
  }
  uint32_t payload = o->max_write;
  if ((o->flags & FUSE_MAX_PAGES) && (uint32_t)o->max_pages * 4096u > payload) payload = (uint32_t)o->max_pages * 4096u;
  if (atomic_load(&pt.uring_offered) && sbx_uring_prepare(pt.se, pt.fd, payload)) {
    o->flags2 |= SBX_FUSE_OVER_IO_URING_FLAG2;
    return true;
  }
  return false;
}

static ssize_t pt_writev(int fd, struct iovec *iov, int count, void *ud) {
  (void)ud;
  const struct fuse_out_header *h = iov[0].iov_base;
  if (reply_fd >= 0) fd = reply_fd; /* notifications, from threads that read nothing: either */
  bool init = h->unique && h->unique == atomic_load(&pt.init_unique), uring = false;
  if (count == 2 && h->error == 0) {
    if (pt.wanted && reply_backing > 0 &&
        (iov[1].iov_len == sizeof(struct fuse_open_out) ||
         iov[1].iov_len == sizeof(struct fuse_entry_out) + sizeof(struct fuse_open_out))) {
      struct fuse_open_out *o =
          (void *)((char *)iov[1].iov_base + iov[1].iov_len - sizeof(struct fuse_open_out));
      o->open_flags |= SBX_FOPEN_PASSTHROUGH;
      o->padding = (uint32_t)reply_backing; /* backing_id */
    } else if (init && iov[1].iov_len >= sizeof(struct fuse_init_out)) {
      uring = amend_init(iov[1].iov_base);
    }
  }
  if (sbx_uring_reply(iov, count)) {
    size_t n = 0;
    for (int i = 0; i < count; i++) n += iov[i].iov_len;
    return (ssize_t)n;
  }
  ssize_t n = writev(fd, iov, count);
  /* the kernel knows the session is initialized once it has the reply */
  if (uring) sbx_uring_start();
  if (init) sbx_uring_restore(); /* needed no more */
  return n;
}

int sbx_fuse_notify_expire_entry(fuse_ino_t parent, const char *name) {
  if (pt.fd < 0) return -EBADF;
  size_t len = strlen(name);
  struct fuse_notify_inval_entry_out arg = {.parent = parent, .namelen = (uint32_t)len, .flags = FUSE_EXPIRE_ONLY};
  struct fuse_out_header h = {.len = (uint32_t)(sizeof h + sizeof arg + len + 1), .error = FUSE_NOTIFY_INVAL_ENTRY};
  struct iovec iov[] = {{&h, sizeof h}, {&arg, sizeof arg}, {(void *)name, len + 1}};
  return writev(pt.fd, iov, 3) < 0 ? -errno : 0;
}

int sbx_fuse_io_attach(struct fuse_session *se, bool passthrough, bool uring) {
  static const struct fuse_custom_io io = {.read = pt_read, .writev = pt_writev};
  int fd = fuse_session_fd(se);
  if (fd < 0) return -EBADF;
  int r = fuse_session_custom_io(se, &io, fd);
  if (r < 0) return r;
  pt.fd = fd;
  pt.wanted = passthrough;
  pt.uring_wanted = uring;
  pt.se = se;
  /* the clone is made now, before any thread acts as a sandbox's root; a
   * kernel or a /dev/fuse that does not allow it leaves plain blocking reads */
  uint32_t session_fd = (uint32_t)fd;
  look_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (look_fd >= 0 && ioctl(look_fd, FUSE_DEV_IOC_CLONE, &session_fd) < 0) {
    close(look_fd);
    look_fd = -1;
  }
  return 0;
}

bool sbx_passthrough_on(void) { return atomic_load(&pt.on); }

int sbx_passthrough_open(int fd) {
  if (!sbx_passthrough_on()) return -EOPNOTSUPP;
  struct sbx_fuse_backing_map map = {.fd = fd};
  int id = ioctl(pt.fd, SBX_FUSE_DEV_IOC_BACKING_OPEN, &map);
  return id > 0 ? id : id == 0 ? -EIO : -errno;
}

void sbx_passthrough_close(int backing_id) {
  uint32_t id = (uint32_t)backing_id;
  if (backing_id > 0) ioctl(pt.fd, SBX_FUSE_DEV_IOC_BACKING_CLOSE, &id);
}

int sbx_passthrough_reply_open(fuse_req_t req, const struct fuse_file_info *fi, int backing_id) {
  reply_backing = backing_id;
  int r = fuse_reply_open(req, fi);
  reply_backing = 0;
  return r;
}

int sbx_passthrough_reply_create(fuse_req_t req, const struct fuse_entry_param *e, const struct fuse_file_info *fi,
                                 int backing_id) {
  reply_backing = backing_id;
  int r = fuse_reply_create(req, e, fi);
  reply_backing = 0;
  return r;
}
