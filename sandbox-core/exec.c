#define _GNU_SOURCE
#include "exec.h"
#include "files.h"
#include "procfiles.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

/* Runs the command in the session's shell state and, on exit (also
 * `exit N`), reports the shell's cwd and exported variables on fd 3, which
 * the command itself never sees (quietly: 2>/dev/null comes first, so that
 * a closed fd 3 says nothing). With bash, the rest of what a persistent
 * shell keeps follows a \1 line: its other variables, functions, aliases
 * and options, given back to the next command of the session on fd 4. */
/* Each wrapper is one line: the command's eval runs on line 1, so that its
 * line N is line N (LINENO, and bash's "line N:" in its messages). HUP,
 * USR1 and USR2 (a reload, a log rotation: killProcess sends them to the
 * whole tree) are the command's: the wrapper, waiting for it, lets them
 * pass instead of dying of them and taking the command with it; a shell
 * command that wants them sets its own trap. */
#define WRAPPER_TRAPS "trap : HUP USR1 USR2; "
static const char sh_wrapper[] =
    WRAPPER_TRAPS "trap '__sbx_rc=$?; { printf \"%s\\n\" \"$PWD\"; export -p; } 2>/dev/null >&3; exit $__sbx_rc' EXIT; "
    "__sbx_cmd=$1; shift; "
    "eval \"$__sbx_cmd\" 3>&-\n";
static const char bash_wrapper[] =
    WRAPPER_TRAPS "trap '__sbx_rc=$?; { printf \"%s\\n\" \"$PWD\"; export -p; printf \"\\1\\n\"; declare -p; declare -f; "
    "alias -p; set +o; shopt -p; } 2>/dev/null >&3; exit $__sbx_rc' EXIT; "
    "__sbx_cmd=$1; "
    "if [ \"$2\" = 1 ]; then . /dev/fd/4 2>/dev/null; else shopt -s expand_aliases; fi; "
    "set --; "
    "eval \"$__sbx_cmd\" 3>&- 4<&-\n";

/* Variables of bash's own that a new shell must set for itself. */
static bool shell_owned(const char *name, size_t n) {
  static const char *const names[] = {
      "_",       "COLUMNS", "COMP_WORDBREAKS", "DIRSTACK", "EPOCHREALTIME", "EPOCHSECONDS", "EUID",
      "FUNCNAME", "GROUPS", "HISTCMD",         "HOSTNAME", "HOSTTYPE",      "LINENO",       "LINES",
      "MACHTYPE", "OPTERR", "OPTIND",          "OSTYPE",   "PIPESTATUS",    "PPID",         "PWD",
      "RANDOM",   "SECONDS", "SHELLOPTS",      "SHLVL",    "SRANDOM",       "UID"};
  if ((n >= 4 && !strncmp(name, "BASH", 4)) || (n >= 5 && !strncmp(name, "__sbx", 5))) return true;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++)
    if (strlen(names[i]) == n && !strncmp(names[i], name, n)) return true;
  return false;
}

char *sbx_shell_state_filter(const char *t, size_t len, size_t *out_len) {
  sbx_buf out = {0};
  size_t i = 0;
  static const char decl[] = "declare -";
  /* `declare -p` comes first, a variable a line ($'...' holds newlines) */
  while (i < len && len - i >= sizeof decl - 1 && !strncmp(t + i, decl, sizeof decl - 1)) {
    const char *nl = memchr(t + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - t) + 1 : len;
    size_t f = i + sizeof decl - 1, fe = f;
    while (fe < end && t[fe] != ' ') fe++;
    size_t ns = fe + 1, ne = ns;
    while (ne < end && t[ne] != '=' && t[ne] != '\n') ne++;
    bool exported = memchr(t + f, 'x', fe - f) != NULL;
    if (!exported && ns < end && !shell_owned(t + ns, ne - ns)) sbx_buf_append(&out, t + i, end - i);
    i = end;
  }
  sbx_buf_append(&out, t + i, len - i); /* functions, aliases, options */
  *out_len = out.len;
  if (!out.data) return strdup("");
  return out.data;
}

#define STATE_MAX (1024 * 1024)

struct stream {
  sbx_headtail ht;
  char carry[4];
  size_t carry_len;
  int file_fd;
  char *path;
  bool short_file; /* the sandbox's disk filled up: the file holds only what fit */
};

typedef struct sbx_shell sbx_shell;

struct sbx_exec {
  uv_loop_t *loop;
  sbx_sandbox *sb;
  sbx_shell *sh; /* run by the session's shell, not a process of its own */
  char session_id[64];
  bool keep_session, discard, background, unattended;
  char *call_cwd; /* a cwd given for this call only */
  sbx_env call_env;
  sbx_cgroup cg;
  pid_t pid;
  int pidfd;
  uv_poll_t pidpoll;
  uv_pipe_t pipes[3]; /* stdout, stderr, state */
  bool pipe_open[3];
  unsigned paused; /* output pipes not read until the next window (bits) */
  uv_pipe_t in;
  bool in_open;
  uv_write_t in_req;
  char *stdin_copy;
  uv_timer_t timer, drain;
  uv_timer_t resig; /* a signal's second look for processes forked after it went */
  int resig_sig, resig_left;
  struct {
    pid_t pid;
    char comm[16]; /* what it ran when signalled */
  } signalled[32];
  int nsignalled;
  struct stream s[2];
  sbx_buf state;
  bool state_overflow, bash;
  size_t limit;
  bool exited, done, timed_out, cancelled;
  int exit_code;
  int left_behind; /* its processes still running when it ended (killed then) */
  uint64_t start_us, oom_before;
  int handles; /* open libuv handles; freed when 0 after done */
  sbx_exec_chunk_cb on_chunk;
  bool raw_chunks;
  unsigned line_cost;
  size_t in_queued; /* written to its stdin, not taken yet */
  sbx_exec_done_cb on_done;
  void *ud;
  struct sbx_exec *next;
};

struct sbx_shell {
  uv_loop_t *loop;
  sbx_sandbox *sb;       /* NULL once the sandbox or session is gone */
  sbx_session *session;
  uint64_t gen;          /* the session state the shell holds */
  pid_t pid;             /* its supervisor, our child */
  pid_t bash;            /* bash's host pid, learnt when it first answers */
  int pidfd, cmdfd;
  uv_poll_t pidpoll;
  uv_pipe_t pipes[3]; /* stdout, stderr, status */
  uv_pipe_t wake;
  uv_timer_t idle;
  sbx_cgroup cg;
  sbx_buf ctl;
  sbx_exec *cur;
  unsigned paused; /* as sbx_exec's */
  bool dead, retired;
  int handles;
  sbx_shell *next;
};

static sbx_exec *all_execs;

/* Idle command cgroups of a sandbox, reused instead of made and removed for
 * every call (they are empty once a command's tree is gone). */
#define CG_POOL 8
static void cg_release(sbx_sandbox *sb, sbx_cgroup *cg) {
  if (sb && sb->cg_pool_n < CG_POOL && !sbx_cg_populated(cg)) {
    sb->cg_pool[sb->cg_pool_n++] = *cg;
    *cg = (sbx_cgroup){0};
    return;
  }
  sbx_cg_remove(cg);
  sbx_cg_free(cg);
}

static int cg_acquire(sbx_sandbox *sb, sbx_cgroup *out) {
  if (sb->cg_pool_n > 0) {
    *out = sb->cg_pool[--sb->cg_pool_n];
    return 0;
  }
  char name[64];
  snprintf(name, sizeof name, "exec-%llu", (unsigned long long)++sb->exec_seq);
  return sbx_cg_create(&sb->cg, name, false, out);
}

static void on_close(uv_handle_t *h) {
  sbx_exec *x = h->data;
  if (--x->handles > 0) return;
  sbx_exec **pp = &all_execs;
  while (*pp && *pp != x) pp = &(*pp)->next;
  if (*pp) *pp = x->next;
  for (int i = 0; i < 2; i++) {
    sbx_headtail_free(&x->s[i].ht);
    if (x->s[i].file_fd >= 0) close(x->s[i].file_fd);
    free(x->s[i].path);
  }
  sbx_buf_free(&x->state);
  sbx_env_clear(&x->call_env);
  free(x->call_cwd);
  free(x->stdin_copy);
  if (x->pidfd >= 0) close(x->pidfd);
  sbx_cg_free(&x->cg);
  free(x);
}

static void close_handle(sbx_exec *x, uv_handle_t *h) {
  if (uv_is_closing(h)) return;
  h->data = x;
  uv_close(h, on_close);
}

static void shell_kill(sbx_shell *sh);

static void kill_tree(sbx_exec *x) {
  if (x->sh) return shell_kill(x->sh);
  if (x->cg.n) sbx_cg_kill(&x->cg);
  if (!x->exited && x->pidfd >= 0) sbx_pidfd_send_signal(x->pidfd, SIGTERM);
}

static bool env_equal(const sbx_env *a, const sbx_env *b) {
  if (a->n != b->n) return false;
  for (size_t i = 0; i < a->n; i++) {
    const char *eq = strchr(a->v[i], '=');
    char key[256];
    if (!eq || (size_t)(eq - a->v[i]) >= sizeof key) return false;
    memcpy(key, a->v[i], eq - a->v[i]);
    key[eq - a->v[i]] = 0;
    const char *o = sbx_env_get(b, key);
    if (!o || strcmp(o, eq + 1)) return false;
  }
  return true;
}

static void shell_synced(sbx_shell *sh, const sbx_session *s);

static void update_session(sbx_exec *x) {
  if (!x->keep_session || !x->sb || x->timed_out || x->cancelled || !x->state.len) return;
  sbx_session *s = sbx_session_find(x->sb, x->session_id);
  if (!s) return;
  char *nl = memchr(x->state.data, '\n', x->state.len);
  if (!nl || nl == x->state.data || x->state.data[0] != '/') return;
  const char *vars = nl + 1, *end = x->state.data + x->state.len;
  const char *rest = memmem(vars, end - vars, "\n\1\n", 3);
  size_t vars_len = rest ? (size_t)(rest + 1 - vars) : (size_t)(end - vars);
  if (x->bash && (!rest || x->state_overflow)) return; /* cut short: keep what the session had */
  sbx_env env = {0};
  if (sbx_env_parse_export(&env, vars, vars_len) < 0 || !sbx_env_get(&env, "PATH")) {
    sbx_env_clear(&env);
    return;
  }
  /* variables given to this call only do not stick, unless the command
   * changed them itself */
  for (size_t i = 0; i < x->call_env.n; i++) {
    const char *kv = x->call_env.v[i], *eq = strchr(kv, '=');
    char key[256];
    if (!eq || (size_t)(eq - kv) >= sizeof key) continue;
    memcpy(key, kv, eq - kv);
    key[eq - kv] = 0;
    const char *now = sbx_env_get(&env, key), *before = sbx_env_get(&s->env, key);
    if (now && !strcmp(now, eq + 1)) {
      if (before) sbx_env_set(&env, key, before);
      else sbx_env_unset(&env, key);
    }
  }
  bool changed = !env_equal(&env, &s->env);
  sbx_env_clear(&s->env);
  s->env = env;
  if (rest) {
    size_t n;
    char *shell = sbx_shell_state_filter(rest + 3, end - (rest + 3), &n);
    if (shell && (n != s->shell_len || memcmp(shell, s->shell, n))) {
      free(s->shell), s->shell = shell, s->shell_len = n;
      changed = true;
    } else {
      free(shell);
    }
  }
  char *cwd = strndup(x->state.data, nl - x->state.data);
  if ((x->call_cwd && !strcmp(cwd, x->call_cwd)) || !strcmp(cwd, s->cwd)) {
    free(cwd); /* the call's cwd does not stick */
  } else {
    free(s->cwd), s->cwd = cwd;
    changed = true;
  }
  if (changed) s->gen++;
  if (x->sh) shell_synced(x->sh, s); /* the shell that ran it holds this state */
  sbx_sandbox_save(x->sb); /* written only when something changed */
}

static void finish(sbx_exec *x) {
  if (x->done || !x->exited) return;
  for (int i = 0; i < 3; i++)
    if (x->pipe_open[i]) return;
  x->done = true;
  uv_timer_stop(&x->timer);
  uv_timer_stop(&x->drain);
  if (x->sb) {
    update_session(x);
    sbx_session *s = sbx_session_find(x->sb, x->session_id);
    if (x->keep_session && s && s->busy) s->busy--;
    if (!x->background) {
      x->sb->running--;
      sbx_sandbox_touch(x->sb);
    }
  }
  sbx_exec_result res = {0};
  res.exit_code = x->exit_code;
  res.left_behind = x->left_behind;
  res.timed_out = x->timed_out;
  res.cancelled = x->cancelled;
  res.duration_ms = (sbx_now_us() - x->start_us) / 1000;
  /* OOM kills are counted where the limit is, the sandbox's cgroup: one
   * during this command that ended it with SIGKILL was its */
  if (x->sb && x->sb->cg.n) res.oom = x->exit_code == 128 + SIGKILL && sbx_cg_oom_kills(&x->sb->cg) > x->oom_before;
  char *raw[2];
  size_t rawlen[2];
  for (int i = 0; i < 2; i++) {
    raw[i] = sbx_headtail_render(&x->s[i].ht, &rawlen[i]);
    if (sbx_headtail_truncated(&x->s[i].ht)) res.truncated = true;
  }
  res.out = sbx_utf8_repair(raw[0], rawlen[0], &res.out_len);
  res.err = sbx_utf8_repair(raw[1], rawlen[1], &res.err_len);
  free(raw[0]);
  free(raw[1]);
  res.output_path = x->s[0].path ? x->s[0].path : x->s[1].path;
  res.output_short = x->s[0].path ? x->s[0].short_file : x->s[1].short_file;
  if (x->cg.n) cg_release(x->sb, &x->cg);
  x->on_done(x->ud, &res, NULL);
  free(res.out);
  free(res.err);
  close_handle(x, (uv_handle_t *)&x->timer);
  close_handle(x, (uv_handle_t *)&x->drain);
  if (x->sh) return;
  close_handle(x, (uv_handle_t *)&x->pidpoll);
  close_handle(x, (uv_handle_t *)&x->resig);
  for (int i = 0; i < 3; i++) close_handle(x, (uv_handle_t *)&x->pipes[i]);
  if (x->in_open) close_handle(x, (uv_handle_t *)&x->in);
}

static void close_pipe(sbx_exec *x, int i) {
  if (!x->pipe_open[i]) return;
  uv_read_stop((uv_stream_t *)&x->pipes[i]);
  x->pipe_open[i] = false;
  finish(x);
}

/* Spilled outputs live on the sandbox's disk (its quota pays for them);
 * only the newest SPILLS_KEPT stay. */
#define SPILLS_KEPT 16

/* The first time a stream passes its bound, everything so far is still in
 * memory: it goes to a file inside the sandbox, and so does the rest. */
static void spill(sbx_exec *x, int i, const char *p, size_t n) {
  struct stream *st = &x->s[i];
  if (st->file_fd < 0 && !st->path && x->sb && st->ht.total + n > x->limit) {
    char name[96], path[128];
    snprintf(name, sizeof name, "exec-%d-%llu.%s", x->pid, (unsigned long long)x->start_us, i ? "stderr" : "stdout");
    snprintf(path, sizeof path, SBX_SPILL_DIR "/%s", name);
    sbx_error err;
    st->file_fd = sbx_fs_own_file(x->sb, SBX_SPILL_DIR, name, SPILLS_KEPT, &err);
    if (st->file_fd >= 0) {
      st->path = strdup(path);
      size_t len;
      char *prev = sbx_headtail_render(&st->ht, &len);
      if (sbx_write_all(st->file_fd, prev, len) < 0) close(st->file_fd), st->file_fd = -1, st->short_file = true;
      free(prev);
    }
  }
  if (st->file_fd >= 0 && sbx_write_all(st->file_fd, p, n) < 0) {
    close(st->file_fd); /* the sandbox's disk is full: the file keeps what fit */
    st->file_fd = -1;
    st->short_file = true;
  }
}

static void on_chunk(sbx_exec *x, int i, const char *p, size_t n) {
  struct stream *st = &x->s[i];
  if (!x->discard) {
    spill(x, i, p, n);
    sbx_headtail_add(&st->ht, p, n);
  }
  if (!x->on_chunk) return;
  if (x->raw_chunks) return x->on_chunk(x->ud, i + 1, p, n);
  /* progress chunks end on code-point boundaries */
  char *buf = malloc(st->carry_len + n);
  if (!buf) return;
  memcpy(buf, st->carry, st->carry_len);
  memcpy(buf + st->carry_len, p, n);
  size_t total = st->carry_len + n, ok = sbx_utf8_complete_prefix(buf, total);
  if (total - ok > 3) ok = total; /* not a cut sequence after all */
  st->carry_len = total - ok;
  memcpy(st->carry, buf + ok, st->carry_len);
  if (ok) {
    size_t len;
    char *text = sbx_utf8_repair(buf, ok, &len);
    x->on_chunk(x->ud, i + 1, text, len);
    free(text);
  }
  free(buf);
}

/* ---- the output budget ---------------------------------------------------
 * The daemon reads what a sandbox's commands print at most OUT_BUDGET bytes
 * per OUT_WINDOW_MS, once for the calls a caller waits on and once for
 * unattended commands (background processes). Past it, those pipes are not
 * read until the next window: their writers block on full pipes (asleep, on
 * their own CPU share) instead of the daemon spending its loop on them. A
 * sandbox printing forever from many processes costs the daemon a bounded
 * share, its own calls are not slowed by its background logs, and every
 * other sandbox's calls still answer. */
#define OUT_WINDOW_MS 50
#define OUT_BUDGET (2u << 20) /* 40 MiB/s per sandbox for calls, as much for unattended commands */

static sbx_shell *all_shells;
static uv_timer_t out_timer;
static bool out_timer_ready;
static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b);
static void shell_read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

/* Stops the reading pipes among the first two of p; returns which. */
static unsigned pause_pipes(uv_pipe_t *p) {
  unsigned bits = 0;
  for (int i = 0; i < 2; i++)
    if (uv_is_active((uv_handle_t *)&p[i]) && !uv_is_closing((uv_handle_t *)&p[i])) {
      uv_read_stop((uv_stream_t *)&p[i]);
      bits |= 1u << i;
    }
  return bits;
}

static void resume_pipes(uv_pipe_t *p, unsigned bits, uv_read_cb cb) {
  for (int i = 0; i < 2; i++)
    if ((bits & (1u << i)) && !uv_is_closing((uv_handle_t *)&p[i])) uv_read_start((uv_stream_t *)&p[i], sbx_read_alloc, cb);
}

static void out_window_cb(uv_timer_t *t) {
  (void)t;
  for (sbx_exec *x = all_execs; x; x = x->next) {
    unsigned bits = x->paused;
    x->paused = 0;
    for (int i = 0; i < 2; i++)
      if (!x->pipe_open[i]) bits &= ~(1u << i);
    resume_pipes(x->pipes, bits, read_cb);
  }
  for (sbx_shell *sh = all_shells; sh; sh = sh->next) {
    resume_pipes(sh->pipes, sh->paused, shell_read_cb);
    sh->paused = 0;
  }
}

/* Counts n bytes read for sb, for calls or unattended commands; past that
 * budget, their output waits. */
static void out_spend(uv_loop_t *loop, sbx_sandbox *sb, bool unattended, size_t n) {
  if (!sb) return;
  uint64_t window = uv_now(loop) / OUT_WINDOW_MS;
  if (sb->out_window != window) sb->out_window = window, sb->out_used[0] = sb->out_used[1] = 0;
  sb->out_used[unattended] += n;
  if (sb->out_used[unattended] < OUT_BUDGET) return;
  for (sbx_exec *x = all_execs; x; x = x->next)
    if (x->sb == sb && !x->sh && x->unattended == unattended) x->paused |= pause_pipes(x->pipes);
  for (sbx_shell *sh = all_shells; sh; sh = sh->next)
    if (sh->sb == sb && !unattended) sh->paused |= pause_pipes(sh->pipes);
  if (!out_timer_ready) {
    uv_timer_init(loop, &out_timer);
    uv_unref((uv_handle_t *)&out_timer);
    out_timer_ready = true;
  }
  if (!uv_is_active((uv_handle_t *)&out_timer))
    uv_timer_start(&out_timer, out_window_cb, OUT_WINDOW_MS - uv_now(loop) % OUT_WINDOW_MS, 0);
}

void sbx_read_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  static char buf[65536];
  (void)h;
  (void)suggested;
  *b = uv_buf_init(buf, sizeof buf);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  sbx_exec *x = s->data;
  int i = (int)((uv_pipe_t *)s - x->pipes);
  if (n > 0) {
    if (i < 2) {
      size_t cost = (size_t)n;
      for (const char *p = b->base, *e = p + n; x->line_cost && i == 0 && (p = memchr(p, '\n', (size_t)(e - p))); p++)
        cost += x->line_cost;
      on_chunk(x, i, b->base, n);
      out_spend(x->loop, x->sb, x->unattended, cost);
    }
    else if (x->state.len + n <= STATE_MAX) sbx_buf_append(&x->state, b->base, n);
    else x->state_overflow = true;
  }
  if (n < 0) close_pipe(x, i);
}

/* What is left in a command's output pipes, read now (even while its output
 * waits for the budget), for x (NULL: dropped). */
static void read_left(uv_pipe_t *pipes, sbx_exec *x) {
  char buf[65536];
  for (int i = 0; i < 2; i++) {
    int fd;
    if (uv_fileno((uv_handle_t *)&pipes[i], &fd) < 0) continue;
    for (int k = 0; k < 64; k++) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      if (x) on_chunk(x, i, buf, n);
    }
  }
}

static void drain_cb(uv_timer_t *t) {
  sbx_exec *x = t->data;
  read_left(x->pipes, x);
  /* no cgroup to kill leftovers (rootless): stop waiting for pipes that a
   * background process keeps open */
  for (int i = 0; i < 3; i++) close_pipe(x, i);
}

/* The supervisor behind a readable pidfd has ended: reaped, polling stops. */
static bool reaped(uv_poll_t *p, int pidfd, siginfo_t *si) {
  *si = (siginfo_t){0};
  if (waitid(P_PIDFD, pidfd, si, WEXITED | WNOHANG) < 0 || si->si_pid == 0) return false;
  uv_poll_stop(p);
  return true;
}

static void pid_cb(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  sbx_exec *x = p->data;
  siginfo_t si;
  if (!reaped(p, x->pidfd, &si)) return;
  x->exited = true;
  x->exit_code = sbx_spawn_exit_code(&si);
  /* nothing of the command outlives it: background children go too */
  if (x->cg.n && (x->left_behind = sbx_cg_each_pid(&x->cg, NULL, NULL)) > 0) sbx_cg_kill(&x->cg);
  else uv_timer_start(&x->drain, drain_cb, 100, 0);
  finish(x);
}

static void timer_cb(uv_timer_t *t) {
  sbx_exec *x = t->data;
  x->timed_out = true;
  kill_tree(x);
}

static void stdin_written(uv_write_t *req, int status) {
  (void)status;
  sbx_exec *x = req->data;
  close_handle(x, (uv_handle_t *)&x->in);
  x->in_open = false;
}

struct more_in {
  uv_write_t req;
  sbx_exec *x;
  size_t len;
  char data[];
};

static void more_written(uv_write_t *req, int status) {
  (void)status;
  struct more_in *m = req->data;
  m->x->in_queued -= m->len;
  free(m);
}

size_t sbx_exec_input_queued(const sbx_exec *x) { return x->in_queued; }

int sbx_exec_write(sbx_exec *x, const char *data, size_t len) {
  if (x->done || !x->in_open || uv_is_closing((uv_handle_t *)&x->in)) return -1;
  if (!data) {
    close_handle(x, (uv_handle_t *)&x->in);
    x->in_open = false;
    return 0;
  }
  struct more_in *m = malloc(sizeof *m + len);
  if (!m) return -1;
  memcpy(m->data, data, len);
  m->req.data = m;
  m->x = x;
  m->len = len;
  uv_buf_t b = uv_buf_init(m->data, (unsigned)len);
  if (uv_write(&m->req, (uv_stream_t *)&x->in, &b, 1, more_written) < 0) {
    free(m);
    return -1;
  }
  x->in_queued += len;
  return 0;
}

void sbx_exec_set_chunk_cb(sbx_exec *x, sbx_exec_chunk_cb cb) { x->on_chunk = cb; }

void sbx_exec_cancel(sbx_exec *x) {
  if (x->done) return;
  x->cancelled = true;
  kill_tree(x);
}

static pid_t command_pid(sbx_exec *x);

static void comm_of(pid_t pid, char out[16]) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/comm", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, out, 15) : -1;
  if (fd >= 0) close(fd);
  out[n > 0 ? n : 0] = 0;
}

/* A pass over the command's cgroup: each process is signalled once, and
 * again if it has executed something else since (see resig_cb); a pass
 * that only looks counts those it would signal. */
struct signal_pass {
  sbx_exec *x;
  bool look;
  int missed;
};

static void signal_once(pid_t pid, void *ud) {
  struct signal_pass *p = ud;
  sbx_exec *x = p->x;
  char comm[16];
  comm_of(pid, comm);
  int i = 0;
  while (i < x->nsignalled && x->signalled[i].pid != pid) i++;
  if (i < x->nsignalled && !strcmp(x->signalled[i].comm, comm)) return;
  p->missed++;
  if (p->look) return;
  if (i == x->nsignalled && x->nsignalled < (int)SBX_ARRAY_SIZE(x->signalled)) x->signalled[x->nsignalled++].pid = pid;
  if (i < x->nsignalled) memcpy(x->signalled[i].comm, comm, sizeof comm);
  kill(pid, x->resig_sig);
}

/* A signal can miss: bash (whose exit trap makes it catch SIGTERM and act
 * on it only once its command ends) forks its command, and a SIGTERM that
 * reaches the child before it executes is caught by bash's handler there
 * and lost with the exec; a child forked after the cgroup was listed gets
 * none. The command then ran on, and bash waited for it. The cgroup is
 * looked at again for two seconds: what is new there, or has executed
 * something else since, gets the signal too. */
static void resig_cb(uv_timer_t *t) {
  sbx_exec *x = t->data;
  if (x->done || --x->resig_left <= 0) uv_timer_stop(t);
  if (x->done) return;
  struct signal_pass look = {x, true, 0}, send = {x, false, 0};
  sbx_cg_each_pid(&x->cg, signal_once, &look);
  if (!look.missed) return;
  /* the command itself first: bash, with a signal of its own pending when
   * its child ends, ends quietly instead of reporting it ("Terminated") */
  pid_t cmd = command_pid(x);
  if (cmd > 0) kill(cmd, x->resig_sig);
  sbx_cg_each_pid(&x->cg, signal_once, &send);
}

void sbx_exec_signal(sbx_exec *x, int sig) {
  if (x->done) return;
  if (x->cg.n) { /* only spawned commands have one, and their resig timer */
    x->resig_sig = sig;
    x->nsignalled = 0;
    struct signal_pass send = {x, false, 0};
    int n = sbx_cg_each_pid(&x->cg, signal_once, &send);
    if (sbx_signal_stops(sig)) { /* (a reload's new workers must not get its HUP) */
      x->resig_left = 20;
      uv_timer_start(&x->resig, resig_cb, 100, 100);
    }
    if (n > 0 || !sbx_signal_stops(sig)) return;
  }
  /* a command that has not joined its cgroup yet (it does just before it
   * executes) is killed by its supervisor, which kills the command's group */
  if (x->pidfd >= 0) sbx_pidfd_send_signal(x->pidfd, SIGTERM);
}

char *sbx_exec_output(sbx_exec *x, int stream, size_t *len) {
  size_t raw_len;
  char *raw = sbx_headtail_render(&x->s[stream == 2].ht, &raw_len);
  char *text = sbx_utf8_repair(raw, raw_len, len);
  free(raw);
  return text;
}

/* A supervisor's one child (its host pid), or 0. */
static pid_t child_of(pid_t pid) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
  FILE *f = fopen(path, "re");
  int child = 0;
  if (f) {
    if (fscanf(f, "%d", &child) != 1) child = 0;
    fclose(f);
  }
  return child > 0 ? child : 0;
}

/* The command's host pid, or 0. */
static pid_t command_pid(sbx_exec *x) { return x->done || x->exited ? 0 : child_of(x->pid); }

int sbx_exec_signal_command(sbx_exec *x, int sig) {
  pid_t child = command_pid(x);
  int fd = child ? sbx_pidfd_open(child) : -1;
  if (fd < 0) return -1;
  /* still the supervisor's child (not a pid reused meanwhile)? */
  int r = command_pid(x) == child ? sbx_pidfd_send_signal(fd, sig) : -1;
  close(fd);
  return r;
}

pid_t sbx_exec_pid_in_sandbox(sbx_exec *x) {
  /* the command's last NSpid is its pid inside the sandbox */
  char path[96], buf[256];
  pid_t child = command_pid(x);
  if (child <= 0) return 0;
  snprintf(path, sizeof path, "/proc/%d/status", child);
  FILE *f = fopen(path, "re");
  pid_t inside = 0;
  while (f && fgets(buf, sizeof buf, f))
    if (!strncmp(buf, "NSpid:", 6)) {
      char *last = strrchr(buf, '\t');
      inside = last ? atoi(last + 1) : 0;
    }
  if (f) fclose(f);
  return inside;
}

/* ---- session shells ------------------------------------------------------
 *
 * A session's commands run in one bash that stays, so `exec true` costs a
 * line to a shell and no process start (bash itself takes a millisecond or
 * two to start). The shell reads a command when a byte arrives on fd 5, the
 * command itself from the memfd on fd 6 (a file, which bash reads in blocks
 * and not a byte at a time as from a pipe), runs it with its own fds put
 * back afterwards, and writes its status and state (as the wrapper above)
 * on fd 3, ending with a marker. What a command leaves running is killed
 * when it ends, as for a command of its own. Everything else (stdin,
 * a cwd or env for one call, background processes, a second command while
 * the shell is busy, no cgroups) starts a process of its own with the
 * session's state; a command that changes the state that way retires the
 * shell, and the next one starts with the new state. */
static const char shell_head[] =
    "exec 7>&1 8>&2 2>/dev/null 4<&-\n"
    "__sbx_dump='{ printf \"%d%s\\n%s\\n\" \"$__sbx_rc\" \"$__sbx_how\" \"$PWD\"; export -p; printf \"\\1\\n\"; "
    "declare -p; declare -f; alias -p; set +o; shopt -p; printf \"\\1sbx-end\\1\\n\"; } >&3'\n"
    "trap '__sbx_rc=$?; __sbx_how=x; eval \"$__sbx_dump\"; exit $__sbx_rc' EXIT\n"
    "shopt -s expand_aliases\n";
/* bash -c runs this: the script (head and state), then the loop, on line 1
 * (see the wrappers above). disown -a: what a command left running is
 * killed, without a notice in the next command's output. */
static const char shell_main[] =
    "IFS= read -r -d '' __sbx_s <&4; eval \"$__sbx_s\"; "
    "set --; __sbx_how=; "
    "while IFS= read -r -n 1 -u 5 __sbx_go; do "
    "IFS= read -r -d '' -u 6 __sbx_cmd; "
    "for __sbx_once in 1; do eval \"$__sbx_cmd\" </dev/null >&7 2>&8 3>&- 5<&- 6<&- 7>&- 8>&-; done; "
    "__sbx_rc=$?; disown -a; eval \"$__sbx_dump\"; "
    "done";

#define SHELL_END "\1sbx-end\1\n"
#define SHELL_IDLE_MS (60 * 1000) /* an idle shell goes; the next command starts one */


static void shell_synced(sbx_shell *sh, const sbx_session *s) {
  if (sh->session == s) sh->gen = s->gen;
}

static void shell_on_close(uv_handle_t *h) {
  sbx_shell *sh = h->data;
  if (--sh->handles > 0) return;
  sbx_shell **pp = &all_shells;
  while (*pp && *pp != sh) pp = &(*pp)->next;
  if (*pp) *pp = sh->next;
  if (sh->cg.n) cg_release(sh->sb, &sh->cg);
  if (sh->pidfd >= 0) close(sh->pidfd);
  if (sh->cmdfd >= 0) close(sh->cmdfd);
  sbx_buf_free(&sh->ctl);
  free(sh);
}

/* Takes the shell from its session: no command goes to it any more. */
static void shell_retire(sbx_shell *sh) {
  if (sh->session && sh->session->sh == sh) sh->session->sh = NULL;
  sh->session = NULL;
  sh->retired = true;
}

static void shell_kill(sbx_shell *sh) {
  shell_retire(sh);
  if (sh->dead) return;
  if (sh->cg.n) sbx_cg_kill(&sh->cg);
  sbx_pidfd_send_signal(sh->pidfd, SIGTERM); /* the supervisor kills the group */
}

static void shell_idle_cb(uv_timer_t *t) { shell_kill(t->data); }

/* What the command wrote is all in the pipes by the time bash reports its
 * end: read it before the report is handled. */
static void shell_drain(sbx_shell *sh) { read_left(sh->pipes, sh->cur); }


/* Reports end with SHELL_END: "<status>[x]\n" then the state as the
 * wrapper writes it; "x" when the shell is exiting. */
static void shell_reports(sbx_shell *sh) {
  for (;;) {
    char *end = memmem(sh->ctl.data, sh->ctl.len, SHELL_END, sizeof SHELL_END - 1);
    if (!end) return;
    size_t blen = end - sh->ctl.data, used = blen + sizeof SHELL_END - 1;
    char *nl = memchr(sh->ctl.data, '\n', blen);
    sbx_exec *x = sh->cur;
    if (nl && x) {
      if (!sh->bash) sh->bash = child_of(sh->pid);
      if (nl > sh->ctl.data && nl[-1] == 'x') sh->retired = true, shell_retire(sh);
      shell_drain(sh);
      x->exit_code = atoi(sh->ctl.data);
      sbx_buf_append(&x->state, nl + 1, blen - (nl + 1 - sh->ctl.data));
      x->exited = true;
      sh->cur = NULL;
      /* nothing of the command outlives it */
      if (sh->bash && !sh->retired) x->left_behind = sbx_cg_kill_except(&sh->cg, sh->bash);
      if (!sh->retired) uv_timer_start(&sh->idle, shell_idle_cb, SHELL_IDLE_MS, 0);
      finish(x);
    }
    memmove(sh->ctl.data, sh->ctl.data + used, sh->ctl.len - used);
    sh->ctl.len -= used;
  }
}

static void shell_read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  sbx_shell *sh = st->data;
  int i = (int)((uv_pipe_t *)st - sh->pipes);
  if (n > 0) {
    if (i < 2) {
      if (sh->cur) on_chunk(sh->cur, i, b->base, n);
      out_spend(sh->loop, sh->sb, false, n);
    } else if (sh->ctl.len + n > STATE_MAX + 64) {
      shell_kill(sh); /* not a report of ours */
    } else {
      sbx_buf_append(&sh->ctl, b->base, n);
      shell_reports(sh);
    }
  }
  if (n < 0) uv_read_stop(st);
}

static void shell_pid_cb(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  sbx_shell *sh = p->data;
  siginfo_t si;
  if (!reaped(p, sh->pidfd, &si)) return;
  sh->dead = true;
  shell_retire(sh);
  /* a last report may still be in the pipe */
  int fd;
  char buf[65536];
  ssize_t n;
  if (uv_fileno((uv_handle_t *)&sh->pipes[2], &fd) == 0)
    while (sh->ctl.len < STATE_MAX + 64 && (n = read(fd, buf, sizeof buf)) > 0) sbx_buf_append(&sh->ctl, buf, n);
  shell_reports(sh);
  if (sh->cg.n) sbx_cg_kill(&sh->cg);
  sbx_exec *x = sh->cur;
  sh->cur = NULL;
  if (x) { /* the command ended the shell (exec, a signal): its status is the shell's */
    shell_drain(sh);
    x->exit_code = sbx_spawn_exit_code(&si);
    x->exited = true;
    finish(x);
  }
  uv_close((uv_handle_t *)&sh->pidpoll, shell_on_close);
  uv_close((uv_handle_t *)&sh->idle, shell_on_close);
  uv_close((uv_handle_t *)&sh->wake, shell_on_close);
  for (int i = 0; i < 3; i++) uv_close((uv_handle_t *)&sh->pipes[i], shell_on_close);
}

static sbx_shell *shell_start(uv_loop_t *loop, sbx_sandbox *sb, sbx_session *s, const char *cwd) {
  sbx_shell *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  sh->loop = loop;
  sh->pidfd = sh->cmdfd = -1;
  int fds[7] = {-1, -1, -1, -1, -1, -1, -1}, ours[4] = {-1, -1, -1, -1};
  sbx_error err = {0};
  if (cg_acquire(sb, &sh->cg) < 0) goto fail;
  if ((fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) goto fail;
  for (int i = 1; i < 4; i++) { /* stdout, stderr, status */
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) goto fail;
    ours[i] = p[0];
    fds[i] = p[1];
  }
  /* the script bash reads first: its head, then the session's state */
  if ((fds[4] = memfd_create("sbx-shell", MFD_CLOEXEC)) < 0 ||
      sbx_write_all(fds[4], shell_head, sizeof shell_head - 1) < 0 ||
      sbx_write_all(fds[4], s->shell ? s->shell : "", s->shell_len) < 0 || lseek(fds[4], 0, SEEK_SET) < 0)
    goto fail;
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) goto fail;
  fds[5] = p[0];
  ours[0] = p[1];
  if ((sh->cmdfd = memfd_create("sbx-command", MFD_CLOEXEC)) < 0 || (fds[6] = dup(sh->cmdfd)) < 0) goto fail;
  char *argv[] = {"/bin/bash", "-c", (char *)shell_main, "bash", NULL};
  sbx_spawn sp = {.argv = argv, .envp = s->env.v, .cwd = cwd, .fds = fds, .nfds = 7, .cg = &sh->cg};
  sh->pid = sbx_sandbox_spawn(sb, &sp, &sh->pidfd, &err);
  for (int i = 0; i < 7; i++) close(fds[i]), fds[i] = -1;
  if (sh->pid < 0) goto fail;

  uv_poll_init(loop, &sh->pidpoll, sh->pidfd);
  uv_timer_init(loop, &sh->idle);
  uv_pipe_init(loop, &sh->wake, 0);
  uv_pipe_open(&sh->wake, ours[0]);
  sh->pidpoll.data = sh->idle.data = sh->wake.data = sh;
  sh->handles = 6;
  for (int i = 0; i < 3; i++) {
    uv_pipe_init(loop, &sh->pipes[i], 0);
    sh->pipes[i].data = sh;
    uv_pipe_open(&sh->pipes[i], ours[i + 1]);
    uv_read_start((uv_stream_t *)&sh->pipes[i], sbx_read_alloc, shell_read_cb);
  }
  uv_poll_start(&sh->pidpoll, UV_READABLE, shell_pid_cb);
  sh->sb = sb;
  sh->session = s;
  sh->gen = s->gen;
  s->sh = sh;
  sh->next = all_shells;
  all_shells = sh;
  return sh;
fail:
  for (int i = 0; i < 7; i++)
    if (fds[i] >= 0) close(fds[i]);
  for (int i = 0; i < 4; i++)
    if (ours[i] >= 0) close(ours[i]);
  if (sh->cmdfd >= 0) close(sh->cmdfd);
  if (sh->cg.n) cg_release(sb, &sh->cg);
  free(sh);
  return NULL;
}

/* The session's idle shell holding its current state, started if need be;
 * NULL when the command must run on its own. */
static sbx_shell *shell_for(uv_loop_t *loop, sbx_sandbox *sb, sbx_session *s, const sbx_exec_opts *o,
                            const char *cwd) {
  if (!o->keep_session || o->background || o->discard || o->stdin_data || o->stdin_stream || o->stdio || o->cwd ||
      (o->env && o->env->n) ||
      !sb->cg.n)
    return NULL;
  sbx_shell *sh = s->sh;
  if (sh && (sh->cur || sh->dead)) return NULL; /* busy: this one runs on its own */
  if (sh && sh->gen != s->gen) {
    shell_kill(sh); /* another command changed the state meanwhile */
    sh = NULL;
  }
  if (!sh) {
    if (!sbx_fs_has_bash(sb)) return NULL;
    sh = shell_start(loop, sb, s, cwd);
  }
  return sh;
}

static int shell_send(sbx_shell *sh, const char *command) {
  size_t len = strlen(command);
  if (ftruncate(sh->cmdfd, 0) < 0 || lseek(sh->cmdfd, 0, SEEK_SET) < 0 ||
      pwrite(sh->cmdfd, command, len + 1, 0) != (ssize_t)(len + 1))
    return -1;
  int fd;
  if (uv_fileno((uv_handle_t *)&sh->wake, &fd) < 0 || write(fd, "g", 1) != 1) return -1;
  uv_timer_stop(&sh->idle);
  return 0;
}

void sbx_exec_shells_leave(sbx_sandbox *sb) {
  for (sbx_shell *sh = all_shells; sh; sh = sh->next)
    if (sh->sb == sb && !sh->cur) shell_kill(sh);
}

void sbx_exec_session_gone(sbx_session *s) {
  if (s->sh) {
    sbx_shell *sh = s->sh;
    shell_kill(sh);
    sh->sb = NULL;
  }
}

void sbx_exec_cancel_sandbox(sbx_sandbox *sb) {
  for (sbx_shell *sh = all_shells; sh; sh = sh->next)
    if (sh->sb == sb) {
      shell_kill(sh);
      sh->sb = NULL;
    }
  for (sbx_exec *x = all_execs; x; x = x->next)
    if (x->sb == sb && !x->done) {
      sbx_exec_cancel(x);
      if (!x->background) sb->running--;
      x->sb = NULL;
    }
}

int sbx_exec_start(uv_loop_t *loop, sbx_sandbox *sb, const sbx_exec_opts *o, sbx_exec_chunk_cb chunk_cb,
                   sbx_exec_done_cb done_cb, void *ud, sbx_exec **out, sbx_error *err) {
  const char *sid = o->session_id ? o->session_id : "default";
  sbx_session *s = sbx_session_find(sb, sid);
  if (!s) return sbx_err(err, "SESSION_NOT_FOUND", "no session '%s' in sandbox '%s'", sid, sb->id);
  char given[4096]; /* a relative cwd is under /workspace, as every path of the tools */
  if (o->cwd && sbx_fs_abspath(o->cwd, given, err) < 0) return -1;
  const char *cwd = o->cwd ? given : s->cwd;
  /* checked here, unless that would wait on a bucket mount: then the
   * command enters it itself, and fails if it cannot */
  int known = sbx_fs_check_dir_nowait(sb, cwd, err);
  bool strict_cwd = known == 1 && o->cwd;
  if (known < 0) {
    if (o->cwd) return -1;
    cwd = "/workspace"; /* the session's directory was removed */
    if (sbx_fs_check_dir_nowait(sb, cwd, err) < 0) cwd = "/";
  }
  if (o->stdin_len > SBX_MAX_STDIN)
    return sbx_err(err, "VALIDATION_FAILED", "stdin is limited to %d bytes; put larger input in files (writeFile) and redirect it",
                   SBX_MAX_STDIN);
  if (sb->running >= SBX_MAX_RUNNING)
    return sbx_err(err, "RESOURCE_LIMIT", "sandbox '%s' already runs %d commands and processes", sb->id, sb->running);

  sbx_exec *x = calloc(1, sizeof *x);
  if (!x) return sbx_err(err, "INTERNAL", "out of memory");
  x->loop = loop;
  x->sb = sb;
  x->pidfd = -1;
  x->s[0].file_fd = x->s[1].file_fd = -1;
  snprintf(x->session_id, sizeof x->session_id, "%s", sid);
  x->keep_session = o->keep_session;
  x->discard = o->discard;
  x->background = o->background;
  x->unattended = o->unattended;
  if (o->cwd) x->call_cwd = strdup(cwd);
  x->limit = o->max_output ? o->max_output : SBX_DEFAULT_MAX_OUTPUT;
  sbx_headtail_init(&x->s[0].ht, x->limit);
  sbx_headtail_init(&x->s[1].ht, x->limit);
  x->on_chunk = chunk_cb;
  x->raw_chunks = o->raw_chunks;
  x->line_cost = o->line_cost;
  x->on_done = done_cb;
  x->ud = ud;
  sbx_env env = {0};
  sbx_env_copy(&env, &s->env);
  if (o->env) {
    sbx_env_copy(&env, o->env);
    sbx_env_copy(&x->call_env, o->env);
  }

  sbx_procfiles_refresh(sb); /* free and top in it see its memory now */
  sbx_shell *sh = shell_for(loop, sb, s, o, cwd);
  if (sh && shell_send(sh, o->command) < 0) {
    shell_kill(sh);
    sh = NULL;
  }
  if (sh) {
    x->sh = sh;
    x->bash = true;
    x->pid = sh->pid;
    sh->cur = x;
    if (sb->cg.n) x->oom_before = sbx_cg_oom_kills(&sb->cg);
    sbx_env_clear(&env);
    x->start_us = sbx_now_us();
    uv_timer_init(loop, &x->timer);
    uv_timer_init(loop, &x->drain);
    x->timer.data = x->drain.data = x;
    x->handles = 2;
    if (o->timeout_ms > 0) uv_timer_start(&x->timer, timer_cb, o->timeout_ms, 0);
    goto started;
  }

  int fds[5] = {-1, -1, -1, -1, -1}, ours[4] = {-1, -1, -1, -1};
  int r = 0;
  if (sb->cg.n) {
    if ((r = cg_acquire(sb, &x->cg)) < 0) {
      sbx_err_errno(err, "INTERNAL", -r, "creating the command's cgroup");
      goto fail;
    }
    x->oom_before = sbx_cg_oom_kills(&sb->cg);
  }
  /* fd 0: stdin or /dev/null; 1, 2: output; 3: shell state */
  if (o->stdio && !o->stdio_out) {
    if ((fds[0] = fcntl(o->stdio_fd, F_DUPFD_CLOEXEC, 0)) < 0) goto fail_errno;
  } else if (o->stdin_data || o->stdin_stream) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) goto fail_errno;
    fds[0] = p[0];
    ours[0] = p[1];
  } else if ((fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
    goto fail_errno;
  }
  for (int i = 1; i < 4; i++) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) goto fail_errno;
    ours[i] = p[0];
    fds[i] = p[1];
  }
  if (o->stdio && o->stdio_out) { /* its stdout is the caller's; our pipe just ends */
    close(fds[1]);
    if ((fds[1] = fcntl(o->stdio_fd, F_DUPFD_CLOEXEC, 0)) < 0) goto fail_errno;
  }
  bool bash = sbx_fs_has_bash(sb);
  x->bash = bash;
  int nfds = 4;
  if (bash && s->shell_len) {
    /* the session's shell state, read by the wrapper from fd 4 */
    if ((fds[4] = memfd_create("sbx-shell", MFD_CLOEXEC)) < 0 || sbx_write_all(fds[4], s->shell, s->shell_len) < 0)
      goto fail_errno;
    nfds = 5;
  }
  char *argv[] = {bash ? "/bin/bash" : "/bin/sh", "-c", (char *)(bash ? bash_wrapper : sh_wrapper),
                  bash ? "bash" : "sh", (char *)o->command, bash ? (nfds == 5 ? "1" : "0") : NULL, NULL};
  sbx_spawn sp = {.argv = argv, .envp = env.v, .cwd = cwd, .strict_cwd = strict_cwd, .fds = fds, .nfds = nfds,
                  .cg = x->cg.n ? &x->cg : NULL};
  x->start_us = sbx_now_us();
  x->pid = sbx_sandbox_spawn(sb, &sp, &x->pidfd, err);
  for (int i = 0; i < 5; i++)
    if (fds[i] >= 0) close(fds[i]), fds[i] = -1;
  sbx_env_clear(&env);
  if (x->pid < 0) goto fail;

  uv_timer_init(loop, &x->timer);
  uv_timer_init(loop, &x->drain);
  uv_timer_init(loop, &x->resig);
  uv_poll_init(loop, &x->pidpoll, x->pidfd);
  x->timer.data = x->drain.data = x->resig.data = x->pidpoll.data = x;
  x->handles = 4;
  for (int i = 0; i < 3; i++) {
    uv_pipe_init(loop, &x->pipes[i], 0);
    x->pipes[i].data = x;
    x->handles++;
    uv_pipe_open(&x->pipes[i], ours[i + 1]);
    x->pipe_open[i] = true;
    uv_read_start((uv_stream_t *)&x->pipes[i], sbx_read_alloc, read_cb);
  }
  if (o->stdin_stream) {
    uv_pipe_init(loop, &x->in, 0);
    x->in.data = x;
    x->handles++;
    x->in_open = true;
    uv_pipe_open(&x->in, ours[0]);
  } else if (o->stdin_data) {
    uv_pipe_init(loop, &x->in, 0);
    x->in.data = x;
    x->handles++;
    x->in_open = true;
    uv_pipe_open(&x->in, ours[0]);
    x->stdin_copy = malloc(o->stdin_len + 1);
    memcpy(x->stdin_copy, o->stdin_data, o->stdin_len);
    uv_buf_t b = uv_buf_init(x->stdin_copy, o->stdin_len);
    x->in_req.data = x;
    if (uv_write(&x->in_req, (uv_stream_t *)&x->in, &b, 1, stdin_written) < 0) {
      close_handle(x, (uv_handle_t *)&x->in);
      x->in_open = false;
    }
  }
  uv_poll_start(&x->pidpoll, UV_READABLE, pid_cb);
  if (o->timeout_ms > 0) uv_timer_start(&x->timer, timer_cb, o->timeout_ms, 0);
started:
  if (x->keep_session) s->busy++; /* its session is not deleted under it (a process runs on a copy) */
  if (!x->background) sb->running++;
  x->next = all_execs;
  all_execs = x;
  if (out) *out = x;
  return 0;
fail_errno:
  sbx_err_errno(err, "INTERNAL", errno, "preparing the command");
fail:
  for (int i = 0; i < 5; i++)
    if (fds[i] >= 0) close(fds[i]);
  for (int i = 0; i < 4; i++)
    if (ours[i] >= 0) close(ours[i]);
  sbx_env_clear(&env);
  if (x->cg.n) cg_release(sb, &x->cg);
  sbx_headtail_free(&x->s[0].ht);
  sbx_headtail_free(&x->s[1].ht);
  sbx_env_clear(&x->call_env);
  free(x->call_cwd);
  free(x);
  return -1;
}
