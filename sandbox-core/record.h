/* Sandbox records: what survives the daemon (options, sessions' cwd and
 * environment, state), as JSON in $SBX_STATE_DIR/sandboxes/<id>/record.json,
 * written atomically. */
#pragma once
#include "sandbox.h"

#include <jansson.h>

#define SBX_RECORD_VERSION 1

json_t *sbx_record_json(const sbx_sandbox *sb);
/* Fills a not yet running sandbox from its record; -1 with err on a record
 * that does not parse (the caller leaves it on disk and says so). */
int sbx_record_apply(sbx_sandbox *sb, json_t *rec, char *err, size_t errlen);
/* Writes text to path through path.tmp: write, fsync, rename. Returns 0
 * or -errno. */
int sbx_write_atomic(const char *path, const char *text, size_t len);

json_t *sbx_env_to_json(const sbx_env *e);
int sbx_env_from_json(sbx_env *e, json_t *obj);
