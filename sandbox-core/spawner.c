/* The spawner: see spawner.h. */
#define _GNU_SOURCE
#include "spawner.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SP_INIT = 1, SP_WRITE = 2 };

/* A request: the arguments' strings travel in strs (offsets, 0 for NULL);
 * an init's socket and sbx-init's fd as SCM_RIGHTS. */
#define SP_STRS (4096 * (SBX_INIT_MOUNTS_MAX + 4))
struct sp_req {
  int op;
  unsigned long flags;
  uid_t euid;
  /* its string pointers are replaced by the offsets below; its layers'
   * targets point to static strings, the same in the spawner (a fork) */
  sbx_init_args a;
  unsigned id, etc_template, image_dir, mount_paths[SBX_INIT_MOUNTS_MAX];
  unsigned path; /* SP_WRITE */
  char text[32], name[16];
  unsigned used;
  char strs[SP_STRS];
};

/* The one answer to a request: from the child itself (err 0, its pid in
 * the message's credentials), or from the spawner when it made none. */
struct sp_reply {
  int err;
};

/* The daemon's side */
static struct spawner {
  int sock; /* SO_PASSCRED */
  pid_t pid;
  unsigned served;
  uv_poll_t poll; /* a hang-up: it died */
} *sp;
static uv_loop_t *sp_loop;
static int broken; /* spawners in a row that ended by themselves or hung, having served nothing */

/* In the spawner and its children: its end of the socket, and the daemon */
static int own = -1;
static pid_t daemon_pid;

/* The calling thread's credentials alone: the raw system calls. glibc's
 * change every thread of the process and wait for each; neither the
 * daemon nor the spawner has another thread (util.h). */
static int thread_setresuid(uid_t r, uid_t e, uid_t s) { return (int)syscall(SYS_setresuid, r, e, s); }
static int thread_setresgid(gid_t r, gid_t e, gid_t s) { return (int)syscall(SYS_setresgid, r, e, s); }

/* In a child of the spawner, first: tells the daemon it exists, and lets
 * go of the spawner's socket (the daemon sees the spawner's death as
 * that socket's hang-up). */
static void announce(void) {
  if (own < 0) return;
  struct sp_reply r = {0};
  (void)!send(own, &r, sizeof r, MSG_NOSIGNAL);
  close(own);
  own = -1;
}

/* The clone itself, in the spawner or (without one) the daemon. */
static pid_t init_here(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  if (euid != (uid_t)-1 && (thread_setresgid(-1, euid, -1) < 0 || thread_setresuid(-1, euid, -1) < 0)) {
    int e = errno;
    thread_setresgid(-1, 0, -1);
    errno = e;
    return -1;
  }
  pid_t pid = sbx_fork_child(flags, pidfd);
  if (pid == 0) {
    announce();
    if (other >= 0) close(other);
    sbx_rootfs_init_main(a);
  }
  int e = errno;
  if (euid != (uid_t)-1) {
    if (thread_setresuid(-1, 0, -1) < 0 || thread_setresgid(-1, 0, -1) < 0) abort(); /* cannot happen: the saved uid is 0 */
    /* a change of credentials clears the parent-death signal: the
     * spawner's own, set again (it dies with the daemon) */
    if (own >= 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != daemon_pid) _exit(0);
    }
  }
  errno = e;
  return pid;
}

static pid_t write_here(const char *path, const char *text, const char *name, unsigned long flags) {
  pid_t pid = sbx_fork_child(flags, NULL);
  if (pid == 0) {
    announce();
    prctl(PR_SET_NAME, name);
    close_range(3, ~0U, 0); /* nothing of the daemon's held open meanwhile */
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    size_t len = strlen(text);
    _exit(fd >= 0 && write(fd, text, len) == (ssize_t)len ? 0 : 1);
  }
  return pid;
}

static const char *str_at(const struct sp_req *q, unsigned off) {
  return off && off < q->used ? q->strs + off : NULL;
}

static _Noreturn void spawner_main(int sock, pid_t daemon) {
  prctl(PR_SET_NAME, "sbx-spawner");
  if (sock != 3) {
    dup3(sock, 3, O_CLOEXEC);
    sock = 3;
  }
  close_range(4, ~0U, 0); /* the daemon's descriptors of the moment are not ours */
  own = sock;
  daemon_pid = daemon;
  if (getppid() != daemon) _exit(0);
  static struct sp_req q;
  for (;;) {
    int fds[2] = {-1, -1}, nfds = 0;
    ssize_t n = sbx_recv_fds(own, &q, sizeof q, fds, 2, &nfds, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0); /* the daemon is gone */
    pid_t pid = -1;
    errno = EINVAL;
    if ((size_t)n >= offsetof(struct sp_req, strs) && q.used <= (size_t)n - offsetof(struct sp_req, strs) && q.used &&
        !q.strs[q.used - 1]) {
      if (q.op == SP_INIT && nfds == 2) {
        sbx_init_args *a = &q.a;
        a->sock = fds[0];
        a->init_exe_fd = fds[1];
        a->id = str_at(&q, q.id);
        a->etc_template = str_at(&q, q.etc_template);
        a->image_dir = str_at(&q, q.image_dir);
        if (a->nmounts < 0 || a->nmounts > SBX_INIT_MOUNTS_MAX) a->nmounts = 0;
        for (int i = 0; i < a->nmounts; i++) a->mount_paths[i] = str_at(&q, q.mount_paths[i]);
        if (a->id) pid = init_here(a, -1, q.flags | CLONE_PARENT, q.euid, NULL);
      } else if (q.op == SP_WRITE && str_at(&q, q.path)) {
        q.text[sizeof q.text - 1] = q.name[sizeof q.name - 1] = 0;
        pid = write_here(str_at(&q, q.path), q.text, q.name, CLONE_PARENT);
      }
    }
    struct sp_reply rep = {.err = errno};
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (pid < 0) (void)!send(own, &rep, sizeof rep, MSG_NOSIGNAL); /* else its child told */
  }
}

static void spawner_closed(uv_handle_t *h) { free(h->data); }

/* This spawner is done with: killed, reaped, its socket closed. Whether
 * it died of a SIGKILL (when it had hung up already: not ours). */
static bool drop(void) {
  struct spawner *s = sp;
  if (!s) return false;
  sp = NULL;
  kill(s->pid, SIGKILL);
  int st = 0;
  while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
  }
  bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  uv_poll_stop(&s->poll);
  close(s->sock);
  s->poll.data = s;
  uv_close((uv_handle_t *)&s->poll, spawner_closed);
  return killed;
}

/* It died or stopped answering (hung): the next requests go to a new one,
 * unless three in a row ended by themselves or hung before serving
 * anything (then the daemon forks for itself from now on). */
static void gone(bool hung) {
  bool served = sp && sp->served;
  bool killed = drop() && !hung; /* from outside: it had hung up, or never got the request */
  broken = served || killed ? 0 : broken + 1;
  if (broken < 3) sbx_spawner_start(sp_loop);
}

static void spawner_hangup(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  struct spawner *s = h->data;
  char c;
  ssize_t n = recv(s->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) { /* a child that told after its request was given up: not ours to keep */
    struct ucred cr = {0};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(struct ucred))];
    } u;
    struct sp_reply rep;
    struct iovec iov = {&rep, sizeof rep};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    if (recvmsg(s->sock, &m, MSG_DONTWAIT) >= 0)
      for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) memcpy(&cr, CMSG_DATA(c), sizeof cr);
    if (cr.pid > 0 && cr.pid != s->pid && kill(cr.pid, SIGKILL) == 0) waitpid(cr.pid, NULL, 0);
    return;
  }
  gone(false);
}

bool sbx_spawner_start(uv_loop_t *loop) {
  if (sp) return true;
  sp_loop = loop;
  int sv[2];
  if (!loop || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return false;
  /* a request is some 60 KiB at most; a small default buffer must not
   * refuse it (the daemon then forks for itself) */
  int one = 1, big = 1 << 20;
  if (setsockopt(sv[0], SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) < 0)
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  struct spawner *s = calloc(1, sizeof *s);
  if (!s || setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0) {
    free(s);
    close(sv[0]), close(sv[1]);
    return false;
  }
  pid_t daemon = getpid();
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid == 0) {
    close(sv[0]);
    spawner_main(sv[1], daemon);
  }
  close(sv[1]);
  if (pid < 0) {
    free(s);
    close(sv[0]);
    return false;
  }
  *s = (struct spawner){.sock = sv[0], .pid = pid};
  uv_poll_init(loop, &s->poll, s->sock);
  s->poll.data = s;
  uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, spawner_hangup);
  sp = s;
  return true;
}

void sbx_spawner_stop(void) { drop(); }

static void start_req(struct sp_req *q, int op) {
  memset(q, 0, offsetof(struct sp_req, strs));
  q->op = op;
  q->strs[0] = 0; /* offset 0 is NULL */
  q->used = 1;
}

static unsigned pack(struct sp_req *q, const char *s) {
  if (!s) return 0;
  size_t len = strlen(s) + 1;
  if (q->used + len > sizeof q->strs) return 0;
  memcpy(q->strs + q->used, s, len);
  q->used += (unsigned)len;
  return q->used - (unsigned)len;
}

/* One request and its answer: the child's pid, or -1 with errno. *asked
 * false: the spawner made no child (it could not be asked, or it died
 * first), and the daemon may fork for itself. */
static pid_t ask(struct sp_req *q, const int *fds, int nfds, bool *asked) {
  *asked = false;
  if (!sp) return -1;
  size_t len = offsetof(struct sp_req, strs) + q->used;
  if (sbx_send_fds(sp->sock, q, len, fds, nfds, 0) != (ssize_t)len) {
    if (errno != EMSGSIZE) gone(false); /* it did not get it */
    return -1;
  }
  /* a clone into new namespaces takes milliseconds; a spawner that has
   * not answered in seconds is hung: killed, then its children, if it
   * made one, still tell (they hold its socket), and a hang-up with none
   * told means there is none */
  uint64_t deadline = sbx_now_ms() + 5000;
  bool killed = false;
  for (;;) {
    uint64_t now = sbx_now_ms();
    if (now >= deadline) {
      if (killed) { /* a child may be on its way: not forked a second time */
        gone(true);
        *asked = true;
        errno = EAGAIN;
        return -1;
      }
      kill(sp->pid, SIGKILL);
      killed = true;
      deadline = now + 2000;
      continue;
    }
    struct pollfd p = {.fd = sp->sock, .events = POLLIN};
    if (poll(&p, 1, (int)(deadline - now)) <= 0) continue;
    struct sp_reply rep;
    struct ucred cr = {0};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(struct ucred))];
    } u;
    struct iovec iov = {&rep, sizeof rep};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(sp->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n != (ssize_t)sizeof rep) { /* a hang-up: it died, and made no child */
      gone(killed);
      return -1;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) memcpy(&cr, CMSG_DATA(c), sizeof cr);
    *asked = true;
    sp->served++;
    if (killed) gone(true);
    if (rep.err) {
      errno = rep.err;
      return -1;
    }
    if (cr.pid <= 0 || (!killed && cr.pid == sp->pid)) { /* cannot happen: a child's message has its pid */
      errno = EPROTO;
      return -1;
    }
    return cr.pid;
  }
}

pid_t sbx_spawn_init(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  if (sp) {
    static struct sp_req q;
    start_req(&q, SP_INIT);
    q.flags = flags;
    q.euid = euid;
    q.a = *a;
    q.id = pack(&q, a->id);
    q.etc_template = pack(&q, a->etc_template);
    q.image_dir = pack(&q, a->image_dir);
    for (int i = 0; i < a->nmounts; i++) q.mount_paths[i] = pack(&q, a->mount_paths[i]);
    bool asked;
    int fds[2] = {a->sock, a->init_exe_fd};
    pid_t pid = ask(&q, fds, 2, &asked);
    if (pid > 0 && pidfd && (*pidfd = sbx_pidfd_open(pid)) < 0) { /* our own child, not reaped: only EMFILE */
      int e = errno;
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      errno = e;
      return -1;
    }
    if (asked) return pid;
  }
  return init_here(a, other, flags, euid, pidfd);
}

pid_t sbx_spawn_write(const char *path, const char *text, const char *name) {
  if (sp) {
    static struct sp_req q;
    start_req(&q, SP_WRITE);
    q.path = pack(&q, path);
    snprintf(q.text, sizeof q.text, "%s", text);
    snprintf(q.name, sizeof q.name, "%s", name);
    bool asked;
    pid_t pid = ask(&q, NULL, 0, &asked);
    if (asked) return pid;
  }
  return write_here(path, text, name, 0);
}
