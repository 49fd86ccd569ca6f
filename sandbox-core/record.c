#define _GNU_SOURCE
#include "record.h"
#include "bucket.h"
#include "code.h"
#include "preview.h"
#include "process.h"

#include <fcntl.h>

json_t *sbx_env_to_json(const sbx_env *e) {
  json_t *o = json_object();
  for (size_t i = 0; i < e->n; i++) {
    const char *eq = strchr(e->v[i], '=');
    if (!eq) continue;
    char *key = strndup(e->v[i], eq - e->v[i]);
    json_object_set_new(o, key, json_string(eq + 1));
    free(key);
  }
  return o;
}

int sbx_env_from_json(sbx_env *e, json_t *obj) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    if (!json_is_string(v) || !*k || strchr(k, '=')) return -EINVAL;
    int r = sbx_env_set(e, k, json_string_value(v));
    if (r < 0) return r;
  }
  return 0;
}

json_t *sbx_record_json(const sbx_sandbox *sb) {
  const sbx_sandbox_opts *o = &sb->opts;
  json_t *sessions = json_array();
  for (const sbx_session *s = sb->sessions; s; s = s->next) {
    json_t *js = json_pack("{s:s, s:s, s:o}", "id", s->id, "cwd", s->cwd, "env", sbx_env_to_json(&s->env));
    /* bash prints bytes that are not UTF-8 as they are in a function's body */
    if (s->shell_len && sbx_utf8_valid(s->shell, s->shell_len))
      json_object_set_new(js, "shell", json_stringn(s->shell, s->shell_len));
    json_array_append_new(sessions, js);
  }
  json_t *opts = json_pack("{s:{s:I, s:f, s:I, s:I}, s:b, s:b, s:I, s:b, s:s, s:o}", "limits", "memoryMB",
                           (json_int_t)o->limits.memory_mb, "cpus", o->limits.cpus, "pids", (json_int_t)o->limits.pids,
                           "diskMB", (json_int_t)o->limits.disk_mb, "limitsExplicit", o->limits_explicit,
                           "diskExplicit", o->disk_explicit, "sleepAfterMs",
                           (json_int_t)o->sleep_after_ms, "keepAlive", o->keep_alive, "network",
                           o->egress ? "egress" : "none", "env", sbx_env_to_json(&o->env));
  if (o->image[0]) json_object_set_new(opts, "image", json_string(o->image));
  if (o->allowed_hosts.n) {
    json_t *a = json_array();
    for (size_t i = 0; i < o->allowed_hosts.n; i++) json_array_append_new(a, json_string(o->allowed_hosts.v[i]));
    json_object_set_new(opts, "allowedHosts", a);
  }
  json_t *buckets = json_array();
  for (const sbx_bucket *b = sb->buckets; b; b = b->next) json_array_append_new(buckets, sbx_bucket_to_json(b));
  json_object_set_new(opts, "buckets", buckets);
  json_object_set_new(opts, "ports", sbx_preview_to_json(sb));
  json_t *rec = json_pack("{s:i, s:s, s:I, s:s, s:b, s:o, s:o}", "version", SBX_RECORD_VERSION, "sandboxId", sb->id,
                           "createdAt", (json_int_t)sb->created_wall_ms, "state",
                           sb->state == SBX_ASLEEP ? "asleep" : "active", "resetPending", sb->reset_pending, "options",
                           opts, "sessions", sessions);
  /* only as the daemon stops: a record that changed with every call would
   * be written (and synced) with every call */
  if (sb->stopping) json_object_set_new(rec, "lastActivity", json_integer((json_int_t)sb->last_used_wall_ms));
  json_t *code = sbx_code_record(sb);
  if (json_array_size(code)) json_object_set_new(rec, "codeContexts", code);
  else json_decref(code);
  json_t *procs = sbx_process_record(sb->id);
  if (json_array_size(procs)) json_object_set_new(rec, "processes", procs);
  else json_decref(procs);
  return rec;
}

#define BAD(...)                                                               \
  do {                                                                         \
    snprintf(err, errlen, __VA_ARGS__);                                        \
    return -1;                                                                 \
  } while (0)

int sbx_record_apply(sbx_sandbox *sb, json_t *rec, char *err, size_t errlen) {
  if (json_integer_value(json_object_get(rec, "version")) != SBX_RECORD_VERSION) BAD("unknown record version");
  const char *id = json_string_value(json_object_get(rec, "sandboxId"));
  if (!id || strcmp(id, sb->id)) BAD("the record names another sandbox");
  json_t *o = json_object_get(rec, "options"), *lim = json_object_get(o, "limits");
  if (!json_is_object(o) || !json_is_object(lim)) BAD("no options");
  sbx_sandbox_opts *op = &sb->opts;
  op->limits.memory_mb = json_integer_value(json_object_get(lim, "memoryMB"));
  op->limits.cpus = json_number_value(json_object_get(lim, "cpus"));
  op->limits.pids = json_integer_value(json_object_get(lim, "pids"));
  op->limits.disk_mb = json_integer_value(json_object_get(lim, "diskMB"));
  if (!op->limits.disk_mb) BAD("no diskMB");
  op->limits_explicit = json_is_true(json_object_get(o, "limitsExplicit"));
  op->disk_explicit = json_is_true(json_object_get(o, "diskExplicit"));
  op->sleep_after_ms = json_integer_value(json_object_get(o, "sleepAfterMs"));
  op->keep_alive = json_is_true(json_object_get(o, "keepAlive"));
  const char *net = json_string_value(json_object_get(o, "network"));
  op->egress = net && !strcmp(net, "egress");
  const char *image = json_string_value(json_object_get(o, "image"));
  if (image && (strlen(image) >= sizeof op->image || strchr(image, '/') || image[0] == '.')) BAD("bad image name");
  snprintf(op->image, sizeof op->image, "%s", image ? image : "");
  if (sbx_env_from_json(&op->env, json_object_get(o, "env")) < 0) BAD("bad env");
  size_t k;
  json_t *h;
  json_array_foreach(json_object_get(o, "allowedHosts"), k, h) {
    if (!json_is_string(h) || sbx_strv_add(&op->allowed_hosts, json_string_value(h)) < 0) BAD("bad allowedHosts");
  }
  json_array_foreach(json_object_get(o, "buckets"), k, h) {
    sbx_bucket *b = calloc(1, sizeof *b);
    if (!b || sbx_bucket_from_json(h, b) < 0) {
      free(b);
      BAD("bad bucket mount");
    }
    sbx_bucket **tail = &sb->buckets;
    while (*tail) tail = &(*tail)->next;
    *tail = b;
  }
  if (sbx_preview_from_json(sb, json_object_get(o, "ports")) < 0) BAD("bad exposed port");
  sb->created_wall_ms = json_integer_value(json_object_get(rec, "createdAt"));
  const char *state = json_string_value(json_object_get(rec, "state"));
  sb->state = state && !strcmp(state, "asleep") ? SBX_ASLEEP : SBX_STOPPED;
  sb->reset_pending = json_is_true(json_object_get(rec, "resetPending"));
  json_t *code = json_object_get(rec, "codeContexts");
  json_array_foreach(code, k, h) {
    const char *cid = json_string_value(json_object_get(h, "id"));
    const char *lang = json_string_value(json_object_get(h, "language"));
    if (!cid || !sbx_valid_id(cid) || !lang || k >= SBX_MAX_CODE_CONTEXTS * 2) BAD("bad code context");
  }
  if (json_array_size(code)) sb->code_gone = json_incref(code);
  /* sessions are made again when the sandbox starts; keep them meanwhile */
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(rec, "sessions"), i, s) {
    const char *sid = json_string_value(json_object_get(s, "id")), *cwd = json_string_value(json_object_get(s, "cwd"));
    if (!sid || !sbx_valid_id(sid) || !cwd || cwd[0] != '/' || i >= SBX_MAX_SESSIONS) BAD("bad session");
    sbx_session *ns = calloc(1, sizeof *ns);
    if (!ns) BAD("out of memory");
    snprintf(ns->id, sizeof ns->id, "%s", sid);
    ns->cwd = strdup(cwd);
    json_t *shell = json_object_get(s, "shell");
    if (json_is_string(shell) && json_string_length(shell)) {
      ns->shell_len = json_string_length(shell);
      ns->shell = malloc(ns->shell_len);
      if (ns->shell) memcpy(ns->shell, json_string_value(shell), ns->shell_len);
      else ns->shell_len = 0;
    }
    if (sbx_env_from_json(&ns->env, json_object_get(s, "env")) < 0) {
      sbx_session_free(ns);
      BAD("bad session env");
    }
    sbx_session **tail = &sb->sessions;
    while (*tail) tail = &(*tail)->next;
    *tail = ns;
  }
  sbx_process_restore(sb->id, json_object_get(rec, "processes"));
  return 0;
}

int sbx_write_atomic(const char *path, const char *text, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  /* written over, then cut to length: an O_TRUNC frees the old blocks,
   * which on a host filesystem mounted with discard is a discard waited
   * for, and makes ext4 start writing the file back at close */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -errno;
  int r = sbx_write_all(fd, text, len);
  if (r == 0 && ftruncate(fd, (off_t)len) < 0) r = -errno;
  if (r == 0 && fsync(fd) < 0) r = -errno;
  if (close(fd) < 0 && r == 0) r = -errno;
  if (r == 0 && rename(tmp, path) < 0) r = -errno;
  if (r < 0) unlink(tmp);
  /* the rename reaches the disk with the filesystem's next commit; the
   * record it names is on disk already, so no state is ever half written */
  return r;
}
