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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SP_INIT = 1, SP_WRITE = 2, SP_EXEC = 3 };

/* A request: the arguments' strings travel in strs (offsets, 0 for NULL),
 * descriptors as SCM_RIGHTS: an init's socket and sbx-init's; a command's
 * init pidfd, cgroup files and its own descriptors, in that order. At most
 * SP_MAX bytes, past which the daemon forks for itself: the kernel puts
 * all but 17 pages of a message in one contiguous allocation, which for
 * a bigger one may fail on a fragmented host (and always does past 4
 * MiB); a command of that size is rare. */
#define SP_MAX (64u << 10)
#define SP_ARGS_MAX 64
#define SP_ENV_MAX (SBX_MAX_ENV + 64)
#define SP_CMD_FDS 8 /* a command's own descriptors, at most */
struct sp_req {
  int op;
  unsigned long flags;
  uid_t euid;
  /* SP_INIT: the init's arguments (some 11 KiB) at offset args in strs,
   * not in this head that every request sends; their string pointers are
   * replaced by the offsets below, their layers' targets point to static
   * strings, the same in the spawner (a fork) */
  unsigned init_args, id, etc_template, image_dir, mount_paths[SBX_INIT_MOUNTS_MAX];
  unsigned path; /* SP_WRITE */
  char text[32], name[16];
  sbx_command c; /* SP_EXEC: its pointers are not used */
  unsigned argc, envc, args, cwd; /* args: argv's strings, then envp's */
  bool strict_cwd;
  int nfds;
  unsigned used, cap;
  char strs[];
};

/* The one answer to a request: from the child itself (err 0, its pid in
 * the message's credentials), or from the spawner when it made none. */
struct sp_reply {
  int err;
  int op; /* from a child: its request's */
};

/* The daemon's side: the spawner, and those given up (killed), kept
 * until they are reaped and their socket hung up: a child that tells
 * after its request was given up is killed, not left unknown. */
struct spawner {
  int sock; /* SO_PASSCRED; -1 once hung up */
  pid_t pid;
  unsigned asked;
  bool reaped, closed;
  uv_poll_t poll;
  struct spawner *next;
};
static struct spawner *sp, *retired;
static uv_loop_t *sp_loop;
static int barren; /* spawners in a row that ended before any request */
/* children killed, their zombies reaped by sbx_spawner_reap */
#define REAP_MAX 32
static pid_t to_reap[REAP_MAX];
static int nreap;
static bool orphans_maybe; /* a child may have died before it told */

/* In the spawner and its children: its end of the socket, and the daemon */
static int own = -1;
static pid_t daemon_pid;

/* The calling thread's credentials alone: the raw system calls. glibc's
 * change every thread of the process and wait for each; neither the
 * daemon nor the spawner has another thread (util.h). */
static int thread_setresuid(uid_t r, uid_t e, uid_t s) { return (int)syscall(SYS_setresuid, r, e, s); }
static int thread_setresgid(gid_t r, gid_t e, gid_t s) { return (int)syscall(SYS_setresgid, r, e, s); }

/* In a child of the spawner, first: takes its own name (a child still
 * named as the spawner has told nothing: see sweep_orphans), tells the
 * daemon it exists and lets go of the spawner's socket (the daemon sees
 * the spawner's death as that socket's hang-up). */
static void announce(int op, const char *name) {
  prctl(PR_SET_NAME, name);
  if (own < 0) return;
  struct sp_reply r = {.op = op};
  (void)!send(own, &r, sizeof r, MSG_NOSIGNAL);
  close(own);
  own = -1;
}

/* A change of credentials clears the parent-death signal: the spawner's
 * own is set again (it dies with the daemon). */
static void still_dies_with_daemon(void) {
  if (own < 0) return; /* the daemon itself */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != daemon_pid) _exit(0);
}

/* The clone itself, in the spawner or (without one) the daemon. */
static pid_t init_here(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  if (euid != (uid_t)-1 && (thread_setresgid(-1, euid, -1) < 0 || thread_setresuid(-1, euid, -1) < 0)) {
    int e = errno;
    thread_setresgid(-1, 0, -1);
    still_dies_with_daemon();
    errno = e;
    return -1;
  }
  pid_t pid = sbx_fork_child(flags, pidfd);
  if (pid == 0) {
    announce(SP_INIT, "sbx-init");
    if (other >= 0) close(other);
    sbx_rootfs_init_main(a);
  }
  int e = errno;
  if (euid != (uid_t)-1) {
    if (thread_setresuid(-1, 0, -1) < 0 || thread_setresgid(-1, 0, -1) < 0) abort(); /* cannot happen: the saved uid is 0 */
    still_dies_with_daemon();
  }
  errno = e;
  return pid;
}

static pid_t command_here(const sbx_command *c, unsigned long flags, int *pidfd) {
  pid_t pid = sbx_fork_child(flags, pidfd);
  if (pid == 0) {
    announce(SP_EXEC, "sbx-exec");
    sbx_supervise(c);
  }
  return pid;
}

static pid_t write_here(const char *path, const char *text, const char *name, unsigned long flags) {
  pid_t pid = sbx_fork_child(flags, NULL);
  if (pid == 0) {
    announce(SP_WRITE, name);
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

/* n strings from offset *off on, into v (NULL after them); false if they
 * are not all there */
static bool strings_at(const struct sp_req *q, unsigned *off, unsigned n, char **v) {
  for (unsigned i = 0; i < n; i++) {
    if (!(v[i] = (char *)str_at(q, *off))) return false;
    *off += (unsigned)strlen(v[i]) + 1;
  }
  v[n] = NULL;
  return true;
}

/* A command's request, in the spawner: its supervisor */
static pid_t exec_request(struct sp_req *q, int *fds, int nfds) {
  static char *argv[SP_ARGS_MAX + 1], *envp[SP_ENV_MAX + 1];
  unsigned off = q->args;
  if (q->argc < 1 || q->argc > SP_ARGS_MAX || q->envc > SP_ENV_MAX || q->c.ncg < 0 || q->c.ncg > SBX_CG_MAX ||
      q->nfds < 0 || q->nfds > SP_CMD_FDS || nfds != 1 + q->c.ncg + q->nfds || !strings_at(q, &off, q->argc, argv) ||
      !strings_at(q, &off, q->envc, envp)) {
    errno = EINVAL;
    return -1;
  }
  sbx_spawn spn = {.argv = argv, .envp = envp, .cwd = str_at(q, q->cwd), .strict_cwd = q->strict_cwd,
                   .fds = fds + 1 + q->c.ncg, .nfds = q->nfds};
  sbx_command c = q->c;
  c.sp = &spn;
  c.init_pidfd = fds[0];
  c.cgfds = fds + 1;
  return command_here(&c, CLONE_PARENT, NULL);
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
  /* untouched pages of it cost nothing */
  static char buf[SP_MAX] __attribute__((aligned(16)));
  struct sp_req *q = (struct sp_req *)buf;
  for (;;) {
    int fds[SBX_FDS_MAX], nfds = 0;
    ssize_t n = sbx_recv_fds(own, buf, sizeof buf, fds, SBX_FDS_MAX, &nfds, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0); /* the daemon is gone */
    pid_t pid = -1;
    errno = EINVAL;
    if ((size_t)n >= offsetof(struct sp_req, strs) && q->used <= (size_t)n - offsetof(struct sp_req, strs) && q->used &&
        !q->strs[q->used - 1]) {
      static sbx_init_args init_args;
      sbx_init_args *a = &init_args;
      if (q->op == SP_INIT && nfds == 2 && q->init_args && q->init_args + sizeof *a <= q->used) {
        memcpy(a, q->strs + q->init_args, sizeof *a);
        a->sock = fds[0];
        a->init_exe_fd = fds[1];
        a->id = str_at(q, q->id);
        a->etc_template = str_at(q, q->etc_template);
        a->image_dir = str_at(q, q->image_dir);
        if (a->nmounts < 0 || a->nmounts > SBX_INIT_MOUNTS_MAX) a->nmounts = 0;
        for (int i = 0; i < a->nmounts; i++) a->mount_paths[i] = str_at(q, q->mount_paths[i]);
        if (a->id) pid = init_here(a, -1, q->flags | CLONE_PARENT, q->euid, NULL);
      } else if (q->op == SP_WRITE && str_at(q, q->path)) {
        q->text[sizeof q->text - 1] = q->name[sizeof q->name - 1] = 0;
        pid = write_here(str_at(q, q->path), q->text, q->name, CLONE_PARENT);
      } else if (q->op == SP_EXEC) {
        pid = exec_request(q, fds, nfds);
      }
    }
    struct sp_reply rep = {.err = errno};
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (pid < 0) (void)!send(own, &rep, sizeof rep, MSG_NOSIGNAL); /* else its child told */
  }
}

/* Reads one answer: its size (0: a hang-up), its sender's pid in *pid. */
static ssize_t read_answer(int sock, struct sp_reply *rep, pid_t *pid) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(struct ucred))];
  } u;
  struct iovec iov = {rep, sizeof *rep};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *pid = 0;
  for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
      struct ucred cr;
      memcpy(&cr, CMSG_DATA(c), sizeof cr);
      *pid = cr.pid;
    }
  return n;
}

/* A child the daemon will not keep. A supervisor may have started its
 * command already: its SIGTERM kills the command's group (it is taken
 * once the supervisor's handler stands), a SIGKILL would leave that
 * running. An init's death ends everything of its sandbox. */
static void kill_child(pid_t pid, int op) {
  if (kill(pid, op == SP_EXEC ? SIGTERM : SIGKILL) == 0 && nreap < REAP_MAX) to_reap[nreap++] = pid;
}

static void handle_closed(uv_handle_t *h) {
  struct spawner *s = h->data;
  s->closed = true;
}

/* Its socket hung up: nothing more can come on it. */
static void hung_up(struct spawner *s) {
  if (s->sock < 0) return;
  uv_poll_stop(&s->poll);
  close(s->sock);
  s->sock = -1;
  uv_close((uv_handle_t *)&s->poll, handle_closed);
}

/* Given up: killed, and kept (see struct spawner) until it is reaped. */
static void retire(struct spawner *s) {
  kill(s->pid, SIGKILL);
  s->next = retired;
  retired = s;
}

/* It died or stopped answering: the next requests go to a new one, unless
 * three in a row ended before their first request (then the daemon forks
 * for itself from now on). */
static void gone(void) {
  struct spawner *s = sp;
  if (!s) return;
  sp = NULL;
  barren = s->asked ? 0 : barren + 1;
  retire(s);
  if (barren < 3) sbx_spawner_start(sp_loop);
}

static void spawner_readable(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  struct spawner *s = h->data;
  for (;;) {
    struct sp_reply rep;
    pid_t pid;
    ssize_t n = read_answer(s->sock, &rep, &pid);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) { /* nothing is asked now: a child that told after its request was given up */
      if (pid > 0 && pid != s->pid) kill_child(pid, rep.op);
      continue;
    }
    if (s == sp) gone();
    hung_up(s);
    return;
  }
}

/* A zombie child of the daemon still named as the spawner, that is no
 * spawner: a child that died before it told (children take their own
 * name first); nobody else would reap it. */
static void sweep_orphans(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  _cleanup_free_ char *line = NULL;
  size_t cap = 0;
  if (!f || getline(&line, &cap, f) < 0) return;
  for (char *t = strtok(line, " \n"); t; t = strtok(NULL, " \n")) {
    pid_t pid = (pid_t)atoi(t);
    bool spawner = sp && sp->pid == pid;
    for (struct spawner *r = retired; r && !spawner; r = r->next) spawner = r->pid == pid;
    char stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    _cleanup_fclose_ FILE *g = fopen(path, "re");
    if (spawner || !g || !fgets(stat, sizeof stat, g)) continue;
    char *open = strchr(stat, '('), *close_ = strrchr(stat, ')');
    if (open && close_ && close_[1] == ' ' && close_[2] == 'Z' && close_ - open - 1 == 11 &&
        !strncmp(open + 1, "sbx-spawner", 11))
      waitpid(pid, NULL, WNOHANG);
  }
}

void sbx_spawner_reap(void) {
  for (int i = nreap - 1; i >= 0; i--)
    if (waitpid(to_reap[i], NULL, WNOHANG) != 0) to_reap[i] = to_reap[--nreap];
  for (struct spawner **pp = &retired; *pp;) {
    struct spawner *r = *pp;
    if (!r->reaped) r->reaped = waitpid(r->pid, NULL, WNOHANG) != 0;
    if (r->reaped && r->closed) {
      *pp = r->next;
      free(r);
    } else {
      pp = &r->next;
    }
  }
  if (orphans_maybe) {
    orphans_maybe = false;
    sweep_orphans();
  }
}

bool sbx_spawner_start(uv_loop_t *loop) {
  if (sp) return true;
  sp_loop = loop;
  int sv[2];
  if (!loop || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return false;
  int one = 1;
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
  uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, spawner_readable);
  sp = s;
  return true;
}

/* At the daemon's stop: what is left is reaped by whoever adopts it. */
void sbx_spawner_stop(void) {
  struct spawner *s = sp;
  if (!s) return;
  sp = NULL;
  retire(s);
  hung_up(s);
  sbx_spawner_reap();
}

/* A request of op with room for strs bytes of strings (NULL: none) */
static struct sp_req *new_req(int op, size_t strs) {
  size_t cap = strs + 1;
  if (cap > SP_MAX - offsetof(struct sp_req, strs)) return NULL; /* forked here */
  struct sp_req *q = malloc(offsetof(struct sp_req, strs) + cap);
  if (!q) return NULL;
  memset(q, 0, offsetof(struct sp_req, strs));
  q->op = op;
  q->strs[0] = 0; /* offset 0 is NULL */
  q->used = 1;
  q->cap = (unsigned)cap;
  return q;
}

static size_t len0(const char *s) { return s ? strlen(s) + 1 : 0; }

/* n bytes of data, as they are (no alignment: copied out before use) */
static unsigned pack_bytes(struct sp_req *q, const void *data, size_t n) {
  if (q->used + n > q->cap) abort(); /* sized by the caller */
  memcpy(q->strs + q->used, data, n);
  q->used += (unsigned)n;
  return q->used - (unsigned)n;
}

static unsigned pack(struct sp_req *q, const char *s) { return s ? pack_bytes(q, s, strlen(s) + 1) : 0; }

/* One request and its answer: the child's pid, or -1 with errno. *asked
 * false: the spawner made no child (it could not be asked, or it died
 * first), and the daemon may fork for itself. */
static pid_t ask(struct sp_req *q, const int *fds, int nfds, bool *asked) {
  *asked = false;
  struct spawner *s = sp;
  if (!s) return -1;
  size_t len = offsetof(struct sp_req, strs) + q->used;
  if (sbx_send_fds(s->sock, q, len, fds, nfds, 0) != (ssize_t)len) {
    /* it did not get it; only a hang-up means it is gone (a message
     * the kernel could not take, ENOBUFS, is forked here) */
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) gone();
    return -1;
  }
  s->asked++;
  /* a clone into new namespaces takes milliseconds; a spawner that has not
   * answered in seconds is hung, or its child died before it told: killed,
   * then a child it made still tells (it holds the socket), and a hang-up
   * with none told means there is none */
  uint64_t deadline = sbx_now_ms() + 5000;
  bool killed = false;
  for (;;) {
    uint64_t now = sbx_now_ms();
    if (now >= deadline) {
      if (!killed) {
        gone(); /* a new one for the next request; this one is still heard */
        orphans_maybe = true;
        killed = true;
        deadline = now + 2000;
        continue;
      }
      /* not even a hang-up (it cannot die: frozen): a child may still tell,
       * so none is made here; what tells later is killed */
      errno = EAGAIN;
      *asked = true;
      return -1;
    }
    struct pollfd p = {.fd = s->sock, .events = POLLIN};
    if (poll(&p, 1, (int)(deadline - now)) <= 0) continue;
    struct sp_reply rep;
    pid_t pid;
    ssize_t n = read_answer(s->sock, &rep, &pid);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n != (ssize_t)sizeof rep) { /* a hang-up: it died, and made no child (or one that died first) */
      if (s == sp) gone();
      hung_up(s);
      orphans_maybe = true;
      return -1;
    }
    *asked = true;
    if (rep.err) {
      errno = rep.err;
      return -1;
    }
    if (pid <= 0 || pid == s->pid) { /* cannot happen: a child's answer has its pid */
      errno = EPROTO;
      return -1;
    }
    return pid;
  }
}

/* ask(), then the child's pidfd if pidfd; the request freed */
static pid_t ask_free(struct sp_req *q, const int *fds, int nfds, int *pidfd, bool *asked) {
  pid_t pid = ask(q, fds, nfds, asked);
  int op = q->op;
  free(q);
  if (pid > 0 && pidfd && (*pidfd = sbx_pidfd_open(pid)) < 0) { /* our own child, not reaped: only EMFILE */
    int e = errno;
    kill_child(pid, op);
    errno = e;
    return -1;
  }
  return pid;
}

pid_t sbx_spawn_init(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  size_t strs = sizeof *a + len0(a->id) + len0(a->etc_template) + len0(a->image_dir);
  for (int i = 0; i < a->nmounts; i++) strs += len0(a->mount_paths[i]);
  struct sp_req *q = sp ? new_req(SP_INIT, strs) : NULL;
  if (q) {
    q->flags = flags;
    q->euid = euid;
    q->init_args = pack_bytes(q, a, sizeof *a);
    q->id = pack(q, a->id);
    q->etc_template = pack(q, a->etc_template);
    q->image_dir = pack(q, a->image_dir);
    for (int i = 0; i < a->nmounts; i++) q->mount_paths[i] = pack(q, a->mount_paths[i]);
    bool asked;
    int fds[2] = {a->sock, a->init_exe_fd};
    pid_t pid = ask_free(q, fds, 2, pidfd, &asked);
    if (asked) return pid;
  }
  return init_here(a, other, flags, euid, pidfd);
}

pid_t sbx_spawn_command(const sbx_command *c, int *pidfd) {
  const sbx_spawn *spn = c->sp;
  size_t strs = len0(spn->cwd);
  unsigned argc = 0, envc = 0;
  for (; spn->argv[argc]; argc++) strs += len0(spn->argv[argc]);
  for (; spn->envp && spn->envp[envc]; envc++) strs += len0(spn->envp[envc]);
  struct sp_req *q = sp && argc <= SP_ARGS_MAX && envc <= SP_ENV_MAX && c->ncg <= SBX_CG_MAX && spn->nfds <= SP_CMD_FDS
                         ? new_req(SP_EXEC, strs)
                         : NULL;
  if (q) {
    q->c = *c;
    q->argc = argc;
    q->envc = envc;
    q->args = q->used;
    for (unsigned i = 0; i < argc; i++) pack(q, spn->argv[i]);
    for (unsigned i = 0; i < envc; i++) pack(q, spn->envp[i]);
    q->cwd = pack(q, spn->cwd);
    q->strict_cwd = spn->strict_cwd;
    q->nfds = spn->nfds;
    int fds[1 + SBX_CG_MAX + SP_CMD_FDS], nfds = 0;
    fds[nfds++] = c->init_pidfd;
    for (int i = 0; i < c->ncg; i++) fds[nfds++] = c->cgfds[i];
    for (int i = 0; i < spn->nfds; i++) fds[nfds++] = spn->fds[i];
    bool asked;
    pid_t pid = ask_free(q, fds, nfds, pidfd, &asked);
    if (asked) return pid;
  }
  return command_here(c, 0, pidfd);
}

pid_t sbx_spawn_write(const char *path, const char *text, const char *name) {
  struct sp_req *q = sp ? new_req(SP_WRITE, len0(path)) : NULL;
  if (q) {
    q->path = pack(q, path);
    snprintf(q->text, sizeof q->text, "%s", text);
    snprintf(q->name, sizeof q->name, "%s", name);
    bool asked;
    pid_t pid = ask_free(q, NULL, 0, NULL, &asked);
    if (asked) return pid;
  }
  return write_here(path, text, name, 0);
}
