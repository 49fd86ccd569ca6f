#define _GNU_SOURCE
#include "control.h"
#include "../sandbox-core/util.h"

#include <jansson.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

static int ensure_private_dir(const char *dir, char *err, size_t errlen) {
  int r = sbx_mkdir_p(dir, 0700);
  if (r < 0) {
    snprintf(err, errlen, "creating %s: %s", dir, strerror(-r));
    return -1;
  }
  struct stat st;
  if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s is not a directory", dir);
    return -1;
  }
  if (st.st_uid != geteuid()) {
    snprintf(err, errlen, "%s belongs to uid %u, not to us (%u): refusing it", dir, (unsigned)st.st_uid,
             (unsigned)geteuid());
    return -1;
  }
  if ((st.st_mode & 077) && chmod(dir, 0700) < 0) {
    snprintf(err, errlen, "chmod %s: %s", dir, strerror(errno));
    return -1;
  }
  return 0;
}

int sbx_paths_find(sbx_paths *p, char *err, size_t errlen) {
  const char *rt = getenv("SBX_RUNTIME_DIR"), *st = getenv("SBX_STATE_DIR");
  const char *xrt = getenv("XDG_RUNTIME_DIR"), *xst = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
  bool root = geteuid() == 0;
  if (rt && *rt) snprintf(p->runtime, sizeof p->runtime, "%s", rt);
  else if (xrt && *xrt) snprintf(p->runtime, sizeof p->runtime, "%s/sbx", xrt);
  else if (root) snprintf(p->runtime, sizeof p->runtime, "/run/sbx");
  else snprintf(p->runtime, sizeof p->runtime, "/tmp/sbx-%u", (unsigned)geteuid());
  if (st && *st) snprintf(p->state, sizeof p->state, "%s", st);
  else if (xst && *xst) snprintf(p->state, sizeof p->state, "%s/sbx", xst);
  else if (root) snprintf(p->state, sizeof p->state, "/var/lib/sbx");
  else snprintf(p->state, sizeof p->state, "%s/.local/state/sbx", home ? home : "/tmp");
  if (strlen(p->runtime) > 90) {
    snprintf(err, errlen, "runtime dir %s is too long for a unix socket path", p->runtime);
    return -1;
  }
  snprintf(p->sock, sizeof p->sock, "%s/sbx.sock", p->runtime);
  snprintf(p->lock, sizeof p->lock, "%s/sbx.lock", p->runtime);
  snprintf(p->pidfile, sizeof p->pidfile, "%s/sbx.pid", p->runtime);
  snprintf(p->log, sizeof p->log, "%s/daemon.log", p->state);
  return 0;
}

int sbx_paths_init(sbx_paths *p, char *err, size_t errlen) {
  if (sbx_paths_find(p, err, errlen) < 0) return -1;
  return ensure_private_dir(p->runtime, err, errlen) < 0 || ensure_private_dir(p->state, err, errlen) < 0 ? -1 : 0;
}

static int try_connect(const sbx_paths *p, char *err, size_t errlen) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(p->sock) >= sizeof a.sun_path) {
    snprintf(err, errlen, "socket path %s is too long", p->sock);
    close(fd);
    return -1;
  }
  memcpy(a.sun_path, p->sock, strlen(p->sock) + 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    snprintf(err, errlen, "connecting to %s: %s", p->sock, strerror(errno));
    close(fd);
    return -1;
  }
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != geteuid()) {
    snprintf(err, errlen, "the daemon on %s does not run as our uid: refusing it", p->sock);
    close(fd);
    return -2;
  }
  return fd;
}

/* Starts `sbx daemon` detached (setsid, cwd /, stdio on its log file) and
 * waits for its readiness pipe. Losing the lock race to another starter is
 * fine: the caller connects to the winner. */
static int start_daemon(const sbx_paths *p, char *err, size_t errlen) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) < 0) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, errlen, "fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    if (fork() != 0) _exit(0); /* the daemon is reparented, never our zombie */
    /* a starter's blocked signals and handlers are not the daemon's (a
     * mask survives exec: a thread that blocks everything would start a
     * daemon deaf to SIGTERM) */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++)
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    setsid();
    if (chdir("/") < 0) _exit(1);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int log = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (null < 0 || log < 0) _exit(1);
    dup2(null, 0);
    dup2(log, 1);
    dup2(log, 2);
    int w = fcntl(ready[1], F_DUPFD, 3); /* without CLOEXEC: the daemon needs it */
    close_range(3, w - 1, 0);
    char num[16];
    snprintf(num, sizeof num, "%d", w);
    setenv("SBX_READY_FD", num, 1);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) _exit(127);
    exe[n] = 0;
    /* sbx replaced on disk since this one started (an upgrade): the new
     * one at that path starts, else this very one */
    static const char gone[] = " (deleted)";
    size_t gl = sizeof gone - 1;
    if ((size_t)n > gl && !strcmp(exe + n - gl, gone)) exe[n - gl] = 0;
    char *argv[] = {"sbx", "daemon", NULL};
    execv(exe, argv); /* by its real path, so its name (comm) is sbx */
    execv("/proc/self/exe", argv);
    fprintf(stderr, "sbx: starting the daemon (%s): %s\n", exe, strerror(errno)); /* into its log */
    _exit(127);
  }
  close(ready[1]);
  int st;
  waitpid(pid, &st, 0);
  struct pollfd pf = {.fd = ready[0], .events = POLLIN};
  int r = poll(&pf, 1, 30000);
  char b;
  if (r > 0) (void)!read(ready[0], &b, 1);
  close(ready[0]);
  if (r == 0) {
    snprintf(err, errlen, "the daemon did not become ready in 30 s (see %s)", p->log);
    return -1;
  }
  return 0;
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : 0;
}

/* The last line written to path past offset from, if any. */
static bool last_line_since(const char *path, off_t from, char *out, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    if (fd >= 0) close(fd);
    return false;
  }
  char buf[4096];
  off_t size = st.st_size, start = size - (off_t)sizeof buf + 1 > from ? size - (off_t)sizeof buf + 1 : from;
  ssize_t n = start < size ? pread(fd, buf, sizeof buf - 1, start) : 0;
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
  char *line = strrchr(buf, '\n');
  line = line ? line + 1 : buf;
  if (!strncmp(line, "sbx daemon: ", 12)) line += 12;
  if (!*line) return false;
  size_t l = strlen(line) < len - 1 ? strlen(line) : len - 1;
  memcpy(out, line, l);
  out[l] = 0;
  return true;
}

bool sbx_daemon_listening(const sbx_paths *p) {
  char err[600];
  int fd = try_connect(p, err, sizeof err);
  if (fd >= 0) close(fd);
  return fd != -1;
}

int sbx_connect(const sbx_paths *p, bool autostart, char *err, size_t errlen) {
  int fd = try_connect(p, err, errlen);
  if (fd >= 0 || fd == -2 || !autostart) return fd < 0 ? -1 : fd;
  /* Starters take turns: the first starts the daemon and waits until it
   * listens; the others then find it. */
  char path[1200];
  snprintf(path, sizeof path, "%s/sbx.start.lock", p->runtime);
  int lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) < 0) {
    snprintf(err, errlen, "locking %s: %s", path, strerror(errno));
    if (lock >= 0) close(lock);
    return -1;
  }
  fd = try_connect(p, err, errlen);
  off_t log_size = file_size(p->log);
  if (fd == -1 && start_daemon(p, err, errlen) == 0) fd = try_connect(p, err, errlen);
  close(lock);
  if (fd == -1) {
    /* why it did not start is the last thing it wrote (an invalid
     * configuration, say): told here, not only in its log */
    char said[400];
    if (last_line_since(p->log, log_size, said, sizeof said))
      snprintf(err, errlen, "the daemon did not start: %s (log: %s)", said, p->log);
    else
      snprintf(err + strlen(err), errlen - strlen(err), " (daemon log: %s)", p->log);
  }
  return fd < 0 ? -1 : fd;
}

int sbx_daemon_stop(const sbx_paths *p, char *err, size_t errlen) {
  FILE *f = fopen(p->pidfile, "re");
  if (!f) return 0;
  int pid = 0;
  int n = fscanf(f, "%d", &pid);
  fclose(f);
  if (n != 1 || pid <= 1) return 0;
  int pfd = sbx_pidfd_open(pid);
  if (pfd < 0) return 0; /* gone already */
  /* a stale pid file may name a reused pid: only signal an sbx daemon */
  char path[64], comm[32] = "";
  snprintf(path, sizeof path, "/proc/%d/comm", pid);
  FILE *c = fopen(path, "re");
  if (c) {
    if (!fgets(comm, sizeof comm, c)) comm[0] = 0;
    fclose(c);
  }
  if (strncmp(comm, "sbx", 3)) {
    close(pfd);
    return 0;
  }
  if (sbx_pidfd_send_signal(pfd, SIGTERM) < 0) {
    close(pfd);
    return 0;
  }
  struct pollfd pf = {.fd = pfd, .events = POLLIN};
  int r = poll(&pf, 1, 30000);
  close(pfd);
  if (r <= 0) {
    snprintf(err, errlen, "daemon %d did not stop within 30 s", pid);
    return -1;
  }
  return pid;
}

json_t *sbx_hello(const char *default_sandbox, const char *tools_csv, bool read_only, char id_out[64]) {
  if (default_sandbox) {
    snprintf(id_out, 64, "%s", default_sandbox);
  } else {
    char cwd[4096];
    sbx_default_id(getcwd(cwd, sizeof cwd) ? cwd : "/", id_out);
  }
  json_t *hello = json_pack("{s:s, s:s, s:{s:s, s:b}}", "jsonrpc", "2.0", "method", "notifications/sbx/hello",
                            "params", "defaultSandboxId", id_out, "readOnly", read_only);
  if (tools_csv) { /* only these tools are listed and callable */
    json_t *names = json_array();
    char *copy = strdup(tools_csv), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
      if (*t) json_array_append_new(names, json_string(t));
    free(copy);
    json_object_set_new(json_object_get(hello, "params"), "tools", names);
  }
  return hello;
}
