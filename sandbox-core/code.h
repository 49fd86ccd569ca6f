/* Code contexts: a Python or Node process per context inside the sandbox
 * (drivers/), fed code on its stdin, answering with JSON lines that are
 * parsed here as untrusted input. State persists between runs of one
 * context; contexts are independent processes. */
#pragma once
#include "exec.h"

#include <jansson.h>

#define SBX_MAX_CODE_CONTEXTS 16        /* per sandbox */
#define SBX_MAX_CODE (1024 * 1024)      /* bytes of code per run */
#define SBX_MAX_CODE_QUEUE 16           /* runs waiting in one context */

typedef struct sbx_code_ctx sbx_code_ctx;
typedef struct sbx_code_run sbx_code_run;

/* stream: "stdout" or "stderr" */
typedef void (*sbx_code_chunk_cb)(void *ud, const char *stream, const char *text, size_t len);
/* result: {results, logs: {stdout, stderr}, error?, executionCount}
 * (borrowed), or err */
typedef void (*sbx_code_done_cb)(void *ud, json_t *result, const sbx_error *err);
/* the context is ready (err NULL) or could not start */
typedef void (*sbx_code_ready_cb)(void *ud, sbx_code_ctx *c, const sbx_error *err);

/* Starts a context; ready_cb (may be NULL) says when its interpreter runs.
 * id NULL: a fresh one; "default-python" and so on for runCode's own. */
int sbx_code_create(uv_loop_t *loop, sbx_sandbox *sb, const char *language, const char *id, const char *cwd,
                    const sbx_env *env, sbx_code_ready_cb ready_cb, void *ud, sbx_code_ctx **out, sbx_error *err);
sbx_code_ctx *sbx_code_find(const char *sandbox, const char *id);
/* Queues code in the context; done_cb answers. */
int sbx_code_submit(sbx_code_ctx *c, const char *code, size_t len, int64_t timeout_ms, sbx_code_chunk_cb chunk_cb,
                 sbx_code_done_cb done_cb, void *ud, sbx_code_run **out, sbx_error *err);
/* Interrupts the run (KeyboardInterrupt; the context keeps its state) or
 * takes it off the queue; done_cb still answers, once. */
void sbx_code_cancel(sbx_code_run *r);
void sbx_code_delete(sbx_code_ctx *c);
bool sbx_code_dead(const sbx_code_ctx *c);
const char *sbx_code_language(const sbx_code_ctx *c); /* "python" or "javascript" */
json_t *sbx_code_json(const sbx_code_ctx *c);
/* {contexts: [...]} of a sandbox, with those that ended with an earlier
 * daemon as dead ones */
json_t *sbx_code_list(const sbx_sandbox *sb);
/* The sandbox was reset or destroyed: its contexts end and are forgotten. */
void sbx_code_forget_sandbox(const char *sandbox);
/* For the record: [{id, language, cwd, reset?}] of its contexts, and of those an
 * earlier daemon had (they ended with it), until they are used or deleted. */
json_t *sbx_code_record(const sbx_sandbox *sb);
/* Why id's context ended, if it is one that ended with an earlier daemon
 * or a reset (else NULL); take also forgets it (the record is the
 * caller's to save). */
const char *sbx_code_gone(const sbx_sandbox *sb, const char *id);
/* A reset ends sb's contexts: they stay listed as ended by it, and the
 * next run of a default one says it is new. */
void sbx_code_reset_sandbox(sbx_sandbox *sb);
bool sbx_code_take_gone(sbx_sandbox *sb, const char *id);
