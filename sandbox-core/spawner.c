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
  sbx_init_args a; /* its pointers are not used: the offsets below say */
  unsigned id, etc_template, image_dir, mount_paths[SBX_INIT_MOUNTS_MAX];
  unsigned path; /* SP_WRITE */
  char text[32], name[16];
  unsigned used;
  char strs[SP_STRS];
};

struct sp_reply {
  int err; /* errno, 0 */
  pid_t pid;
};

static struct {
  int sock; /* the daemon's end; -1: none (fork here) */
  pid_t pid;
} sp = {-1, 0};

/* The calling thread's credentials alone: the raw system calls. glibc's
 * change every thread of the process and wait for each; neither the
 * daemon nor the spawner has another thread (util.h). */
static int thread_setresuid(uid_t r, uid_t e, uid_t s) { return (int)syscall(SYS_setresuid, r, e, s); }
static int thread_setresgid(gid_t r, gid_t e, gid_t s) { return (int)syscall(SYS_setresgid, r, e, s); }

/* The clone itself, in the daemon or the spawner (whose own socket the
 * child closes, with the daemon's end of init's socket, other). */
static pid_t init_here(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  if (euid != (uid_t)-1 && (thread_setresgid(-1, euid, -1) < 0 || thread_setresuid(-1, euid, -1) < 0)) {
    int e = errno;
    thread_setresgid(-1, 0, -1);
    errno = e;
    return -1;
  }
  pid_t pid = sbx_fork_child(flags, pidfd);
  if (pid == 0) {
    if (other >= 0) close(other);
    if (sp.sock >= 0) close(sp.sock);
    sbx_rootfs_init_main(a);
  }
  int e = errno;
  if (euid != (uid_t)-1 && (thread_setresuid(-1, 0, -1) < 0 || thread_setresgid(-1, 0, -1) < 0))
    abort(); /* cannot happen: the saved uid is 0 */
  errno = e;
  return pid;
}

static pid_t write_here(const char *path, const char *text, const char *name, unsigned long flags) {
  pid_t pid = sbx_fork_child(flags, NULL);
  if (pid == 0) {
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

static _Noreturn void spawner_main(int sock) {
  prctl(PR_SET_NAME, "sbx-spawner");
  if (sock != 3) {
    dup3(sock, 3, O_CLOEXEC);
    sock = 3;
  }
  close_range(4, ~0U, 0); /* the daemon's descriptors of the moment are not ours */
  sp.sock = sock;
  static struct sp_req q;
  for (;;) {
    int fds[2] = {-1, -1}, nfds = 0;
    ssize_t n = sbx_recv_fds(sock, &q, sizeof q, fds, 2, &nfds, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0); /* the daemon is gone */
    struct sp_reply rep = {.err = EINVAL, .pid = -1};
    int pidfd = -1;
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
        rep.pid = init_here(a, -1, q.flags | CLONE_PARENT, q.euid, &pidfd);
      } else if (q.op == SP_WRITE && str_at(&q, q.path)) {
        q.text[sizeof q.text - 1] = q.name[sizeof q.name - 1] = 0;
        rep.pid = write_here(str_at(&q, q.path), q.text, q.name, CLONE_PARENT);
      }
      rep.err = rep.pid < 0 ? errno : 0;
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    sbx_send_fds(sock, &rep, sizeof rep, &pidfd, pidfd >= 0, 0);
    if (pidfd >= 0) close(pidfd);
  }
}

bool sbx_spawner_start(void) {
  if (sp.sock >= 0) return true;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return false;
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid == 0) {
    close(sv[0]);
    spawner_main(sv[1]);
  }
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    return false;
  }
  sp.sock = sv[0];
  sp.pid = pid;
  return true;
}

void sbx_spawner_stop(void) {
  if (sp.sock < 0) return;
  close(sp.sock); /* it exits at the hang-up */
  sp.sock = -1;
  while (waitpid(sp.pid, NULL, 0) < 0 && errno == EINTR) {
  }
  sp.pid = 0;
}

/* The spawner died or stopped answering: this request is done by the
 * daemon itself, the next ones by a new spawner (a fork of the daemon as
 * it is now, which costs its pages one copy-on-write fault each once). */
static void gone(void) {
  kill(sp.pid, SIGKILL);
  sbx_spawner_stop();
  sbx_spawner_start();
}

/* the header cleared; strs starts with the 0 that offset 0 (NULL) is */
static void start(struct sp_req *q, int op) {
  memset(q, 0, offsetof(struct sp_req, strs));
  q->op = op;
  q->strs[0] = 0;
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

/* One request and its answer; -1 with errno when the spawner cannot be
 * asked (and is then given up), otherwise the child's pid or -1 with the
 * spawner's errno. */
static pid_t ask(struct sp_req *q, const int *fds, int nfds, int *pidfd, bool *asked) {
  *asked = false;
  if (sp.sock < 0) return -1;
  size_t len = offsetof(struct sp_req, strs) + q->used;
  if (sbx_send_fds(sp.sock, q, len, fds, nfds, 0) != (ssize_t)len) {
    gone();
    return -1;
  }
  struct sp_reply rep;
  int got[1], ngot = 0;
  ssize_t n;
  for (;;) {
    /* a clone into new namespaces is milliseconds; far more is a spawner
     * that hangs */
    struct pollfd p = {.fd = sp.sock, .events = POLLIN};
    int pr = poll(&p, 1, 10000);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      n = -1;
      break;
    }
    n = sbx_recv_fds(sp.sock, &rep, sizeof rep, got, 1, &ngot, 0);
    if (n >= 0 || errno != EINTR) break;
  }
  if (n != (ssize_t)sizeof rep || (rep.pid > 0 && pidfd && ngot != 1)) {
    for (int i = 0; i < ngot; i++) close(got[i]);
    gone();
    return -1;
  }
  *asked = true;
  if (pidfd) *pidfd = ngot ? got[0] : -1;
  else if (ngot) close(got[0]);
  if (rep.pid < 0) errno = rep.err;
  return rep.pid;
}

pid_t sbx_spawn_init(const sbx_init_args *a, int other, unsigned long flags, uid_t euid, int *pidfd) {
  if (sp.sock >= 0) {
    static struct sp_req q;
    start(&q, SP_INIT);
    q.flags = flags;
    q.euid = euid;
    q.a = *a;
    q.id = pack(&q, a->id);
    q.etc_template = pack(&q, a->etc_template);
    q.image_dir = pack(&q, a->image_dir);
    for (int i = 0; i < a->nmounts; i++) q.mount_paths[i] = pack(&q, a->mount_paths[i]);
    bool asked;
    int fds[2] = {a->sock, a->init_exe_fd};
    pid_t pid = ask(&q, fds, 2, pidfd, &asked);
    if (asked) return pid;
  }
  return init_here(a, other, flags, euid, pidfd);
}

pid_t sbx_spawn_write(const char *path, const char *text, const char *name) {
  if (sp.sock >= 0) {
    static struct sp_req q;
    start(&q, SP_WRITE);
    q.path = pack(&q, path);
    snprintf(q.text, sizeof q.text, "%s", text);
    snprintf(q.name, sizeof q.name, "%s", name);
    bool asked;
    pid_t pid = ask(&q, NULL, 0, NULL, &asked);
    if (asked) return pid;
  }
  return write_here(path, text, name, 0);
}
