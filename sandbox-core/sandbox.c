#define _GNU_SOURCE
#include "sandbox.h"
#include "rootfs.h"
#include "network.h"
#include "seccomp.h"
#include "disk.h"
#include "record.h"
#include "bucket.h"
#include "exec.h"
#include "preview.h"
#include "procfiles.h"
#include "config.h"
#include "spawner.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#define UID_RANGE 65536
#define UID_POOL_BASE 0x40000000u /* far above any host user's uid */

static struct {
  sbx_engine_config cfg;
  char *etc_template;
  int init_exe_fd;
  uint64_t incarnations;
  sbx_sandbox *list;
  sbx_sandbox *index[4096]; /* the list by id (id_slot), for a call's lookup among a thousand */
  int count;
  unsigned char *slots; /* uid ranges in use (root), SBX_MAX_SANDBOXES_CAP of them */
  int slots_used;
  int slots_fd; /* /run/sbx-uids.lock: a byte locked for each range in use (lock_slot), or -1 */
  int cap_last;
} eng;

/* sandboxes made ahead, oldest first (see "sandboxes made ahead") */
#define AHEAD_MAX 2
#define SETTLE_MS 2000 /* quiet this long, a sandbox's disk is checkpointed (sbx_disk_settle) */
#define SETTLES_PER_SWEEP 64
static struct {
  struct {
    sbx_sandbox *sb;
    int sock; /* its child waits on it for the name */
  } made[AHEAD_MAX];
  int n;
  unsigned seq;
  uv_timer_t timer;
  bool timer_ready;
} ahead;

#define START_TIMEOUT_MS 15000
#define START_MAX 4 /* starts at once (see "starts under way") */

typedef struct start_waiter {
  sbx_started_cb cb;
  void *ud;
  struct start_waiter *next;
} start_waiter;

typedef struct sbx_start {
  uv_poll_t poll; /* on sock, once its turn came (sock >= 0) */
  uv_timer_t timer;
  int sock;
  int open_handles;
  struct sbx_start *qnext; /* waiting for its turn */
  sbx_sandbox *sb;
  sbx_state before; /* its state again if the start fails */
  bool fresh;       /* a create: the sandbox goes if the start fails */
  bool ahead;       /* made ahead: started afresh once if it fails */
  start_waiter *waiters; /* in the order they came */
} sbx_start;

static struct {
  sbx_start *queue; /* waiting for their turn, oldest first */
  int running;
  uv_timer_t timer; /* the next turns, on the loop's next turn */
  bool timer_ready;
} starts;

static void start_abort(sbx_sandbox *sb, const char *code, const char *why);
static sbx_sandbox *ahead_take(const char *id, const sbx_sandbox_opts *opts, int *sock_out);
static void sandbox_free(sbx_sandbox *sb);
static void ahead_discard(int i, bool wait);
static void ahead_make(void);
static void ahead_soon(void);
static void stop_running_async(sbx_sandbox *sb, bool wait);
static void stop_running(sbx_sandbox *sb);
static void bury_all(void);
static bool lock_slot(int slot, short type);
static int session_new(sbx_sandbox *sb, const char *id, const char *cwd, const sbx_env *env, sbx_session **out,
                       sbx_error *err);

/* The session every call without a sessionId uses, fresh when it is not there. */
static void ensure_default_session(sbx_sandbox *sb) {
  sbx_session *def;
  if (!sbx_session_find(sb, "default")) session_new(sb, "default", "/workspace", &sb->opts.env, &def, NULL);
}
static uint64_t wall_ms(void);

/* ---- environments ------------------------------------------------------ */

static size_t key_len(const char *kv) {
  const char *eq = strchr(kv, '=');
  return eq ? (size_t)(eq - kv) : strlen(kv);
}

int sbx_env_set(sbx_env *e, const char *key, const char *value) {
  size_t kl = strlen(key);
  char *kv = sbx_strdup_printf("%s=%s", key, value);
  if (!kv) return -ENOMEM;
  for (size_t i = 0; i < e->n; i++)
    if (key_len(e->v[i]) == kl && !strncmp(e->v[i], key, kl)) {
      free(e->v[i]);
      e->v[i] = kv;
      return 0;
    }
  if (e->n >= SBX_MAX_ENV) {
    free(kv);
    return -E2BIG;
  }
  char **nv = realloc(e->v, (e->n + 2) * sizeof *nv);
  if (!nv) {
    free(kv);
    return -ENOMEM;
  }
  e->v = nv;
  e->v[e->n++] = kv;
  e->v[e->n] = NULL;
  return 0;
}

const char *sbx_env_get(const sbx_env *e, const char *key) {
  size_t kl = strlen(key);
  for (size_t i = 0; i < e->n; i++)
    if (key_len(e->v[i]) == kl && !strncmp(e->v[i], key, kl)) return e->v[i] + kl + 1;
  return NULL;
}

void sbx_env_unset(sbx_env *e, const char *key) {
  size_t kl = strlen(key);
  for (size_t i = 0; i < e->n; i++)
    if (key_len(e->v[i]) == kl && !strncmp(e->v[i], key, kl)) {
      free(e->v[i]);
      memmove(&e->v[i], &e->v[i + 1], (e->n - i) * sizeof *e->v);
      e->n--;
      return;
    }
}

void sbx_env_clear(sbx_env *e) {
  for (size_t i = 0; i < e->n; i++) free(e->v[i]);
  free(e->v);
  *e = (sbx_env){0};
}

int sbx_env_copy(sbx_env *dst, const sbx_env *src) {
  for (size_t i = 0; i < src->n; i++) {
    size_t kl = key_len(src->v[i]);
    char key[256];
    if (kl >= sizeof key) continue;
    memcpy(key, src->v[i], kl);
    key[kl] = 0;
    int r = sbx_env_set(dst, key, src->v[i][kl] ? src->v[i] + kl + 1 : "");
    if (r < 0) return r;
  }
  return 0;
}

/* Appends the value of bash's $'...' quoting from t[i] (just past the
 * opening quote) and returns the index past the closing quote. */
static size_t ansi_c_unquote(sbx_buf *val, const char *t, size_t i, size_t len) {
  while (i < len && t[i] != '\'') {
    if (t[i] != '\\' || i + 1 >= len) {
      sbx_buf_append(val, t + i++, 1);
      continue;
    }
    char c = t[++i], out = c;
    i++;
    switch (c) {
    case 'a': out = '\a'; break;
    case 'b': out = '\b'; break;
    case 'e':
    case 'E': out = 033; break;
    case 'f': out = '\f'; break;
    case 'n': out = '\n'; break;
    case 'r': out = '\r'; break;
    case 't': out = '\t'; break;
    case 'v': out = '\v'; break;
    case 'c':
      if (i < len) out = t[i++] & 037;
      break;
    case 'x': {
      unsigned v = 0;
      int n = 0;
      for (; n < 2 && i < len && isxdigit((unsigned char)t[i]); n++, i++)
        v = v * 16 + (isdigit((unsigned char)t[i]) ? t[i] - '0' : (tolower((unsigned char)t[i]) - 'a' + 10));
      out = n ? (char)v : 'x';
      if (!n) sbx_buf_append(val, "\\", 1);
      break;
    }
    default:
      if (c >= '0' && c <= '7') {
        unsigned v = c - '0';
        for (int n = 1; n < 3 && i < len && t[i] >= '0' && t[i] <= '7'; n++, i++) v = v * 8 + (t[i] - '0');
        out = (char)v;
      } else if (!strchr("\\'\"?", c)) {
        sbx_buf_append(val, "\\", 1); /* not an escape: kept as written */
      }
    }
    sbx_buf_append(val, &out, 1);
  }
  return i < len ? i + 1 : i;
}

/* The output of `export -p`: dash prints lines `export NAME='value'` (a
 * quote inside written '"'"' or '\'') whose values may span lines; bash
 * prints `declare -x NAME="value"`, with $'...' for control characters.
 * `export NAME` and `declare -x NAME` have no value and are skipped. */
int sbx_env_parse_export(sbx_env *e, const char *t, size_t len) {
  size_t i = 0;
  while (i < len) {
    while (i < len && (t[i] == '\n' || t[i] == ' ')) i++;
    static const char kw[] = "export ", decl[] = "declare -";
    if (i + sizeof decl - 1 <= len && !strncmp(t + i, decl, sizeof decl - 1)) {
      size_t f = i + sizeof decl - 1;
      while (f < len && isalpha((unsigned char)t[f])) f++;
      if (f >= len || t[f] != ' ' || !memchr(t + i + sizeof decl - 1, 'x', f - (i + sizeof decl - 1))) {
        while (i < len && t[i] != '\n') i++; /* not exported */
        continue;
      }
      i = f + 1;
    } else if (i + sizeof kw - 1 <= len && !strncmp(t + i, kw, sizeof kw - 1)) {
      i += sizeof kw - 1;
    } else {
      while (i < len && t[i] != '\n') i++; /* not ours: skip the line */
      continue;
    }
    size_t ks = i;
    while (i < len && t[i] != '=' && t[i] != '\n') i++;
    char key[256];
    size_t kl = i - ks;
    if (kl == 0 || kl >= sizeof key) continue;
    memcpy(key, t + ks, kl);
    key[kl] = 0;
    if (i >= len || t[i] != '=') continue; /* exported without a value */
    i++;
    sbx_buf val = {0};
    while (i < len && t[i] != '\n') {
      if (t[i] == '$' && i + 1 < len && t[i + 1] == '\'') {
        i = ansi_c_unquote(&val, t, i + 2, len);
      } else if (t[i] == '\'') {
        size_t q = ++i;
        while (i < len && t[i] != '\'') i++;
        sbx_buf_append(&val, t + q, i - q);
        if (i < len) i++;
      } else if (t[i] == '"') {
        i++;
        while (i < len && t[i] != '"') {
          if (t[i] == '\\' && i + 1 < len && strchr("\\\"$`", t[i + 1])) i++;
          sbx_buf_append(&val, t + i, 1);
          i++;
        }
        if (i < len) i++;
      } else if (t[i] == '\\' && i + 1 < len) {
        sbx_buf_append(&val, t + i + 1, 1);
        i += 2;
      } else {
        sbx_buf_append(&val, t + i, 1);
        i++;
      }
    }
    if (strcmp(key, "_") != 0) {
      int r = sbx_env_set(e, key, val.data ? val.data : "");
      sbx_buf_free(&val);
      if (r < 0) return r;
    } else {
      sbx_buf_free(&val);
    }
  }
  return 0;
}

/* ---- engine ------------------------------------------------------------ */

const sbx_engine_config *sbx_engine_cfg(void) { return &eng.cfg; }

static sbx_sandbox *sandbox_new(const char *id) {
  sbx_sandbox *sb = calloc(1, sizeof *sb);
  if (!sb) return NULL;
  snprintf(sb->id, sizeof sb->id, "%.63s", id);
  sb->slot = -1;
  sb->init_pidfd = sb->rootfd = sb->net_pidfd = sb->meminfo_fd = -1;
  return sb;
}

static void changed(const char *id, const char *event) {
  if (eng.cfg.on_change) eng.cfg.on_change(id, event);
}

static sbx_sandbox **id_slot(const char *id) { return &eng.index[sbx_fnv1a(id) % SBX_ARRAY_SIZE(eng.index)]; }

static void sandbox_link(sbx_sandbox *sb) {
  eng.count++;
  sb->next = eng.list;
  eng.list = sb;
  sbx_sandbox **slot = id_slot(sb->id);
  sb->hnext = *slot;
  *slot = sb;
}

/* Out of the list and the index. */
static void sandbox_unlink(sbx_sandbox *sb) {
  for (sbx_sandbox **pp = &eng.list; *pp; pp = &(*pp)->next)
    if (*pp == sb) {
      *pp = sb->next;
      eng.count--;
      break;
    }
  for (sbx_sandbox **pp = id_slot(sb->id); *pp; pp = &(*pp)->hnext)
    if (*pp == sb) {
      *pp = sb->hnext;
      break;
    }
}

/* The sandboxes of earlier daemons, from their records: stopped (their
 * files intact) or asleep. Records that do not parse are left alone. */
static void load_records(void) {
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/sandboxes", eng.cfg.state_dir);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!sbx_valid_id(e->d_name) || sbx_sandbox_find(e->d_name)) continue;
    char path[1500], why[256] = "";
    snprintf(path, sizeof path, "%s/%s/" SBX_FILE_RECORD, dir, e->d_name);
    json_error_t je;
    json_t *rec = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    sbx_sandbox *sb = rec ? sandbox_new(e->d_name) : NULL;
    if (!rec) snprintf(why, sizeof why, "%s", je.text);
    if (sb && sbx_record_apply(sb, rec, why, sizeof why) == 0) {
      sb->restart_pending = sb->state == SBX_STOPPED;
      if (sb->state == SBX_STOPPED && !sbx_disk_exists(sb->id)) sb->state = SBX_ASLEEP, sb->reset_pending = true;
      sb->last_activity_wall_ms = wall_ms();
      uint64_t used = (uint64_t)json_integer_value(json_object_get(rec, "lastActivity"));
      sb->last_used_wall_ms = used && used <= sb->last_activity_wall_ms ? used : sb->last_activity_wall_ms;
      sb->saved_record = json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS);
      sandbox_link(sb);
      sb = NULL;
    } else if (eng.cfg.warn) {
      char msg[1800];
      snprintf(msg, sizeof msg, "sandbox record %s is not usable (%s); left as it is", path, why);
      eng.cfg.warn(msg);
    }
    if (sb) sandbox_free(sb);
    json_decref(rec);
  }
  if (d) closedir(d);
}

int sbx_engine_init(const sbx_engine_config *cfg, sbx_error *err) {
  eng.cfg = *cfg;
  eng.cfg.state_dir = strdup(cfg->state_dir);
  eng.cfg.runtime_dir = strdup(cfg->runtime_dir);
  if (eng.cfg.max_sandboxes <= 0) eng.cfg.max_sandboxes = 1024;
  if (!eng.cfg.default_limits.disk_mb)
    eng.cfg.default_limits = (sbx_limits){.memory_mb = 2048, .cpus = 1, .pids = 1024, .disk_mb = 8192};
  eng.slots = calloc(SBX_MAX_SANDBOXES_CAP, 1);
  if (!eng.slots) return sbx_err(err, "INTERNAL", "out of memory");
  eng.slots_fd = cfg->rootless ? -1 : open("/run/sbx-uids.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  int r = sbx_seccomp_compile();
  if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "compiling the seccomp policy");
  if (!cfg->rootless) {
    r = sbx_cg_init();
    if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "setting up cgroups");
  } else {
    sbx_cg_init(); /* a delegated cgroup may still work; limits say if not */
  }
  _cleanup_fclose_ FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
  if (!f || fscanf(f, "%d", &eng.cap_last) != 1) eng.cap_last = CAP_LAST_CAP;
  /* sbx-init lives beside sbx (in the build dir, or where both are installed) */
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    strcpy(slash ? slash + 1 : exe, "sbx-init");
    eng.init_exe_fd = open(exe, O_PATH | O_CLOEXEC);
  }
  if (n <= 0 || eng.init_exe_fd < 0) return sbx_err_errno(err, "INTERNAL", errno, "opening %s", n > 0 ? exe : "sbx-init");
  /* templates of daemons that died without cleaning up */
  char *rootfs = sbx_strdup_printf("%s/rootfs", cfg->state_dir);
  DIR *d = opendir(rootfs);
  if (d) {
    struct dirent *e;
    int pid;
    while ((e = readdir(d)))
      if (sscanf(e->d_name, "etc-%d", &pid) == 1 && pid != getpid() && !sbx_daemon_alive(pid))
        sbx_remove_tree_at(dirfd(d), e->d_name, true);
    closedir(d);
  }
  free(rootfs);
  eng.etc_template = sbx_strdup_printf("%s/rootfs/etc-%d", cfg->state_dir, getpid());
  r = sbx_rootfs_build_etc(eng.etc_template);
  if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "building the /etc template in %s", eng.etc_template);
  if (sbx_disk_init(cfg->state_dir, cfg->rootless, err) < 0) return -1;
  /* the default size is formatted now, not on the first create */
  if (sbx_disk_template(eng.cfg.default_limits.disk_mb, err) < 0) return -1;
  /* the directories of sandboxes made ahead by a daemon that died */
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/sandboxes", cfg->state_dir);
  d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (!strncmp(e->d_name, "_ahead-", 7)) sbx_disk_remove(e->d_name, -1);
  if (d) closedir(d);
  /* before the records fill the heap: see spawner.h */
  if (eng.cfg.loop) sbx_spawner_start(eng.cfg.loop);
  if (eng.cfg.loop) sbx_disk_pool_start(eng.cfg.loop, eng.cfg.default_limits.disk_mb, ahead_soon);
  load_records();
  if (eng.cfg.loop) sbx_bucket_init();
  return 0;
}

void sbx_engine_shutdown(void) {
  sbx_bucket_shutdown(); /* the sandboxes leave memory, not the state dir: their bucket caches stay */
  /* every init is told first, then waited for: they die in parallel */
  for (sbx_sandbox *sb = eng.list, *next; sb; sb = next) {
    next = sb->next;
    bool fresh = sb->start && sb->start->fresh;
    start_abort(sb, "INTERNAL", "was stopped with the daemon");
    if (fresh) { /* a create that had not answered: no record, nothing left */
      sandbox_unlink(sb);
      int shut = sbx_disk_fd(sb->id, sb->rootfd);
      stop_running_async(sb, false); /* waited for with the others below */
      sbx_disk_remove(sb->id, shut);
      sandbox_free(sb);
      continue;
    }
    sb->stopping = true;
    sbx_sandbox_save(sb); /* sessions as they are now, and when it was last used */
    stop_running_async(sb, false);
  }
  while (ahead.n) ahead_discard(ahead.n - 1, false);
  if (ahead.timer_ready) uv_close((uv_handle_t *)&ahead.timer, NULL);
  ahead.timer_ready = false;
  if (starts.timer_ready) uv_close((uv_handle_t *)&starts.timer, NULL);
  starts.timer_ready = false;
  bury_all();
  sbx_disk_pool_stop();
  sbx_spawner_stop();
  while (eng.list) {
    sbx_sandbox *sb = eng.list;
    sandbox_unlink(sb);
    sandbox_free(sb);
  }
  sbx_cg_shutdown();
  if (eng.etc_template) sbx_remove_tree_at(AT_FDCWD, eng.etc_template, true);
}

/* ---- sandboxes --------------------------------------------------------- */

void sbx_sandbox_default_opts(sbx_sandbox_opts *o) {
  *o = (sbx_sandbox_opts){
      .limits = eng.cfg.default_limits.disk_mb ? eng.cfg.default_limits
                                               : (sbx_limits){.memory_mb = 2048, .cpus = 1, .pids = 1024, .disk_mb = 8192},
      .sleep_after_ms = 10 * 60 * 1000,
  };
}

sbx_sandbox *sbx_sandbox_find(const char *id) {
  for (sbx_sandbox *s = *id_slot(id); s; s = s->hnext)
    if (!strcmp(s->id, id)) return s;
  return NULL;
}

sbx_sandbox *sbx_sandbox_list(void) { return eng.list; }
int sbx_sandbox_count(void) { return eng.count; }

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sbx_sandbox_touch(sbx_sandbox *sb) {
  sb->last_activity_wall_ms = sb->last_used_wall_ms = wall_ms();
  sb->settled = false;
}

unsigned sbx_sandbox_uids(void) { return eng.cfg.rootless ? 1 : UID_RANGE; }

bool sbx_sandbox_alive(sbx_sandbox *sb) {
  struct pollfd p = {.fd = sb->init_pidfd, .events = POLLIN};
  return sb->state == SBX_RUNNING && sb->init_pidfd >= 0 && poll(&p, 1, 0) == 0;
}

sbx_enforced sbx_sandbox_enforced(sbx_sandbox *sb) {
  bool cg = sb->cg.n > 0;
  /* without a cgroup, pids still holds: RLIMIT_NPROC in the sandbox's own
   * user namespace (see the one way in) */
  return (sbx_enforced){.memory = cg && sb->opts.limits.memory_mb, .cpus = cg && sb->opts.limits.cpus > 0,
                        .pids = sb->opts.limits.pids > 0, .disk = sbx_disk_quota_enforced()};
}

const char *sbx_sandbox_status(sbx_sandbox *sb) {
  switch (sb->state) {
  case SBX_ASLEEP: return "sleeping";
  case SBX_STOPPED: return "stopped";
  case SBX_STARTING: return "starting";
  default: return sbx_sandbox_alive(sb) ? "running" : "failed";
  }
}

int sbx_sandbox_save(sbx_sandbox *sb) {
  json_t *rec = sbx_record_json(sb);
  char *text = json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(rec);
  if (!text) return -ENOMEM;
  if (sb->saved_record && !strcmp(sb->saved_record, text)) {
    free(text);
    return 0;
  }
  char path[1300];
  sbx_disk_dir(sb->id, path, sizeof path);
  mkdir(path, 0700);
  strcat(path, "/" SBX_FILE_RECORD);
  int r = sbx_write_atomic(path, text, strlen(text));
  if (r == 0) {
    free(sb->saved_record);
    sb->saved_record = text;
  } else {
    free(text);
  }
  return r;
}

static int write_maps(pid_t pid, uid_t base, bool rootless) {
  char path[64], map[64];
  int r;
  if (rootless) {
    snprintf(path, sizeof path, "/proc/%d/setgroups", pid);
    if ((r = sbx_write_string(path, "deny")) < 0) return r;
    snprintf(map, sizeof map, "0 %u 1\n", (unsigned)getuid());
  } else {
    snprintf(map, sizeof map, "0 %u %u\n", (unsigned)base, UID_RANGE);
  }
  snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
  if ((r = sbx_write_string(path, map)) < 0) return r;
  if (rootless) snprintf(map, sizeof map, "0 %u 1\n", (unsigned)getgid());
  snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
  return sbx_write_string(path, map);
}

static int idmap(int fd, int userns, bool recursive) {
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = userns};
  return mount_setattr(fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr, sizeof attr) < 0 ? -errno : 0;
}

/* Root mode: the lower layers as mounts idmapped to the sandbox's user
 * namespace, so sandbox root owns them and overlay copy-up works. */
static int idmapped_layers(int userns, const sbx_layer *layers, int nl, int *fds, int *n, sbx_error *err) {
  for (int i = 0; i < nl; i++) {
    int fd = open_tree(AT_FDCWD, layers[i].host, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (fd < 0) return sbx_err_errno(err, "INTERNAL", errno, "cloning %s", layers[i].host);
    fds[(*n)++] = fd;
    int r = idmap(fd, userns, true);
    if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "idmapping %s", layers[i].host);
  }
  return 0;
}

static int send_go(int sock, const int *fds, int n) {
  return sbx_send_fds(sock, "g", 1, fds, n, 0) == 1 ? 0 : -errno;
}

/* The init's reply: "ok" with its root directory fd, or an error text. */
static ssize_t recv_reply(int sock, char *buf, size_t len, int *fd) {
  return sbx_recv_fds(sock, buf, len, fd, 1, NULL, 0);
}

void sbx_session_free(sbx_session *s) {
  sbx_exec_session_gone(s);
  free(s->cwd);
  free(s->shell);
  sbx_env_clear(&s->env);
  free(s);
}

static void free_sessions(sbx_sandbox *sb) {
  while (sb->sessions) {
    sbx_session *s = sb->sessions;
    sb->sessions = s->next;
    sbx_session_free(s);
  }
}

/* What is left of a sandbox being torn down: its init is dying (and with
 * it the whole pid namespace, its mounts, its disk); its cgroups and its
 * uid range are released once it is gone. */
typedef struct grave {
  uv_poll_t poll;
  int pidfd, slot;
  sbx_cgroup cg;
  struct grave *next;
} grave;
static grave *graves;

static void grave_closed(uv_handle_t *h) { free(h->data); }

static void bury(grave *g) {
  if (g->pidfd >= 0) {
    siginfo_t si;
    /* init dies only after every process of its pid namespace is gone */
    while (waitid(P_PIDFD, g->pidfd, &si, WEXITED) < 0 && errno == EINTR) {
    }
    close(g->pidfd);
    g->pidfd = -1;
  }
  if (g->cg.n) {
    /* supervisors' leftovers, if any (a freeze on v1 waits for the
     * freezer's lock, held by other cgroups' moves and makes: 8-20 ms in
     * a burst, for a cgroup that is almost always empty here) */
    if (sbx_cg_populated(&g->cg)) sbx_cg_kill(&g->cg);
    sbx_cg_remove(&g->cg);
  }
  sbx_cg_free(&g->cg);
  if (g->slot >= 0) {
    eng.slots[g->slot] = 0;
    eng.slots_used--;
    lock_slot(g->slot, F_UNLCK); /* the host's claim goes */
  }
  g->slot = -1;
}

static void grave_ready(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  grave *g = p->data;
  for (grave **pp = &graves; *pp; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      break;
    }
  uv_poll_stop(p);
  bury(g);
  uv_close((uv_handle_t *)p, grave_closed);
}

/* Releases what a running sandbox holds: its processes (init's death takes
 * the whole pid namespace, and with it every mount: its disk is unmounted),
 * its cgroups, its root fd and its uid range. Record, sessions and disk
 * stay. With a loop the release finishes in the background (a destroy or a
 * reset answers at once); without one it is done on return. */
static void stop_running_async(sbx_sandbox *sb, bool wait) {
  sbx_bucket_stopped(sb); /* its mounts go with its mount namespace */
  sbx_exec_cancel_sandbox(sb); /* commands left (code contexts) no longer hand cgroups back to it */
  sbx_net_stop(sb);
  grave *g = calloc(1, sizeof *g);
  if (!g) wait = true;
  grave local = {.pidfd = sb->init_pidfd, .slot = sb->slot, .cg = sb->cg};
  if (sb->init_pidfd >= 0) sbx_pidfd_send_signal(sb->init_pidfd, SIGKILL);
  sb->init_pidfd = -1;
  sb->slot = -1;
  sb->cg = (sbx_cgroup){0};
  if (sb->rootfd >= 0) close(sb->rootfd);
  sb->rootfd = -1;
  sbx_procfiles_close(sb);
  for (int i = 0; i < sb->cg_pool_n; i++) sbx_cg_free(&sb->cg_pool[i]);
  sb->cg_pool_n = 0;
  if (wait || !eng.cfg.loop || local.pidfd < 0) {
    bury(&local);
    free(g);
    return;
  }
  *g = local;
  g->poll.data = g;
  if (uv_poll_init(eng.cfg.loop, &g->poll, g->pidfd) < 0) {
    bury(g);
    free(g);
    return;
  }
  uv_poll_start(&g->poll, UV_READABLE, grave_ready);
  g->next = graves;
  graves = g;
}

static void stop_running(sbx_sandbox *sb) { stop_running_async(sb, true); }

/* Waits for every sandbox being torn down. */
static void bury_all(void) {
  while (graves) {
    grave *g = graves;
    graves = g->next;
    uv_poll_stop(&g->poll);
    bury(g);
    uv_close((uv_handle_t *)&g->poll, grave_closed);
  }
}

static void sandbox_free(sbx_sandbox *sb) {
  start_abort(sb, "INTERNAL", "was stopped");
  stop_running(sb);
  free_sessions(sb);
  sbx_env_clear(&sb->opts.env);
  sbx_strv_clear(&sb->opts.allowed_hosts);
  sbx_bucket_free_all(sb);
  sbx_preview_free(sb);
  json_decref(sb->code_gone);
  free(sb->saved_record);
  free(sb);
}

#define NS_FLAGS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC)

/* A uid range is claimed on the host, not only in this daemon: two daemons
 * (other state directories) gave their sandboxes the same host uids. The
 * claim is an open file description lock on byte SLOT of
 * /run/sbx-uids.lock, held while the range is in use and gone with the
 * daemon (one fd for all: a file a sandbox would have cost every later
 * fork a descriptor more to copy and close); a host where the file cannot
 * be made has the daemon's own count only. */
static bool lock_slot(int slot, short type) {
  struct flock l = {.l_type = type, .l_whence = SEEK_SET, .l_start = slot, .l_len = 1};
  return eng.slots_fd < 0 || fcntl(eng.slots_fd, F_OFD_SETLK, &l) == 0;
}

static int take_slot(sbx_sandbox *sb, sbx_error *err) {
  if (eng.cfg.rootless) {
    sb->uid_base = getuid();
    return 0;
  }
  if (eng.slots_used >= eng.cfg.max_sandboxes && ahead.n && sb->id[0] != '_') /* a range made ahead is wanted now */
    ahead_discard(ahead.n - 1, true);
  if (eng.slots_used >= eng.cfg.max_sandboxes)
    return sbx_err(err, "RESOURCE_LIMIT", "at most %d sandboxes may run at once", eng.cfg.max_sandboxes);
  int slot = 0;
  while (slot < SBX_MAX_SANDBOXES_CAP && (eng.slots[slot] || !lock_slot(slot, F_WRLCK))) slot++;
  if (slot >= SBX_MAX_SANDBOXES_CAP)
    return sbx_err(err, "RESOURCE_LIMIT", "no uid range is free on this host (other sbx daemons hold them all)");
  eng.slots[slot] = 1;
  eng.slots_used++;
  sb->slot = slot;
  sb->uid_base = UID_POOL_BASE + (uid_t)slot * UID_RANGE;
  return 0;
}

/* Starts a sandbox from its record: uid range, cgroup, disk, namespaces,
 * and init, which builds the root filesystem meanwhile: it returns once
 * that is under way, with the socket init answers on in *sock_out
 * (start_finish does the rest). Made ahead (ahead set): only on a fresh
 * disk of the pool, and its child waits on that socket for a name first. */
static int start(sbx_sandbox *sb, bool ahead, int *sock_out, sbx_error *err) {
  const char *id = sb->id;
  const sbx_sandbox_opts *opts = &sb->opts;
  int diskfd = -1;
  if (take_slot(sb, err) < 0) return -1;
  sb->incarnation = ++eng.incarnations; /* what of the last one still winds down is told apart */
  if (sbx_cg_available()) {
    /* one name per incarnation: a command of a destroyed sandbox that is
     * still winding down can never touch a new sandbox of the same id */
    char name[96];
    snprintf(name, sizeof name, "%s.%llu", id, (unsigned long long)sb->incarnation);
    int r = sbx_cg_create(NULL, name, true, &sb->cg);
    if (r == 0) r = sbx_cg_apply(&sb->cg, &opts->limits);
    if (r < 0 && (opts->limits_explicit || !eng.cfg.rootless)) {
      stop_running(sb);
      return sbx_err_errno(err, "RESOURCE_LIMIT", -r, "applying limits to sandbox '%s'", id);
    }
    if (r < 0) sbx_cg_free(&sb->cg);
  } else if (opts->limits_explicit) {
    stop_running(sb);
    return sbx_err(err, "RESOURCE_LIMIT",
                   "limits cannot be enforced: this daemon has no cgroup it may write (see `sbx doctor`)");
  }
  if (opts->disk_explicit && !sbx_disk_quota_enforced()) {
    stop_running(sb);
    return sbx_err(err, "RESOURCE_LIMIT", "diskMB cannot be enforced here: %s (see `sbx doctor`)",
                   eng.cfg.rootless ? "a rootless daemon keeps disks as plain directories"
                                    : "no loop devices (/dev/loop-control)");
  }
  if (!eng.cfg.rootless && !sbx_disk_exists(id)) diskfd = sbx_disk_take_fresh(id, opts->limits.disk_mb);
  if (diskfd < 0 && ahead) {
    stop_running(sb);
    return sbx_err(err, "RESOURCE_LIMIT", "no fresh disk ready");
  }
  if (diskfd < 0 && sbx_disk_ensure(id, opts->limits.disk_mb, err) < 0) {
    stop_running(sb);
    return -1;
  }
  if (!eng.cfg.rootless && diskfd < 0 && (diskfd = sbx_disk_mount(id, err)) < 0) {
    stop_running(sb);
    return -1;
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    if (diskfd >= 0) close(diskfd);
    stop_running(sb);
    return sbx_err_errno(err, "INTERNAL", errno, "socketpair");
  }
  sbx_init_args args = {.sock = sv[1], .id = sb->id, .ahead = ahead, .idmapped = !eng.cfg.rootless,
                        .etc_template = eng.etc_template, .init_exe_fd = eng.init_exe_fd};
  if (eng.cfg.rootless) sbx_disk_path(id, args.disk_dir, sizeof args.disk_dir);
  char image_dir[1100];
  if (opts->image[0]) {
    snprintf(image_dir, sizeof image_dir, "%s/images/%s", eng.cfg.state_dir, opts->image);
    struct stat st;
    /* a real directory: a symlink could name the host's own / (and its /etc) */
    if (lstat(image_dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
      close(sv[0]), close(sv[1]);
      if (diskfd >= 0) close(diskfd);
      stop_running(sb);
      return sbx_err(err, "VALIDATION_FAILED", "no image '%s' (a directory under %s/images/)", opts->image,
                     eng.cfg.state_dir);
    }
    snprintf(image_dir + strlen(image_dir), sizeof image_dir - strlen(image_dir), "/usr");
    if (stat(image_dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
      close(sv[0]), close(sv[1]);
      if (diskfd >= 0) close(diskfd);
      stop_running(sb);
      return sbx_err(err, "VALIDATION_FAILED", "image '%s' has no usr/ directory", opts->image);
    }
    image_dir[strlen(image_dir) - 4] = 0;
    args.image_dir = image_dir;
  }
  args.nlayers = sbx_rootfs_layers(args.image_dir, eng.etc_template, args.layers);
  uint64_t half = opts->limits.memory_mb / 2;
  args.dev_mb = !opts->limits.memory_mb || half >= SBX_DEV_MB ? SBX_DEV_MB : half ? (unsigned)half : 1;
  sbx_rootfs_scan(args.image_dir ? args.image_dir : "", &args);
  sbx_procfiles pf;
  int r0;
  if ((r0 = sbx_procfiles_open(sb, &pf)) < 0) {
    close(sv[0]), close(sv[1]);
    if (diskfd >= 0) close(diskfd);
    stop_running(sb);
    return sbx_err_errno(err, "INTERNAL", -r0, "writing the /proc files of sandbox '%s'", id);
  }
  args.meminfo = pf.has_meminfo;
  args.cpu_online = sb->cpu_online = pf.has_online;
  snprintf(args.procdir, sizeof args.procdir, "%s/sandboxes/%s", eng.cfg.state_dir, sb->id);
  int pidfd = -1;
  /* a wake's bucket mounts, attached by init as it builds the root */
  int bfds[SBX_INIT_MOUNTS_MAX];
  args.nmounts = ahead ? 0 : sbx_bucket_start_mounts(sb, args.mount_paths, bfds);
  /* init keeps every signal blocked: sbx-init waits for SIGCHLD with sigwaitinfo */
  /* As root, the user namespace is created with the sandbox's own host uid
   * as effective uid: the kernel charges per-user counts (inotify
   * instances, message queues, pending signals...) of a namespace to its
   * owner, so each sandbox gets its own instead of sharing host root's.
   * The real and saved ids stay 0: nothing running as that uid may signal
   * or trace what clones it. */
  pid_t pid = sbx_spawn_init(&args, sv[0], NS_FLAGS, eng.cfg.rootless ? (uid_t)-1 : sb->uid_base, &pidfd);
  close(sv[1]);
  if (pid < 0) {
    int e = errno;
    for (int i = 0; i < args.nmounts; i++) close(bfds[i]);
    if (pf.meminfo >= 0) close(pf.meminfo);
    if (pf.online >= 0) close(pf.online);
    close(sv[0]);
    if (diskfd >= 0) close(diskfd);
    stop_running(sb);
    return sbx_err_errno(err, "INTERNAL", e, "creating the namespaces of sandbox '%s'", id);
  }
  sb->init_pid = pid;
  sb->init_pidfd = pidfd;
  int fds[SBX_LAYERS_MAX + SBX_INIT_MOUNTS_MAX + 3], nfds = 0, r = 0;
  if ((r = write_maps(pid, sb->uid_base, eng.cfg.rootless)) < 0) {
    sbx_err_errno(err, "INTERNAL", -r, "writing the uid map of sandbox '%s'", id);
    goto fail;
  }
  if (sb->cg.n && (r = sbx_cg_add_pid(&sb->cg, pid)) < 0) {
    sbx_err_errno(err, "INTERNAL", -r, "moving sandbox '%s' into its cgroup", id);
    goto fail;
  }
  if (!eng.cfg.rootless) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
    _cleanup_close_ int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (userns < 0) {
      sbx_err_errno(err, "INTERNAL", errno, "opening %s", path);
      goto fail;
    }
    /* the disk's files are stored as the sandbox sees them (root is 0), so
     * they keep their owners whatever host range the next start gets */
    fds[nfds++] = diskfd;
    diskfd = -1;
    if ((r = idmap(fds[0], userns, false)) < 0) {
      sbx_err_errno(err, "INTERNAL", -r, "idmapping the disk of sandbox '%s'", id);
      goto fail;
    }
    if (idmapped_layers(userns, args.layers, args.nlayers, fds, &nfds, err) < 0) goto fail;
    for (int i = 0; i < args.nmounts; i++) fds[nfds++] = bfds[i];
    args.nmounts = 0;
  }
  if (pf.meminfo >= 0) fds[nfds++] = pf.meminfo, pf.meminfo = -1;
  if (pf.online >= 0) fds[nfds++] = pf.online, pf.online = -1;
  r = send_go(sv[0], fds, nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  nfds = 0;
  if (r < 0) {
    sbx_err_errno(err, "INTERNAL", -r, "starting sandbox '%s'", id);
    goto fail;
  }
  sbx_bucket_start_servers(sb);
  *sock_out = sv[0];
  return 0;
fail:
  for (int i = 0; i < nfds; i++) close(fds[i]);
  for (int i = 0; i < args.nmounts; i++) close(bfds[i]);
  if (diskfd >= 0) close(diskfd);
  if (pf.meminfo >= 0) close(pf.meminfo);
  if (pf.online >= 0) close(pf.online);
  close(sv[0]);
  stop_running(sb);
  return -1;
}

/* The end of a start, once init answered or its time ran out: its "ok"
 * with the sandbox's root, then what runs beside it. The socket is closed
 * either way. */
static int start_finish(sbx_sandbox *sb, int sock, sbx_error *err) {
  const char *id = sb->id;
  const sbx_sandbox_opts *opts = &sb->opts;
  char reply[512] = "";
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int pr = poll(&p, 1, 0); /* a last look, when the time ran out */
  int rootfd = -1;
  ssize_t n = pr > 0 ? recv_reply(sock, reply, sizeof reply - 1, &rootfd) : -1;
  if (n > 0) reply[n] = 0;
  sb->rootfd = rootfd;
  close(sock);
  bool ok = n > 0 && !strncmp(reply, "ok", 2) && (!reply[2] || reply[2] == ' ');
  if (!ok || sb->rootfd < 0) {
    sbx_err(err, "INTERNAL", "setting up sandbox '%s': %s", id,
            n > 0 && !ok ? reply
            : pr == 0                     ? "timed out (its init had not built its root in 15 s)"
                                          : "its init died");
    stop_running_async(sb, pr != 0); /* one that does not answer may not die soon either */
    return -1;
  }
  sb->state = SBX_RUNNING;
  if (opts->egress && sbx_net_egress_start(sb, err) < 0) {
    stop_running(sb);
    return -1;
  }
  ensure_default_session(sb);
  sbx_bucket_start_all(sb, reply[2] ? reply + 3 : ""); /* which of its bucket mounts init attached */
  return 0;
}

/* ---- starts under way -----------------------------------------------------
 * A start returns once init builds the root; its answer is awaited on the
 * loop, which serves every other sandbox meanwhile (a slow disk, a start
 * that hangs: nobody else waits for it). Calls for the sandbox wait in
 * its list of waiters. At most START_MAX starts run at once, the others
 * wait their turn in order (a thousand creates at once would otherwise
 * build a thousand roots on the host's cpus and disk together, and each
 * would take as long as all of them); a start's time counts from its
 * turn. */
static void start_closed(uv_handle_t *h) {
  sbx_start *st = h->data;
  if (--st->open_handles == 0) free(st);
}

static void starts_kick(void);

/* The start leaves its sandbox (and its turn or its place in the queue);
 * its waiters are returned for the caller to tell. */
static start_waiter *start_detach(sbx_sandbox *sb) {
  sbx_start *st = sb->start;
  start_waiter *w = st->waiters;
  sb->start = NULL;
  if (st->sock >= 0) {
    starts.running--;
    uv_close((uv_handle_t *)&st->poll, start_closed);
    uv_close((uv_handle_t *)&st->timer, start_closed);
    starts_kick();
    ahead_soon(); /* the next made ahead: on the loop's next turn, once this answer is sent */
    return w;
  }
  for (sbx_start **pp = &starts.queue; *pp; pp = &(*pp)->qnext)
    if (*pp == st) {
      *pp = st->qnext;
      break;
    }
  free(st);
  return w;
}

static void tell_waiters(start_waiter *w, const sbx_error *err) {
  while (w) {
    start_waiter *next = w->next;
    w->cb(w->ud, err);
    free(w);
    w = next;
  }
}

/* A start that failed: the sandbox as it was (a create's: gone, nothing of
 * it left, as no record was written), its waiters told why. */
static void start_failed(sbx_sandbox *sb, start_waiter *w, bool fresh, sbx_state before, const sbx_error *err) {
  sb->state = before;
  if (fresh) {
    sandbox_unlink(sb);
    sbx_disk_remove(sb->id, -1);
  }
  tell_waiters(w, err);
  if (fresh) sandbox_free(sb);
}

/* A start ends before init answered (a destroy, the daemon stopping): its
 * waiters hear why. The caller stops what runs. */
static void start_abort(sbx_sandbox *sb, const char *code, const char *why) {
  if (!sb->start) return;
  int sock = sb->start->sock;
  sb->state = sb->start->before;
  start_waiter *w = start_detach(sb); /* its poll closed before its fd */
  if (sock >= 0) close(sock);
  sbx_error err = {0};
  sbx_err(&err, code, "sandbox '%s' %s before it had started", sb->id, why);
  tell_waiters(w, &err);
}

static void start_ready(uv_poll_t *p, int status, int events);
static void start_late(uv_timer_t *t);

/* Its turn: the start runs (a create takes a sandbox made ahead if one
 * fits). On failure, -1 with err and nothing changed of sb->start. */
static int start_begin(sbx_sandbox *sb, sbx_error *err) {
  sbx_start *st = sb->start;
  int sock = -1;
  sbx_sandbox *made = st->fresh ? ahead_take(sb->id, &sb->opts, &sock) : NULL;
  if (made) { /* it stands in for sb, in the list and for the start */
    made->created_wall_ms = sb->created_wall_ms;
    made->last_activity_wall_ms = sb->last_activity_wall_ms;
    made->last_used_wall_ms = sb->last_used_wall_ms;
    sandbox_unlink(sb);
    sb->start = NULL;
    sandbox_free(sb);
    sb = made;
    sb->start = st;
    st->sb = sb;
    st->ahead = true;
    sandbox_link(sb);
    /* the next is made once this one answered (start_detach): a make is a
     * few ms of the loop, more when cgroup v1 waits, and would come first */
  } else if (start(sb, false, &sock, err) < 0) {
    return -1;
  }
  sb->state = SBX_STARTING;
  uv_poll_init(eng.cfg.loop, &st->poll, sock);
  uv_timer_init(eng.cfg.loop, &st->timer);
  st->poll.data = st->timer.data = st;
  st->open_handles = 2;
  st->sock = sock;
  starts.running++;
  uv_poll_start(&st->poll, UV_READABLE, start_ready);
  uv_timer_start(&st->timer, start_late, START_TIMEOUT_MS, 0);
  return 0;
}

/* A start for sb is asked for: it runs now, or waits its turn (starting,
 * either way); -1 with err if it failed at once (sb as it was). */
static int start_request(sbx_sandbox *sb, bool fresh, sbx_error *err) {
  sbx_start *st = calloc(1, sizeof *st);
  if (!st) return sbx_err(err, "INTERNAL", "out of memory");
  st->sock = -1;
  st->sb = sb;
  st->before = sb->state;
  st->fresh = fresh;
  sb->start = st;
  sb->state = SBX_STARTING;
  if (starts.running >= START_MAX) {
    sbx_start **pp = &starts.queue;
    while (*pp) pp = &(*pp)->qnext;
    *pp = st;
    return 0;
  }
  if (start_begin(sb, err) == 0) return 0;
  sb->state = st->before;
  sb->start = NULL;
  free(st);
  return -1;
}

static void starts_next(uv_timer_t *t) {
  (void)t;
  while (starts.queue && starts.running < START_MAX) {
    sbx_start *st = starts.queue;
    starts.queue = st->qnext;
    sbx_sandbox *sb = st->sb;
    sbx_error err = {0};
    if (start_begin(sb, &err) == 0) continue;
    start_waiter *w = st->waiters;
    bool fresh = st->fresh;
    sbx_state before = st->before;
    sb->start = NULL;
    free(st);
    start_failed(sb, w, fresh, before, &err);
  }
}

static void starts_kick(void) {
  if (!starts.queue) return;
  if (!starts.timer_ready) {
    uv_timer_init(eng.cfg.loop, &starts.timer);
    uv_unref((uv_handle_t *)&starts.timer);
    starts.timer_ready = true;
  }
  uv_timer_start(&starts.timer, starts_next, 0, 0);
}

int sbx_sandbox_when_started(sbx_sandbox *sb, sbx_started_cb cb, void *ud) {
  start_waiter *w = sb->start ? calloc(1, sizeof *w) : NULL;
  if (!w) return -1;
  w->cb = cb;
  w->ud = ud;
  start_waiter **pp = &sb->start->waiters;
  while (*pp) pp = &(*pp)->next;
  *pp = w;
  return 0;
}

/* Init answered (or its time ran out: late): the start ends, and its
 * waiters hear how. */
static void start_end(sbx_start *st, bool late) {
  sbx_sandbox *sb = st->sb;
  int sock = st->sock;
  bool fresh = st->fresh, ahead = st->ahead;
  sbx_state before = st->before;
  start_waiter *w = start_detach(sb);
  sbx_error err = {0};
  int r = start_finish(sb, sock, &err);
  if (r < 0 && ahead && !late) {
    /* made ahead and it failed: once more from nothing, as a create that
     * found none made ahead */
    if (eng.cfg.warn) {
      char msg[700];
      snprintf(msg, sizeof msg, "the sandbox made ahead could not become '%s' (%s); starting it afresh", sb->id,
               err.message);
      eng.cfg.warn(msg);
    }
    sbx_disk_remove(sb->id, -1);
    sb->state = before;
    if (start_request(sb, false, &err) == 0) {
      sb->start->fresh = fresh;
      sb->start->before = before;
      sb->start->waiters = w;
      return;
    }
  }
  if (r < 0) return start_failed(sb, w, fresh, before, &err);
  sbx_sandbox_touch(sb);
  sbx_sandbox_save(sb);
  changed(sb->id, fresh ? "created" : "started");
  tell_waiters(w, NULL);
}

static void start_ready(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  start_end(p->data, false);
}

static void start_late(uv_timer_t *t) { start_end(t->data, true); }

/* ---- sandboxes made ahead ------------------------------------------------
 * As root, two sandboxes of the default options are kept made ahead: slot,
 * cgroups, a fresh disk, namespaces, and (in its child, while the daemon
 * does other work) the whole root, /dev, /proc, loopback. It has no record
 * and is in no list; its name starts with '_', which no id has. A create
 * that fits takes it: its directory and cgroups are renamed, the child gets
 * the name (hostname, /etc/hosts) and becomes init. The next one is made on
 * the loop's next turn, after the reply has gone, or when the disk pool
 * hands over a fresh disk. */
static bool same_limits(const sbx_limits *a, const sbx_limits *b) {
  return a->memory_mb == b->memory_mb && a->cpus == b->cpus && a->pids == b->pids && a->disk_mb == b->disk_mb;
}

/* Whether sb, made ahead, serves a create of opts. Other limits than the
 * defaults are set at the take (see ahead_take) where what it was built
 * with serves them too: its disk's size, /dev's (half its memory, at most
 * SBX_DEV_MB) and /proc/meminfo, and a cpu-online file where the limit
 * runs its commands on fewer cpus than the host has. A limit of none where
 * the default has one is not. */
static bool ahead_fits(const sbx_sandbox *sb, const sbx_sandbox_opts *o) {
  const sbx_limits *l = &o->limits, *d = &eng.cfg.default_limits;
  if (o->image[0] || o->egress || l->disk_mb != d->disk_mb) return false;
  bool mem = l->memory_mb == d->memory_mb || (l->memory_mb >= 2 * SBX_DEV_MB && d->memory_mb >= 2 * SBX_DEV_MB);
  bool pids = l->pids == d->pids || (l->pids && d->pids);
  /* (below 0.01, a quota the kernel refuses: a create that fails anyway) */
  bool cpus = l->cpus == d->cpus || (l->cpus >= 0.01 && d->cpus > 0 && (sb->cpu_online || !sbx_procfiles_pins(l->cpus)));
  return mem && pids && cpus;
}

/* Takes made[i] out of the list: its sandbox, its socket in *sock. */
static sbx_sandbox *ahead_remove(int i, int *sock) {
  sbx_sandbox *sb = ahead.made[i].sb;
  *sock = ahead.made[i].sock;
  memmove(&ahead.made[i], &ahead.made[i + 1], (size_t)(ahead.n - i - 1) * sizeof ahead.made[0]);
  ahead.n--;
  return sb;
}

/* wait: its uid range is free on return (else once its init is gone) */
static void ahead_discard(int i, bool wait) {
  int sock;
  sbx_sandbox *sb = ahead_remove(i, &sock);
  close(sock);
  stop_running_async(sb, wait);
  sbx_disk_remove(sb->id, -1);
  sandbox_free(sb);
}

/* Makes one (a few milliseconds of the loop's time: one per turn). */
static void ahead_make(void) {
  if (ahead.n >= AHEAD_MAX || eng.cfg.rootless || !eng.cfg.loop || !eng.etc_template || !sbx_cg_available() ||
      eng.count + ahead.n + 1 >= eng.cfg.max_sandboxes)
    return;
  /* none without a fresh disk: its cgroups would be made and removed for
   * nothing (the pool calls again when one is ready) */
  if (!sbx_disk_fresh_ready(eng.cfg.default_limits.disk_mb)) return;
  char id[64];
  snprintf(id, sizeof id, "_ahead-%d-%u", (int)getpid(), ++ahead.seq);
  sbx_sandbox *sb = sandbox_new(id);
  if (!sb) return;
  sbx_sandbox_default_opts(&sb->opts);
  sb->opts.limits = eng.cfg.default_limits;
  sb->state = SBX_STOPPED;
  sbx_error err = {0};
  int sock = -1;
  if (start(sb, true, &sock, &err) < 0) {
    sbx_disk_remove(id, -1);
    sandbox_free(sb);
    return;
  }
  ahead.made[ahead.n].sb = sb;
  ahead.made[ahead.n++].sock = sock;
  ahead_soon();
}

static void ahead_timer(uv_timer_t *t) {
  (void)t;
  ahead_make();
}

static void ahead_soon(void) {
  if (ahead.n >= AHEAD_MAX || eng.cfg.rootless || !eng.cfg.loop) return;
  if (!ahead.timer_ready) {
    uv_timer_init(eng.cfg.loop, &ahead.timer);
    uv_unref((uv_handle_t *)&ahead.timer);
    ahead.timer_ready = true;
  }
  uv_timer_start(&ahead.timer, ahead_timer, 0, 0);
}

/* The sandbox made ahead as `id` with opts (copied by the caller), its
 * start under way (its init's socket in *sock); NULL when there is none or
 * it failed (the caller starts one as usual). */
static sbx_sandbox *ahead_take(const char *id, const sbx_sandbox_opts *opts, int *sock_out) {
  if (!ahead.n || !ahead_fits(ahead.made[0].sb, opts)) return NULL;
  int sock;
  sbx_sandbox *sb = ahead_remove(0, &sock); /* the oldest: the likeliest to be built */
  char from[1200], to[1200], name[96];
  sbx_disk_dir(sb->id, from, sizeof from);
  sbx_disk_dir(id, to, sizeof to);
  snprintf(name, sizeof name, "%s.%llu", id, (unsigned long long)sb->incarnation);
  bool moved = rename(from, to) == 0;
  if (moved) snprintf(sb->id, sizeof sb->id, "%s", id);
  sbx_cg_rename(&sb->cg, name); /* v2 may refuse: the name is only for people */
  bool sized = same_limits(&sb->opts.limits, &opts->limits);
  if (moved && !sized) { /* its own limits, before anything of the create runs */
    sb->opts.limits = opts->limits;
    sized = sbx_cg_reapply(&sb->cg, &opts->limits) == 0 && sbx_procfiles_resize(sb) == 0;
  }
  if (moved && sized && send(sock, id, strlen(id), MSG_NOSIGNAL) >= 0) {
    sb->opts.env = (sbx_env){0};
    sbx_env_copy(&sb->opts.env, &opts->env);
    sb->opts.sleep_after_ms = opts->sleep_after_ms;
    sb->opts.keep_alive = opts->keep_alive;
    sb->opts.limits_explicit = opts->limits_explicit;
    sb->opts.disk_explicit = opts->disk_explicit;
    *sock_out = sock;
    return sb;
  }
  close(sock);
  if (eng.cfg.warn) {
    char msg[700];
    snprintf(msg, sizeof msg, "the sandbox made ahead could not become '%s' (%s); starting it afresh", id,
             !moved ? strerror(errno) : !sized ? "its limits could not be set" : "its setup had failed");
    eng.cfg.warn(msg);
  }
  stop_running(sb);
  sbx_disk_remove(sb->id, -1);
  sandbox_free(sb);
  return NULL;
}

/* One limit asked for (key) against the most it may be (0: no most);
 * why: what sets that most when the configuration does not. */
static int over(const char *key, double asked, double most, const char *why, sbx_error *err) {
  if (!most || asked <= most) return 0;
  return sbx_err(err, "RESOURCE_LIMIT", "%s %.15g is over the most a sandbox may have here, %.15g%s; maxLimits in the "
                 "daemon's configuration sets it", key, asked, most, why);
}

/* Limits a create asks for are at most what a person allows (maxLimits)
 * or the host has: an agent cannot hand sandbox code all of its memory,
 * tasks or disk. What the call leaves as the configured defaults is not
 * asked for. */
static int over_max(const sbx_sandbox_opts *o, sbx_error *err) {
  if (!o->limits_explicit) return 0;
  const sbx_config *c = sbx_config_get();
  const sbx_limits *d = &eng.cfg.default_limits, *l = &o->limits, *set = c ? &c->max_limits : &(sbx_limits){0};
  sbx_limits m = sbx_limits_max(c, eng.cfg.state_dir);
  if (l->memory_mb != d->memory_mb &&
      over("memoryMB", (double)l->memory_mb, (double)m.memory_mb, set->memory_mb ? "" : " (what this host has)", err))
    return -1;
  if (l->pids != d->pids &&
      over("pids", (double)l->pids, (double)m.pids, set->pids ? "" : " (three quarters of the host's tasks)", err))
    return -1;
  if (l->cpus != d->cpus && over("cpus", l->cpus, m.cpus, "", err)) return -1;
  if (o->disk_explicit && l->disk_mb != d->disk_mb &&
      over("diskMB", (double)l->disk_mb, (double)m.disk_mb,
           set->disk_mb ? "" : " (the size of the filesystem its disk is on)", err))
    return -1;
  return 0;
}

int sbx_sandbox_create(const char *id, const sbx_sandbox_opts *opts, sbx_sandbox **out, bool *created,
                       sbx_error *err) {
  if (!sbx_valid_id(id)) return sbx_err(err, "VALIDATION_FAILED", "sandboxId must be 1-63 of [a-z0-9-], got '%s'", id);
  if (!eng.etc_template) return sbx_err(err, "INTERNAL", "the sandbox engine is not running");
  sbx_sandbox *sb = sbx_sandbox_find(id);
  if (created) *created = false;
  if (sb) {
    int r = sbx_sandbox_wake(sb, err);
    if (r < 0) return -1;
    sbx_sandbox_touch(sb);
    *out = sb;
    return r;
  }
  if (eng.count >= eng.cfg.max_sandboxes)
    return sbx_err(err, "RESOURCE_LIMIT", "at most %d sandboxes may exist at once (maxSandboxes in %s)",
                   eng.cfg.max_sandboxes, "the daemon's configuration");
  /* a new one: its id is its host name (a sandbox of such an id made
   * before this rule still answers to it) */
  if (id[0] == '-' || id[strlen(id) - 1] == '-')
    return sbx_err(err, "VALIDATION_FAILED", "sandboxId may not start or end with '-' (it is the sandbox's host "
                   "name), got '%s'", id);
  if (over_max(opts, err) < 0) return -1;
  /* a directory left by a crash between making a disk and its record */
  sbx_disk_remove(id, -1);
  sb = sandbox_new(id);
  if (!sb) return sbx_err(err, "INTERNAL", "out of memory");
  sb->opts = *opts;
  sb->opts.env = (sbx_env){0};
  sb->opts.allowed_hosts = (sbx_strv){0};
  sbx_env_copy(&sb->opts.env, &opts->env);
  sbx_strv_copy(&sb->opts.allowed_hosts, &opts->allowed_hosts);
  sb->state = SBX_STOPPED;
  sb->created_wall_ms = sb->last_activity_wall_ms = sb->last_used_wall_ms = wall_ms();
  /* in the list while it starts: a call for it meanwhile waits for it */
  sandbox_link(sb);
  if (start_request(sb, true, err) < 0) {
    sandbox_unlink(sb);
    sbx_disk_remove(id, -1);
    sandbox_free(sb);
    return -1;
  }
  *out = sbx_sandbox_find(id); /* one made ahead may stand in for sb */
  if (created) *created = true;
  return 1;
}

int sbx_sandbox_reset(sbx_sandbox *sb) {
  if (sb->state == SBX_ASLEEP || sb->state == SBX_STARTING) return 0;
  int shut = sbx_disk_fd(sb->id, sb->rootfd);
  stop_running_async(sb, false);
  free_sessions(sb);
  sbx_disk_discard(sb->id, shut);
  sb->state = SBX_ASLEEP;
  sb->reset_pending = true;
  sb->restart_pending = false;
  json_decref(sb->code_gone); /* reset: true says all of it */
  sb->code_gone = NULL;
  sbx_sandbox_save(sb);
  changed(sb->id, "reset");
  return 0;
}

int sbx_sandbox_wake(sbx_sandbox *sb, sbx_error *err) {
  if (sbx_sandbox_alive(sb)) return 0;
  if (sb->state == SBX_STARTING) return 1;
  if (sb->state == SBX_RUNNING) {
    /* its init died (killed from the host, or by the kernel): what ran
     * went with it; files, sessions and records stay, and it starts
     * again as after a daemon restart */
    stop_running_async(sb, false);
    sb->state = SBX_STOPPED;
    sb->restart_pending = true;
  }
  if (start_request(sb, false, err) < 0) return -1;
  sbx_sandbox_touch(sb);
  return 1;
}

bool sbx_sandbox_take_reset(sbx_sandbox *sb) {
  bool r = sb->reset_pending;
  sb->reset_pending = false;
  if (r) sbx_sandbox_save(sb);
  return r;
}

bool sbx_sandbox_take_restart(sbx_sandbox *sb) {
  bool r = sb->restart_pending && sb->state == SBX_RUNNING;
  if (r) sb->restart_pending = false;
  return r;
}

int sbx_sandbox_sweep_idle(char ids[][64], int max) {
  uint64_t now = wall_ms();
  int n = 0;
  sbx_cg_reap();
  sbx_spawner_reap();
  int settles = 0;
  for (sbx_sandbox *sb = eng.list; sb; sb = sb->next) {
    /* what free and top read in it follows its memory while commands run
     * (each command also starts with it fresh) */
    if (sb->state == SBX_RUNNING && sb->running > 0) sbx_procfiles_refresh(sb);
    /* quiet for a while: what its journal pins in memory is let go (a
     * few a second, so the helper's queue stays short) */
    if (sb->state == SBX_RUNNING && !sb->settled && sb->running == 0 && now - sb->last_activity_wall_ms >= SETTLE_MS &&
        settles++ < SETTLES_PER_SWEEP) {
      sbx_disk_settle(sb->id, sb->rootfd);
      sb->settled = true;
    }
    if (sb->state == SBX_ASLEEP || sb->state == SBX_STARTING || sb->opts.keep_alive || sb->running > 0 ||
        sb->opts.sleep_after_ms <= 0)
      continue;
    if (now - sb->last_activity_wall_ms < (uint64_t)sb->opts.sleep_after_ms) continue;
    if (n >= max) continue; /* the next sweep: each one reset is also told to the caller */
    sbx_sandbox_reset(sb);
    snprintf(ids[n++], 64, "%s", sb->id);
  }
  return n;
}

int sbx_sandbox_destroy(const char *id, sbx_error *err) {
  sbx_sandbox *sb = sbx_sandbox_find(id);
  if (!sb) return sbx_err(err, "SANDBOX_NOT_FOUND", "no sandbox '%s'", id);
  sandbox_unlink(sb);
  start_abort(sb, "SANDBOX_NOT_FOUND", "was destroyed");
  int shut = sbx_disk_fd(sb->id, sb->rootfd);
  stop_running_async(sb, false);
  sbx_disk_remove(sb->id, shut);
  sbx_bucket_destroyed(sb);
  changed(sb->id, "destroyed");
  sandbox_free(sb);
  return 0;
}

/* ---- sessions ---------------------------------------------------------- */

sbx_session *sbx_session_find(sbx_sandbox *sb, const char *id) {
  for (sbx_session *s = sb->sessions; s; s = s->next)
    if (!strcmp(s->id, id)) return s;
  return NULL;
}

static int session_new(sbx_sandbox *sb, const char *id, const char *cwd, const sbx_env *env, sbx_session **out,
                       sbx_error *err) {
  if (!sbx_valid_id(id)) return sbx_err(err, "VALIDATION_FAILED", "session id must be 1-63 of [a-z0-9-]");
  if (sbx_session_find(sb, id)) return sbx_err(err, "VALIDATION_FAILED", "session '%s' exists", id);
  int n = 0;
  for (sbx_session *s = sb->sessions; s; s = s->next) n++;
  if (n >= SBX_MAX_SESSIONS) return sbx_err(err, "RESOURCE_LIMIT", "at most %d sessions per sandbox", SBX_MAX_SESSIONS);
  sbx_session *s = calloc(1, sizeof *s);
  if (!s) return sbx_err(err, "INTERNAL", "out of memory");
  snprintf(s->id, sizeof s->id, "%s", id);
  s->cwd = strdup(cwd ? cwd : "/workspace");
  sbx_env_set(&s->env, "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  sbx_env_set(&s->env, "HOME", "/root");
  sbx_env_set(&s->env, "LANG", "C.UTF-8");
  sbx_env_set(&s->env, "TERM", "xterm-256color");
  sbx_env_set(&s->env, "HOSTNAME", sb->id);
  sbx_env_set(&s->env, "USER", "root");
  if (!sb->opts.egress) { /* no network: package managers fail at once instead of retrying for seconds */
    sbx_env_set(&s->env, "PIP_RETRIES", "0");
    sbx_env_set(&s->env, "npm_config_fetch_retries", "0");
  }
  sbx_env_copy(&s->env, &sb->opts.env);
  if (env) sbx_env_copy(&s->env, env);
  s->next = sb->sessions;
  sb->sessions = s;
  *out = s;
  return 0;
}

int sbx_session_create(sbx_sandbox *sb, const char *id, const char *cwd, const sbx_env *env, sbx_session **out,
                       sbx_error *err) {
  if (session_new(sb, id, cwd, env, out, err) < 0) return -1;
  sbx_sandbox_save(sb);
  return 0;
}

int sbx_session_delete(sbx_sandbox *sb, const char *id, sbx_error *err) {
  sbx_session **pp = &sb->sessions;
  while (*pp && strcmp((*pp)->id, id)) pp = &(*pp)->next;
  if (!*pp) return sbx_err(err, "SESSION_NOT_FOUND", "no session '%s' in sandbox '%s'", id, sb->id);
  if ((*pp)->busy) return sbx_err(err, "VALIDATION_FAILED", "session '%s' has a command running", id);
  sbx_session *s = *pp;
  *pp = s->next;
  sbx_session_free(s);
  ensure_default_session(sb); /* every call without a sessionId uses it: deleted, it starts again, fresh */
  sbx_sandbox_save(sb);
  return 0;
}

/* ---- the one way in ---------------------------------------------------- */

/* The container default capability set. */
static const int default_caps[] = {CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,
                                   CAP_KILL,    CAP_SETGID,       CAP_SETUID,           CAP_SETPCAP,
                                   CAP_NET_BIND_SERVICE, CAP_NET_RAW, CAP_SYS_CHROOT,   CAP_MKNOD,
                                   CAP_AUDIT_WRITE, CAP_SETFCAP};

static volatile pid_t supervised;
static void kill_supervised(int sig) {
  (void)sig;
  if (supervised > 0) kill(-supervised, SIGKILL);
}

static void child_fail(const char *what) {
  char msg[256];
  int n = snprintf(msg, sizeof msg, "sbx: %s: %s\n", what, strerror(errno));
  (void)!write(2, msg, n);
  _exit(127);
}

int sbx_spawn_exit_code(const siginfo_t *si) {
  if (si->si_code == CLD_EXITED) return si->si_status;
  return 128 + si->si_status;
}

/* The command, in the sandbox's namespaces: its cgroup, sandbox root,
 * capabilities, no_new_privs, seccomp, its fds, exec. Runs on the
 * supervisor's memory (CLONE_VM): no allocation here. */
static int command_main(void *arg) {
  const sbx_command *c = arg;
  const sbx_spawn *sp = c->sp;
  for (int i = 0; i < c->ncg; i++)
    if (write(c->cgfds[i], "0", 1) != 1) child_fail("joining the command's cgroup");
  setsid();
  if (setgroups(0, NULL) < 0 && errno != EPERM) child_fail("setgroups");
  if (setresgid(0, 0, 0) < 0) child_fail("setresgid");
  if (setresuid(0, 0, 0) < 0) child_fail("setresuid");
  int cwd_errno = 0;
  if (chdir(sp->cwd ? sp->cwd : "/workspace") < 0) {
    cwd_errno = errno;
    if (chdir("/") < 0) child_fail("chdir");
  }
  if (c->pin) sched_setaffinity(0, sizeof c->cpus, &c->cpus);
  /* counted per user of the sandbox's own user namespace: per sandbox */
  if (c->nproc != RLIM_INFINITY && setrlimit(RLIMIT_NPROC, &(struct rlimit){c->nproc, c->nproc}) < 0)
    child_fail("RLIMIT_NPROC");
  for (int i = 0; i <= c->cap_last; i++)
    if (!(c->capmask & (1ull << i)) && prctl(PR_CAPBSET_DROP, i, 0, 0, 0) < 0 && errno != EINVAL)
      child_fail("dropping capabilities");
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2] = {{(uint32_t)c->capmask, (uint32_t)c->capmask, 0},
                                        {(uint32_t)(c->capmask >> 32), (uint32_t)(c->capmask >> 32), 0}};
  if (syscall(SYS_capset, &h, d) < 0) child_fail("capset");
  if (sbx_seccomp_install() < 0) child_fail("seccomp");
  /* move the given fds to 0..n-1 without clobbering each other */
  int tmp[8];
  for (int i = 0; i < sp->nfds && i < 8; i++) tmp[i] = fcntl(sp->fds[i], F_DUPFD_CLOEXEC, 64);
  for (int i = 0; i < sp->nfds && i < 8; i++)
    if (dup2(tmp[i], i) < 0) child_fail("dup2");
  close_range(sp->nfds, ~0U, 0);
  if (cwd_errno && sp->strict_cwd) { /* told on the command's own stderr */
    char msg[4200];
    int n = snprintf(msg, sizeof msg, "sbx: cwd %s: %s\n", sp->cwd, strerror(cwd_errno));
    (void)!write(2, msg, n < (int)sizeof msg ? (size_t)n : sizeof msg - 1);
    _exit(1);
  }
  signal(SIGTERM, SIG_DFL); /* the supervisor's handler is not the command's */
  sbx_child_unblock();
  execve(sp->argv[0], sp->argv, sp->envp);
  child_fail(sp->argv[0]);
  return 127;
}

_Noreturn void sbx_supervise(const sbx_command *c) {
  /* the supervisor: the daemon's own child, outside the sandbox's pid
   * namespace and cgroup, so its exit status cannot be forged. Signals
   * stay blocked until its SIGTERM handler stands. */
  signal(SIGTERM, kill_supervised);
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_NAME, "sbx-exec");
  if (setns(c->init_pidfd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC |
                               CLONE_NEWCGROUP) < 0)
    child_fail("joining the sandbox");
  /* the command shares the supervisor's memory until it executes (no
   * page tables to copy); it runs on its own stack */
  static char stack[64 * 1024] __attribute__((aligned(16)));
  pid_t g = clone(command_main, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, (void *)c);
  if (g < 0) child_fail("clone");
  supervised = g;
  sbx_child_unblock(); /* a SIGTERM that came meanwhile now kills the command's group */
  close_range(0, ~0U, 0);
  siginfo_t si;
  for (;;) {
    if (waitid(P_PID, g, &si, WEXITED) == 0) break;
    if (errno != EINTR) _exit(127);
  }
  _exit(sbx_spawn_exit_code(&si) & 0xff);
}

pid_t sbx_sandbox_spawn(sbx_sandbox *sb, const sbx_spawn *sp, int *pidfd_out, sbx_error *err) {
  int cgfds[SBX_CG_MAX] = {-1, -1, -1, -1}, ncg = 0;
  if (sp->cg && sp->cg->n) {
    ncg = sbx_cg_open_procs(sp->cg, cgfds);
    if (ncg < 0) return sbx_err_errno(err, "INTERNAL", -ncg, "opening the command's cgroup");
  }
  sbx_command c = {.sp = sp, .init_pidfd = sb->init_pidfd, .cgfds = cgfds, .ncg = ncg, .cap_last = eng.cap_last,
                   .nproc = !sb->cg.n && sb->opts.limits.pids ? (rlim_t)sb->opts.limits.pids : RLIM_INFINITY};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(default_caps); i++) c.capmask |= 1ull << default_caps[i];
  c.pin = sbx_procfiles_cpuset(sb, &c.cpus);
  int pidfd = -1;
  pid_t pid = sbx_spawn_command(&c, &pidfd);
  int e = errno;
  for (int i = 0; i < ncg; i++) close(cgfds[i]);
  if (pid < 0) return sbx_err_errno(err, "INTERNAL", e, "starting the command's supervisor");
  *pidfd_out = pidfd;
  return pid;
}
