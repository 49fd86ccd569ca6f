/* The tool handlers: arguments (already validated against the catalog's
 * inputSchema) in, engine calls, structured results out. */
#define _GNU_SOURCE
#include "mcp.h"
#include "offload.h"
#include "matcher.h"

#include <ctype.h>

#include "../sandbox-core/bucket.h"
#include "../sandbox-core/files.h"
#include "../sandbox-core/netpolicy.h"
#include "../sandbox-core/ports.h"
#include "../sandbox-core/preview.h"
#include "../sandbox-core/process.h"

#include <signal.h>

static const char *str(json_t *args, const char *key) { return json_string_value(json_object_get(args, key)); }
static bool flag(json_t *args, const char *key) { return json_is_true(json_object_get(args, key)); }

static int env_from_json(json_t *obj, sbx_env *env, sbx_error *err) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    if (!*k || strchr(k, '=') || strlen(k) > 255)
      return sbx_err(err, "VALIDATION_FAILED", "invalid environment variable name '%.100s'", k);
    if (strlen(json_string_value(v)) != json_string_length(v))
      return sbx_err(err, "VALIDATION_FAILED", "environment variable '%.100s' contains a NUL byte", k);
    if (sbx_env_set(env, k, json_string_value(v)) < 0)
      return sbx_err(err, "VALIDATION_FAILED", "too many environment variables");
  }
  return 0;
}

static json_t *sandbox_json(sbx_sandbox *sb) {
  char created[32], last[32];
  sbx_iso_time(sb->created_wall_ms, created);
  sbx_iso_time(sb->last_used_wall_ms, last);
  int sessions = 0;
  for (sbx_session *s = sb->sessions; s; s = s->next) sessions++;
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s}", "sandboxId", sb->id, "status", sbx_sandbox_status(sb),
                        "createdAt", created, "lastActivity", last, "runningCommands", sb->running, "sessions", sessions,
                        "network", sb->opts.egress ? "egress" : "none");
  if (sb->opts.allowed_hosts.n) {
    json_t *a = json_array();
    for (size_t i = 0; i < sb->opts.allowed_hosts.n; i++) json_array_append_new(a, json_string(sb->opts.allowed_hosts.v[i]));
    json_object_set_new(o, "allowedHosts", a);
  }
  return o;
}

/* ---- sandboxes --------------------------------------------------------- */

static void h_create(mcp_call *call, json_t *args, sbx_sandbox *unused) {
  (void)unused;
  sbx_error err = {0};
  sbx_sandbox_opts o;
  sbx_sandbox_default_opts(&o);
  const char *sleep = str(args, "sleepAfter");
  /* a bare number is seconds, as Cloudflare's sleepAfter takes it */
  if (sleep && (o.sleep_after_ms = sbx_parse_duration_ms(sleep, 1000)) < 0) {
    sbx_err(&err, "VALIDATION_FAILED", "sleepAfter '%s' is not a duration like \"30s\", \"10m\", \"1h\"", sleep);
    return mcp_call_fail(call, &err);
  }
  if (sleep && o.sleep_after_ms < 1000) { /* an idle reset discards files: never by mistake */
    sbx_err(&err, "VALIDATION_FAILED", "sleepAfter '%s' is under a second: an idle sandbox is reset and its files go", sleep);
    return mcp_call_fail(call, &err);
  }
  o.keep_alive = flag(args, "keepAlive");
  const char *net = str(args, "network");
  o.egress = net && !strcmp(net, "egress");
  json_t *hosts = json_object_get(args, "allowedHosts");
  if (hosts) {
    if (net && !o.egress) {
      sbx_err(&err, "VALIDATION_FAILED", "allowedHosts narrows network \"egress\"; it means nothing with network \"none\"");
      return mcp_call_fail(call, &err);
    }
    o.egress = true;
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h) {
      sbx_cidr c;
      const char *v = json_string_value(h);
      if (sbx_cidr_parse(v, &c) < 0 && !sbx_dns_name_valid(v)) {
        sbx_err(&err, "VALIDATION_FAILED", "allowedHosts[%zu] '%.100s' is not a host name (\"api.example.com\", "
                "\"*.example.com\"), an address or a CIDR (\"203.0.113.0/24\", \"2001:db8::/32\")", i, v);
        sbx_strv_clear(&o.allowed_hosts);
        return mcp_call_fail(call, &err);
      }
      sbx_strv_add(&o.allowed_hosts, v);
    }
  }
  const char *image = str(args, "image");
  if (image) snprintf(o.image, sizeof o.image, "%s", image);
  json_t *lim = json_object_get(args, "limits");
  if (lim) {
    o.limits_explicit = true;
    json_t *v;
    if ((v = json_object_get(lim, "memoryMB"))) o.limits.memory_mb = json_number_value(v);
    if ((v = json_object_get(lim, "cpus"))) o.limits.cpus = json_number_value(v);
    if ((v = json_object_get(lim, "pids"))) o.limits.pids = json_number_value(v);
    if ((v = json_object_get(lim, "diskMB"))) o.limits.disk_mb = json_number_value(v), o.disk_explicit = true;
  }
  if (env_from_json(json_object_get(args, "env"), &o.env, &err) < 0) {
    sbx_env_clear(&o.env);
    sbx_strv_clear(&o.allowed_hosts);
    return mcp_call_fail(call, &err);
  }
  sbx_sandbox *sb;
  bool created;
  int r = sbx_sandbox_create(call->sandbox_id, &o, &sb, &created, &err);
  created |= call->sandbox_created; /* this call made it, and waited for its start */
  if (r > 0) {
    call->sandbox_created = created;
    sbx_env_clear(&o.env);
    sbx_strv_clear(&o.allowed_hosts);
    return mcp_call_wait_start(call, args, sb);
  }
  json_t *updated = json_array(), *not_applied = json_array();
  if (r == 0 && !created) {
    /* an existing sandbox: what can change live changes, the rest is named */
    if (sleep && sb->opts.sleep_after_ms != o.sleep_after_ms) {
      sb->opts.sleep_after_ms = o.sleep_after_ms;
      json_array_append_new(updated, json_string("sleepAfter"));
    }
    if (json_object_get(args, "keepAlive") && sb->opts.keep_alive != o.keep_alive) {
      sb->opts.keep_alive = o.keep_alive;
      json_array_append_new(updated, json_string("keepAlive"));
    }
    if (o.env.n) { /* for every command from now on, in every session */
      sbx_env_copy(&sb->opts.env, &o.env);
      for (sbx_session *s = sb->sessions; s; s = s->next) sbx_env_copy(&s->env, &o.env), s->gen++;
      json_array_append_new(updated, json_string("env"));
    }
    if (net && o.egress != sb->opts.egress) json_array_append_new(not_applied, json_string("network"));
    if (hosts) json_array_append_new(not_applied, json_string("allowedHosts"));
    if (image && strcmp(image, sb->opts.image)) json_array_append_new(not_applied, json_string("image"));
    /* only the limits the call names: the others it leaves as they are */
    const sbx_limits *l = &sb->opts.limits;
    if (lim && ((json_object_get(lim, "memoryMB") && o.limits.memory_mb != l->memory_mb) ||
                (json_object_get(lim, "cpus") && o.limits.cpus != l->cpus) ||
                (json_object_get(lim, "pids") && o.limits.pids != l->pids) ||
                (json_object_get(lim, "diskMB") && o.limits.disk_mb != l->disk_mb)))
      json_array_append_new(not_applied, json_string("limits"));
    if (json_array_size(updated)) sbx_sandbox_save(sb);
  }
  sbx_env_clear(&o.env);
  sbx_strv_clear(&o.allowed_hosts);
  if (r < 0) {
    json_decref(updated);
    json_decref(not_applied);
    return mcp_call_fail(call, &err);
  }
  call->reset = sbx_sandbox_take_reset(sb);
  call->restarted = sbx_sandbox_take_restart(sb);
  const sbx_limits *l = &sb->opts.limits;
  sbx_enforced e = sbx_sandbox_enforced(sb);
  char text[400];
  int n = snprintf(text, sizeof text, "sandbox %s %s", sb->id, created ? "created" : "already exists");
  for (size_t i = 0; i < json_array_size(updated) && n < (int)sizeof text; i++)
    n += snprintf(text + n, sizeof text - n, "%s%s", i ? ", " : "; updated: ", json_string_value(json_array_get(updated, i)));
  for (size_t i = 0; i < json_array_size(not_applied) && n < (int)sizeof text; i++)
    n += snprintf(text + n, sizeof text - n, "%s%s", i ? ", " : "; NOT changed (they need a new sandbox: destroySandbox, "
                  "then createSandbox): ", json_string_value(json_array_get(not_applied, i)));
  if (!e.memory || !e.cpus || !e.pids || !e.disk) /* never silently */
    snprintf(text + n, sizeof text - n, "; limits NOT enforced on this host:%s%s%s%s (see sbx doctor)",
             e.memory ? "" : " memoryMB", e.cpus ? "" : " cpus", e.pids ? "" : " pids", e.disk ? "" : " diskMB");
  json_t *res = json_pack("{s:s, s:s, s:b, s:{s:I, s:f, s:I, s:I}, s:{s:b, s:b, s:b, s:b}}", "sandboxId", sb->id, "status",
                          sbx_sandbox_status(sb), "created", created, "limits", "memoryMB", (json_int_t)l->memory_mb, "cpus",
                          l->cpus, "pids", (json_int_t)l->pids, "diskMB", (json_int_t)l->disk_mb, "limitsEnforced",
                          "memory", e.memory, "cpus", e.cpus, "pids", e.pids, "disk", e.disk);
  if (json_array_size(updated)) json_object_set(res, "updated", updated);
  if (json_array_size(not_applied)) json_object_set(res, "notApplied", not_applied);
  json_decref(updated);
  json_decref(not_applied);
  mcp_call_ok(call, res, text);
}

static void h_list(mcp_call *call, json_t *args, sbx_sandbox *unused) {
  (void)args;
  (void)unused;
  json_t *arr = json_array();
  sbx_buf text = {0};
  for (sbx_sandbox *sb = sbx_sandbox_list(); sb; sb = sb->next) {
    json_array_append_new(arr, sandbox_json(sb));
    sbx_buf_append(&text, sb->id, strlen(sb->id));
    sbx_buf_append(&text, "\n", 1);
  }
  if (!text.data) sbx_buf_append(&text, "no sandboxes", 12);
  mcp_call_ok(call, json_pack("{s:o}", "sandboxes", arr), text.data);
  sbx_buf_free(&text);
}

static void h_destroy(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  (void)args;
  sbx_error err = {0};
  char id[64];
  snprintf(id, sizeof id, "%s", sb->id);
  mcp_sandbox_ended(sb); /* its commands are cancelled by the destroy itself */
  if (sbx_sandbox_destroy(id, &err) < 0) return mcp_call_fail(call, &err);
  char text[128];
  snprintf(text, sizeof text, "sandbox %s destroyed", id);
  mcp_call_ok(call, json_pack("{s:s, s:b}", "sandboxId", id, "destroyed", 1), text);
}

/* A sandbox destroyed or reset: its processes, code contexts and preview
 * URLs (they answer 410 from now on) go with it. */
void mcp_sandbox_ended(sbx_sandbox *sb) {
  mcp_offload_forget(sb);
  sbx_process_forget_sandbox(sb->id);
  sbx_code_forget_sandbox(sb->id);
  sbx_preview_revoke_sandbox(sb);
}

/* ---- exec -------------------------------------------------------------- */

static void exec_chunk(void *ud, int stream, const char *data, size_t len) {
  mcp_call_progress(ud, stream == 1 ? "stdout" : "stderr", data, len);
}

/* A command that failed the way programs fail without a network, in a
 * sandbox that has none: say how to get one. */
#define NO_NETWORK_HINT                                                                                          \
  "this sandbox has no network (network \"none\"), and a sandbox's network is set when it is made: a new "       \
  "sandbox id with createSandbox {network: \"egress\"} has one (or destroySandbox, then that, losing the files)"

static const char *no_network_hint(mcp_call *call, const sbx_exec_result *r) {
  static const char *const marks[] = {"Temporary failure in name resolution", "EAI_AGAIN", "ENOTFOUND",
                                      "Could not resolve host", "Name or service not known", "Network is unreachable",
                                      "Failed to establish a new connection", "No address associated with hostname",
                                      "getaddrinfo", "Could not resolve hostname", "unable to resolve host"};
  sbx_sandbox *sb = sbx_sandbox_find(call->sandbox_id);
  if (r->exit_code == 0 || !sb || sb->opts.egress) return NULL;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(marks); i++)
    if (memmem(r->out, r->out_len, marks[i], strlen(marks[i])) || memmem(r->err, r->err_len, marks[i], strlen(marks[i])))
      return NO_NETWORK_HINT;
  return NULL;
}

static void exec_done(void *ud, const sbx_exec_result *r, const sbx_error *err) {
  mcp_call *call = ud;
  call->exec = NULL;
  if (err) return mcp_call_fail(call, err);
  json_t *o = json_pack("{s:s%, s:s%, s:i, s:b, s:I}", "stdout", r->out, r->out_len, "stderr", r->err, r->err_len,
                        "exitCode", r->exit_code, "success", r->exit_code == 0 && !r->timed_out, "duration",
                        (json_int_t)r->duration_ms);
  if (r->timed_out) { /* an error, so it is not taken for a result; the output so far is there */
    json_object_set_new(o, "timedOut", json_true());
    call->result_is_error = true;
    char msg[160];
    snprintf(msg, sizeof msg, "the command timed out after %llu ms and was killed with everything it started",
             (unsigned long long)r->duration_ms);
    json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", "COMMAND_TIMEOUT", "message", msg));
    mcp_call_log(call, "warning", "command timed out after %llu ms and was killed with everything it started",
                 (unsigned long long)r->duration_ms);
  }
  if (r->oom) mcp_call_log(call, "error", "command killed: the sandbox ran out of memory (raise limits.memoryMB)");
  if (r->truncated) json_object_set_new(o, "truncated", json_true());
  if (r->output_path) json_object_set_new(o, "outputPath", json_string(r->output_path));
  if (r->oom) json_object_set_new(o, "oomKilled", json_true());
  const char *hint = no_network_hint(call, r);
  char left[300];
  if (!hint && r->left_behind > 0 && !r->timed_out && !r->cancelled) { /* `srv &`: gone as the call returns */
    snprintf(left, sizeof left, "%d process%s the command started in the background %s ended with it (nothing of a "
             "call outlives it): use startProcess for a server or a job that must keep running", r->left_behind,
             r->left_behind == 1 ? "" : "es", r->left_behind == 1 ? "was" : "were");
    hint = left;
  }
  if (hint) json_object_set_new(o, "hint", json_string(hint));
  sbx_buf t = {0};
  sbx_buf_append(&t, r->out, r->out_len);
  if (r->err_len) {
    if (t.len && t.data[t.len - 1] != '\n') sbx_buf_append(&t, "\n", 1);
    sbx_buf_append(&t, "[stderr]\n", 9);
    sbx_buf_append(&t, r->err, r->err_len);
  }
  char tail[256];
  int n = snprintf(tail, sizeof tail, "%s[exit code %d, %llu ms%s%s%s]", t.len && t.data[t.len - 1] != '\n' ? "\n" : "",
                   r->exit_code, (unsigned long long)r->duration_ms, r->timed_out ? ", timed out" : "",
                   r->oom ? ", killed: out of memory" : "", r->truncated ? ", output truncated" : "");
  sbx_buf_append(&t, tail, n);
  if (r->output_path) {
    n = snprintf(tail, sizeof tail, r->output_short ? "\n[output so far: %s (the rest did not fit: the sandbox's disk is full)]"
                                                    : "\n[full output: %s]", r->output_path);
    sbx_buf_append(&t, tail, n);
  }
  if (hint) {
    sbx_buf_append(&t, "\n[hint: ", 8);
    sbx_buf_append(&t, hint, strlen(hint));
    sbx_buf_append(&t, "]", 1);
  }
  mcp_call_ok(call, o, t.data);
  sbx_buf_free(&t);
}

static void h_exec(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  sbx_env env = {0};
  if (env_from_json(json_object_get(args, "env"), &env, &err) < 0) {
    sbx_env_clear(&env);
    return mcp_call_fail(call, &err);
  }
  json_t *in = json_object_get(args, "stdin");
  sbx_exec_opts o = {
      .command = str(args, "command"),
      .cwd = str(args, "cwd"),
      .env = &env,
      .timeout_ms = json_integer_value(json_object_get(args, "timeout")),
      .session_id = str(args, "sessionId"),
      .stdin_data = in ? json_string_value(in) : NULL,
      .stdin_len = in ? json_string_length(in) : 0,
      .max_output = json_integer_value(json_object_get(args, "maxOutputBytes")),
      .keep_session = true,
      .raw_chunks = call->raw,
  };
  if (strlen(o.command) != json_string_length(json_object_get(args, "command"))) {
    sbx_env_clear(&env);
    sbx_err(&err, "VALIDATION_FAILED", "command contains a NUL byte");
    return mcp_call_fail(call, &err);
  }
  int in_sock = -1;
  if (call->stdin_socket) { /* sbx exec -i: stdin streams in through a socket, never whole in memory */
    if (o.stdin_data || (in_sock = call->conn ? mcp_conn_take_stdin(call->conn) : -1) < 0) {
      sbx_env_clear(&env);
      sbx_err(&err, "VALIDATION_FAILED", "_meta sbx/stdin needs a stream opened with sbx/stdin/open, and no stdin");
      return mcp_call_fail(call, &err);
    }
    o.stdio = true;
    o.stdio_fd = in_sock;
  }
  int r = sbx_exec_start(mcp_call_loop(call), sb, &o, exec_chunk, exec_done, call, &call->exec, &err);
  if (in_sock >= 0) close(in_sock);
  sbx_env_clear(&env);
  if (r < 0) mcp_call_fail(call, &err);
}

/* ---- background processes ---------------------------------------------- */

/* What a call waits on (call->wait): cancelled through its first member. */
typedef struct wait_head {
  void (*cancel)(void *self);
} wait_head;

static json_t *process_json(sbx_process *p) {
  char start[32], end[32];
  sbx_iso_time(p->start_ms, start);
  json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "id", p->id, "command", p->command, "status", p->status, "startTime",
                        start);
  pid_t pid = p->done ? 0 : sbx_exec_pid_in_sandbox(p->x);
  if (pid > 0) json_object_set_new(o, "pid", json_integer(pid));
  if (p->done) json_object_set_new(o, "exitCode", json_integer(p->exit_code));
  if (p->done && !p->lost) {
    sbx_iso_time(p->end_ms, end);
    json_object_set_new(o, "endTime", json_string(end));
  }
  return o;
}

static sbx_process *find_process(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  const char *id = str(args, "processId");
  sbx_process *p = sbx_process_find(sb->id, id);
  if (!p) {
    sbx_error err;
    sbx_err(&err, "PROCESS_NOT_FOUND", "no process '%s' in sandbox '%s' (see listProcesses)", id, sb->id);
    mcp_call_fail(call, &err);
  }
  return p;
}

/* startProcess answers once the command's pid is known (its supervisor
 * starts it a moment after the call), or once it has ended, or after
 * START_WAIT_MS without it. */
#define START_WAIT_MS 1000

struct start_wait {
  wait_head head;
  mcp_call *call;
  sbx_process *p;
  sbx_process_watch *w;
  uv_timer_t timer;
  int ticks;
  bool replaced; /* a finished process of that name was forgotten for it */
};

static void start_closed(uv_handle_t *h) { free(h->data); }

static void start_answer(struct start_wait *sw) {
  mcp_call *call = sw->call;
  call->wait = NULL;
  if (sw->w) sbx_process_unwatch(sw->p, sw->w);
  uv_timer_stop(&sw->timer);
  uv_close((uv_handle_t *)&sw->timer, start_closed);
  if (!sw->p) {
    sbx_error err;
    sbx_err(&err, "PROCESS_NOT_FOUND", "the process is gone (its sandbox was reset or destroyed)");
    return mcp_call_fail(call, &err);
  }
  char text[200];
  snprintf(text, sizeof text, "started process %s%s", sw->p->id,
           sw->replaced ? " (in place of the finished process of that name, whose record and logs are gone)" : "");
  mcp_call_ok(call, process_json(sw->p), text);
}

static void start_ended(void *ud, sbx_process *p) {
  struct start_wait *sw = ud;
  sw->w = NULL; /* the process drops its watches itself */
  sw->p = p;
  start_answer(sw);
}

static void start_tick(uv_timer_t *t) {
  struct start_wait *sw = t->data;
  if (sbx_exec_pid_in_sandbox(sw->p->x) > 0 || ++sw->ticks * 2 >= START_WAIT_MS) start_answer(sw);
}

static void start_cancel(void *self) { start_answer(self); }

static void h_start_process(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  sbx_env env = {0};
  if (env_from_json(json_object_get(args, "env"), &env, &err) < 0) {
    sbx_env_clear(&env);
    return mcp_call_fail(call, &err);
  }
  /* a server's log lines reach getProcessLogs and waitForLog as printed,
   * not when Python's block buffer fills (a pipe is not a terminal) */
  if (!sbx_env_get(&env, "PYTHONUNBUFFERED")) sbx_env_set(&env, "PYTHONUNBUFFERED", "1");
  sbx_exec_opts o = {.command = str(args, "command"), .cwd = str(args, "cwd"), .env = &env,
                     .session_id = str(args, "sessionId")};
  const char *id = str(args, "processId");
  sbx_process *p, *old = id ? sbx_process_find(sb->id, id) : NULL;
  bool replaced = old && old->done;
  int r = sbx_process_start(mcp_call_loop(call), sb, id, &o, &p, &err);
  sbx_env_clear(&env);
  if (r < 0) return mcp_call_fail(call, &err);
  struct start_wait *sw = calloc(1, sizeof *sw);
  if (!sw) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  *sw = (struct start_wait){.head.cancel = start_cancel, .call = call, .p = p, .replaced = replaced};
  uv_timer_init(mcp_call_loop(call), &sw->timer);
  sw->timer.data = sw;
  call->wait = sw;
  if (p->done || !(sw->w = sbx_process_watch_add(p, NULL, start_ended, sw))) return start_answer(sw);
  uv_timer_start(&sw->timer, start_tick, 0, 2);
}

static void h_list_processes(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  (void)args;
  json_t *arr = json_array();
  sbx_buf t = {0};
  for (sbx_process *p = sbx_process_list(); p; p = p->next) {
    if (p->orphaned || strcmp(p->sandbox, sb->id)) continue;
    json_array_append_new(arr, process_json(p));
    char line[256];
    int n = snprintf(line, sizeof line, "%s\t%s\t%.150s\n", p->id, p->status, p->command);
    sbx_buf_append(&t, line, n);
  }
  mcp_call_ok(call, json_pack("{s:o}", "processes", arr), t.data ? t.data : "no processes");
  sbx_buf_free(&t);
}

static void h_get_process(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_process *p = find_process(call, args, sb);
  if (!p) return;
  char text[128];
  snprintf(text, sizeof text, "%s: %s%s", p->id, p->status, p->lost ? " (it ran when the sbx daemon stopped)" : "");
  mcp_call_ok(call, process_json(p), text);
}

static void h_process_logs(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_process *p = find_process(call, args, sb);
  if (!p) return;
  size_t tail = json_integer_value(json_object_get(args, "tail")), ol = 0, el = 0;
  char *out = sbx_process_logs(p, 1, tail, &ol), *err = sbx_process_logs(p, 2, tail, &el);
  json_t *o = json_pack("{s:s, s:s%, s:s%, s:s}", "processId", p->id, "stdout", out ? out : "", ol, "stderr",
                        err ? err : "", el, "status", p->status);
  if (p->output_path[0]) json_object_set_new(o, "outputPath", json_string(p->output_path));
  sbx_buf t = {0};
  sbx_buf_append(&t, out ? out : "", ol);
  if (el) {
    sbx_buf_append(&t, "[stderr]\n", 9);
    sbx_buf_append(&t, err, el);
  }
  mcp_call_ok(call, o, t.data ? t.data : "(no output yet)");
  sbx_buf_free(&t);
  free(out);
  free(err);
}

static int signal_number(const char *name) {
  static const struct {
    const char *name;
    int sig;
  } t[] = {{"SIGTERM", SIGTERM}, {"SIGKILL", SIGKILL}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
           {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  for (size_t i = 0; name && i < SBX_ARRAY_SIZE(t); i++)
    if (!strcmp(name, t[i].name)) return t[i].sig;
  return SIGTERM;
}

/* ---- waiting on processes ------------------------------------------------------ */

#define MAX_LOG_LINE (64 * 1024) /* a longer line is matched on its first 64 KiB */
#define MAX_PROMPT 1024           /* a line not ended yet is matched as it grows up to this long */

struct proc_wait {
  wait_head head;
  mcp_call *call;
  sbx_process *p;
  sbx_process_watch *w;
  uv_timer_t timer;
  mcp_matcher *m; /* compiles and matches the pattern, off the loop (matcher.h) */
  char ended_status[16]; /* how the process ended, for when the matcher answers (its record may be gone) */
  int ended_code;
  bool has_re, stream_all, finished, kill;
  sbx_buf line[2];
  char id[64];
};

static void wait_closed(uv_handle_t *h) {
  struct proc_wait *pw = h->data;
  mcp_matcher_free(pw->m);
  sbx_buf_free(&pw->line[0]);
  sbx_buf_free(&pw->line[1]);
  free(pw);
}

/* Answers once: the watch and the timer go. */
static void wait_finish(struct proc_wait *pw, json_t *ok, const char *text, const sbx_error *err) {
  if (pw->finished) return json_decref(ok);
  pw->finished = true;
  pw->call->wait = NULL;
  mcp_matcher_free(pw->m);
  pw->m = NULL;
  if (pw->w && pw->p) sbx_process_unwatch(pw->p, pw->w);
  pw->w = NULL;
  if (err) mcp_call_fail(pw->call, err);
  else mcp_call_ok(pw->call, ok, text);
  uv_timer_stop(&pw->timer);
  uv_close((uv_handle_t *)&pw->timer, wait_closed);
}

static void proc_wait_cancel(void *self) {
  sbx_error err;
  sbx_err(&err, "INTERNAL", "cancelled");
  wait_finish(self, NULL, NULL, &err);
}

/* The matcher's answer: a line matched, none did by the process's end, or
 * matching failed. */
static void matched(void *ud, int stream, const char *line, size_t len, const sbx_error *err) {
  struct proc_wait *pw = ud;
  if (err) return wait_finish(pw, NULL, NULL, err);
  if (!line) {
    sbx_error e;
    sbx_err(&e, "PROCESS_EXITED", "process '%s' ended (%s, exit code %d) without printing a matching line", pw->id,
            pw->ended_status, pw->ended_code);
    return wait_finish(pw, NULL, NULL, &e);
  }
  char text[300];
  snprintf(text, sizeof text, "%.280s", line);
  wait_finish(pw, json_pack("{s:s, s:s%, s:s}", "processId", pw->id, "line", line, strnlen(line, len), "stream",
                            stream == 2 ? "stderr" : "stdout"),
              text, NULL);
}

/* Feeds output through the line buffers to the matcher. A line not ended
 * yet (a prompt waiting for input) is matched as it is, while short. */
static void wait_feed(struct proc_wait *pw, int stream, const char *data, size_t len) {
  sbx_buf *b = &pw->line[stream == 2];
  while (len && pw->m) {
    const char *nl = memchr(data, '\n', len);
    size_t take = nl ? (size_t)(nl - data) : len;
    if (b->len < MAX_LOG_LINE) sbx_buf_append(b, data, b->len + take > MAX_LOG_LINE ? MAX_LOG_LINE - b->len : take);
    if (!nl) {
      if (b->len && take && b->len <= MAX_PROMPT) mcp_matcher_feed(pw->m, stream, b->data, b->len);
      break;
    }
    mcp_matcher_feed(pw->m, stream, b->data ? b->data : "", b->len);
    b->len = 0;
    len -= take + 1;
    data = nl + 1;
  }
  if (pw->m) mcp_matcher_flush(pw->m);
}

static void wait_chunk(void *ud, int stream, const char *data, size_t len) {
  struct proc_wait *pw = ud;
  if (pw->finished) return;
  if (pw->stream_all) return mcp_call_progress(pw->call, stream == 2 ? "stderr" : "stdout", data, len);
  if (pw->m) wait_feed(pw, stream, data, len);
}

static json_t *exit_json(sbx_process *p) {
  return json_pack("{s:s, s:i, s:s}", "processId", p->id, "exitCode", p->exit_code, "status", p->status);
}

static void wait_end(void *ud, sbx_process *p) {
  struct proc_wait *pw = ud;
  pw->w = NULL; /* the process drops its watches itself */
  pw->p = p;
  if (pw->finished) return;
  sbx_error err;
  if (!p) {
    sbx_err(&err, "PROCESS_NOT_FOUND", "process '%s' is gone (its sandbox was reset or destroyed)", pw->id);
    return wait_finish(pw, NULL, NULL, &err);
  }
  if (pw->m) { /* a last line without a newline; the answer comes once every line is matched */
    snprintf(pw->ended_status, sizeof pw->ended_status, "%s", p->status);
    pw->ended_code = p->exit_code;
    for (int i = 0; i < 2; i++)
      if (pw->line[i].len > MAX_PROMPT) mcp_matcher_feed(pw->m, i + 1, pw->line[i].data, pw->line[i].len);
    return mcp_matcher_end(pw->m);
  }
  char text[128];
  snprintf(text, sizeof text, "%s %s (exit code %d)", p->id, p->status, p->exit_code);
  json_t *res = exit_json(p);
  if (pw->kill) json_object_set_new(res, "killed", json_true());
  wait_finish(pw, res, text, NULL);
}

static void wait_timeout(uv_timer_t *t) {
  struct proc_wait *pw = t->data;
  sbx_error err;
  if (pw->m && !mcp_matcher_compiled(pw->m))
    sbx_err(&err, "COMMAND_TIMEOUT", "the pattern was still being compiled when the timeout came: it is too complex "
            "(a simpler one)");
  else
    sbx_err(&err, "COMMAND_TIMEOUT", "process '%s' %s within the timeout", pw->id,
            pw->has_re ? "printed no matching line" : "did not end");
  wait_finish(pw, NULL, NULL, &err);
}

/* A wait of call on p, its timer ready; NULL (the call answered) when
 * memory ran out. */
static struct proc_wait *proc_wait_new(mcp_call *call, sbx_process *p) {
  struct proc_wait *pw = calloc(1, sizeof *pw);
  if (!pw) {
    mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
    return NULL;
  }
  pw->head.cancel = proc_wait_cancel;
  pw->call = call;
  pw->p = p;
  snprintf(pw->id, sizeof pw->id, "%s", p->id);
  uv_timer_init(mcp_call_loop(call), &pw->timer);
  pw->timer.data = pw;
  return pw;
}

/* kind: 'l' waitForLog, 'x' waitForExit, 's' streamProcessLogs */
static void process_wait(mcp_call *call, json_t *args, sbx_sandbox *sb, char kind) {
  sbx_process *p = find_process(call, args, sb);
  struct proc_wait *pw = p ? proc_wait_new(call, p) : NULL;
  if (!pw) return;
  pw->stream_all = kind == 's';
  if (kind == 'l') {
    const char *pat = str(args, "pattern"), *why = NULL;
    int bounds = 0;
    if (strlen(pat) > 256) why = "is longer than 256 characters";
    for (const char *q = pat; !why && *q; q++) {
      if (*q == '\\' && q[1] >= '1' && q[1] <= '9') why = "uses a back-reference";
      else if (*q == '\\' && q[1]) q++;
      else if (*q == '{') { /* counted repetition: small and few, or regcomp's automaton explodes */
        long m = strtol(q + 1, NULL, 10);
        const char *comma = strchr(q, ','), *close = strchr(q, '}');
        long n = comma && close && comma < close && comma[1] != '}' ? strtol(comma + 1, NULL, 10) : m;
        if (m > 32 || n > 32 || ++bounds > 3) why = "has counted repetitions above {32} or more than three of them";
      }
    }
    if (why) {
      sbx_error err;
      sbx_err(&err, "VALIDATION_FAILED", "pattern %s (kept simple so that matching stays cheap)", why);
      return wait_finish(pw, NULL, NULL, &err);
    }
    /* compiled by the matcher, not here: regcomp too can take minutes */
    pw->has_re = true;
    sbx_error err = {0};
    if (!(pw->m = mcp_matcher_start(mcp_call_loop(call), sb, pat, matched, pw, &err)))
      return wait_finish(pw, NULL, NULL, &err);
  }
  /* what is there already: the logs so far (the last 1 MiB of each stream) */
  for (int stream = 1; stream <= 2 && kind != 'x'; stream++) {
    size_t n = 0;
    char *old = sbx_process_logs(p, stream, 0, &n);
    if (old && kind == 's' && n) mcp_call_progress(call, stream == 2 ? "stderr" : "stdout", old, n);
    if (old && kind == 'l') wait_feed(pw, stream, old, n);
    free(old);
  }
  /* a cancel or a client gone ends the wait, an ended process's too (its
   * matcher may still be at the lines it left) */
  call->wait = pw;
  int64_t timeout = json_integer_value(json_object_get(args, "timeout"));
  if (timeout > 0) uv_timer_start(&pw->timer, wait_timeout, (uint64_t)timeout, 0);
  if (p->done) return wait_end(pw, p);
  pw->w = sbx_process_watch_add(p, wait_chunk, wait_end, pw);
  if (!pw->w) return wait_finish(pw, NULL, NULL, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
}

/* killProcess with a signal that asks a process to stop answers once it
 * has (its final status), or after KILL_WAIT_MS with it still running (a
 * process may catch SIGTERM): a getProcess after it never says "running"
 * of a process that was on its way out. */
#define KILL_WAIT_MS 5000

static void kill_timeout(uv_timer_t *t) {
  struct proc_wait *pw = t->data;
  char text[160];
  snprintf(text, sizeof text, "%s signalled; still running after %d s (SIGKILL ends it)", pw->id, KILL_WAIT_MS / 1000);
  wait_finish(pw, json_pack("{s:s, s:b, s:s}", "processId", pw->id, "killed", 1, "status", "running"), text, NULL);
}

static void h_kill_process(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_process *p = find_process(call, args, sb);
  if (!p) return;
  int sig = signal_number(str(args, "signal"));
  if (!sbx_process_kill(p, sig)) {
    char text[160];
    snprintf(text, sizeof text, "%s had already ended (%s, exit code %d)", p->id, p->status, p->exit_code);
    return mcp_call_ok(call, json_pack("{s:s, s:b, s:s, s:i}", "processId", p->id, "killed", 0, "status", p->status,
                                       "exitCode", p->exit_code), text);
  }
  if (!sbx_signal_stops(sig)) /* one it may well handle (SIGHUP, SIGUSR1...): not waited for */
    return mcp_call_ok(call, json_pack("{s:s, s:b, s:s}", "processId", p->id, "killed", 1, "status", p->status), "signalled");
  struct proc_wait *pw = proc_wait_new(call, p);
  if (!pw) return;
  pw->kill = true;
  pw->w = sbx_process_watch_add(p, NULL, wait_end, pw);
  if (!pw->w) return wait_finish(pw, NULL, NULL, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  uv_timer_start(&pw->timer, kill_timeout, KILL_WAIT_MS, 0);
  call->wait = pw;
}

/* killAllProcesses waits the same way, for all of them at once. */
struct kill_all {
  wait_head head;
  mcp_call *call;
  uv_timer_t timer;
  int signalled, waiting;
  struct kill_one {
    struct kill_all *ka;
    sbx_process *p;
    sbx_process_watch *w;
  } one[SBX_MAX_PROCESSES];
};

static void kill_all_closed(uv_handle_t *h) { free(h->data); }

static void kill_all_finish(struct kill_all *ka) {
  ka->call->wait = NULL;
  for (int i = 0; i < ka->signalled; i++)
    if (ka->one[i].w) sbx_process_unwatch(ka->one[i].p, ka->one[i].w);
  char text[96];
  snprintf(text, sizeof text, "signalled %d processes%s", ka->signalled,
           ka->waiting ? "; some still run after 5 s (SIGKILL ends them)" : "");
  mcp_call_ok(ka->call, json_pack("{s:i, s:i}", "count", ka->signalled, "running", ka->waiting), text);
  uv_timer_stop(&ka->timer);
  uv_close((uv_handle_t *)&ka->timer, kill_all_closed);
}

static void kill_all_end(void *ud, sbx_process *p) {
  struct kill_one *o = ud;
  (void)p;
  o->w = NULL; /* the process drops its watches itself */
  if (--o->ka->waiting == 0) kill_all_finish(o->ka);
}

static void kill_all_timeout(uv_timer_t *t) { kill_all_finish(t->data); }
static void kill_all_cancel(void *self) { kill_all_finish(self); }

static void h_kill_all(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  int sig = signal_number(str(args, "signal"));
  struct kill_all *ka = calloc(1, sizeof *ka);
  if (!ka) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  ka->head.cancel = kill_all_cancel;
  ka->call = call;
  uv_timer_init(mcp_call_loop(call), &ka->timer);
  ka->timer.data = ka;
  for (sbx_process *p = sbx_process_list(); p && ka->signalled < SBX_MAX_PROCESSES; p = p->next) {
    if (p->orphaned || strcmp(p->sandbox, sb->id) || !sbx_process_kill(p, sig)) continue;
    struct kill_one *o = &ka->one[ka->signalled++];
    *o = (struct kill_one){ka, p, NULL};
    if (sbx_signal_stops(sig) && (o->w = sbx_process_watch_add(p, NULL, kill_all_end, o))) ka->waiting++;
  }
  if (!ka->waiting) return kill_all_finish(ka);
  uv_timer_start(&ka->timer, kill_all_timeout, KILL_WAIT_MS, 0);
  call->wait = ka;
}

static void h_wait_log(mcp_call *call, json_t *args, sbx_sandbox *sb) { process_wait(call, args, sb, 'l'); }
static void h_wait_exit(mcp_call *call, json_t *args, sbx_sandbox *sb) { process_wait(call, args, sb, 'x'); }
static void h_stream_logs(mcp_call *call, json_t *args, sbx_sandbox *sb) { process_wait(call, args, sb, 's'); }

void mcp_wait_cancel(void *wait) { ((wait_head *)wait)->cancel(wait); }

/* ---- gitCheckout --------------------------------------------------------------- */

/* git runs inside the sandbox; the URL, branch and directory reach it as
 * variables, never as shell text. Exit 3: the target is in the way. */
/* With force over a non-empty target, the clone goes to a hidden sibling
 * first and replaces the target only once it succeeded: a failed clone (a
 * wrong URL or branch, a timeout) leaves the target as it was. A sibling
 * left by a clone killed on its timeout is removed by the next try. A
 * target (or sibling) that is a mount point or holds one (a bucket mount,
 * /etc, /usr) is not replaced (exit 6, the mount point printed): rm -rf
 * would delete what is mounted there, a bucket's files among them, and
 * then fail on the mount point itself. The target is compared with its
 * symlinks resolved, written as mountinfo writes space, tab and backslash
 * (octal escapes; a newline is refused before). Without awk or realpath to
 * check with, force is refused (exit 7). */
static const char git_script[] =
    "command -v git >/dev/null || exit 127\n"
    /* a session's tracing would print the Authorization header */
    "unset GIT_TRACE GIT_TRACE_CURL GIT_TRACE_PACKET GIT_TRACE_SETUP GIT_TRACE_PERFORMANCE GIT_TRACE_PACK_ACCESS "
    "GIT_TRACE_SHALLOW GIT_TRACE2 GIT_TRACE2_EVENT GIT_TRACE2_PERF GIT_CURL_VERBOSE\n"
    "export GIT_TRACE_REDACT=1\n"
    "to=\"$SBX_GIT_DIR\"\n"
    "if [ -e \"$SBX_GIT_DIR\" ] && [ -n \"$(ls -A \"$SBX_GIT_DIR\" 2>/dev/null)\" ]; then\n"
    "  [ \"$SBX_GIT_FORCE\" = 1 ] || exit 3\n"
    "  to=\"$(dirname -- \"$SBX_GIT_DIR\")/.$(basename -- \"$SBX_GIT_DIR\").sbx-clone\"\n"
    "  command -v awk >/dev/null && command -v realpath >/dev/null || exit 7\n"
    "  for d in \"$SBX_GIT_DIR\" \"$to\"; do\n"
    "    m=$(T=$(realpath -m -- \"$d\" | sed 's/\\\\/\\\\134/g; s/ /\\\\040/g; s/\\t/\\\\011/g') awk "
    "'BEGIN { t = ENVIRON[\"T\"] } !m && ($5 == t || index($5, t \"/\") == 1) { m = $5 } END { if (m) print m; exit !m }' "
    "/proc/self/mountinfo) && { printf '%b\\n' \"$m\"; exit 6; }\n"
    "  done\n"
    "  rm -rf -- \"$to\"\n"
    "fi\n"
    "git clone --progress ${SBX_GIT_BRANCH:+--branch \"$SBX_GIT_BRANCH\"} ${SBX_GIT_DEPTH:+--depth \"$SBX_GIT_DEPTH\"} "
    "-- \"$SBX_GIT_URL\" \"$to\" || { [ \"$to\" = \"$SBX_GIT_DIR\" ] || rm -rf -- \"$to\"; exit 4; }\n"
    "if [ \"$to\" != \"$SBX_GIT_DIR\" ]; then rm -rf -- \"$SBX_GIT_DIR\" && mv -- \"$to\" \"$SBX_GIT_DIR\" || exit 5; fi\n"
    "cd \"$SBX_GIT_DIR\" && git rev-parse HEAD && git rev-parse --abbrev-ref HEAD\n";

#define GIT_SECRETS 4

struct git_call {
  mcp_call *call;
  char *shown; /* with any password replaced */
  /* what to hide wherever it shows: the password (or a token as the user
   * name), as written and percent-decoded, the Authorization header's
   * base64 of it, a query string */
  char *secret[GIT_SECRETS];
  char dir[4096];
};

static void add_secret(struct git_call *g, const char *s, size_t len) {
  if (len < 3) return; /* "***" for "x" would hide every x */
  for (int i = 0; i < GIT_SECRETS; i++)
    if (!g->secret[i]) {
      g->secret[i] = strndup(s, len);
      return;
    }
}

/* Text with the URL's credentials replaced by "***" (malloc'd): at each
 * place, the longest secret that is there. */
static char *redact(const struct git_call *g, const char *text, size_t len, size_t *out_len) {
  sbx_buf b = {0};
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *first = NULL;
    size_t flen = 0;
    for (int i = 0; i < GIT_SECRETS; i++) {
      size_t sl = g->secret[i] ? strlen(g->secret[i]) : 0;
      const char *hit = sl ? memmem(p, (size_t)(end - p), g->secret[i], sl) : NULL;
      if (hit && (!first || hit < first || (hit == first && sl > flen))) first = hit, flen = sl;
    }
    if (!first) break;
    sbx_buf_append(&b, p, (size_t)(first - p));
    sbx_buf_append(&b, "***", 3);
    p = first + flen;
  }
  sbx_buf_append(&b, p, (size_t)(end - p));
  sbx_buf_append(&b, "", 1);
  if (out_len) *out_len = b.len - 1;
  return b.data;
}

static void git_free(struct git_call *g) {
  free(g->shown);
  for (int i = 0; i < GIT_SECRETS; i++) {
    if (g->secret[i]) explicit_bzero(g->secret[i], strlen(g->secret[i]));
    free(g->secret[i]);
  }
  free(g);
}

static void git_chunk(void *ud, int stream, const char *data, size_t len) {
  struct git_call *g = ud;
  size_t n;
  char *t = redact(g, data, len, &n);
  mcp_call_progress(g->call, stream == 1 ? "stdout" : "stderr", t, n);
  free(t);
}

static void git_done(void *ud, const sbx_exec_result *r, const sbx_error *err) {
  struct git_call *g = ud;
  mcp_call *call = g->call;
  call->exec = NULL;
  sbx_error e = {0};
  if (err) {
    e = *err;
  } else if (r->timed_out) {
    sbx_err(&e, "COMMAND_TIMEOUT", "git clone did not finish within the timeout");
  } else if (r->exit_code == 3) {
    sbx_err(&e, "FILE_EXISTS", "%s exists and is not empty (force: true replaces it)", g->dir);
  } else if (r->exit_code == 6) {
    const char *nl = r->out_len ? memchr(r->out, '\n', r->out_len) : NULL;
    sbx_err(&e, "VALIDATION_FAILED",
            "%s holds a mount point (%.*s): force: true would delete what is mounted there; clone into a "
            "directory of its own",
            g->dir, nl ? (int)(nl - r->out) : 0, nl ? r->out : "");
  } else if (r->exit_code == 7) {
    sbx_err(&e, "VALIDATION_FAILED",
            "force: true needs awk and realpath in the sandbox, to see that %s holds no mount point first", g->dir);
  } else if (r->exit_code == 127) {
    sbx_err(&e, "GIT_CLONE_FAILED", "git is not installed in the sandbox");
  } else if (r->exit_code != 0) {
    /* git's own words: from its last "fatal:" (else its last line), credentials hidden;
     * exit 5: the clone worked and replacing the target failed */
    size_t n;
    char *t = redact(g, r->err, r->err_len, &n);
    for (size_t k = 0; k < n; k++)
      if (t[k] == '\r') t[k] = '\n';
    while (n && t[n - 1] == '\n') t[--n] = 0;
    char *last = NULL;
    for (char *f = strstr(t, "fatal:"); f; f = strstr(f + 1, "fatal:")) last = f;
    if (!last) {
      last = strrchr(t, '\n');
      last = last ? last + 1 : t;
    }
    const char *hint = no_network_hint(call, r);
    /* a server on the host's loopback, as the agent sees it: not the sandbox's */
    static const char *const loops[] = {"://127.", "://localhost", "://[::1]", "@127.", "@localhost", "@[::1]"};
    for (size_t i = 0; !hint && i < SBX_ARRAY_SIZE(loops); i++)
      if (strstr(g->shown, loops[i]) && (strstr(t, "refused") || strstr(t, "unable to connect") ||
                                         strstr(t, "Failed to connect") || strstr(t, "Couldn't connect")))
        hint = "the sandbox's 127.0.0.1 and localhost are its own loopback, not the host's: nothing in the sandbox "
               "answered there (is the server you started in it still running?), and a server on the host is out of "
               "its reach (copy a repository in with sbx cp, or serve it from inside the sandbox)";
    if (r->exit_code == 5) /* rm's or mv's words */
      sbx_err(&e, "GIT_CLONE_FAILED", "the clone worked, but it could not replace %s: %s", g->dir,
              *last ? last : "(no message)");
    else
      sbx_err(&e, "GIT_CLONE_FAILED", "git clone %s failed: %s%s%s", g->shown, *last ? last : "(no message)",
              hint ? "; " : "", hint ? hint : "");
    free(t);
  }
  if (e.code) {
    git_free(g);
    return mcp_call_fail(call, &e);
  }
  char *nl = memchr(r->out, '\n', r->out_len);
  char commit[64] = "", branch[256] = "";
  if (nl) {
    snprintf(commit, sizeof commit, "%.*s", (int)(nl - r->out), r->out);
    snprintf(branch, sizeof branch, "%.*s", (int)strcspn(nl + 1, "\n"), nl + 1);
  }
  char text[4400];
  snprintf(text, sizeof text, "cloned %s (%s at %.12s) into %s", g->shown, branch, commit, g->dir);
  mcp_call_ok(call, json_pack("{s:s, s:s, s:s, s:s}", "repoUrl", g->shown, "branch", branch, "targetDir", g->dir, "commit",
                              commit),
              text);
  git_free(g);
}

/* http(s)://, git://, ssh:// URLs and scp-like user@host:path; nothing
 * git would read as an option, a local path or a transport helper. 1: it
 * is one; 0: it is not; -1: its password has a '/', '?', '#' or '@' that
 * is not percent-encoded (where the host starts is ambiguous). */
static int git_url_ok(const char *u, const char **userinfo, size_t *ui_len) {
  *userinfo = NULL;
  *ui_len = 0;
  for (const char *p = u; *p; p++)
    if ((unsigned char)*p <= ' ' || *p == 0x7f) return 0;
  const char *helper = strstr(u, "::"); /* <transport>::<address>: a remote helper (not an IPv6 [::1]) */
  if (helper && !memchr(u, '/', (size_t)(helper - u)) && !memchr(u, '[', (size_t)(helper - u))) return 0;
  const char *schemes[] = {"https://", "http://", "git://", "ssh://"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(schemes); i++) {
    size_t l = strlen(schemes[i]);
    if (strncasecmp(u, schemes[i], l)) continue;
    const char *host = u + l;
    size_t hl = strcspn(host, "/?#");
    if (!hl) return 0;
    const char *end = host + hl, *at = NULL;
    for (const char *p = host; p < end; p++)
      if (*p == '@') at = p;
    /* "user:pa/ss@host": no '@' before the first '/', a colon with more
     * than a port after it, and an '@' further on */
    const char *colon = *host == '[' ? NULL : memchr(host, ':', hl); /* (an IPv6 literal has colons) */
    if (!at && colon && strspn(colon + 1, "0123456789") != (size_t)(end - colon - 1) && strchr(end, '@')) return -1;
    if (at) {
      *userinfo = host;
      *ui_len = at - host;
      host = at + 1;
    }
    return host < end && *host != '-';
  }
  if (strstr(u, "://")) return 0; /* another scheme */
  /* scp-like: [user@]host:path, host without '/' before the ':' */
  const char *at = NULL, *colon;
  for (const char *p = u; *p && *p != '/'; p++)
    if (*p == '@') at = p;
  colon = strchr(at ? at : u, ':');
  if (at && memchr(u, ':', (size_t)(at - u))) { /* user:password@host:path */
    *userinfo = u;
    *ui_len = (size_t)(at - u);
  }
  return colon && colon > u && u[0] != '-' && (!at || at[1] != '-') && !memchr(u, '/', (size_t)(colon - u)) && colon[1] &&
         strncasecmp(u, "ext:", 4) && strncasecmp(u, "file:", 5) && strncasecmp(u, "fd:", 3);
}

static void h_git_checkout(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  const char *url = str(args, "repoUrl"), *branch = str(args, "branch"), *target = str(args, "targetDir");
  const char *ui;
  size_t ui_len;
  int ok = git_url_ok(url, &ui, &ui_len);
  if (ok < 0)
    return mcp_call_fail(call, &(sbx_error){.code = "INVALID_GIT_URL",
                                            .message = "repoUrl's password has a '/', '?', '#' or '@': write it "
                                                       "percent-encoded (%2F, %3F, %23, %40)"});
  if (!ok)
    return mcp_call_fail(call, &(sbx_error){.code = "INVALID_GIT_URL",
                                            .message = "repoUrl must be an https://, http://, git:// or ssh:// URL "
                                                       "(or user@host:path); a repository already in the sandbox is "
                                                       "cloned with exec: git clone /its/path (one on the host "
                                                       "gets there with `sbx cp /its/path SANDBOX:dir`)"});
  if (ui && !strncasecmp(url, "git://", 6)) /* git would take user:password@host for a host name */
    return mcp_call_fail(call, &(sbx_error){.code = "INVALID_GIT_URL",
                                            .message = "git:// URLs carry no credentials: use https:// or ssh:// "
                                                       "for a repository that needs them"});
  if (branch && (branch[0] == '-' || strpbrk(branch, " \t\n\\:~^?*[") || strstr(branch, "..")))
    return mcp_call_fail(call, &(sbx_error){.code = "VALIDATION_FAILED", .message = "branch is not a valid git ref name"});
  struct git_call *g = calloc(1, sizeof *g);
  if (!g) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  g->call = call;
  const char *colon = ui ? memchr(ui, ':', ui_len) : NULL;
  if (ui && colon) { /* user:password@: the password is the secret (the whole userinfo when it has none) */
    add_secret(g, colon + 1, ui_len - (size_t)(colon + 1 - ui));
  } else if (ui && strncasecmp(url, "ssh://", 6)) {
    add_secret(g, ui, ui_len); /* a token as the user name */
  }
  const char *query = strchr(url, '?');
  if (query && strchr(query, '=')) add_secret(g, query + 1, strcspn(query + 1, "#")); /* ?access_token=... */
  if (ui && colon) { /* the password in the URL by its place, however short */
    char *masked = sbx_strdup_printf("%.*s***%s", (int)(colon + 1 - url), url, ui + ui_len);
    g->shown = redact(g, masked, strlen(masked), NULL);
    free(masked);
  } else {
    g->shown = redact(g, url, strlen(url), NULL);
  }
  /* the target: targetDir, else /workspace/<repo name> */
  char name[256];
  const char *tail = url + strlen(url);
  while (tail > url && tail[-1] == '/') tail--;
  const char *start = tail;
  while (start > url && start[-1] != '/' && start[-1] != ':') start--;
  size_t nl = tail - start;
  if (nl > 4 && !strncmp(tail - 4, ".git", 4)) nl -= 4;
  snprintf(name, sizeof name, "%.*s", (int)nl, start);
  if (!target && (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))) snprintf(name, sizeof name, "repo");
  char rel[4400];
  snprintf(rel, sizeof rel, "%s", target ? target : name);
  if (sbx_fs_abspath(rel, g->dir, &err) < 0) {
    git_free(g);
    return mcp_call_fail(call, &err);
  }
  if (strchr(g->dir, '\n')) { /* (the mount check compares lines) */
    git_free(g);
    return mcp_call_fail(call, &(sbx_error){.code = "VALIDATION_FAILED", .message = "targetDir may not hold a newline"});
  }
  char depth[32] = "";
  json_int_t d = json_integer_value(json_object_get(args, "depth"));
  if (d > 0) snprintf(depth, sizeof depth, "%lld", (long long)d);
  sbx_env env = {0};
  char *clone_url = strdup(url);
  if (ui && !strncasecmp(url, "http", 4) && clone_url) {
    /* http(s) credentials go to git as an Authorization header in its
     * environment: not in any argv (ps shows those) and not saved in the
     * clone's .git/config, whose origin is the URL without them */
    char *userinfo = strndup(ui, ui_len), *dec = malloc(ui_len + 2);
    size_t k = 0;
    for (size_t i = 0; userinfo && dec && i < ui_len; i++) { /* percent-decoding */
      if (userinfo[i] == '%' && isxdigit((unsigned char)userinfo[i + 1]) && isxdigit((unsigned char)userinfo[i + 2])) {
        char hex[3] = {userinfo[i + 1], userinfo[i + 2], 0};
        dec[k++] = (char)strtol(hex, NULL, 16);
        i += 2;
      } else {
        dec[k++] = userinfo[i];
      }
    }
    if (dec && !memchr(dec, ':', k)) dec[k++] = ':'; /* a token as the user name */
    const char *dcolon = dec ? memchr(dec, ':', k) : NULL;
    if (dcolon) add_secret(g, dcolon + 1, k - (size_t)(dcolon + 1 - dec)); /* decoded, as git may echo it */
    size_t b64len = 0;
    char *b64 = dec ? sbx_base64_encode(dec, k, &b64len) : NULL;
    if (b64) add_secret(g, b64, b64len);
    char *header = b64 ? sbx_strdup_printf("Authorization: Basic %s", b64) : NULL;
    if (header) {
      sbx_env_set(&env, "GIT_CONFIG_COUNT", "1");
      sbx_env_set(&env, "GIT_CONFIG_KEY_0", "http.extraHeader");
      sbx_env_set(&env, "GIT_CONFIG_VALUE_0", header);
      size_t at = (size_t)(ui - url);
      memmove(clone_url + at, clone_url + at + ui_len + 1, strlen(clone_url + at + ui_len + 1) + 1);
    }
    if (header) explicit_bzero(header, strlen(header));
    if (dec) explicit_bzero(dec, k);
    if (userinfo) explicit_bzero(userinfo, ui_len);
    free(header);
    free(b64);
    free(dec);
    free(userinfo);
  }
  sbx_env_set(&env, "SBX_GIT_URL", clone_url ? clone_url : url);
  free(clone_url);
  sbx_env_set(&env, "SBX_GIT_DIR", g->dir);
  sbx_env_set(&env, "SBX_GIT_BRANCH", branch ? branch : "");
  sbx_env_set(&env, "SBX_GIT_DEPTH", depth);
  sbx_env_set(&env, "SBX_GIT_FORCE", flag(args, "force") ? "1" : "0");
  sbx_env_set(&env, "GIT_TERMINAL_PROMPT", "0"); /* a private repo fails instead of waiting for a password */
  sbx_exec_opts o = {.command = git_script, .env = &env, .session_id = str(args, "sessionId"),
                     .timeout_ms = json_integer_value(json_object_get(args, "timeout")), .max_output = 65536};
  int r = sbx_exec_start(mcp_call_loop(call), sb, &o, git_chunk, git_done, g, &call->exec, &err);
  sbx_env_clear(&env);
  if (r < 0) {
    git_free(g);
    mcp_call_fail(call, &err);
  }
}

/* ---- preview URLs ------------------------------------------------------------ */

static json_t *exposure_json(sbx_sandbox *sb, const sbx_exposure *e) {
  char url[300];
  sbx_preview_url(sb, e, url, sizeof url);
  return json_pack("{s:s, s:i, s:s}", "url", url, "port", e->port, "name", e->name);
}

static void h_expose(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  const char *problem = sbx_preview_problem();
  if (problem) {
    sbx_err(&err, "INTERNAL", "%s", problem);
    return mcp_call_fail(call, &err);
  }
  const sbx_exposure *e;
  if (sbx_preview_expose(sb, (int)json_integer_value(json_object_get(args, "port")), str(args, "name"), &e, &err) < 0)
    return mcp_call_fail(call, &err);
  json_t *o = exposure_json(sb, e);
  char text[400];
  snprintf(text, sizeof text, "port %d of sandbox %s is at %s (open it in a browser on this machine)", e->port, sb->id,
           json_string_value(json_object_get(o, "url")));
  mcp_call_ok(call, o, text);
}

static void h_unexpose(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  int port = (int)json_integer_value(json_object_get(args, "port"));
  if (sbx_preview_unexpose(sb, port, &err) < 0) return mcp_call_fail(call, &err);
  char text[100];
  snprintf(text, sizeof text, "port %d is no longer exposed (its URL answers 410)", port);
  mcp_call_ok(call, json_pack("{s:i, s:b}", "port", port, "unexposed", 1), text);
}

static void h_exposed(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  (void)args;
  json_t *a = json_array();
  sbx_buf t = {0};
  /* the ports stay exposed (the record keeps them), but their URLs answer
   * nothing of this daemon while its proxy cannot listen: said so */
  const char *problem = sbx_preview_problem();
  if (problem && sb->exposures) {
    sbx_buf_append(&t, "these URLs do not work now: ", 28);
    sbx_buf_append(&t, problem, strlen(problem));
    sbx_buf_append(&t, "\n", 1);
  }
  for (const sbx_exposure *e = sb->exposures; e; e = e->next) {
    json_t *o = exposure_json(sb, e);
    char line[400];
    int n = snprintf(line, sizeof line, "%d\t%s%s%s\n", e->port, json_string_value(json_object_get(o, "url")),
                     e->name[0] ? "\t" : "", e->name);
    sbx_buf_append(&t, line, (size_t)n);
    json_array_append_new(a, o);
  }
  sbx_buf_append(&t, "", 1);
  json_t *res = json_pack("{s:o}", "ports", a);
  if (problem && sb->exposures) json_object_set_new(res, "warning", json_string(problem));
  mcp_call_ok(call, res, t.len > 1 ? t.data : "no exposed ports");
  sbx_buf_free(&t);
}

struct port_wait {
  mcp_call *call;
  int port;
};

static void port_done(void *ud, bool ready, uint64_t waited) {
  struct port_wait *w = ud;
  char text[96];
  snprintf(text, sizeof text, "port %d %s after %llu ms", w->port, ready ? "is ready" : "is not ready",
           (unsigned long long)waited);
  mcp_call_ok(w->call, json_pack("{s:b, s:i, s:I}", "ready", ready, "port", w->port, "waited", (json_int_t)waited), text);
  free(w);
}

static void h_wait_port(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  json_t *t = json_object_get(args, "timeout");
  const char *mode = str(args, "mode");
  struct port_wait *w = calloc(1, sizeof *w);
  w->call = call;
  w->port = (int)json_integer_value(json_object_get(args, "port"));
  if (sbx_port_wait(mcp_call_loop(call), sb, w->port, t ? json_integer_value(t) : 30000, mode && !strcmp(mode, "http"),
                    port_done, w, &err) < 0) {
    free(w);
    mcp_call_fail(call, &err);
  }
}

/* ---- files ------------------------------------------------------------- */

static bool is_base64(json_t *args) {
  const char *e = str(args, "encoding");
  return e && !strcmp(e, "base64");
}

static void h_write(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  json_t *c = json_object_get(args, "content");
  const char *data = json_string_value(c);
  size_t len = json_string_length(c);
  _cleanup_free_ char *decoded = NULL;
  if (is_base64(args)) {
    if (sbx_base64_decode(data, len, &decoded, &len) < 0) {
      sbx_err(&err, "VALIDATION_FAILED", "content is not valid base64");
      return mcp_call_fail(call, &err);
    }
    data = decoded;
  }
  char abs[4096];
  if (sbx_fs_abspath(str(args, "path"), abs, &err) < 0 || sbx_fs_write(sb, abs, data, len, &err) < 0)
    return mcp_call_fail(call, &err);
  char text[4200];
  snprintf(text, sizeof text, "wrote %zu bytes to %s", len, abs);
  mcp_call_ok(call, json_pack("{s:s, s:I}", "path", abs, "size", (json_int_t)len), text);
}

static void h_read(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  char abs[4096];
  _cleanup_free_ char *whole = NULL;
  size_t len;
  json_t *joff = json_object_get(args, "offset"), *jlen = json_object_get(args, "length");
  bool part = joff || jlen, text_part = part && !is_base64(args);
  uint64_t offset = joff ? (uint64_t)json_integer_value(joff) : 0, fsize = 0;
  /* a part of a text file is read with the 3 bytes before it, to tell where its first character starts */
  size_t pre = text_part ? (offset < 3 ? (size_t)offset : 3) : 0;
  if (sbx_fs_abspath(str(args, "path"), abs, &err) < 0 ||
      sbx_fs_read_part(sb, abs, offset - pre, jlen ? (size_t)json_integer_value(jlen) + pre : 0, SBX_MAX_READ, &whole, &len,
                       &fsize, &err) < 0)
    return mcp_call_fail(call, &err);
  if (offset > fsize) offset = fsize;
  pre = len < pre ? len : pre;
  char *data = whole + pre;
  len -= pre;
  size_t lead, keep = text_part ? sbx_utf8_part(data, pre, len, offset + len >= fsize, &lead) : 0;
  if (keep) { /* whole characters at both ends; else the bytes as they are (base64) */
    data += lead, offset += lead, len = keep;
    data[len] = 0;
  }
  bool binary = memchr(data, 0, len) || !sbx_utf8_valid(data, len);
  json_t *o;
  const char *mime = sbx_fs_mime(abs, !binary);
  if (binary || is_base64(args)) {
    _cleanup_free_ char *b = sbx_base64_encode(data, len, NULL);
    o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:b}", "path", abs, "content", b, "encoding", "base64", "size",
                  (json_int_t)len, "mimeType", mime, "isBinary", binary);
    /* what the agent can look at: an image as an image block, any other
     * binary file as an embedded resource (small ones: the content is in
     * structuredContent too, and a message has a size limit) */
    if (len > 8 * 1024 * 1024 || part) {
      /* structuredContent only (a part is not the resource its URI names) */
    } else if (binary && b && !strncmp(mime, "image/", 6) && strcmp(mime, "image/svg+xml")) {
      call->extra_content = json_pack("[{s:s, s:s, s:s}]", "type", "image", "data", b, "mimeType", mime);
    } else if (binary && b) {
      char *uri = sbx_strdup_printf("sbx://%s%s", sb->id, abs);
      call->extra_content = json_pack("[{s:s, s:{s:s, s:s, s:s}}]", "type", "resource", "resource", "uri", uri ? uri : "",
                                      "mimeType", mime, "blob", b);
      free(uri);
    }
  } else {
    o = json_pack("{s:s, s:s%, s:s, s:I, s:s, s:b}", "path", abs, "content", data, len, "encoding", "utf-8", "size",
                  (json_int_t)len, "mimeType", mime, "isBinary", 0);
  }
  if (!o) {
    sbx_err(&err, "INTERNAL", "encoding %s", abs);
    return mcp_call_fail(call, &err);
  }
  if (part) {
    json_object_set_new(o, "offset", json_integer((json_int_t)offset));
    json_object_set_new(o, "fileSize", json_integer((json_int_t)fsize));
  }
  /* the text rendering is the content itself for text files */
  if (!binary && !is_base64(args)) {
    mcp_call_ok(call, o, data);
  } else {
    char text[4200];
    snprintf(text, sizeof text, "%s: %zu bytes of %s, base64 in structuredContent.content", abs, len, mime);
    mcp_call_ok(call, o, text);
  }
}

struct list_ctx {
  json_t *arr;
  sbx_buf text;
  size_t in_text;
};

#define LIST_TEXT_MAX 16384

/* A name as JSON can carry it: bytes that are not UTF-8 become U+FFFD (the
 * entry says so; such a file is reached with exec). */
static json_t *list_string(const char *s, bool *repaired) {
  if (sbx_utf8_valid(s, strlen(s))) return json_string(s);
  *repaired = true;
  return mcp_json_repaired(s);
}

static void list_cb(void *ud, const sbx_fs_entry *e) {
  struct list_ctx *l = ud;
  char when[32], mode[8];
  sbx_iso_time(e->mtime_ms, when);
  snprintf(mode, sizeof mode, "%04o", (unsigned)e->mode);
  bool repaired = false;
  json_t *name = list_string(e->name, &repaired), *path = list_string(e->path, &repaired);
  json_t *o = json_pack("{s:o, s:o, s:s, s:I, s:s, s:s}", "name", name, "path", path, "type", e->type, "size",
                        (json_int_t)e->size, "modifiedAt", when, "mode", mode);
  if (!o) return;
  if (repaired) json_object_set_new(o, "notUtf8", json_true());
  json_array_append_new(l->arr, o);
  if (l->text.len >= LIST_TEXT_MAX) return;
  /* one line per entry: a name with a newline, a control character, a quote
   * or a backslash is written as a JSON string, so no name reads as two */
  const char *p = json_string_value(path);
  bool plain = true;
  for (const unsigned char *c = (const unsigned char *)p; *c && plain; c++)
    plain = *c >= 0x20 && *c != 0x7f && *c != '"' && *c != '\\';
  char *quoted = plain ? NULL : json_dumps(path, JSON_ENCODE_ANY);
  const char *line = quoted ? quoted : p;
  sbx_buf_append(&l->text, line, strlen(line));
  free(quoted);
  if (!strcmp(e->type, "directory")) sbx_buf_append(&l->text, "/", 1);
  sbx_buf_append(&l->text, "\n", 1);
  l->in_text++;
}

static void h_list_files(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  char abs[4096];
  struct list_ctx l = {.arr = json_array()};
  bool truncated = false;
  int n = -1;
  if (sbx_fs_abspath(str(args, "path"), abs, &err) == 0)
    n = sbx_fs_list(sb, abs, flag(args, "recursive"), flag(args, "includeHidden"), list_cb, &l, &truncated, &err);
  if (n < 0) {
    json_decref(l.arr);
    sbx_buf_free(&l.text);
    return mcp_call_fail(call, &err);
  }
  if (!l.text.data) sbx_buf_append(&l.text, "(empty)", 7);
  if (truncated || l.in_text < (size_t)n) {
    char more[240];
    int k = truncated ? snprintf(more, sizeof more, "[%zu entries shown here, %d in structuredContent.files, where the "
                                                   "listing stops: list a subdirectory, or use exec with find for the rest]",
                                 l.in_text, n)
                      : snprintf(more, sizeof more, "[%zu of %d entries shown here; all of them are in "
                                                   "structuredContent.files]", l.in_text, n);
    sbx_buf_append(&l.text, more, (size_t)k);
  }
  json_t *o = json_pack("{s:s, s:o, s:i}", "path", abs, "files", l.arr, "count", n);
  if (truncated) json_object_set_new(o, "truncated", json_true());
  mcp_call_ok(call, o, l.text.data);
  sbx_buf_free(&l.text);
}

static void h_mkdir(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  char abs[4096];
  int made = sbx_fs_abspath(str(args, "path"), abs, &err) < 0 ? -1 : sbx_fs_mkdir(sb, abs, flag(args, "recursive"), &err);
  if (made < 0) return mcp_call_fail(call, &err);
  char text[4200];
  snprintf(text, sizeof text, "%s%s", abs, made ? "" : " (a directory already)");
  mcp_call_ok(call, json_pack("{s:s, s:b}", "path", abs, "created", made), text);
}

static void h_delete(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  char abs[4096];
  if (sbx_fs_abspath(str(args, "path"), abs, &err) < 0 || sbx_fs_delete(sb, abs, flag(args, "recursive"), &err) < 0)
    return mcp_call_fail(call, &err);
  char text[4200];
  snprintf(text, sizeof text, "deleted %s", abs);
  mcp_call_ok(call, json_pack("{s:s, s:b}", "path", abs, "deleted", 1), text);
}

static void do_move(mcp_call *call, json_t *args, sbx_sandbox *sb, const char *kfrom, const char *kto, bool into) {
  sbx_error err = {0};
  char a[4096], b[4096], moved[4096];
  if (sbx_fs_abspath(str(args, kfrom), a, &err) < 0 || sbx_fs_abspath(str(args, kto), b, &err) < 0 ||
      sbx_fs_rename(sb, a, b, into, moved, &err) < 0)
    return mcp_call_fail(call, &err);
  char text[8300]; /* (moved: moveFile into a directory gives the path inside it) */
  snprintf(text, sizeof text, "%s -> %s", a, moved);
  mcp_call_ok(call, json_pack("{s:s, s:s}", kfrom, a, kto, moved), text);
}

static void h_rename(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  do_move(call, args, sb, "oldPath", "newPath", false);
}
static void h_move(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  do_move(call, args, sb, "sourcePath", "destinationPath", true);
}

static void h_exists(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  char abs[4096];
  bool ex = false;
  if (sbx_fs_abspath(str(args, "path"), abs, &err) < 0 || sbx_fs_exists(sb, abs, &ex, &err) < 0)
    return mcp_call_fail(call, &err);
  mcp_call_ok(call, json_pack("{s:s, s:b}", "path", abs, "exists", ex), ex ? "exists" : "does not exist");
}

/* ---- sessions ---------------------------------------------------------- */

/* A session's name, as "id" or as "sessionId" (the other tools' name for
 * it): NULL with err when both are given and differ. */
static const char *session_arg(json_t *args, sbx_error *err) {
  const char *id = str(args, "id"), *sid = str(args, "sessionId");
  if (id && sid && strcmp(id, sid)) {
    sbx_err(err, "VALIDATION_FAILED", "id '%.63s' and sessionId '%.63s' name different sessions: give one", id, sid);
    return NULL;
  }
  return id ? id : sid;
}

static void h_session_create(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  sbx_env env = {0};
  char id[64];
  const char *want = session_arg(args, &err);
  if (err.code) return mcp_call_fail(call, &err);
  if (want) snprintf(id, sizeof id, "%s", want);
  else snprintf(id, sizeof id, "session-%llu", (unsigned long long)(sbx_now_us() % 100000000));
  char cwd[4096] = "/workspace";
  const char *c = str(args, "cwd");
  if ((c && (sbx_fs_abspath(c, cwd, &err) < 0 || sbx_fs_check_dir_nowait(sb, cwd, &err) < 0)) ||
      env_from_json(json_object_get(args, "env"), &env, &err) < 0) {
    sbx_env_clear(&env);
    return mcp_call_fail(call, &err);
  }
  sbx_session *s;
  int r = sbx_session_create(sb, id, cwd, &env, &s, &err);
  sbx_env_clear(&env);
  if (r < 0) return mcp_call_fail(call, &err);
  char text[200];
  snprintf(text, sizeof text, "session %s in %s", s->id, s->cwd);
  mcp_call_ok(call, json_pack("{s:s, s:s}", "id", s->id, "cwd", s->cwd), text);
}

static void h_session_delete(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  const char *id = session_arg(args, &err);
  if (!id && !err.code) sbx_err(&err, "VALIDATION_FAILED", "deleteSession: 'id' (or sessionId) is required");
  if (!id || sbx_session_delete(sb, id, &err) < 0) return mcp_call_fail(call, &err);
  mcp_call_ok(call, json_pack("{s:s, s:b}", "id", id, "deleted", 1),
              !strcmp(id, "default") ? "session deleted; the default session starts again, fresh" : "session deleted");
}

static void h_session_list(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  (void)args;
  json_t *arr = json_array();
  sbx_buf t = {0};
  for (sbx_session *s = sb->sessions; s; s = s->next) {
    json_array_append_new(arr, json_pack("{s:s, s:s}", "id", s->id, "cwd", s->cwd));
    char line[4200];
    int n = snprintf(line, sizeof line, "%s\t%s\n", s->id, s->cwd);
    sbx_buf_append(&t, line, n);
  }
  mcp_call_ok(call, json_pack("{s:o}", "sessions", arr), t.data ? t.data : "");
  sbx_buf_free(&t);
}

static void h_setenv(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  const char *sid = str(args, "sessionId");
  sbx_session *s = sbx_session_find(sb, sid ? sid : "default");
  if (!s) {
    sbx_err(&err, "SESSION_NOT_FOUND", "no session '%s'", sid);
    return mcp_call_fail(call, &err);
  }
  sbx_env env = {0};
  s->gen++; /* its shell is started again with the new environment */
  if (env_from_json(json_object_get(args, "env"), &env, &err) < 0 || sbx_env_copy(&s->env, &env) < 0) {
    sbx_env_clear(&env);
    if (!err.code) sbx_err(&err, "VALIDATION_FAILED", "too many environment variables");
    return mcp_call_fail(call, &err);
  }
  size_t n = env.n;
  sbx_env_clear(&env);
  mcp_call_ok(call, json_pack("{s:I}", "count", (json_int_t)n), "environment updated");
}

/* ---- buckets ------------------------------------------------------------ */

struct bucket_call {
  mcp_call *call;
  char mount_path[1100];
  char bucket[64];
  bool local, read_only, unmount;
};

static void bucket_done(void *ud, const sbx_error *err, const char *detail) {
  struct bucket_call *b = ud;
  if (err) {
    mcp_call_fail(b->call, err);
  } else if (b->unmount) {
    char text[1400];
    snprintf(text, sizeof text, "%s: %s", b->mount_path, detail);
    mcp_call_ok(b->call, json_pack("{s:s, s:b}", "mountPath", b->mount_path, "unmounted", 1), text);
  } else {
    char text[1400];
    snprintf(text, sizeof text, "%s bucket %s %s at %s%s", b->local ? "local" : "S3", b->bucket, detail, b->mount_path,
             b->read_only ? " (read-only)" : "");
    mcp_call_ok(b->call,
                json_pack("{s:s, s:s, s:b, s:b}", "mountPath", b->mount_path, "bucket", b->bucket, "local", b->local,
                          "readOnly", b->read_only),
                text);
  }
  free(b);
}

static void h_mount_bucket(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  json_t *creds = json_object_get(args, "credentials"), *local = json_object_get(args, "localBucket");
  sbx_bucket_req r = {.bucket = str(args, "bucket"), .mount_path = str(args, "mountPath"), .endpoint = str(args, "endpoint"),
                      .region = str(args, "region"), .prefix = str(args, "prefix"), .profile = str(args, "profile"),
                      .access_key = str(creds, "accessKeyId"), .secret_key = str(creds, "secretAccessKey"),
                      .read_only = flag(args, "readOnly"), .local = local ? json_is_true(local) : -1};
  sbx_bucket spec;
  char ak[256], sk[256];
  if (sbx_bucket_prepare(&r, &spec, ak, sk, &err) < 0) return mcp_call_fail(call, &err);
  explicit_bzero(sk, sizeof sk);
  struct bucket_call *b = calloc(1, sizeof *b);
  if (!b) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  b->call = call;
  snprintf(b->mount_path, sizeof b->mount_path, "%s", spec.mount_path);
  snprintf(b->bucket, sizeof b->bucket, "%s", spec.bucket);
  b->local = spec.local;
  b->read_only = spec.read_only;
  if (sbx_bucket_mount(sb, &r, bucket_done, b, &err) < 0) {
    free(b);
    mcp_call_fail(call, &err);
  }
}

static void h_unmount_bucket(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  struct bucket_call *b = calloc(1, sizeof *b);
  if (!b) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  b->call = call;
  b->unmount = true;
  const char *mp = str(args, "mountPath");
  snprintf(b->mount_path, sizeof b->mount_path, "%s%s", mp[0] == '/' ? "" : "/workspace/", mp);
  if (sbx_bucket_unmount(sb, mp, bucket_done, b, &err) < 0) {
    free(b);
    mcp_call_fail(call, &err);
  }
}

/* ---- code contexts ---------------------------------------------------------- */

static void context_ready(void *ud, sbx_code_ctx *c, const sbx_error *err) {
  mcp_call *call = ud;
  if (err) return mcp_call_fail(call, err);
  json_t *o = sbx_code_json(c);
  char text[256];
  snprintf(text, sizeof text, "code context %s (%s %s) in %s", json_string_value(json_object_get(o, "id")),
           json_string_value(json_object_get(o, "language")), json_string_value(json_object_get(o, "version")),
           json_string_value(json_object_get(o, "cwd")));
  mcp_call_ok(call, o, text);
}

static void h_context_create(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  sbx_env env = {0};
  if (env_from_json(json_object_get(args, "env"), &env, &err) < 0) {
    sbx_env_clear(&env);
    return mcp_call_fail(call, &err);
  }
  const char *lang = str(args, "language");
  int r = sbx_code_create(mcp_call_loop(call), sb, lang ? lang : "python", NULL, str(args, "cwd"), &env, context_ready,
                          call, NULL, &err);
  sbx_env_clear(&env);
  if (r < 0) mcp_call_fail(call, &err);
  else sbx_sandbox_save(sb); /* the record knows its contexts: a restart says they ended */
}

static void h_context_list(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  (void)args;
  json_t *o = sbx_code_list(sb);
  size_t n = json_array_size(json_object_get(o, "contexts"));
  char text[64];
  snprintf(text, sizeof text, "%zu code context%s", n, n == 1 ? "" : "s");
  mcp_call_ok(call, o, text);
}

static sbx_code_ctx *find_context(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  const char *id = str(args, "contextId");
  sbx_code_ctx *c = id ? sbx_code_find(sb->id, id) : NULL;
  if (!c) {
    sbx_error err;
    const char *why = id ? sbx_code_gone(sb, id) : NULL;
    if (why)
      sbx_err(&err, "CONTEXT_NOT_FOUND", "code context '%s' is gone with its state (%s): delete it and create another",
              id, why);
    else
      sbx_err(&err, "CONTEXT_NOT_FOUND", "no code context '%s' in sandbox '%s' (listCodeContexts shows them)",
              id ? id : "", sb->id);
    mcp_call_fail(call, &err);
  }
  return c;
}

static void h_context_delete(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  const char *id = str(args, "contextId");
  bool gone = id && sbx_code_take_gone(sb, id); /* ended with an earlier daemon: only its name was left */
  sbx_code_ctx *c = gone ? NULL : find_context(call, args, sb);
  if (!gone && !c) return;
  char text[128];
  snprintf(text, sizeof text, "code context %s deleted", id);
  json_t *o = json_pack("{s:s, s:b}", "contextId", id, "deleted", 1);
  if (c) sbx_code_delete(c);
  sbx_sandbox_save(sb);
  mcp_call_ok(call, o, text);
}

static void code_chunk(void *ud, const char *stream, const char *text, size_t len) {
  mcp_call_progress(ud, stream, text, len);
}

/* A run's text is its start and its end past this (clients count a tool's
 * text against the model's context; the structured result has it all) */
#define CODE_TEXT_MAX (64 * 1024)

/* t as its first and last max/2 bytes, with a line that says what was
 * cut between them (characters cut in two are U+FFFD). */
static void cut_middle(sbx_buf *t, size_t max) {
  if (t->len <= max) return;
  sbx_headtail h;
  sbx_headtail_init(&h, max);
  sbx_headtail_add(&h, t->data, t->len);
  size_t n, len;
  char *raw = sbx_headtail_render(&h, &n), *text = sbx_utf8_repair(raw, n, &len);
  sbx_headtail_free(&h);
  free(raw);
  sbx_buf_free(t);
  *t = (sbx_buf){0};
  sbx_buf_append(t, text, len);
  free(text);
  static const char all[] = "\n[the text is the start and the end: structuredContent has all of the logs and results]";
  sbx_buf_append(t, all, sizeof all - 1);
}

/* Where a result's text says nothing but its type (Python's default repr,
 * "<__main__.T object at 0x7f...>") or is missing, and it has a textual
 * form (_repr_markdown_, _repr_json_, _repr_html_...), that goes in the
 * text, named: a client that shows only text sees what the object shows.
 * True if it did. */
static bool richer_text(sbx_buf *t, json_t *result, json_t *text) {
  const char *s = json_string_value(text);
  size_t n = json_string_length(text);
  if (s && !(n > 2 && s[0] == '<' && s[n - 1] == '>' && memmem(s, n, " object at 0x", 13))) return false;
  static const char *const kinds[] = {"markdown", "json", "html", "latex", "svg"};
  for (size_t k = 0; k < SBX_ARRAY_SIZE(kinds); k++) {
    json_t *r = json_object_get(result, kinds[k]);
    if (!r) continue;
    char *dumped = json_is_string(r) ? NULL : json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY);
    const char *body = dumped ? dumped : json_string_value(r);
    if (!body) continue;
    sbx_buf_append(t, "[", 1);
    sbx_buf_append(t, kinds[k], strlen(kinds[k]));
    sbx_buf_append(t, "]\n", 2);
    sbx_buf_append(t, body, strlen(body));
    free(dumped);
    return true;
  }
  return false;
}

/* A short text of a run for clients that show only text; images also go
 * as image blocks (the structured result keeps everything). */
static void code_done(void *ud, json_t *res, const sbx_error *err) {
  mcp_call *call = ud;
  call->code_run = NULL;
  if (err) return mcp_call_fail(call, err);
  sbx_buf t = {0};
  json_t *v;
  size_t i;
  if (call->fresh_context) {
    json_object_set_new(res, "contextRestarted", json_true());
    static const char note[] = "(the earlier context had ended: this ran in a new one, without its state)\n";
    sbx_buf_append(&t, note, sizeof note - 1);
  }
  json_array_foreach(json_object_get(json_object_get(res, "logs"), "stdout"), i, v)
      sbx_buf_append(&t, json_string_value(v), json_string_length(v));
  bool any_err = false;
  json_array_foreach(json_object_get(json_object_get(res, "logs"), "stderr"), i, v) {
    if (!any_err) {
      if (t.len && t.data[t.len - 1] != '\n') sbx_buf_append(&t, "\n", 1);
      sbx_buf_append(&t, "[stderr]\n", 9);
      any_err = true;
    }
    sbx_buf_append(&t, json_string_value(v), json_string_length(v));
  }
  json_t *images = json_array();
  json_array_foreach(json_object_get(res, "results"), i, v) {
    const char *kinds[][2] = {{"png", "image/png"}, {"jpeg", "image/jpeg"}};
    bool image = false;
    for (int k = 0; k < 2; k++) {
      json_t *data = json_object_get(v, kinds[k][0]);
      if (json_is_string(data)) {
        json_array_append_new(images, json_pack("{s:s, s:O, s:s}", "type", "image", "data", data, "mimeType", kinds[k][1]));
        image = true;
      }
    }
    json_t *text = json_object_get(v, "text");
    if (t.len && t.data[t.len - 1] != '\n') sbx_buf_append(&t, "\n", 1);
    if (image) sbx_buf_append(&t, "[image]\n", 8);
    else if (!richer_text(&t, v, text) && json_is_string(text))
      sbx_buf_append(&t, json_string_value(text), json_string_length(text));
  }
  json_t *e = json_object_get(res, "error");
  if (e) {
    if (t.len && t.data[t.len - 1] != '\n') sbx_buf_append(&t, "\n", 1);
    json_array_foreach(json_object_get(e, "traceback"), i, v) {
      sbx_buf_append(&t, json_string_value(v), json_string_length(v));
      if (!json_string_length(v) || json_string_value(v)[json_string_length(v) - 1] != '\n') sbx_buf_append(&t, "\n", 1);
    }
    char line[600];
    int n = snprintf(line, sizeof line, "%s: %s", json_string_value(json_object_get(e, "name")),
                     json_string_value(json_object_get(e, "value")));
    if (!json_array_size(json_object_get(e, "traceback"))) sbx_buf_append(&t, line, (size_t)n);
  }
  if (!t.len) sbx_buf_append(&t, "(no output)", 11);
  static const char cut[] = "\n[truncated: a run keeps the first 1 MiB and the last 256 KiB of each stream, and 16 "
                            "MiB of results]";
  if (json_is_true(json_object_get(res, "truncated"))) sbx_buf_append(&t, cut, sizeof cut - 1);
  cut_middle(&t, CODE_TEXT_MAX);
  sbx_buf_append(&t, "", 1);
  if (json_array_size(images)) call->extra_content = images;
  else json_decref(images);
  json_incref(res);
  mcp_call_ok(call, res, t.data);
  sbx_buf_free(&t);
}

struct code_call {
  mcp_call *call;
  json_t *args;
};

static void run_in(mcp_call *call, json_t *args, sbx_code_ctx *c) {
  sbx_error err = {0};
  json_t *code = json_object_get(args, "code");
  if (sbx_code_submit(c, json_string_value(code), json_string_length(code), json_integer_value(json_object_get(args, "timeout")),
                   code_chunk, code_done, call, &call->code_run, &err) < 0)
    mcp_call_fail(call, &err);
}

static void default_ready(void *ud, sbx_code_ctx *c, const sbx_error *err) {
  struct code_call *cc = ud;
  if (err) mcp_call_fail(cc->call, err);
  else run_in(cc->call, cc->args, c);
  json_decref(cc->args);
  free(cc);
}

static void h_run_code(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  sbx_error err = {0};
  const char *lang = str(args, "language");
  if (str(args, "contextId")) {
    sbx_code_ctx *c = find_context(call, args, sb);
    if (!c) return;
    if (lang && strcmp(lang, sbx_code_language(c))) { /* never code of one language run by the other */
      sbx_err(&err, "VALIDATION_FAILED", "context %s runs %s, not %s (omit language, or use another context)",
              str(args, "contextId"), sbx_code_language(c), lang);
      return mcp_call_fail(call, &err);
    }
    return run_in(call, args, c);
  }
  /* a default context per language, made on first use */
  char id[32];
  snprintf(id, sizeof id, "default-%s", lang ? lang : "python");
  sbx_code_ctx *c = sbx_code_find(sb->id, id);
  if (c && sbx_code_dead(c)) {
    sbx_code_delete(c); /* it died: a fresh one, and the result says so */
    c = NULL;
    call->fresh_context = true;
  }
  if (!c && sbx_code_take_gone(sb, id)) call->fresh_context = true; /* it ended with an earlier daemon */
  if (c) return run_in(call, args, c);
  struct code_call *cc = calloc(1, sizeof *cc);
  if (!cc) return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  cc->call = call;
  cc->args = json_incref(args);
  int r = sbx_code_create(mcp_call_loop(call), sb, lang ? lang : "python", id, NULL, NULL, default_ready, cc, NULL, &err);
  sbx_sandbox_save(sb); /* the record knows its contexts (and not one that ended): a restart says they ended */
  if (r < 0) {
    json_decref(cc->args);
    free(cc);
    mcp_call_fail(call, &err);
  }
}

const mcp_handler mcp_handlers[] = {
    {"createSandbox", h_create, true},
    {"listSandboxes", h_list, true},
    {"destroySandbox", h_destroy, false, true},
    {"exec", h_exec, false},
    {"startProcess", h_start_process, false},
    {"listProcesses", h_list_processes, false},
    {"getProcess", h_get_process, false},
    {"getProcessLogs", h_process_logs, false},
    {"killProcess", h_kill_process, false},
    {"killAllProcesses", h_kill_all, false},
    {"waitForPort", h_wait_port, false},
    {"writeFile", h_write, .offload = true},
    {"readFile", h_read, .offload = true},
    {"listFiles", h_list_files, .offload = true},
    {"mkdir", h_mkdir, .offload = true},
    {"deleteFile", h_delete, .offload = true, .offload_when = "recursive"},
    {"renameFile", h_rename, .offload = true},
    {"moveFile", h_move, .offload = true},
    {"exists", h_exists, .offload = true},
    {"createSession", h_session_create, false},
    {"deleteSession", h_session_delete, false},
    {"listSessions", h_session_list, false},
    {"setEnvVars", h_setenv, false},
    {"mountBucket", h_mount_bucket, false},
    {"unmountBucket", h_unmount_bucket, false},
    {"createCodeContext", h_context_create, false},
    {"listCodeContexts", h_context_list, false},
    {"deleteCodeContext", h_context_delete, false},
    {"runCode", h_run_code, false},
    {"waitForLog", h_wait_log, false},
    {"waitForExit", h_wait_exit, false},
    {"streamProcessLogs", h_stream_logs, false},
    {"gitCheckout", h_git_checkout, false},
    {"exposePort", h_expose, false},
    {"unexposePort", h_unexpose, false},
    {"getExposedPorts", h_exposed, false},
};
const size_t mcp_handler_count = SBX_ARRAY_SIZE(mcp_handlers);
