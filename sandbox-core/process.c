/* Background processes of a sandbox (startProcess): commands that outlive
 * the call that started them, with their logs and exit status kept. They
 * are execs without a waiting caller, in their own session state. */
#define _GNU_SOURCE
#include "process.h"

#include <signal.h>

static sbx_process *all;

struct sbx_process_watch {
  sbx_watch_chunk_cb chunk;
  sbx_watch_end_cb end;
  void *ud;
  sbx_process_watch *next;
};

static void on_chunk(void *ud, int stream, const char *data, size_t len);

sbx_process_watch *sbx_process_watch_add(sbx_process *p, sbx_watch_chunk_cb chunk, sbx_watch_end_cb end, void *ud) {
  sbx_process_watch *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  *w = (sbx_process_watch){chunk, end, ud, p->watches};
  p->watches = w;
  if (p->x) sbx_exec_set_chunk_cb(p->x, on_chunk); /* output is followed only while someone watches */
  return w;
}

static void on_chunk(void *ud, int stream, const char *data, size_t len) {
  sbx_process *p = ud;
  for (sbx_process_watch *w = p->watches, *next; w; w = next) {
    next = w->next; /* a watcher may leave while called */
    if (w->chunk) w->chunk(w->ud, stream, data, len);
  }
}

void sbx_process_unwatch(sbx_process *p, sbx_process_watch *w) {
  for (sbx_process_watch **pp = &p->watches; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      free(w);
      break;
    }
  if (!p->watches && p->x) sbx_exec_set_chunk_cb(p->x, NULL);
}

/* Tells every watcher the end (p NULL: forgotten) and drops them. */
static void end_watches(sbx_process *p, bool forgotten) {
  while (p->watches) {
    sbx_process_watch *w = p->watches;
    p->watches = w->next;
    w->end(w->ud, forgotten ? NULL : p);
    free(w);
  }
}

static int count_in(const char *sandbox) {
  int n = 0;
  for (sbx_process *p = all; p; p = p->next)
    if (!p->orphaned && !strcmp(p->sandbox, sandbox)) n++;
  return n;
}

static unsigned long long seq; /* of generated ids (proc-N), past an earlier daemon's */

/* Sandboxes whose records changed, written within SAVE_AFTER_MS (a
 * written record is synced: not one a start and one an end in the loop). */
#define SAVE_AFTER_MS 1000
#define SAVE_MAX 64
static struct {
  uv_timer_t timer;
  bool ready;
  char ids[SAVE_MAX][64];
  int n;
} pending;

static void save_pending(uv_timer_t *t) {
  (void)t;
  for (int i = 0; i < pending.n; i++) {
    sbx_sandbox *sb = sbx_sandbox_find(pending.ids[i]);
    if (sb) sbx_sandbox_save(sb);
  }
  pending.n = 0;
}

/* The records changed: the sandbox's record with them, soon. */
static void saved(uv_loop_t *loop, const char *sandbox) {
  for (int i = 0; i < pending.n; i++)
    if (!strcmp(pending.ids[i], sandbox)) return;
  if (pending.n == SAVE_MAX) save_pending(NULL);
  snprintf(pending.ids[pending.n++], sizeof pending.ids[0], "%s", sandbox);
  if (!pending.ready) {
    uv_timer_init(loop, &pending.timer);
    uv_unref((uv_handle_t *)&pending.timer);
    pending.ready = true;
  }
  if (!uv_is_active((uv_handle_t *)&pending.timer)) uv_timer_start(&pending.timer, save_pending, SAVE_AFTER_MS, 0);
}

static void unlink_free(sbx_process *p) {
  sbx_process **pp = &all;
  while (*pp && *pp != p) pp = &(*pp)->next;
  if (*pp) *pp = p->next;
  free(p->command);
  free(p->out);
  free(p->err);
  free(p);
}

/* Keeps at most SBX_MAX_PROCESSES records per sandbox: the oldest finished
 * one goes first. */
static bool make_room(const char *sandbox) {
  if (count_in(sandbox) < SBX_MAX_PROCESSES) return true;
  sbx_process *oldest = NULL;
  for (sbx_process *p = all; p; p = p->next)
    if (!p->orphaned && p->done && !strcmp(p->sandbox, sandbox) && (!oldest || p->end_ms < oldest->end_ms)) oldest = p;
  if (!oldest) return false;
  unlink_free(oldest);
  return true;
}

static void on_done(void *ud, const sbx_exec_result *r, const sbx_error *err) {
  sbx_process *p = ud;
  p->x = NULL;
  p->done = true;
  p->end_ms = sbx_wall_ms();
  if (err) {
    p->status = "error";
  } else {
    p->exit_code = r->exit_code;
    p->status = p->killed ? "killed" : r->exit_code == 0 ? "completed" : "failed";
    p->out = strndup(r->out, r->out_len);
    p->out_len = r->out_len;
    p->err = strndup(r->err, r->err_len);
    p->err_len = r->err_len;
    if (r->output_path) snprintf(p->output_path, sizeof p->output_path, "%s", r->output_path);
  }
  end_watches(p, p->orphaned);
  if (p->orphaned) unlink_free(p);
  else if (pending.ready) saved(pending.timer.loop, p->sandbox);
}

sbx_process *sbx_process_find(const char *sandbox, const char *id) {
  for (sbx_process *p = all; p; p = p->next)
    if (!p->orphaned && !strcmp(p->sandbox, sandbox) && !strcmp(p->id, id)) return p;
  return NULL;
}

sbx_process *sbx_process_list(void) { return all; }

int sbx_process_start(uv_loop_t *loop, sbx_sandbox *sb, const char *id, const sbx_exec_opts *o, sbx_process **out,
                      sbx_error *err) {
  char gen[64];
  if (!id) {
    do /* past any that a record (or the caller) named so */
      snprintf(gen, sizeof gen, "proc-%llu", ++seq);
    while (sbx_process_find(sb->id, gen));
    id = gen;
  }
  if (!sbx_valid_id(id)) return sbx_err(err, "VALIDATION_FAILED", "processId must be 1-63 of [a-z0-9-]");
  sbx_process *old = sbx_process_find(sb->id, id);
  if (old && !old->done) return sbx_err(err, "VALIDATION_FAILED", "process '%s' is still running", id);
  if (old) unlink_free(old);
  if (!make_room(sb->id))
    return sbx_err(err, "RESOURCE_LIMIT", "at most %d processes per sandbox", SBX_MAX_PROCESSES);
  sbx_process *p = calloc(1, sizeof *p);
  if (!p) return sbx_err(err, "INTERNAL", "out of memory");
  snprintf(p->id, sizeof p->id, "%s", id);
  snprintf(p->sandbox, sizeof p->sandbox, "%s", sb->id);
  p->command = strdup(o->command);
  p->status = "running";
  p->start_ms = sbx_wall_ms();
  sbx_exec_opts opts = *o;
  opts.keep_session = false;
  size_t held = 0, mine = 0; /* the log limits of every record (both streams), and this sandbox's share */
  for (sbx_process *q = all; q; q = q->next) {
    held += 2 * q->log_limit;
    if (!strcmp(q->sandbox, sb->id)) mine += 2 * q->log_limit;
  }
  p->log_limit = held + 2 * SBX_PROCESS_LOG <= SBX_PROCESS_LOGS_MAX && mine + 2 * SBX_PROCESS_LOG <= SBX_PROCESS_LOGS_MAX / 4
                     ? SBX_PROCESS_LOG
                     : SBX_PROCESS_LOG_LEAN;
  opts.max_output = p->log_limit;
  opts.unattended = true;
  if (sbx_exec_start(loop, sb, &opts, NULL, on_done, p, &p->x, err) < 0) {
    free(p->command);
    free(p);
    return -1;
  }
  p->next = all;
  all = p;
  *out = p;
  saved(loop, sb->id);
  return 0;
}

int sbx_process_kill(sbx_process *p, int sig) {
  if (p->done) return 0;
  p->killed |= sbx_signal_stops(sig);
  /* a signal sent again within a second (calls that came together, or
   * two signals in turn): signalled once, a pass over its whole tree each
   * time otherwise; so at most one pass a second per signal */
  uint64_t now = sbx_now_ms();
  if (sig > 0 && sig < 32) {
    if (p->sent_ms[sig] && now - p->sent_ms[sig] < 1000) return 1;
    p->sent_ms[sig] = now;
  }
  sbx_exec_signal(p->x, sig);
  return 1;
}

void sbx_process_forget_sandbox(const char *sandbox) {
  for (sbx_process *p = all, *next; p; p = next) {
    next = p->next;
    if (strcmp(p->sandbox, sandbox) || p->orphaned) continue;
    end_watches(p, true);
    if (p->done) unlink_free(p);
    else p->orphaned = true; /* freed when its exec ends */
  }
}

char *sbx_process_logs(sbx_process *p, int stream, size_t tail_lines, size_t *len) {
  char *text;
  size_t n;
  if (p->done) {
    const char *src = stream == 2 ? p->err : p->out;
    n = stream == 2 ? p->err_len : p->out_len;
    text = strndup(src ? src : "", src ? n : 0);
  } else {
    text = sbx_exec_output(p->x, stream, &n);
  }
  if (!text) return NULL;
  if (tail_lines > 0) { /* the last tail_lines lines */
    size_t i = n, lines = 0;
    if (i && text[i - 1] == '\n') i--;
    while (i > 0) {
      if (text[i - 1] == '\n' && ++lines == tail_lines) break;
      i--;
    }
    memmove(text, text + i, n - i + 1);
    n -= i;
  }
  *len = n;
  return text;
}

#define RECORD_COMMAND_MAX 256 /* of a command, in the sandbox's record: it names it, no more */

json_t *sbx_process_record(const char *sandbox) {
  json_t *a = json_array();
  for (sbx_process *p = all; p; p = p->next) {
    if (p->orphaned || strcmp(p->sandbox, sandbox)) continue;
    size_t n = strlen(p->command);
    if (n > RECORD_COMMAND_MAX) n = sbx_utf8_complete_prefix(p->command, RECORD_COMMAND_MAX);
    json_t *o = json_pack("{s:s, s:s%, s:s, s:I}", "id", p->id, "command", p->command, n, "status",
                          p->done || p->lost ? p->status : "running", "startTime", (json_int_t)p->start_ms);
    if (p->done && !p->lost) {
      json_object_set_new(o, "exitCode", json_integer(p->exit_code));
      json_object_set_new(o, "endTime", json_integer((json_int_t)p->end_ms));
    }
    if (p->output_path[0]) json_object_set_new(o, "outputPath", json_string(p->output_path));
    json_array_append_new(a, o);
  }
  return a;
}

/* A time of a record: a wall-clock ms up to a day from now, else 0. */
static uint64_t record_time(json_t *v) {
  json_int_t t = json_integer_value(v);
  return json_is_integer(v) && t > 0 && (uint64_t)t <= sbx_wall_ms() + 86400000 ? (uint64_t)t : 0;
}

/* An earlier entry of records (a newer one) with id. */
static bool newer_has(json_t *records, size_t i, const char *id) {
  for (size_t j = 0; j < i; j++)
    if (!strcmp(id, json_string_value(json_object_get(json_array_get(records, j), "id")) ?: "")) return true;
  return false;
}

void sbx_process_restore(const char *sandbox, json_t *records) {
  static const char *const ended[] = {"completed", "failed", "killed", "error"};
  size_t n = json_array_size(records) < SBX_MAX_PROCESSES ? json_array_size(records) : SBX_MAX_PROCESSES;
  for (size_t i = n; i-- > 0;) { /* the newest SBX_MAX_PROCESSES, oldest first: the list is newest first */
    json_t *r = json_array_get(records, i);
    const char *id = json_string_value(json_object_get(r, "id")), *cmd = json_string_value(json_object_get(r, "command"));
    const char *status = json_string_value(json_object_get(r, "status")), *out = json_string_value(json_object_get(r, "outputPath"));
    uint64_t start = record_time(json_object_get(r, "startTime"));
    if (!id || !sbx_valid_id(id) || !cmd || !status || !start || newer_has(records, i, id) || sbx_process_find(sandbox, id))
      continue;
    sbx_process *p = calloc(1, sizeof *p);
    if (!p || !(p->command = strdup(cmd))) {
      free(p);
      return;
    }
    snprintf(p->id, sizeof p->id, "%s", id);
    snprintf(p->sandbox, sizeof p->sandbox, "%s", sandbox);
    p->done = true;
    p->lost = true;
    p->status = "killed";
    p->exit_code = 128 + SIGKILL; /* as a daemon's stop ends its sandboxes */
    json_int_t code = json_integer_value(json_object_get(r, "exitCode"));
    uint64_t end = record_time(json_object_get(r, "endTime"));
    for (size_t k = 0; k < SBX_ARRAY_SIZE(ended); k++)
      if (!strcmp(status, ended[k]) && json_is_integer(json_object_get(r, "exitCode")) && code >= 0 && code <= 255 && end) {
        p->status = ended[k];
        p->lost = false;
        p->exit_code = (int)code;
        p->end_ms = end;
      }
    p->start_ms = start;
    /* only where sbx spills output: the record is the daemon's, but a file of it is echoed back */
    if (out && strlen(out) < sizeof p->output_path && !strncmp(out, SBX_SPILL_DIR "/", sizeof SBX_SPILL_DIR) &&
        !strstr(out, "/../"))
      snprintf(p->output_path, sizeof p->output_path, "%s", out);
    if (!strncmp(id, "proc-", 5) && strlen(id) <= 5 + 15 && strspn(id + 5, "0123456789") == strlen(id + 5)) {
      unsigned long long num = strtoull(id + 5, NULL, 10); /* at most 15 digits: never near wrapping */
      if (num > seq) seq = num;
    }
    p->next = all;
    all = p;
  }
}
