/* The files API: paths as the sandbox sees them, resolved from the
 * sandbox's root fd with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS),
 * regular files only, created owned by sandbox root. They may block as
 * long as a file system does: for a sandbox with a bucket mount the file
 * tools call them in a child process (mcp-server/offload.h). */
#pragma once
#include "sandbox.h"

#define SBX_MAX_READ (32 * 1024 * 1024)
#define SBX_MAX_WRITE (32 * 1024 * 1024)
#define SBX_MAX_LIST 10000

/* Absolute, clean form of a path (relative → under /workspace; "." and
 * ".." taken lexically); -1 + err when empty or too long. */
int sbx_fs_abspath(const char *path, char out[4096], sbx_error *err);

int sbx_fs_check_dir(sbx_sandbox *sb, const char *path, sbx_error *err);
/* For the daemon's loop ("nowait"): in a sandbox with a bucket mount
 * (whose server may keep a lookup waiting for minutes) names are looked up
 * in the kernel's caches alone (RESOLVE_CACHED); 1 means "not known
 * without waiting". */
int sbx_fs_check_dir_nowait(sbx_sandbox *sb, const char *path, sbx_error *err);
/* Whether /bin/bash is there ("nowait": true when not known). */
bool sbx_fs_has_bash(sbx_sandbox *sb);
/* An O_PATH fd of a directory of the sandbox reached without any symlink
 * or mount crossing (for the FUSE view: its /workspace). */
int sbx_fs_open_dir(sbx_sandbox *sb, const char *path, sbx_error *err);
/* Creates (or truncates) a regular file, making parents; returns its fd. */
int sbx_fs_create(sbx_sandbox *sb, const char *path, mode_t mode, sbx_error *err);
/* A new file name (0600) in dir, a directory of the sandbox's root
 * filesystem made if absent (for the daemon's own files, such as spilled
 * output): reached through no symlink and no other mount, so it never
 * waits on a bucket mount; only the newest `keep` regular files of dir
 * stay. Returns its fd. */
int sbx_fs_own_file(sbx_sandbox *sb, const char *dir, const char *name, int keep, sbx_error *err);
int sbx_fs_write(sbx_sandbox *sb, const char *path, const void *data, size_t len, sbx_error *err);
/* *data is malloc'd (NUL-terminated for convenience). */
int sbx_fs_read(sbx_sandbox *sb, const char *path, size_t max, char **data, size_t *len, sbx_error *err);
/* length bytes of it from offset (length 0: to its end); *size gets the
 * file's size (may be NULL). */
int sbx_fs_read_part(sbx_sandbox *sb, const char *path, uint64_t offset, size_t length, size_t max, char **data,
                     size_t *len, uint64_t *size, sbx_error *err);
/* 1: made; 0: a directory already (recursive only); -1 + err. */
int sbx_fs_mkdir(sbx_sandbox *sb, const char *path, bool recursive, sbx_error *err);
int sbx_fs_delete(sbx_sandbox *sb, const char *path, bool recursive, sbx_error *err);
/* into_dir: when `to` is an existing directory, move `from` inside it;
 * moved_to (may be NULL) gets the path it has now. */
int sbx_fs_rename(sbx_sandbox *sb, const char *from, const char *to, bool into_dir, char moved_to[4096], sbx_error *err);
int sbx_fs_exists(sbx_sandbox *sb, const char *path, bool *exists, sbx_error *err);

typedef struct sbx_fs_entry {
  const char *name, *path, *type; /* "file" "directory" "symlink" "other" */
  uint64_t size;
  int64_t mtime_ms;
  mode_t mode;
} sbx_fs_entry;
typedef void (*sbx_fs_list_cb)(void *ud, const sbx_fs_entry *e);
/* Returns the number of entries, or -1; *truncated when SBX_MAX_LIST cut. */
int sbx_fs_list(sbx_sandbox *sb, const char *path, bool recursive, bool hidden, sbx_fs_list_cb cb, void *ud,
                bool *truncated, sbx_error *err);

/* mimeType from a file name's extension; text/plain for text (valid
 * UTF-8) whose extension says nothing. */
const char *sbx_fs_mime(const char *path, bool text);
