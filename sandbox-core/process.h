/* Background processes (startProcess and friends). */
#pragma once
#include "exec.h"

#include <jansson.h>

#include <signal.h>

#define SBX_MAX_PROCESSES 64            /* records per sandbox, running or finished */
#define SBX_PROCESS_LOG (1024 * 1024)   /* per stream kept in memory; the rest spills to a file */
/* What all processes' logs may hold in the daemon's memory, every
 * sandbox's together (and a quarter of it one sandbox's): a process started
 * past it keeps SBX_PROCESS_LOG_LEAN of each stream (its whole output is in
 * its file all the same). */
#define SBX_PROCESS_LOGS_MAX (256u * 1024 * 1024)
#define SBX_PROCESS_LOG_LEAN (16 * 1024)

typedef struct sbx_process_watch sbx_process_watch;

typedef struct sbx_process {
  char id[64], sandbox[64];
  char *command;
  const char *status; /* running, completed, failed, killed, error */
  int exit_code;
  bool done, killed, orphaned;
  uint64_t sent_ms[32]; /* when each signal was last sent: one sent again at once is not sent twice */
  uint64_t start_ms, end_ms;
  sbx_exec *x; /* while running */
  char *out, *err; /* once done */
  size_t out_len, err_len;
  size_t log_limit; /* of each stream, held in memory (SBX_PROCESS_LOGS_MAX) */
  bool lost; /* an earlier daemon's, running when it stopped: killed with it, when unknown */
  char output_path[128];
  sbx_process_watch *watches;
  struct sbx_process *next;
} sbx_process;

/* Someone following a running process's output (waitForLog,
 * streamProcessLogs) or waiting for its end. chunk: stream 1 or 2, UTF-8.
 * end: p has ended (p->done) or is being forgotten (p NULL); the watch is
 * gone after it. */
typedef void (*sbx_watch_chunk_cb)(void *ud, int stream, const char *data, size_t len);
typedef void (*sbx_watch_end_cb)(void *ud, sbx_process *p);
sbx_process_watch *sbx_process_watch_add(sbx_process *p, sbx_watch_chunk_cb chunk, sbx_watch_end_cb end, void *ud);
void sbx_process_unwatch(sbx_process *p, sbx_process_watch *w);

int sbx_process_start(uv_loop_t *loop, sbx_sandbox *sb, const char *id, const sbx_exec_opts *o, sbx_process **out,
                      sbx_error *err);
sbx_process *sbx_process_find(const char *sandbox, const char *id);
/* Every record (filter by ->sandbox, skip ->orphaned). */
sbx_process *sbx_process_list(void);
/* Signals a running process's whole tree; returns 1 if it was running. */
int sbx_process_kill(sbx_process *p, int sig);
/* The sandbox was destroyed or reset: its records go. */
void sbx_process_forget_sandbox(const char *sandbox);
/* Its output so far (or final), optionally only the last tail_lines lines. */
char *sbx_process_logs(sbx_process *p, int stream, size_t tail_lines, size_t *len);

/* The sandbox's records (id, command, how each ended) for its record, so
 * that the next daemon lists them (sbx_process_restore) and names new
 * ones after them: an array, newest first. */
json_t *sbx_process_record(const char *sandbox);
/* Records of an earlier daemon, from the sandbox's record: ended, those
 * that were running killed with it (lost). */
void sbx_process_restore(const char *sandbox, json_t *records);
