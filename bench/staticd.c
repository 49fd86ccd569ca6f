/* A small static HTTP/1.1 server for the preview benchmark, built inside
 * the sandbox with the host's gcc: one thread, epoll, keep-alive and
 * pipelining, a backlog that drops no SYN. GET /big answers 1 GiB of
 * zeros; anything else a 612-byte page (the size of nginx's default).
 *   staticd PORT */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BIG (1024L * 1024 * 1024)

typedef struct conn {
  int fd;
  size_t in;
  char buf[8192];
  const char *out; /* a fixed response being written */
  size_t out_left;
  long big_left; /* bytes of /big still to write */
} conn;

static char page[612], small[1024], big_head[128], zeros[1 << 20];
static size_t small_len, big_head_len;

static void drop(int ep, conn *c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c);
}

/* Writes what is pending; 1 when all of it is out, 0 when the socket is
 * full, -1 on error. */
static int flush(conn *c) {
  while (c->out_left || c->big_left) {
    ssize_t n;
    if (c->out_left) n = write(c->fd, c->out, c->out_left);
    else n = write(c->fd, zeros, c->big_left < (long)sizeof zeros ? (size_t)c->big_left : sizeof zeros);
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    if (c->out_left) c->out += n, c->out_left -= (size_t)n;
    else c->big_left -= n;
  }
  return 1;
}

/* Answers every complete request in the buffer, in order. */
static int serve(conn *c) {
  for (;;) {
    int r = flush(c);
    if (r <= 0) return r;
    char *end = memmem(c->buf, c->in, "\r\n\r\n", 4);
    if (!end) return c->in == sizeof c->buf ? -1 : 1; /* a head over 8 KiB: dropped */
    size_t len = (size_t)(end + 4 - c->buf);
    if (!strncmp(c->buf, "GET /big ", 9)) {
      c->out = big_head, c->out_left = big_head_len, c->big_left = BIG;
    } else {
      c->out = small, c->out_left = small_len;
    }
    memmove(c->buf, c->buf + len, c->in - len);
    c->in -= len;
  }
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 8000;
  memset(page, 'x', sizeof page);
  small_len = (size_t)snprintf(small, sizeof small, "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %zu\r\n\r\n",
                               sizeof page);
  memcpy(small + small_len, page, sizeof page);
  small_len += sizeof page;
  big_head_len = (size_t)snprintf(big_head, sizeof big_head, "HTTP/1.1 200 OK\r\nContent-Length: %ld\r\n\r\n", BIG);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 4096) < 0) {
    perror("staticd");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  printf("listening on %d\n", port);
  fflush(stdout);
  struct epoll_event evs[64];
  for (;;) {
    int n = epoll_wait(ep, evs, 64, -1);
    for (int i = 0; i < n; i++) {
      conn *c = evs[i].data.ptr;
      if (!c) {
        int fd;
        while ((fd = accept4(s, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          c = calloc(1, sizeof *c);
          c->fd = fd;
          struct epoll_event ce = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce);
        }
        continue;
      }
      int r;
      for (;;) { /* edge-triggered: answer, then read, until the socket says wait */
        if ((r = serve(c)) <= 0) break;
        ssize_t k = read(c->fd, c->buf + c->in, sizeof c->buf - c->in);
        if (k == 0 || (k < 0 && errno != EAGAIN)) {
          r = -1;
          break;
        }
        if (k < 0) break;
        c->in += (size_t)k;
      }
      if (r < 0) drop(ep, c);
    }
  }
}
