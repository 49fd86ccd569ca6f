/* Newline framing of MCP messages on a byte stream, with a size cap: pure,
 * shared by the socket server and the fuzz target. */
#pragma once
#include "../sandbox-core/util.h"

typedef struct mcp_framer {
  sbx_buf in;
  size_t max;      /* largest message accepted */
  bool discarding; /* skipping the rest of an oversized message */
} mcp_framer;

/* Called per complete message (without the newline; blank lines are not
 * messages) or, with msg NULL, once per message that exceeded `max`.
 * Returning false stops the feed (the connection is going away). */
typedef bool (*mcp_frame_fn)(void *ud, const char *msg, size_t len);

void mcp_framer_init(mcp_framer *f, size_t max);
void mcp_framer_feed(mcp_framer *f, const char *data, size_t n, mcp_frame_fn fn, void *ud);
void mcp_framer_free(mcp_framer *f);
