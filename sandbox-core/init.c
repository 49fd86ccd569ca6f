/* sbx-init: pid 1 of every sandbox. Statically linked, so it runs on any
 * image. It names the sandbox (argv[1], or for a sandbox made ahead the
 * first message on fd 3, the socket it inherits, once a create takes it),
 * tells the daemon it is up (sending the sandbox's root directory on fd 3,
 * with "ok", and argv[2] after it: which bucket mounts the root has),
 * then reaps orphans forever. It is not dumpable, so nothing inside the
 * sandbox can ptrace or read it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aside.h"

/* path, a regular file of the sandbox's /etc, written with text. What the
 * sandbox left there instead (a FIFO, which would block init and the
 * daemon that waits for it; a symlink or a directory, which would fail
 * every start) is moved aside to path.sbx-N first. Written over, then cut
 * to length: an O_TRUNC to empty would make ext4 start writing the file
 * back at close (its guard for programs that replace a file by truncating
 * it), which a create would wait for. */
static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    sbx_move_aside(AT_FDCWD, path); /* (when nothing is there, the open says why) */
    if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0) return -1;
  }
  size_t len = strlen(text);
  int r = write(fd, text, len) == (ssize_t)len && ftruncate(fd, (off_t)len) == 0 ? 0 : -1;
  close(fd);
  return r;
}

/* hostname, /etc/hostname, /etc/hosts; NULL or what failed */
static const char *name_sandbox(const char *name) {
  char text[256];
  snprintf(text, sizeof text, "%s\n", name);
  if (write_file("/etc/hostname", text) < 0) return "/etc/hostname";
  snprintf(text, sizeof text, "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", name);
  if (write_file("/etc/hosts", text) < 0) return "/etc/hosts";
  if (sethostname(name, strlen(name)) < 0) return "sethostname";
  if (setdomainname("sbx", 3) < 0) return "setdomainname";
  return NULL;
}

int main(int argc, char **argv) {
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_NAME, "sbx-init");
  sigset_t set;
  sigfillset(&set);
  sigprocmask(SIG_BLOCK, &set, NULL);
  close_range(1, 2, 0);
  close_range(4, ~0U, 0); /* fd 3: the daemon's socket, kept open */
  char name[64];
  if (argc > 1) {
    snprintf(name, sizeof name, "%s", argv[1]);
  } else { /* made ahead: a hang-up means it was discarded */
    ssize_t n;
    while ((n = recv(3, name, sizeof name - 1, 0)) < 0 && errno == EINTR) {
    }
    if (n <= 0) _exit(0);
    name[n] = 0;
  }
  const char *failed = name_sandbox(name);
  if (failed) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s", failed, strerror(errno));
    (void)!send(3, msg, strlen(msg), MSG_NOSIGNAL);
    _exit(1);
  }
  /* the daemon gets the sandbox's root from the sandbox itself: reading
   * /proc/PID/root of a non-dumpable init needs privileges a rootless
   * daemon lacks */
  int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) _exit(1);
  char ok[64];
  snprintf(ok, sizeof ok, "ok%s%s", argc > 2 ? " " : "", argc > 2 ? argv[2] : "");
  struct iovec iov = {ok, strlen(ok)};
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
