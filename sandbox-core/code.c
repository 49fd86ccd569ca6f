#define _GNU_SOURCE
#include "code.h"
#include "files.h"
#include "driver_node.h"
#include "driver_python.h"

#include <inttypes.h>
#include <signal.h>

#define MAX_LINE (8u * 1024 * 1024)    /* one message from a driver (a big plot) */
#define MAX_TOKENS 100000              /* JSON structure in one message: jansson's memory grows with it */
#define MAX_LOGS (1024u * 1024)        /* per stream and run, kept in the result */
#define TAIL_MAX (256u * 1024)         /* ...and past it, its last bytes, */
#define TAIL_LINES 1024                /* ...at most this many lines of them */
#define TAIL_COST (TAIL_MAX + TAIL_LINES * LOG_ENTRY_COST) /* what a stream's tail may hold */
#define MAX_RESULTS (16u * 1024 * 1024) /* all of a run's results */
/* What the daemon holds of a run is counted as what it costs it, not as
 * the text the driver sent: a JSON value parsed is some 100-250 bytes of
 * jansson's whatever its text ("{}" is two), a log entry some 60 beside
 * its text. The sandbox chooses both. */
#define TOKEN_COST 256     /* of a result's JSON structure, a '{', '[', ',' or ':' */
#define LOG_ENTRY_COST 64  /* of each entry in a run's logs */
#define HELD_MAX (256u * 1024 * 1024) /* all runs' results and logs, every sandbox's together */
#define SANDBOX_HELD_MAX (HELD_MAX / 4)  /* ...and one sandbox's runs: it cannot take it all from the others */
#define STOP_GRACE_MS 5000             /* an interrupted run has this long to stop */
#define LINE_COST 512                  /* what a line read from a driver counts of its sandbox's output budget */
#define INPUT_MAX (32u * 1024 * 1024)  /* queued toward a context that does not read its input: then it ends */

struct sbx_code_run {
  sbx_code_ctx *ctx;
  char sandbox[64]; /* its context's, for its share of what runs hold */
  uint64_t id;
  char *code;
  size_t len;
  int64_t timeout_ms;
  bool sent, cancelled, counted;
  json_t *results, *out, *err;
  size_t out_bytes, err_bytes, result_bytes; /* what each costs (see TOKEN_COST) */
  /* past MAX_LOGS, what a stream prints goes on into its tail, whose last
   * TAIL_MAX bytes end the logs (as exec keeps a head and a tail) */
  sbx_headtail tail[2]; /* head 0, tail TAIL_MAX; tail_cap 0 until charged */
  size_t tail_bytes;    /* what the tails are charged (TAIL_COST each) */
  bool past_head[2];    /* the head took no more */
  bool truncated;
  sbx_buf pending[2]; /* stdout, stderr not yet sent as progress: one notification a read, not one a write */
  uv_timer_t timer; /* the backstop: a run that does not stop ends its context */
  sbx_code_chunk_cb chunk_cb;
  sbx_code_done_cb done_cb;
  void *ud;
  sbx_code_run *next;
};

struct sbx_code_ctx {
  char id[64], sandbox[64], language[16], cwd[1024];
  uv_loop_t *loop;
  sbx_exec *x;
  bool ready, dead, forgotten;
  char why[600]; /* why it died */
  sbx_buf line;
  bool skipping; /* the rest of an oversized line */
  uint64_t next_id, count, created_ms;
  pid_t pid;
  char version[32];
  sbx_code_run *runs; /* the first one is the running one once sent */
  sbx_code_ready_cb ready_cb;
  void *ready_ud;
  sbx_code_ctx *next;
};

static sbx_code_ctx *all;

sbx_code_ctx *sbx_code_find(const char *sandbox, const char *id) {
  for (sbx_code_ctx *c = all; c; c = c->next)
    if (!c->forgotten && !strcmp(c->sandbox, sandbox) && !strcmp(c->id, id)) return c;
  return NULL;
}

json_t *sbx_code_json(const sbx_code_ctx *c) {
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I}", "id", c->id, "language", c->language, "cwd", c->cwd, "status",
                        c->dead ? "dead" : c->ready ? "ready" : "starting", "executionCount", (json_int_t)c->count);
  if (c->dead) json_object_set_new(o, "error", json_string(c->why));
  if (c->version[0]) json_object_set_new(o, "version", json_string(c->version));
  return o;
}

/* Why a context of sb->code_gone ended: a restart (the record's own
 * contexts, read back), or an idle reset (sbx_code_reset_sandbox). */
static const char *gone_why(const json_t *g) {
  return json_is_true(json_object_get(g, "reset")) ? "it ended when the sandbox was reset for being idle"
                                                   : "it ended when the sbx daemon restarted";
}

json_t *sbx_code_list(const sbx_sandbox *sb) {
  json_t *a = json_array(), *g;
  for (sbx_code_ctx *c = all; c; c = c->next)
    if (!c->forgotten && !strcmp(c->sandbox, sb->id)) json_array_append_new(a, sbx_code_json(c));
  size_t i;
  json_array_foreach(sb->code_gone, i, g) {
    json_t *o = json_deep_copy(g);
    json_object_set_new(o, "status", json_string("dead"));
    json_object_set_new(o, "error", json_string(gone_why(g)));
    json_object_del(o, "reset");
    json_object_set_new(o, "executionCount", json_integer(0));
    json_array_append_new(a, o);
  }
  return json_pack("{s:o}", "contexts", a);
}

json_t *sbx_code_record(const sbx_sandbox *sb) {
  json_t *a = json_array(), *g;
  for (sbx_code_ctx *c = all; c; c = c->next)
    if (!c->forgotten && !strcmp(c->sandbox, sb->id))
      json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "id", c->id, "language", c->language, "cwd", c->cwd));
  size_t i;
  json_array_foreach(sb->code_gone, i, g) json_array_append(a, g);
  return a;
}

static size_t gone_index(const sbx_sandbox *sb, const char *id) {
  size_t i;
  json_t *g;
  json_array_foreach(sb->code_gone, i, g) if (!strcmp(json_string_value(json_object_get(g, "id")), id)) return i;
  return (size_t)-1;
}

const char *sbx_code_gone(const sbx_sandbox *sb, const char *id) {
  size_t i = gone_index(sb, id);
  return i == (size_t)-1 ? NULL : gone_why(json_array_get(sb->code_gone, i));
}

void sbx_code_reset_sandbox(sbx_sandbox *sb) {
  json_decref(sb->code_gone); /* (a reset has cleared it: its record is of the live contexts alone) */
  sb->code_gone = NULL;
  json_t *a = sbx_code_record(sb), *g;
  size_t i;
  json_array_foreach(a, i, g) json_object_set_new(g, "reset", json_true());
  if (json_array_size(a)) sb->code_gone = a;
  else json_decref(a);
  sbx_code_forget_sandbox(sb->id);
}

bool sbx_code_take_gone(sbx_sandbox *sb, const char *id) {
  size_t i = gone_index(sb, id);
  if (i == (size_t)-1) return false;
  json_array_remove(sb->code_gone, i);
  return true;
}

/* ---- runs ------------------------------------------------------------------ */

static size_t held; /* the cost of every run's results and logs (HELD_MAX) */

/* What each sandbox's runs hold (SANDBOX_HELD_MAX), by its id: entries
 * while it holds anything. */
typedef struct share {
  char sandbox[64];
  size_t n;
  struct share *next;
} share;
static share *shares;

static share **share_at(const char *sandbox) {
  share **pp = &shares;
  while (*pp && strcmp((*pp)->sandbox, sandbox)) pp = &(*pp)->next;
  return pp;
}

static size_t left(size_t used, size_t most) { return used < most ? most - used : 0; }

/* How much more of its cost r may hold, on top of bytes of at most most. */
static size_t room_for(const sbx_code_run *r, size_t bytes, size_t most) {
  share *sh = *share_at(r->sandbox);
  size_t room = left(bytes, most), all = left(held, HELD_MAX), mine = left(sh ? sh->n : 0, SANDBOX_HELD_MAX);
  if (room > all) room = all;
  return room < mine ? room : mine;
}

static void charge(const sbx_code_run *r, size_t *bytes, size_t n) {
  share **pp = share_at(r->sandbox);
  if (!*pp && (*pp = calloc(1, sizeof **pp))) snprintf((*pp)->sandbox, sizeof (*pp)->sandbox, "%s", r->sandbox);
  if (*pp) (*pp)->n += n;
  *bytes += n;
  held += n;
}

static void uncharge(const sbx_code_run *r, size_t n) {
  share **pp = share_at(r->sandbox), *sh = *pp;
  held -= n;
  if (sh && (sh->n -= sh->n < n ? sh->n : n) == 0) {
    *pp = sh->next;
    free(sh);
  }
}

/* Whether n more of a run's cost may be held (it is counted if so). */
static bool hold(sbx_code_run *r, size_t *bytes, size_t most, size_t n) {
  if (n > room_for(r, *bytes, most)) return false;
  charge(r, bytes, n);
  return true;
}

static void run_timer_closed(uv_handle_t *h) {
  sbx_code_run *r = h->data;
  uncharge(r, r->out_bytes + r->err_bytes + r->result_bytes + r->tail_bytes);
  sbx_headtail_free(&r->tail[0]);
  sbx_headtail_free(&r->tail[1]);
  sbx_buf_free(&r->pending[0]);
  sbx_buf_free(&r->pending[1]);
  free(r->code);
  json_decref(r->results);
  json_decref(r->out);
  json_decref(r->err);
  free(r);
}

static void run_free(sbx_code_run *r) {
  uv_timer_stop(&r->timer);
  uv_close((uv_handle_t *)&r->timer, run_timer_closed);
}

static void uncount(sbx_code_run *r) {
  sbx_sandbox *sb = r->counted ? sbx_sandbox_find(r->ctx->sandbox) : NULL;
  if (sb && sb->running > 0) {
    sb->running--;
    sbx_sandbox_touch(sb);
  }
  r->counted = false;
}

static void unlink_run(sbx_code_run *r) {
  uncount(r);
  for (sbx_code_run **pp = &r->ctx->runs; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      return;
    }
}

static void run_fail(sbx_code_run *r, const sbx_error *e) {
  unlink_run(r);
  if (r->done_cb) r->done_cb(r->ud, NULL, e);
  run_free(r);
}

static void ctx_end(sbx_code_ctx *c, const char *why);

static void send_next(sbx_code_ctx *c);

/* What the run printed since the last progress notification, sent as one
 * per stream. */
static void flush_progress(sbx_code_run *r) {
  for (int i = 0; i < 2; i++) {
    if (r->pending[i].len && r->chunk_cb) r->chunk_cb(r->ud, i ? "stderr" : "stdout", r->pending[i].data, r->pending[i].len);
    r->pending[i].len = 0;
    if (r->pending[i].cap > 65536) sbx_buf_free(&r->pending[i]);
  }
}

static void tail_to_logs(sbx_code_run *r, int i);

static void run_done(sbx_code_ctx *c, sbx_code_run *r, json_t *error) {
  flush_progress(r);
  unlink_run(r);
  c->count++;
  tail_to_logs(r, 0);
  tail_to_logs(r, 1);
  if (r->done_cb) {
    json_t *res = json_pack("{s:O, s:{s:O, s:O}, s:I}", "results", r->results, "logs", "stdout", r->out, "stderr",
                            r->err, "executionCount", (json_int_t)c->count);
    if (json_is_object(error)) json_object_set(res, "error", error);
    if (r->truncated) json_object_set_new(res, "truncated", json_true());
    r->done_cb(r->ud, res, NULL);
    json_decref(res);
  }
  run_free(r);
  send_next(c);
}

static void backstop(uv_timer_t *t) {
  sbx_code_run *r = t->data;
  sbx_code_ctx *c = r->ctx;
  sbx_error e;
  sbx_err(&e, "COMMAND_TIMEOUT", "the code did not stop when interrupted; its %s context was ended (its state is gone)",
          c->language);
  run_fail(r, &e);
  ctx_end(c, "ended: a run did not stop when interrupted");
}

static void send_next(sbx_code_ctx *c) {
  sbx_code_run *r = c->runs;
  /* a run cancelled before it was sent is never sent: its timer fails it
   * (and sends the next) */
  if (!c->ready || c->dead || !r || r->sent || r->cancelled) return;
  json_t *req = json_pack("{s:I, s:s%, s:I}", "id", (json_int_t)r->id, "code", r->code, r->len, "timeout",
                          (json_int_t)r->timeout_ms);
  char *line = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
  json_decref(req);
  bool full = line && sbx_exec_input_queued(c->x) + strlen(line) > INPUT_MAX;
  bool ok = line && !full && sbx_exec_write(c->x, line, strlen(line)) == 0 && sbx_exec_write(c->x, "\n", 1) == 0;
  free(line);
  if (!ok) {
    sbx_error e;
    sbx_err(&e, "INTERNAL", "the %s context does not take input%s", c->language,
            full ? " (it stopped reading it): the context was ended" : "");
    run_fail(r, &e);
    if (full) ctx_end(c, "ended: it stopped reading its input");
    return;
  }
  r->sent = true;
  sbx_sandbox *sb = sbx_sandbox_find(c->sandbox);
  if (sb) { /* a run in flight is activity: its sandbox does not go idle under it */
    sb->running++;
    r->counted = true;
  }
  if (r->timeout_ms > 0) uv_timer_start(&r->timer, backstop, (uint64_t)r->timeout_ms + STOP_GRACE_MS, 0);
}

int sbx_code_submit(sbx_code_ctx *c, const char *code, size_t len, int64_t timeout_ms, sbx_code_chunk_cb chunk_cb,
                 sbx_code_done_cb done_cb, void *ud, sbx_code_run **out, sbx_error *err) {
  if (c->dead) return sbx_err(err, "CONTEXT_NOT_FOUND", "code context '%s' has died (%s): delete it and create another", c->id, c->why);
  if (len > SBX_MAX_CODE) return sbx_err(err, "VALIDATION_FAILED", "code is limited to %d bytes", SBX_MAX_CODE);
  size_t queued = 0;
  for (sbx_code_run *r = c->runs; r; r = r->next) queued++;
  if (queued >= SBX_MAX_CODE_QUEUE)
    return sbx_err(err, "RESOURCE_LIMIT", "code context '%s' already has %zu runs waiting", c->id, queued);
  sbx_code_run *r = calloc(1, sizeof *r);
  if (!r || !(r->code = malloc(len + 1))) {
    free(r);
    return sbx_err(err, "INTERNAL", "out of memory");
  }
  memcpy(r->code, code, len);
  r->code[len] = 0;
  r->len = len;
  r->ctx = c;
  snprintf(r->sandbox, sizeof r->sandbox, "%s", c->sandbox);
  r->id = ++c->next_id;
  r->timeout_ms = timeout_ms;
  r->results = json_array();
  r->out = json_array();
  r->err = json_array();
  r->chunk_cb = chunk_cb;
  r->done_cb = done_cb;
  r->ud = ud;
  uv_timer_init(c->loop, &r->timer);
  r->timer.data = r;
  sbx_code_run **pp = &c->runs;
  while (*pp) pp = &(*pp)->next;
  *pp = r;
  if (out) *out = r;
  send_next(c);
  return 0;
}

static void cancelled_unsent(uv_timer_t *t) {
  sbx_code_run *r = t->data;
  sbx_code_ctx *c = r->ctx;
  sbx_error e;
  sbx_err(&e, "INTERNAL", "cancelled before it ran");
  run_fail(r, &e);
  send_next(c);
}

void sbx_code_cancel(sbx_code_run *r) {
  sbx_code_ctx *c = r->ctx;
  if (!r->sent) { /* still waiting: it never runs (answered from the loop, not inside the caller) */
    r->cancelled = true;
    uv_timer_start(&r->timer, cancelled_unsent, 0, 0);
    return;
  }
  if (r->cancelled) return;
  r->cancelled = true;
  /* Python's driver turns the line (naming the run) into SIGINT for its
   * main thread; Node's main thread may be in a busy loop, so it gets the
   * signal (breakOnSigint) */
  if (!c->dead && !strcmp(c->language, "python")) {
    char line[48];
    int n = snprintf(line, sizeof line, "{\"interrupt\":%" PRIu64 "}\n", r->id);
    sbx_exec_write(c->x, line, (size_t)n);
  } else if (!c->dead)
    sbx_exec_signal_command(c->x, SIGINT);
  if (!uv_is_active((uv_handle_t *)&r->timer) || uv_timer_get_due_in(&r->timer) > STOP_GRACE_MS)
    uv_timer_start(&r->timer, backstop, STOP_GRACE_MS, 0);
}

/* ---- what the driver says ----------------------------------------------------- */

static sbx_code_run *run_of(sbx_code_ctx *c, json_t *msg) {
  json_t *id = json_object_get(msg, "id");
  sbx_code_run *r = c->runs;
  if (!r || !r->sent) return NULL;
  if (json_is_integer(id) && (uint64_t)json_integer_value(id) != r->id) return NULL;
  return r; /* text without an id (a child writing late) goes to the run in progress */
}

/* What a stream prints past its MAX_LOGS: its last TAIL_MAX bytes kept. */
static void to_tail(sbx_code_run *r, int i, const char *text, size_t len) {
  sbx_headtail *t = &r->tail[i];
  if (!len || (!t->tail_cap && !hold(r, &r->tail_bytes, 2 * TAIL_COST, TAIL_COST))) return;
  if (!t->tail_cap) sbx_headtail_init_split(t, 0, TAIL_MAX);
  sbx_headtail_add(t, text, len);
}

/* A stream's tail at the end of its logs, after a line that says how much
 * was cut: whole lines (the first one cut is left out), TAIL_LINES of them
 * at most, an entry each (up to 4 KiB). */
static void tail_to_logs(sbx_code_run *r, int i) {
  sbx_buf b = {0};
  sbx_headtail_tail(&r->tail[i], &b);
  if (!b.len) return sbx_buf_free(&b);
  size_t from = 0, lines = 0;
  for (size_t at = b.len; at > 0; at--)
    if (b.data[at - 1] == '\n' && at < b.len && ++lines >= TAIL_LINES) {
      from = at;
      break;
    }
  /* (from the head's end when nothing was dropped; else from a line's start) */
  bool line_start = from > 0 ? b.data[from - 1] == '\n' : !sbx_headtail_truncated(&r->tail[i]);
  if (!line_start) { /* begun mid-line: from the next one, if one ends before the end; else from a character */
    const char *nl = memchr(b.data + from, '\n', b.len - from);
    if (nl && nl + 1 < b.data + b.len) from = (size_t)(nl + 1 - b.data);
    else
      while (from < b.len && ((unsigned char)b.data[from] & 0xc0) == 0x80) from++;
  }
  json_t *a = i ? r->err : r->out;
  uint64_t cut = r->tail[i].total - (b.len - from);
  char note[96];
  snprintf(note, sizeof note, "[... %llu bytes cut here ...]\n", (unsigned long long)cut);
  if (cut) json_array_append_new(a, json_string(note));
  while (from < b.len) {
    const char *p = b.data + from, *nl = memchr(p, '\n', b.len - from);
    size_t n = nl ? (size_t)(nl + 1 - p) : b.len - from;
    if (n > 4096) n = sbx_utf8_complete_prefix(p, 4096);
    if (!n) n = b.len - from < 4096 ? b.len - from : 4096; /* not text: as it is */
    json_array_append_new(a, json_stringn(p, n)); /* (NULL, and left out, if not UTF-8) */
    from += n;
  }
  sbx_buf_free(&b);
}

static void add_log(sbx_code_run *r, const char *stream, const char *text, size_t len) {
  bool out = !strcmp(stream, "stdout");
  int i = out ? 0 : 1; /* of r->pending */
  size_t *bytes = out ? &r->out_bytes : &r->err_bytes;
  /* a line written in parts (print's text, then its newline) is one entry,
   * up to 4 KiB: longer ones stay in the parts they came in */
  json_t *a = out ? r->out : r->err, *last = json_array_get(a, json_array_size(a) - 1);
  size_t ll = last ? json_string_length(last) : 0;
  bool join = last && ll && ll + len <= 4096 && json_string_value(last)[ll - 1] != '\n';
  size_t cost = join ? 0 : LOG_ENTRY_COST;
  size_t room = room_for(r, *bytes, MAX_LOGS), whole = len;
  if (r->past_head[i]) room = 0; /* once the head is full, what follows is the tail's: in order */
  if (len + cost > room) {
    r->past_head[i] = true;
    len = room > cost ? sbx_utf8_complete_prefix(text, room - cost) : 0; /* whole characters */
    r->truncated = true;
    to_tail(r, i, text + len, whole - len);
  }
  if (len) {
    charge(r, bytes, len + cost);
    if (join) {
      char joined[4096];
      memcpy(joined, json_string_value(last), ll);
      memcpy(joined + ll, text, len);
      json_string_setn(last, joined, ll + len);
    } else {
      json_array_append_new(a, json_stringn(text, len));
    }
  }
  if (len && r->chunk_cb) {
    if (r->pending[!i].len) flush_progress(r); /* the other stream's first: in the order printed */
    sbx_buf_append(&r->pending[i], text, len); /* sent once the read is through */
  }
}

static const char *const result_keys[] = {"text", "html", "png", "jpeg", "svg", "json", "markdown", "latex", "javascript",
                                          "isMain", NULL};

/* A result, as the driver sent it: only known keys, strings (json: any). */
static json_t *clean_result(json_t *in) {
  if (!json_is_object(in)) return NULL;
  json_t *o = json_object();
  for (int i = 0; result_keys[i]; i++) {
    json_t *v = json_object_get(in, result_keys[i]);
    if (!v) continue;
    if (!strcmp(result_keys[i], "json") || (!strcmp(result_keys[i], "isMain") && json_is_boolean(v)) || json_is_string(v))
      json_object_set(o, result_keys[i], v);
  }
  return o;
}

/* How much JSON structure text has: its '{', '[', ',' and ':' outside
 * strings (a CSV in a string is text, not structure), counted up to past
 * most. */
static size_t json_structure(const char *p, size_t n, size_t most) {
  size_t t = 0;
  bool str = false;
  for (size_t k = 0; k < n && t <= most; k++) {
    char ch = p[k];
    if (str) {
      if (ch == '\\') k++;
      else if (ch == '"') str = false;
    } else if (ch == '"') {
      str = true;
    } else {
      t += ch == '{' || ch == '[' || ch == ',' || ch == ':';
    }
  }
  return t;
}

/* tokens: how much JSON structure the message's line had (TOKEN_COST) */
static void on_message(sbx_code_ctx *c, json_t *msg, size_t tokens) {
  if (json_is_true(json_object_get(msg, "ready")) && !c->ready) {
    c->ready = true;
    json_t *pid = json_object_get(msg, "pid"), *ver = json_object_get(msg, "version");
    if (json_is_integer(pid)) c->pid = (pid_t)json_integer_value(pid);
    if (json_is_string(ver)) snprintf(c->version, sizeof c->version, "%s", json_string_value(ver));
    if (c->ready_cb) {
      sbx_code_ready_cb cb = c->ready_cb;
      c->ready_cb = NULL;
      cb(c->ready_ud, c, NULL);
    }
    return send_next(c);
  }
  sbx_code_run *r = run_of(c, msg);
  if (!r) return;
  json_t *stream = json_object_get(msg, "stream"), *text = json_object_get(msg, "text"),
         *texts = json_object_get(msg, "texts");
  if (json_is_string(stream) && (json_is_string(text) || json_is_array(texts))) {
    const char *s = json_string_value(stream);
    if (strcmp(s, "stdout") && strcmp(s, "stderr")) return;
    if (json_is_string(text)) add_log(r, s, json_string_value(text), json_string_length(text));
    size_t i; /* the drivers send what was printed meanwhile in one message, an entry a line */
    json_t *t;
    json_array_foreach(texts, i, t) if (json_is_string(t)) add_log(r, s, json_string_value(t), json_string_length(t));
    return;
  }
  json_t *res = clean_result(json_object_get(msg, "result"));
  if (res) {
    char *dump = json_dumps(res, JSON_COMPACT);
    size_t n = dump ? strlen(dump) + tokens * TOKEN_COST : 0;
    free(dump);
    if (!hold(r, &r->result_bytes, MAX_RESULTS, n)) {
      r->truncated = true;
      json_decref(res);
    } else {
      json_array_append_new(r->results, res);
    }
    return;
  }
  if (json_is_true(json_object_get(msg, "done"))) {
    json_t *e = json_object_get(msg, "error"), *clean = NULL;
    if (json_is_object(e)) {
      json_t *name = json_object_get(e, "name"), *value = json_object_get(e, "value"), *tb = json_object_get(e, "traceback");
      clean = json_pack("{s:s, s:s, s:[]}", "name", json_is_string(name) ? json_string_value(name) : "Error", "value",
                        json_is_string(value) ? json_string_value(value) : "", "traceback");
      size_t i;
      json_t *l;
      json_array_foreach(tb, i, l) if (json_is_string(l)) json_array_append(json_object_get(clean, "traceback"), l);
    }
    run_done(c, r, clean);
    json_decref(clean);
  }
}

static void on_output(void *ud, int stream, const char *data, size_t len) {
  sbx_code_ctx *c = ud;
  if (stream != 1) { /* the interpreter's own complaints before the driver runs */
    sbx_code_run *r = c->runs;
    if (r && r->sent) add_log(r, "stderr", data, len), flush_progress(r);
    return;
  }
  if (c->ready && (!c->runs || !c->runs->sent)) {
    c->line.len = 0; /* nothing is asked of it: what it says is dropped unread */
    c->skipping = !(len && data[len - 1] == '\n');
    return;
  }
  while (len) {
    const char *nl = memchr(data, '\n', len);
    size_t take = nl ? (size_t)(nl - data) : len;
    if (!c->skipping) {
      if (c->line.len + take > MAX_LINE) {
        c->skipping = true; /* too big to be ours: dropped, and the run says something is missing */
        c->line.len = 0;
        if (c->runs && c->runs->sent) c->runs->truncated = true;
      } else {
        sbx_buf_append(&c->line, data, take);
      }
    }
    if (!nl) break;
    if (!c->skipping && c->line.len) {
      json_error_t je;
      /* a line of "[[[[..." or "{},{}..." would cost the daemon gigabytes to parse */
      size_t tokens = json_structure(c->line.data, c->line.len, MAX_TOKENS);
      json_t *msg = tokens > MAX_TOKENS || c->line.data[0] != '{'
                        ? NULL
                        : json_loadb(c->line.data, c->line.len, JSON_REJECT_DUPLICATES, &je);
      if (json_is_object(msg)) on_message(c, msg, tokens);
      else {
        /* not a message: something wrote to the channel; it is output */
        sbx_code_run *r = c->runs;
        if (r && r->sent) {
          sbx_buf_append(&c->line, "\n", 1);
          add_log(r, "stdout", c->line.data, c->line.len);
        }
      }
      json_decref(msg);
    }
    c->line.len = 0;
    if (c->line.cap > 65536) sbx_buf_free(&c->line);
    c->skipping = false;
    len -= take + 1;
    data = nl + 1;
  }
  if (c->runs && c->runs->sent) flush_progress(c->runs);
}

static void ctx_free_if_done(sbx_code_ctx *c) {
  if (!c->forgotten || c->x) return;
  for (sbx_code_ctx **pp = &all; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  sbx_buf_free(&c->line);
  free(c);
}

static void fail_all(sbx_code_ctx *c, const char *code) {
  while (c->runs) {
    sbx_error e;
    sbx_err(&e, code, "the %s context ended before the code finished (%s)", c->language, c->why);
    run_fail(c->runs, &e);
  }
}

static void on_exit_cb(void *ud, const sbx_exec_result *res, const sbx_error *err) {
  sbx_code_ctx *c = ud;
  c->x = NULL;
  /* the code ended its interpreter (os._exit, a crash, the sandbox's
   * memory): not ended by sbx (ctx_end), nor failed to start */
  bool by_code = !c->dead && !err && c->ready;
  if (!c->dead) {
    c->dead = true;
    if (err) snprintf(c->why, sizeof c->why, "%s", err->message);
    else if (!c->ready && res->exit_code == 127)
      snprintf(c->why, sizeof c->why, "%s is not installed in the sandbox", !strcmp(c->language, "python") ? "python3" : "node");
    else if (res->oom) snprintf(c->why, sizeof c->why, "killed: the sandbox ran out of memory");
    else {
      /* 128 + a signal's number: killed by it (or so the code exited) */
      const char *sig = res->exit_code > 128 && res->exit_code - 128 < NSIG ? sigabbrev_np(res->exit_code - 128) : NULL;
      snprintf(c->why, sizeof c->why, "its interpreter ended (exit code %d%s%s)", res->exit_code, sig ? ", SIG" : "",
               sig ? sig : "");
    }
  }
  const char *code = !c->ready && !err && res->exit_code == 127 ? "INTERPRETER_NOT_AVAILABLE"
                     : by_code                                    ? "CONTEXT_NOT_FOUND"
                                                                  : "INTERNAL";
  if (c->ready_cb) {
    sbx_error e;
    sbx_err(&e, code, "the %s context could not start: %s", c->language, c->why);
    sbx_code_ready_cb cb = c->ready_cb;
    c->ready_cb = NULL;
    cb(c->ready_ud, NULL, &e);
  }
  sbx_code_run *r = c->runs;
  if (by_code && r && r->sent && !r->cancelled) {
    /* its answer is what it printed until then, and why it ended, as an
     * error of the code's (the next run of the default context starts a
     * new one) */
    json_t *e = json_pack("{s:s, s:s+, s:[]}", "name", "InterpreterExited", "value", c->why,
                          "; the context's state is gone", "traceback");
    run_done(c, r, e);
    json_decref(e);
  }
  fail_all(c, code);
  ctx_free_if_done(c);
}

static void ctx_end(sbx_code_ctx *c, const char *why) {
  if (!c->dead) {
    c->dead = true;
    snprintf(c->why, sizeof c->why, "%s", why);
  }
  if (c->x) sbx_exec_cancel(c->x); /* on_exit_cb follows */
}

/* ---- contexts ----------------------------------------------------------------- */

int sbx_code_create(uv_loop_t *loop, sbx_sandbox *sb, const char *language, const char *id, const char *cwd,
                    const sbx_env *env, sbx_code_ready_cb ready_cb, void *ud, sbx_code_ctx **out, sbx_error *err) {
  bool py = !strcmp(language, "python");
  if (!py && strcmp(language, "javascript"))
    return sbx_err(err, "VALIDATION_FAILED", "language must be \"python\" or \"javascript\"");
  size_t n = 0;
  for (sbx_code_ctx *c = all; c; c = c->next)
    if (!c->forgotten && !strcmp(c->sandbox, sb->id)) n++;
  if (n >= SBX_MAX_CODE_CONTEXTS)
    return sbx_err(err, "RESOURCE_LIMIT", "sandbox '%s' has %zu code contexts already (deleteCodeContext some)", sb->id, n);
  char abs[4096] = "/workspace";
  if (cwd && sbx_fs_abspath(cwd, abs, err) < 0) return -1;
  if (strlen(abs) >= sizeof ((sbx_code_ctx *)0)->cwd) return sbx_err(err, "VALIDATION_FAILED", "cwd is too long");
  sbx_code_ctx *c = calloc(1, sizeof *c);
  if (!c) return sbx_err(err, "INTERNAL", "out of memory");
  static uint64_t seq;
  if (id) snprintf(c->id, sizeof c->id, "%s", id);
  else snprintf(c->id, sizeof c->id, "ctx-%llu-%llu", (unsigned long long)(sbx_now_ms() % 1000000), (unsigned long long)++seq);
  snprintf(c->sandbox, sizeof c->sandbox, "%s", sb->id);
  snprintf(c->language, sizeof c->language, "%s", language);
  snprintf(c->cwd, sizeof c->cwd, "%s", abs);
  c->loop = loop;
  c->created_ms = sbx_now_ms();
  c->ready_cb = ready_cb;
  c->ready_ud = ud;
  sbx_env e = {0};
  if (env) sbx_env_copy(&e, env);
  sbx_env_set(&e, "SBX_DRIVER", py ? driver_python : driver_node);
  if (py) sbx_env_set(&e, "PYTHONUNBUFFERED", "1");
  /* `command -v` first: a missing interpreter is exit 127 before any output */
  const char *cmd = py ? "command -v python3 >/dev/null || exit 127; exec python3 -c \"$SBX_DRIVER\""
                       : "command -v node >/dev/null || exit 127; exec node -e \"$SBX_DRIVER\"";
  sbx_exec_opts o = {.command = cmd, .cwd = c->cwd, .env = &e, .stdin_stream = true, .discard = true, .background = true,
                     .line_cost = LINE_COST};
  int r = sbx_exec_start(loop, sb, &o, on_output, on_exit_cb, c, &c->x, err);
  sbx_env_clear(&e);
  if (r < 0) {
    free(c);
    return -1;
  }
  c->next = all;
  all = c;
  if (out) *out = c;
  return 0;
}

const char *sbx_code_language(const sbx_code_ctx *c) { return c->language; }

bool sbx_code_dead(const sbx_code_ctx *c) { return c->dead; }

void sbx_code_delete(sbx_code_ctx *c) {
  c->forgotten = true;
  ctx_end(c, "deleted");
  fail_all(c, "CONTEXT_NOT_FOUND");
  ctx_free_if_done(c);
}

void sbx_code_forget_sandbox(const char *sandbox) {
  for (sbx_code_ctx *c = all, *next; c; c = next) {
    next = c->next;
    if (!c->forgotten && !strcmp(c->sandbox, sandbox)) sbx_code_delete(c);
  }
}
