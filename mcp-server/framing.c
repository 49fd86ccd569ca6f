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
