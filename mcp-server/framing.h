/* Newline framing of MCP messages on a byte stream, with a size cap: pure,
 * shared by the socket server and the fuzz target. */
#pragma once
#include "../sandbox-core/util.h"

#include <jansson.h>

#define MCP_FRAMER_HEAD 4096 /* what is kept of an oversized message */

/* how an oversized message is answered, by every transport that frames */
#define MCP_OVERSIZE_CODE (-32600)
#define MCP_OVERSIZE_MESSAGE                                                                                           \
  "the message exceeds the 64 MiB limit and was not read; send large data in parts (files of less than 64 MiB, "     \
  "joined by a command)"

typedef struct mcp_framer {
  sbx_buf in;
  size_t max;      /* largest message accepted */
  bool discarding; /* skipping the rest of an oversized message */
  /* the start of the last oversized message, so its id can be answered */
  char head[MCP_FRAMER_HEAD];
  size_t head_len;
} mcp_framer;

/* Called per complete message (without the newline; blank lines are not
 * messages) or, with msg NULL, once per message that exceeded `max` (its
 * first bytes are then in the framer's `head`).
 * Returning false stops the feed (the connection is going away). */
typedef bool (*mcp_frame_fn)(void *ud, const char *msg, size_t len);

void mcp_framer_init(mcp_framer *f, size_t max);
void mcp_framer_feed(mcp_framer *f, const char *data, size_t n, mcp_frame_fn fn, void *ud);
void mcp_framer_free(mcp_framer *f);

/* The id of a JSON-RPC message from its first bytes alone (an oversized
 * message is never read whole): a new reference to a string or integer id
 * found at the top level, or NULL when the prefix does not hold one. */
json_t *mcp_peek_id(const char *prefix, size_t len);
