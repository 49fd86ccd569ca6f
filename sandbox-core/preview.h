/* Preview URLs: exposePort's records, and the daemon's HTTP/WebSocket proxy
 * on 127.0.0.1 that routes http://{port}-{sandbox}-{token}.localhost:{proxy}/
 * to the port inside the sandbox, through sockets made in the sandbox's
 * network namespace (no NAT, no host port, no firewall rule). */
#pragma once
#include "sandbox.h"

#include <jansson.h>

#define SBX_MAX_EXPOSED 32 /* ports per sandbox */

typedef struct sbx_exposure {
  int port;
  char name[64];
  char token[17]; /* 16 of [a-z0-9] */
  struct sbx_exposure *next;
} sbx_exposure;

/* Starts the proxy (port from the configuration); a port in use is an
 * error the daemon logs, and the rest of it works on (the port is tried
 * again every few seconds and whenever its state is asked for). The URLs
 * revoked so far (unexposed, or of a sandbox reset or destroyed) are kept
 * in state_dir/preview-revoked: they answer 410 across daemon restarts. */
int sbx_preview_start(uv_loop_t *loop, int port, const char *state_dir, char *err, size_t errlen);
/* Closes the proxy, its connections and its helpers (daemon shutdown). */
void sbx_preview_stop(void);
/* The proxy's state for doctor and exposePort: NULL when it listens (a
 * proxy that could not listen tries once more first). */
const char *sbx_preview_problem(void);
int sbx_preview_expose(sbx_sandbox *sb, int port, const char *name, const sbx_exposure **out, sbx_error *err);
int sbx_preview_unexpose(sbx_sandbox *sb, int port, sbx_error *err);
/* The URL of an exposure: http://{port}-{sandbox}-{token}.localhost:{proxy}/ */
void sbx_preview_url(const sbx_sandbox *sb, const sbx_exposure *e, char *out, size_t len);
/* Reset or destroyed: its URLs answer 410 from now on, its connections end. */
void sbx_preview_revoke_sandbox(sbx_sandbox *sb);
/* The record's side. */
json_t *sbx_preview_to_json(const sbx_sandbox *sb);
int sbx_preview_from_json(sbx_sandbox *sb, json_t *a);
void sbx_preview_free(sbx_sandbox *sb);
