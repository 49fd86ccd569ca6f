#define _GNU_SOURCE
#include "viewlink.h"
#include "../mcp-server/control.h"
#include "../mcp-server/framing.h"

#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_FDS 64

typedef struct pending {
  long long id;
  bool done;
  int fd, err;
  uid_t uid;
  gid_t gid;
  unsigned uids;
  struct pending *next;
} pending;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t thread;
  int fd; /* the daemon, or -1 */
  int wake[2]; /* stop pipe */
  viewlink_cb cb;
  long long next_id;
  pending *pending;
  int fdq[MAX_FDS]; /* fds received, in the order of the replies that carry them */
  int nfdq;
  mcp_framer framer;
  bool listed; /* the first list has been handed to reset_all */
  bool stopping;
} L = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .fd = -1};

static int send_line(int fd, json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (!s) return -ENOMEM;
  size_t n = strlen(s);
  s[n] = '\n';
  int r = sbx_write_all(fd, s, n + 1);
  free(s);
  return r;
}

static int map_code(const char *code) {
  if (code && !strcmp(code, "SANDBOX_NOT_FOUND")) return ENOENT;
  if (code && (!strcmp(code, "FILE_NOT_FOUND") || !strcmp(code, "NOT_DIRECTORY"))) return ENOENT;
  return EIO;
}

/* One message from the daemon (on the link's thread, lock not held). */
static bool on_line(void *ud, const char *msg, size_t len) {
  (void)ud;
  if (!msg) return true;
  json_t *m = json_loadb(msg, len, 0, NULL);
  if (!m) return true;
  const char *method = json_string_value(json_object_get(m, "method"));
  json_t *id = json_object_get(m, "id");
  if (method && !strcmp(method, "sbx/view/changed")) {
    json_t *p = json_object_get(m, "params");
    const char *sid = json_string_value(json_object_get(p, "sandboxId")),
               *ev = json_string_value(json_object_get(p, "event"));
    if (sid && ev && sbx_valid_id(sid)) L.cb.changed(L.cb.ud, sid, ev);
  } else if (json_is_string(id) && !strcmp(json_string_value(id), "subscribe")) {
    json_t *list = json_object_get(json_object_get(m, "result"), "sandboxes");
    size_t n = json_array_size(list), k = 0;
    const char **ids = calloc(n + 1, sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
      const char *sid = json_string_value(json_object_get(json_array_get(list, i), "sandboxId"));
      if (sid && sbx_valid_id(sid)) ids[k++] = sid;
    }
    if (ids) L.cb.reset_all(L.cb.ud, ids, k);
    free(ids);
    pthread_mutex_lock(&L.lock);
    L.listed = true;
    pthread_cond_broadcast(&L.cond);
    pthread_mutex_unlock(&L.lock);
  } else if (json_is_integer(id)) {
    pthread_mutex_lock(&L.lock);
    json_t *res = json_object_get(m, "result");
    /* the fd that came with this answer: taken off the queue whether or
     * not its asker still waits (one that gave up, after the daemon took
     * over a minute, left it there for the next answer to take: the next
     * sandbox opened showed this one's files) */
    int fd = -1;
    if (res && L.nfdq > 0) {
      fd = L.fdq[0];
      memmove(L.fdq, L.fdq + 1, --L.nfdq * sizeof(int));
    }
    for (pending *p = L.pending; p; p = p->next) {
      if (p->id != json_integer_value(id) || p->done) continue;
      if (fd >= 0) {
        p->fd = fd;
        fd = -1;
        p->uid = (uid_t)json_integer_value(json_object_get(res, "uid"));
        p->gid = (gid_t)json_integer_value(json_object_get(res, "gid"));
        p->uids = (unsigned)json_integer_value(json_object_get(res, "uids"));
      } else {
        p->err = map_code(json_string_value(json_object_get(json_object_get(json_object_get(m, "error"), "data"), "code")));
      }
      p->done = true;
    }
    if (fd >= 0) close(fd);
    pthread_cond_broadcast(&L.cond);
    pthread_mutex_unlock(&L.lock);
  }
  json_decref(m);
  return true;
}

/* The daemon is gone: every waiter fails, every fd it sent goes. */
static void lose(void) {
  pthread_mutex_lock(&L.lock);
  if (L.fd >= 0) close(L.fd);
  L.fd = -1;
  for (pending *p = L.pending; p; p = p->next)
    if (!p->done) p->done = true, p->err = EIO;
  for (int i = 0; i < L.nfdq; i++) close(L.fdq[i]);
  L.nfdq = 0;
  pthread_cond_broadcast(&L.cond);
  pthread_mutex_unlock(&L.lock);
  mcp_framer_free(&L.framer);
  L.cb.lost(L.cb.ud);
}

/* Connects and subscribes. The link's own retries never start a daemon
 * (a daemon stopped on purpose stays stopped); the view's next use does. */
static int connect_once(bool autostart, char *err, size_t errlen) {
  sbx_paths paths;
  /* a retry makes nothing: the daemon's directories removed (its user
   * gone, a test's environment deleted) are not made again by a view
   * that outlived them */
  if ((autostart ? sbx_paths_init : sbx_paths_find)(&paths, err, errlen) < 0) return -1;
  int fd = sbx_connect(&paths, autostart, err, errlen);
  if (fd < 0) return -1;
  pthread_mutex_lock(&L.lock);
  if (L.fd >= 0) { /* the link thread and a use of the view raced: one connection */
    int have = L.fd;
    pthread_mutex_unlock(&L.lock);
    close(fd);
    return have;
  }
  mcp_framer_free(&L.framer);
  mcp_framer_init(&L.framer, 16 * 1024 * 1024);
  if (send_line(fd, json_pack("{s:s, s:s, s:s}", "jsonrpc", "2.0", "id", "subscribe", "method", "sbx/view/subscribe")) <
      0) {
    pthread_mutex_unlock(&L.lock);
    snprintf(err, errlen, "the daemon went away");
    close(fd);
    return -1;
  }
  L.fd = fd;
  pthread_mutex_unlock(&L.lock);
  return fd;
}

/* Reads until the daemon goes or we stop; false when stopping. */
static bool serve(int fd) {
  char buf[65536];
  for (;;) {
    struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = L.wake[0], .events = POLLIN}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) return true;
    if (pf[1].revents) {
      char c;
      if (read(L.wake[0], &c, 1) == 1 && c == 'q') return false;
    }
    if (!pf[0].revents) continue;
    int got[8], ngot = 0;
    ssize_t n = sbx_recv_fds(fd, buf, sizeof buf, got, 8, &ngot, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    pthread_mutex_lock(&L.lock);
    for (int i = 0; i < ngot; i++) {
      if (L.nfdq < MAX_FDS) L.fdq[L.nfdq++] = got[i];
      else close(got[i]);
    }
    pthread_mutex_unlock(&L.lock);
    mcp_framer_feed(&L.framer, buf, n, on_line, NULL);
  }
}

static void *link_main(void *arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  int delay_ms = 100;
  while (!L.stopping) {
    char err[600];
    pthread_mutex_lock(&L.lock);
    int fd = L.fd;
    pthread_mutex_unlock(&L.lock);
    if (fd < 0) fd = connect_once(false, err, sizeof err);
    if (fd >= 0) {
      delay_ms = 100;
      bool go_on = serve(fd);
      lose();
      if (!go_on) break;
      continue;
    }
    /* no daemon now: look again a little later, or when a use of the view
     * has started one (a byte on the wake pipe) */
    struct pollfd pf = {.fd = L.wake[0], .events = POLLIN};
    if (poll(&pf, 1, delay_ms) > 0) {
      char c;
      if (read(L.wake[0], &c, 1) == 1 && c == 'q') break;
    }
    if (delay_ms < 2000) delay_ms *= 2;
  }
  return NULL;
}

int viewlink_connect(const viewlink_cb *cb, char *err, size_t errlen) {
  L.cb = *cb;
  if (pipe2(L.wake, O_CLOEXEC) < 0) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    return -1;
  }
  return connect_once(true, err, errlen) < 0 ? -1 : 0;
}

int viewlink_run(void) { return pthread_create(&L.thread, NULL, link_main, NULL) == 0 ? 0 : -1; }

void viewlink_wait_listed(int timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&L.lock);
  while (!L.listed && L.fd >= 0)
    if (pthread_cond_timedwait(&L.cond, &L.lock, &until) == ETIMEDOUT) break;
  pthread_mutex_unlock(&L.lock);
}

int viewlink_open(const char *id, uid_t *uid, gid_t *gid, unsigned *uids) {
  pthread_mutex_lock(&L.lock);
  if (L.fd < 0) { /* the daemon went away: this use of the view starts one */
    pthread_mutex_unlock(&L.lock);
    char err[600];
    static pthread_mutex_t starting = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&starting);
    /* as the view's own user: this thread may be acting as a sandbox's root
     * (view.c's act_as), which may not open the daemon's start lock */
    uid_t was_uid = (uid_t)setfsuid(getuid());
    gid_t was_gid = (gid_t)setfsgid(getgid());
    int r = L.fd >= 0 ? 0 : connect_once(true, err, sizeof err);
    setfsgid(was_gid);
    setfsuid(was_uid);
    pthread_mutex_unlock(&starting);
    if (r < 0) {
      fprintf(stderr, "sbx mount: %s\n", err);
      return -EIO;
    }
    (void)!write(L.wake[1], "k", 1); /* the link thread serves it */
    pthread_mutex_lock(&L.lock);
    if (L.fd < 0) {
      pthread_mutex_unlock(&L.lock);
      return -EIO;
    }
  }
  pending p = {.id = ++L.next_id, .fd = -1};
  p.next = L.pending;
  L.pending = &p;
  int r = send_line(L.fd, json_pack("{s:s, s:I, s:s, s:{s:s}}", "jsonrpc", "2.0", "id", (json_int_t)p.id, "method",
                                    "sbx/view/open", "params", "sandboxId", id));
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60; /* a sandbox that must wake first takes milliseconds; this is a bound, not a wait */
  while (r == 0 && !p.done)
    if (pthread_cond_timedwait(&L.cond, &L.lock, &until) == ETIMEDOUT) p.err = ETIMEDOUT, p.done = true;
  for (pending **pp = &L.pending; *pp; pp = &(*pp)->next)
    if (*pp == &p) {
      *pp = p.next;
      break;
    }
  pthread_mutex_unlock(&L.lock);
  if (r < 0) return -EIO;
  if (p.fd < 0) return -(p.err ? p.err : EIO);
  *uid = p.uid;
  *gid = p.gid;
  *uids = p.uids ? p.uids : 1;
  return p.fd;
}

bool viewlink_connected(void) {
  pthread_mutex_lock(&L.lock);
  bool up = L.fd >= 0;
  pthread_mutex_unlock(&L.lock);
  return up;
}

void viewlink_touch(const char *id) {
  json_t *m = json_pack("{s:s, s:s, s:{s:s}}", "jsonrpc", "2.0", "method", "sbx/view/touch", "params", "sandboxId", id);
  char *s = m ? json_dumps(m, JSON_COMPACT) : NULL;
  json_decref(m);
  if (!s) return;
  size_t n = strlen(s);
  s[n] = '\n';
  pthread_mutex_lock(&L.lock);
  /* never waits on the daemon: a line that cannot go now is not sent (the
   * next use of the sandbox sends another); one that went in part is ended */
  ssize_t w = L.fd >= 0 ? send(L.fd, s, n + 1, MSG_DONTWAIT | MSG_NOSIGNAL) : -1;
  if (w > 0 && (size_t)w < n + 1) (void)sbx_write_all(L.fd, s + w, n + 1 - (size_t)w);
  pthread_mutex_unlock(&L.lock);
  free(s);
}

void viewlink_stop(void) {
  L.stopping = true;
  (void)!write(L.wake[1], "q", 1);
  pthread_join(L.thread, NULL);
}
