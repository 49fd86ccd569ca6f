/* `sbx mcp`: what an agent starts. It connects to the daemon (starting it
 * when needed), names this connection's default sandbox, and relays bytes
 * both ways until stdin closes. Nothing but MCP goes to stdout. */
#define _GNU_SOURCE
#include "control.h"
#include "server.h"
#include "../sandbox-core/util.h"

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

int sbx_relay_main(const char *default_sandbox, const char *tools_csv, bool read_only) {
  signal(SIGPIPE, SIG_IGN);
  sbx_paths p;
  char err[600];
  if (sbx_paths_init(&p, err, sizeof err) < 0) {
    fprintf(stderr, "sbx mcp: %s\n", err);
    return 1;
  }
  int fd = sbx_connect(&p, true, err, sizeof err);
  if (fd < 0) {
    fprintf(stderr, "sbx mcp: %s\n", err);
    return 1;
  }
  char id[64];
  json_t *hello = sbx_hello(default_sandbox, tools_csv, read_only, id);
  char *line = json_dumps(hello, JSON_COMPACT);
  json_decref(hello);
  size_t n = strlen(line);
  line[n] = '\n'; /* overwrite the NUL: send n + 1 bytes */
  int r = sbx_write_all(fd, line, n + 1);
  free(line);
  if (r < 0) {
    fprintf(stderr, "sbx mcp: writing to the daemon: %s\n", strerror(-r));
    return 1;
  }
  static char buf[1 << 16];
  struct pollfd pf[2] = {{.fd = 0, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
  for (;;) {
    if (poll(pf, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (pf[0].revents) {
      ssize_t k = read(0, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return 0; /* the agent closed stdin: we are done */
      if (sbx_write_all(fd, buf, k) < 0) {
        fprintf(stderr, "sbx mcp: the daemon went away\n");
        return 1;
      }
    }
    if (pf[1].revents) {
      ssize_t k = read(fd, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        fprintf(stderr, "sbx mcp: the daemon closed the connection\n");
        return 1;
      }
      if (sbx_write_all(1, buf, k) < 0) return 0;
    }
  }
}
