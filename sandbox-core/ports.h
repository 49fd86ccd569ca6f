/* Waiting for a port inside a sandbox (waitForPort). */
#pragma once
#include "sandbox.h"

typedef void (*sbx_port_cb)(void *ud, bool ready, uint64_t waited_ms);
/* Checks from inside the sandbox's network namespace (a forked child that
 * joins it) until something accepts on 127.0.0.1:port (and, with http,
 * answers an HTTP request), or timeout_ms passes. cb fires once. */
int sbx_port_wait(uv_loop_t *loop, sbx_sandbox *sb, int port, int64_t timeout_ms, bool http, sbx_port_cb cb, void *ud,
                  sbx_error *err);
