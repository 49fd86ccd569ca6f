#define _GNU_SOURCE
#include "ports.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

typedef struct waiter {
  uv_poll_t poll;
  int pidfd;
  uint64_t start;
  sbx_port_cb cb;
  void *ud;
} waiter;

/* ms from now to the deadline, at most cap (at least 1: a last look). */
static int left(uint64_t deadline, int cap) {
  uint64_t now = sbx_now_ms();
  return now >= deadline ? 1 : deadline - now < (uint64_t)cap ? (int)(deadline - now) : cap;
}

/* One attempt at 127.0.0.1 or [::1] (v6): connect within 500 ms (and for
 * http, get a status line within 2 s), none of it past the deadline. */
static bool probe(int port, bool http, bool v6, uint64_t deadline) {
  int s = sbx_loopback_connect((uint16_t)port, v6);
  if (s < 0) return false;
  bool ok = false;
  struct pollfd p = {.fd = s, .events = POLLOUT};
  int err = 0;
  socklen_t l = sizeof err;
  if (poll(&p, 1, left(deadline, 500)) == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err == 0) {
    ok = true;
    if (http) {
      static const char req[] = "GET / HTTP/1.0\r\nHost: localhost\r\n\r\n";
      char buf[8] = "";
      p.events = POLLIN;
      ok = send(s, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)sizeof req - 1 && poll(&p, 1, left(deadline, 2000)) == 1 &&
           recv(s, buf, 5, 0) == 5 && !memcmp(buf, "HTTP/", 5);
      /* the whole answer is read (HTTP/1.0: the server closes), so the
       * close is not a reset the server would log */
      char rest[4096];
      uint64_t until = sbx_now_ms() + 2000;
      if (until > deadline) until = deadline;
      while (ok && sbx_now_ms() < until && poll(&p, 1, left(until, 200)) == 1 && recv(s, rest, sizeof rest, 0) > 0) {
      }
    }
  }
  close(s);
  return ok;
}

static void on_exit_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  waiter *w = h->data;
  siginfo_t si = {0};
  if (waitid(P_PIDFD, w->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0) return;
  uv_poll_stop(h);
  w->cb(w->ud, si.si_code == CLD_EXITED && si.si_status == 0, sbx_now_ms() - w->start);
  close(w->pidfd);
  uv_close((uv_handle_t *)h, (uv_close_cb)free);
}

int sbx_port_wait(uv_loop_t *loop, sbx_sandbox *sb, int port, int64_t timeout_ms, bool http, sbx_port_cb cb, void *ud,
                  sbx_error *err) {
  if (port < 1 || port > 65535) return sbx_err(err, "INVALID_PORT", "port must be 1-65535, got %d", port);
  int pidfd = -1;
  pid_t pid = sbx_fork_child(0, &pidfd);
  if (pid < 0) return sbx_err_errno(err, "INTERNAL", errno, "fork");
  if (pid == 0) {
    sbx_child_unblock();
    if (setns(sb->init_pidfd, CLONE_NEWUSER | CLONE_NEWNET) < 0) _exit(2);
    close_range(3, ~0U, 0); /* none of the daemon's sockets stay open in here */
    uint64_t deadline = sbx_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
      /* a server on "localhost" may listen on [::1] alone (Node, Vite) */
      if (probe(port, http, false, deadline) || probe(port, http, true, deadline)) _exit(0);
      if (sbx_now_ms() >= deadline) _exit(1);
      struct timespec ts = {0, 50 * 1000 * 1000}; /* between attempts: nothing to wait on in another netns */
      nanosleep(&ts, NULL);
    }
  }
  waiter *w = calloc(1, sizeof *w);
  w->pidfd = pidfd;
  w->start = sbx_now_ms();
  w->cb = cb;
  w->ud = ud;
  uv_poll_init(loop, &w->poll, pidfd);
  w->poll.data = w;
  uv_poll_start(&w->poll, UV_READABLE, on_exit_cb);
  return 0;
}
