/* Running a command in a sandbox session, on the event loop: streamed
 * output, bounded results, timeout and cancellation that kill the
 * command's whole tree, and the session's cwd/env carried between calls. */
#pragma once
#include "sandbox.h"

#include <signal.h>

#define SBX_DEFAULT_MAX_OUTPUT (64 * 1024)
#define SBX_MAX_STDIN (16 * 1024 * 1024)
#define SBX_MAX_RUNNING 256 /* commands and processes running at once in one sandbox */

typedef struct sbx_exec sbx_exec;

typedef struct sbx_exec_opts {
  const char *command;
  const char *cwd;        /* NULL: the session's */
  const sbx_env *env;     /* this call only */
  int64_t timeout_ms;     /* 0: none */
  const char *session_id; /* NULL: "default" */
  const char *stdin_data;
  size_t stdin_len;
  size_t max_output; /* per stream; 0: default */
  bool keep_session; /* false: run with session state but do not save it */
  bool stdin_stream; /* stdin stays open for sbx_exec_write (stdin_data unused) */
  bool discard;      /* output only goes to the chunk callback: nothing kept or spilled */
  bool background;   /* not activity: the sandbox may still go idle (a code context) */
  bool unattended;   /* no caller waits (startProcess): its output shares a read budget with
                      * the sandbox's other such commands, apart from the calls' */
  bool stdio;        /* stdio_fd (the caller's; dup'ed) is its stdin, or its stdout with stdio_out */
  bool stdio_out;
  int stdio_fd;
  bool raw_chunks;   /* the chunk callback gets the bytes as they are, not UTF-8 text (sbx exec) */
  unsigned line_cost; /* bytes each line of stdout counts of the output budget besides its own (a reader
                       * that works per line: code contexts) */
} sbx_exec_opts;

typedef struct sbx_exec_result {
  char *out, *err; /* valid UTF-8, bounded */
  size_t out_len, err_len;
  int exit_code;
  bool timed_out, cancelled, truncated, oom;
  uint64_t duration_ms;
  char *output_path; /* inside the sandbox, when truncated */
  bool output_short; /* ...holding only what fit on the sandbox's disk */
  int left_behind;   /* processes the command started that were still running when it ended (ended with it) */
} sbx_exec_result;

/* Where output past a call's bound is saved, inside the sandbox */
#define SBX_SPILL_DIR "/tmp/sbx-output"

/* A read's buffer for the loop's pipes: one serves every read, so each is
 * consumed before its callback returns. */
void sbx_read_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b);

/* stream: 1 stdout, 2 stderr; data is valid UTF-8 ending on a code point. */
typedef void (*sbx_exec_chunk_cb)(void *ud, int stream, const char *data, size_t len);
/* err is NULL on success; res is owned by the exec and valid during the call. */
typedef void (*sbx_exec_done_cb)(void *ud, const sbx_exec_result *res, const sbx_error *err);

/* What of bash's state dump (`declare -p`, `declare -f`, `alias -p`, `set
 * +o`, `shopt -p`) a session keeps: not the exported variables (the
 * session's environment has them) nor those bash sets for itself. */
char *sbx_shell_state_filter(const char *text, size_t len, size_t *out_len);

/* Starts the command. On failure returns -1 with err filled and no
 * callback will fire. */
int sbx_exec_start(uv_loop_t *loop, sbx_sandbox *sb, const sbx_exec_opts *o, sbx_exec_chunk_cb on_chunk,
                   sbx_exec_done_cb on_done, void *ud, sbx_exec **out, sbx_error *err);
/* Kills the command's tree; done fires later with cancelled = true. */
void sbx_exec_cancel(sbx_exec *x);
/* More input for a command started with stdin_stream (copied); len 0 with
 * data NULL closes it. -1 when its stdin is gone. */
int sbx_exec_write(sbx_exec *x, const char *data, size_t len);
/* Bytes written with sbx_exec_write that the command has not read yet. */
size_t sbx_exec_input_queued(const sbx_exec *x);
/* Output goes (cb) or stops going (NULL) to a chunk callback from now on
 * (the user data given at start). */
void sbx_exec_set_chunk_cb(sbx_exec *x, sbx_exec_chunk_cb cb);
/* Whether sig asks a process to stop (SIGTERM, SIGKILL, SIGINT, SIGQUIT):
 * one that ends of it is "killed". */
static inline bool sbx_signal_stops(int sig) { return sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGQUIT; }
/* Sends sig to every process of the command (its cgroup), or, without
 * cgroups, to its process group. One that stops is sent again for two
 * seconds to what starts there meanwhile; another (a reload's HUP) once. */
void sbx_exec_signal(sbx_exec *x, int sig);
/* What the command wrote so far (head and tail within its bound), as valid
 * UTF-8; malloc'd. stream: 1 stdout, 2 stderr. */
char *sbx_exec_output(sbx_exec *x, int stream, size_t *len);
/* The command's pid as the sandbox sees it (0 once it is gone). */
pid_t sbx_exec_pid_in_sandbox(sbx_exec *x);
/* A signal to the command's own process only (not its children). */
int sbx_exec_signal_command(sbx_exec *x, int sig);
/* Kills every exec of a sandbox (before it is destroyed). */
void sbx_exec_cancel_sandbox(sbx_sandbox *sb);
/* The sandbox's idle session shells end (the next command starts one with
 * the same state): they hold their cwd, which may be in a mount that is
 * about to go. */
void sbx_exec_shells_leave(sbx_sandbox *sb);
/* The session is being freed: its shell goes. */
void sbx_exec_session_gone(sbx_session *s);
