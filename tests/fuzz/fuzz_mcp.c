/* libFuzzer target for the message path: bytes → framing → JSON → MCP
 * dispatch → argument validation → replies. The engine is not started, so a
 * call that would create a sandbox gets an error instead. Every reply must
 * be one valid JSON object. */
#include <stdint.h>
#include <stdlib.h>

#include "../../mcp-server/framing.h"
#include "../../mcp-server/mcp.h"

static void check_reply(void *ud, const char *data, size_t len) {
  (void)ud;
  json_error_t e;
  json_t *j = json_loadb(data, len, 0, &e);
  if (!json_is_object(j)) abort(); /* the server must only ever send JSON objects */
  json_decref(j);
}

static mcp_conn *conn;
static mcp_framer f;

static bool on_message(void *ud, const char *msg, size_t len) {
  (void)ud;
  if (msg) {
    mcp_conn_handle(conn, msg, len);
    json_t *id = mcp_peek_id(msg, len); /* what is found in a prefix must be the id */
    json_t *whole = json_loadb(msg, len, JSON_REJECT_DUPLICATES, NULL);
    if (id && whole && !json_equal(id, json_object_get(whole, "id"))) abort();
    json_decref(whole);
    json_decref(id);
  } else {
    json_t *id = mcp_peek_id(f.head, f.head_len);
    mcp_conn_send_error(conn, id, MCP_OVERSIZE_CODE, MCP_OVERSIZE_MESSAGE);
    json_decref(id);
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool ready;
  if (!ready) {
    char err[256];
    if (mcp_catalog_init(err, sizeof err) < 0) abort();
    ready = true;
  }
  conn = mcp_conn_new(uv_default_loop(), check_reply, NULL);
  mcp_framer_init(&f, 1 << 20); /* a small cap, so the fuzzer reaches it */
  /* feed in two pieces to exercise messages split across reads */
  size_t half = size / 2;
  mcp_framer_feed(&f, (const char *)data, half, on_message, NULL);
  mcp_framer_feed(&f, (const char *)data + half, size - half, on_message, NULL);
  mcp_framer_free(&f);
  mcp_conn_close(conn);
  return 0;
}
