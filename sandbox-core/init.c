/* sbx-init: pid 1 of every sandbox. Statically linked, so it runs on any
 * image. It tells the daemon it is up (sending the sandbox's root directory
 * on fd 3, the socket it inherits), then reaps orphans forever. It is not
 * dumpable, so nothing inside the sandbox can ptrace or read it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_NAME, "sbx-init");
  sigset_t set;
  sigfillset(&set);
  sigprocmask(SIG_BLOCK, &set, NULL);
  close_range(1, 2, 0);
  close_range(4, ~0U, 0); /* fd 3: the daemon's socket, kept open */
  /* the daemon gets the sandbox's root from the sandbox itself: reading
   * /proc/PID/root of a non-dumpable init needs privileges a rootless
   * daemon lacks */
  int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) _exit(1);
  char ok[] = "ok";
  struct iovec iov = {ok, 2};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &rootfd, sizeof(int));
  if (sendmsg(3, &m, MSG_NOSIGNAL) < 0) _exit(1);
  close(rootfd);

  for (;;) {
    siginfo_t si;
    int sig = sigwaitinfo(&set, &si);
    if (sig == SIGCHLD)
      while (waitpid(-1, NULL, WNOHANG) > 0) {
      }
  }
}
