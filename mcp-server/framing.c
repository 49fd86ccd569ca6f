#include "framing.h"

void mcp_framer_init(mcp_framer *f, size_t max) { *f = (mcp_framer){.max = max}; }

static bool emit(const char *line, size_t len, mcp_frame_fn fn, void *ud) {
  if (len && line[len - 1] == '\r') len--;
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
  if (i == len) return true; /* blank lines are not messages */
  return fn(ud, line, len);
}

void mcp_framer_feed(mcp_framer *f, const char *data, size_t n, mcp_frame_fn fn, void *ud) {
  const char *p = data, *end = data + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', end - p);
    size_t take = nl ? (size_t)(nl - p) : (size_t)(end - p);
    bool go = true;
    if (f->discarding) {
      if (nl) f->discarding = false;
    } else if (f->in.len + take > f->max) {
      size_t had = f->in.len < MCP_FRAMER_HEAD ? f->in.len : MCP_FRAMER_HEAD;
      memcpy(f->head, f->in.data, had);
      size_t more = take < MCP_FRAMER_HEAD - had ? take : MCP_FRAMER_HEAD - had;
      memcpy(f->head + had, p, more);
      f->head_len = had + more;
      sbx_buf_free(&f->in);
      f->discarding = !nl;
      go = fn(ud, NULL, 0);
    } else if (nl && f->in.len == 0) {
      go = emit(p, take, fn, ud); /* the common case: no copy */
    } else {
      sbx_buf_append(&f->in, p, take);
      if (nl) {
        /* the buffer is handed over whole: a callback may feed again */
        sbx_buf line = f->in;
        f->in = (sbx_buf){0};
        go = emit(line.data, line.len, fn, ud);
        sbx_buf_free(&line);
      }
    }
    if (!go) return;
    p += take + (nl ? 1 : 0);
  }
}

void mcp_framer_free(mcp_framer *f) { sbx_buf_free(&f->in); }

/* ---- the id of a message too large to read ------------------------------ */

static const char *skip_ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  return p;
}

/* past a string whose opening quote is at p, or NULL if it is cut off */
static const char *skip_string(const char *p, const char *end) {
  for (p++; p < end; p++) {
    if (*p == '\\') p++;
    else if (*p == '"') return p + 1;
  }
  return NULL;
}

/* past one value (nested ones included), or NULL if it is cut off */
static const char *skip_value(const char *p, const char *end) {
  int depth = 0;
  while (p < end) {
    char ch = *p;
    if (ch == '"') {
      if (!(p = skip_string(p, end))) return NULL;
      if (depth == 0) return p;
      continue;
    }
    if (ch == '{' || ch == '[') depth++;
    else if (ch == '}' || ch == ']') {
      if (depth == 0) return p; /* the end of the enclosing object */
      if (--depth == 0) return p + 1;
    } else if (ch == ',' && depth == 0) return p;
    p++;
  }
  return NULL;
}

json_t *mcp_peek_id(const char *prefix, size_t len) {
  const char *p = prefix, *end = prefix + len;
  p = skip_ws(p, end);
  if (p == end || *p++ != '{') return NULL;
  for (;;) {
    p = skip_ws(p, end);
    if (p == end || *p != '"') return NULL;
    const char *key = p, *after = skip_string(p, end);
    if (!after) return NULL;
    bool is_id = after - key == 4 && !memcmp(key, "\"id\"", 4);
    p = skip_ws(after, end);
    if (p == end || *p++ != ':') return NULL;
    p = skip_ws(p, end);
    const char *v = p;
    if (!(p = skip_value(p, end))) return NULL; /* a value must be seen to end */
    if (is_id) {
      json_t *id = json_loadb(v, p - v, JSON_DECODE_ANY, NULL);
      if (json_is_string(id) || json_is_integer(id)) return id;
      json_decref(id);
      return NULL;
    }
    p = skip_ws(p, end);
    if (p == end || *p++ != ',') return NULL;
  }
}
