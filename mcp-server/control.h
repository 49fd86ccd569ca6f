/* The control plane shared by the daemon and its clients: where the
 * runtime and state directories are, the socket, the lock, and starting
 * the daemon on demand. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct sbx_paths {
  char runtime[1024];
  char state[1024];
  char sock[1100];
  char lock[1100];
  char pidfile[1100];
  char log[1100];
} sbx_paths;

/* Resolves the directories (SBX_RUNTIME_DIR, XDG_*, root or per-user
 * defaults) and creates them mode 0700; refuses a runtime dir another user
 * owns. Returns 0 or -1 with a message. */
int sbx_paths_init(sbx_paths *p, char *err, size_t errlen);
/* The same paths, nothing made: for looking for a daemon that is there
 * without starting one (a missing directory means it is not). */
int sbx_paths_find(sbx_paths *p, char *err, size_t errlen);

/* Connects to the daemon's socket, checking it runs as our uid. With
 * autostart, starts the daemon when none answers and waits until it is
 * ready. Returns the connected fd or -1 with a message. */
int sbx_connect(const sbx_paths *p, bool autostart, char *err, size_t errlen);
/* Whether a daemon answers on the socket (one that is stopping does not). */
bool sbx_daemon_listening(const sbx_paths *p);

/* The first message of every client of the socket: names the connection's
 * default sandbox (given, or derived from the cwd, written to id_out) and
 * its tool filters (tools_csv may be NULL). Returns a new json_t. */
struct json_t;
struct json_t *sbx_hello(const char *default_sandbox, const char *tools_csv, bool read_only, char id_out[64]);

/* Stops the running daemon (SIGTERM) and waits for it; returns its pid,
 * 0 when none runs, -1 with a message when it would not stop. */
int sbx_daemon_stop(const sbx_paths *p, char *err, size_t errlen);
