/* The sandbox engine's C API: sandboxes by id, their sessions, and the one
 * way into them. The MCP layer calls only what is declared here and in
 * exec.h / files.h. */
#pragma once
#include "cgroup.h"
#include "util.h"

#include <signal.h>
#include <uv.h>

#define SBX_MAX_SESSIONS 64
#define SBX_MAX_ENV 512

/* A NULL-terminated "KEY=VALUE" vector. */
typedef struct sbx_env {
  char **v;
  size_t n;
} sbx_env;
int sbx_env_set(sbx_env *e, const char *key, const char *value);
const char *sbx_env_get(const sbx_env *e, const char *key);
void sbx_env_unset(sbx_env *e, const char *key);
void sbx_env_clear(sbx_env *e);
int sbx_env_copy(sbx_env *dst, const sbx_env *src);
/* Parses the output of POSIX `export -p` (as dash and bash print it). */
int sbx_env_parse_export(sbx_env *e, const char *text, size_t len);

typedef struct sbx_session {
  char id[64];
  char *cwd;
  sbx_env env;
  char *shell; /* bash's variables, functions, aliases and options (sbx_shell_state_filter) */
  size_t shell_len;
  uint64_t gen;        /* bumped when cwd, env or shell state change */
  struct sbx_shell *sh; /* the bash that runs its commands, if one is up */
  int busy; /* execs running in it */
  struct sbx_session *next;
} sbx_session;

typedef struct sbx_sandbox_opts {
  sbx_limits limits;
  bool limits_explicit; /* the caller named limits: refuse when unenforceable */
  bool disk_explicit;   /* ...and diskMB among them */
  int64_t sleep_after_ms;
  bool keep_alive;
  bool egress; /* network "egress" (else "none": loopback only) */
  sbx_strv allowed_hosts; /* egress only to these CIDRs and names (empty: the public internet) */
  char image[64]; /* a directory under $SBX_STATE_DIR/images/, or "" for the host's */
  sbx_env env;
} sbx_sandbox_opts;

/* running: its init is up (or it failed: sbx_sandbox_alive says);
 * stopped: its files are on disk, nothing runs (after a daemon restart);
 * asleep: reset for idleness, only the record is left;
 * starting: its init is building its root (sbx_sandbox_when_started). */
typedef enum { SBX_RUNNING, SBX_STOPPED, SBX_ASLEEP, SBX_STARTING } sbx_state;

typedef struct sbx_sandbox {
  char id[64];
  sbx_state state;
  pid_t init_pid;
  int init_pidfd;
  int rootfd; /* the sandbox's / (O_PATH), for the files API */
  int meminfo_fd; /* what it reads as /proc/meminfo (procfiles.h) */
  pid_t net_pid; /* pasta, for network "egress" */
  int net_pidfd;
  struct sbx_dns *dns; /* the filtering resolver, for allowedHosts names */
  uid_t uid_base; /* its root on the host; its uids are uid_base .. + sbx_sandbox_uids() */
  int slot;
  sbx_cgroup cg;
  sbx_cgroup cg_pool[8]; /* idle command cgroups (exec.c) */
  int cg_pool_n;
  sbx_sandbox_opts opts;
  sbx_session *sessions;
  uint64_t created_wall_ms, last_activity_wall_ms;
  /* what listSandboxes says of its last use: last_activity_wall_ms, except
   * after a daemon restart, whose idle clock starts then (an idle reset
   * never counts the time no daemon ran) while this is what the daemon
   * that stopped knew (its record's lastActivity, written as it stopped) */
  uint64_t last_used_wall_ms;
  bool stopping; /* its record is written by a daemon that stops: with lastActivity */
  uint64_t exec_seq;
  uint64_t out_window;  /* exec.c's output budget: the window, and bytes read in it */
  size_t out_used[2];   /* for calls, and for unattended commands */
  int running; /* execs in flight */
  bool settled; /* its disk checkpointed since its last activity (sbx_disk_settle) */
  bool cpu_online; /* started with a cpu-online file over its own (procfiles.h) */
  bool reset_pending;     /* the next result tells the caller its files are gone */
  bool restart_pending;   /* ...that its processes ended with an earlier daemon */
  char *saved_record;     /* the record as last written */
  struct sbx_bucket *buckets; /* bucket mounts (bucket.h), remounted on every start */
  uint64_t incarnation;       /* which start this is (its cgroup's name, bucket servers') */
  struct sbx_exposure *exposures; /* exposePort (preview.h), part of the record */
  struct json_t *code_gone; /* code contexts of an earlier daemon (code.h), part of the record */
  struct sbx_start *start;  /* while starting: init's answer awaited, and who waits for it */
  struct sbx_sandbox *next;
  struct sbx_sandbox *hnext; /* in the engine's index by id */
} sbx_sandbox;

typedef struct sbx_engine_config {
  char *state_dir;
  char *runtime_dir;
  bool rootless; /* daemon not root: no idmapped mounts, no subordinate ranges */
  int max_sandboxes;
  sbx_limits default_limits;
  void (*warn)(const char *msg); /* what the daemon's log should hear of */
  /* what the daemon's log and its clients should hear of a sandbox (a
   * bucket mount it did not get back); NULL: warn alone */
  void (*warn_sandbox)(const char *id, const char *msg);
  uv_loop_t *loop;               /* starts and teardowns finish on it */
  /* a sandbox was "created", "started", "reset" or "destroyed" (for the
   * FUSE view; may be NULL) */
  void (*on_change)(const char *id, const char *event);
} sbx_engine_config;

/* Prepares the engine: cgroups, seccomp, the /etc template, the disks, and
 * the sandboxes of earlier daemons (from their records: stopped, to be
 * started by their next call). Call before the event loop starts. */
int sbx_engine_init(const sbx_engine_config *cfg, sbx_error *err);
/* Stops every sandbox; records and disks stay for the next daemon. */
void sbx_engine_shutdown(void);
const sbx_engine_config *sbx_engine_cfg(void);

void sbx_sandbox_default_opts(sbx_sandbox_opts *o);
sbx_sandbox *sbx_sandbox_find(const char *id);
sbx_sandbox *sbx_sandbox_list(void);
/* Creates a sandbox; *created tells whether this call made it
 * (idempotent). Like sbx_sandbox_wake: 0 once it runs, 1 while it starts
 * (*out set: sbx_sandbox_when_started), -1 with err. */
int sbx_sandbox_create(const char *id, const sbx_sandbox_opts *opts, sbx_sandbox **out, bool *created,
                       sbx_error *err);
int sbx_sandbox_destroy(const char *id, sbx_error *err);
/* Idle lifecycle: reset kills every process and discards the root layer and
 * /workspace, keeping the record; wake starts it (fresh after a reset, on
 * its own files when stopped). */
int sbx_sandbox_reset(sbx_sandbox *sb);
/* 0: it runs; 1: it is starting (now or already), and the loop goes on
 * serving everyone else meanwhile; -1: it cannot start (err). */
int sbx_sandbox_wake(sbx_sandbox *sb, sbx_error *err);
/* cb(ud, NULL) once a starting sandbox runs, cb(ud, err) if its start
 * failed or it was destroyed or stopped first: then sb may be gone, and cb
 * must not touch it (look it up again by id). Never called from within
 * this call. */
typedef void (*sbx_started_cb)(void *ud, const sbx_error *err);
int sbx_sandbox_when_started(sbx_sandbox *sb, sbx_started_cb cb, void *ud);
/* True once after a reset: for the `reset: true` of the next result. */
bool sbx_sandbox_take_reset(sbx_sandbox *sb);
/* True once after a start that followed a daemon restart (`restarted`). */
bool sbx_sandbox_take_restart(sbx_sandbox *sb);
/* Writes the sandbox's record (options, sessions) when it changed:
 * write, fsync, rename. */
int sbx_sandbox_save(sbx_sandbox *sb);
/* Which limits hold for this running sandbox. */
typedef struct sbx_enforced {
  bool memory, cpus, pids, disk;
} sbx_enforced;
sbx_enforced sbx_sandbox_enforced(sbx_sandbox *sb);
/* "running", "starting", "stopped", "sleeping" or "failed". */
const char *sbx_sandbox_status(sbx_sandbox *sb);
int sbx_sandbox_count(void);
/* Resets the sandboxes idle past their sleepAfter (not keepAlive, nothing
 * running), at most max of them; fills ids with those reset; returns how
 * many (the rest wait for the next call). Called once a
 * second: it also reaps what the cgroups left to reap (sbx_cg_reap). */
int sbx_sandbox_sweep_idle(char ids[][64], int max);
void sbx_sandbox_touch(sbx_sandbox *sb);
/* How many host uids (and gids) a sandbox has from its uid_base: 65536 as
 * root, 1 rootless (its user alone). */
unsigned sbx_sandbox_uids(void);
/* True while the sandbox's init is alive (false while asleep or stopped). */
bool sbx_sandbox_alive(sbx_sandbox *sb);

sbx_session *sbx_session_find(sbx_sandbox *sb, const char *id);
int sbx_session_create(sbx_sandbox *sb, const char *id, const char *cwd, const sbx_env *env,
                       sbx_session **out, sbx_error *err);
void sbx_session_free(sbx_session *s);
int sbx_session_delete(sbx_sandbox *sb, const char *id, sbx_error *err);

/* The one way in. Runs argv inside the sandbox with the given fds as its
 * 0..nfds-1, landing in cgroup `cg` (may be NULL), with capabilities
 * dropped, no_new_privs, seccomp and a clean environment. Returns the pid
 * of the daemon's own child that supervises the command and exits with its
 * status (exit code, or 128+signal); *pidfd gets a pidfd for it. */
typedef struct sbx_spawn {
  char *const *argv;
  char *const *envp;
  const char *cwd; /* inside the sandbox */
  bool strict_cwd; /* unchecked by the daemon: not entering it fails the command (else it runs in /) */
  const int *fds;
  int nfds;
  const sbx_cgroup *cg;
} sbx_spawn;
pid_t sbx_sandbox_spawn(sbx_sandbox *sb, const sbx_spawn *sp, int *pidfd, sbx_error *err);
/* Decodes a waitid status of that child into the command's exit code. */
int sbx_spawn_exit_code(const siginfo_t *si);
