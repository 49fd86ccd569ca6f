/* The Streamable HTTP transport of `sbx daemon --http ADDR:PORT`. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

/* Listens on addr (loopback unless allow_remote) on the default loop;
 * the bearer token lives in state_dir/http-token (made 0600 if absent). */
int sbx_http_start(const char *addr, bool allow_remote, const char *state_dir, char *err, size_t errlen);
void sbx_http_stop(void);
/* Where it listens ("127.0.0.1:8788"), false when it does not. */
bool sbx_http_address(char *out, size_t len);
