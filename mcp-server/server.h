/* `sbx daemon` and `sbx mcp`. */
#pragma once
#include <stdbool.h>

/* Runs the daemon until SIGTERM; returns the process exit code. With
 * mount_dir it also runs the FUSE view there. */
int sbx_daemon_main(const char *http_addr, bool http_allow_remote, const char *mount_dir);
/* Relays MCP between stdio and the daemon's socket (starting the daemon
 * when none runs); default_sandbox may be NULL. Returns the exit code. */
int sbx_relay_main(const char *default_sandbox, const char *tools_csv, bool read_only);
