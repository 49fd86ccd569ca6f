/* Bucket mounts: directories of a sandbox that outlive its idle resets.
 *
 * An S3/R2 bucket is served by `sbx bucketfs`, a FUSE server of its own on
 * the host side (so credentials never enter the sandbox), one per mount,
 * in a cgroup of its own, as an unprivileged user; its mount is made by the
 * daemon (or, rootless, in the sandbox's user namespace) and moved into the
 * sandbox's mount namespace at mountPath. A local bucket is a directory of
 * the state dir ($SBX_STATE_DIR/buckets/<bucket>) bound there, idmapped so
 * its files keep their owners across incarnations.
 *
 * Mounts are part of the sandbox's record (never its secrets: those live
 * 0600 in the mount's cache directory) and come back on every start. */
#pragma once
#include "sandbox.h"

#include <jansson.h>

typedef struct sbx_bucket {
  char id[17]; /* names its cache directory: a hash of what it mounts */
  char bucket[64];
  char mount_path[1024];
  char endpoint[512]; /* "" for a local bucket */
  char region[64];
  char prefix[520];
  char profile[64];
  bool read_only, local, path_style, public_only;
  /* the mount attached in the sandbox, while it runs (not in the record):
   * an fd of it, by which it is detached wherever the sandbox moved it */
  bool attached;
  int mfd;
  /* a start's mount, made before init's clone and given to it to attach
   * (sbx_bucket_start_mounts), until the start ends: its fd, the /dev/fuse
   * fd until its server runs, the server's configuration until then */
  bool pending, served;
  int pmfd, pdevfd;
  char *pconfig;
  int init_slot; /* its place among the mounts given to init */
  struct sbx_bucket *next;
} sbx_bucket;

/* What mountBucket asks for (strings may be NULL). */
typedef struct sbx_bucket_req {
  const char *bucket, *mount_path, *endpoint, *region, *prefix, *profile, *access_key, *secret_key;
  bool read_only;
  int local; /* -1: not said (local when no endpoint and no profile) */
} sbx_bucket_req;

/* err NULL: done; detail says more (for the result's text). */
typedef void (*sbx_bucket_cb)(void *ud, const sbx_error *err, const char *detail);

/* Validates a request against the daemon's configuration into b (and the
 * credentials into ak/sk); pure but for the configuration (unit-tested). */
int sbx_bucket_prepare(const sbx_bucket_req *r, sbx_bucket *b, char ak[256], char sk[256], sbx_error *err);
/* What an agent can make the host give one sandbox is bounded: each S3
 * mount is a server process (512 MiB of memory at most) with a cache on
 * the host's disk of up to the sandbox's diskMB. */
#define SBX_MAX_BUCKETS 8
/* Caches left by mounts gone, with changes their bucket has not taken,
 * kept on this machine (of destroyed sandboxes too): past it, a mount that
 * needs a new cache is RESOURCE_LIMIT. */
#define SBX_MAX_ORPHAN_CACHES 64
/* Mounts a bucket into a running sandbox: a local one at once, an S3 one
 * once the bucket answered (cb then, MOUNT_FAILED saying why); at most
 * SBX_MAX_BUCKETS per sandbox (RESOURCE_LIMIT). */
int sbx_bucket_mount(sbx_sandbox *sb, const sbx_bucket_req *r, sbx_bucket_cb cb, void *ud, sbx_error *err);
/* The sandbox stopped: its mounts went with its mount namespace. */
void sbx_bucket_stopped(sbx_sandbox *sb);
/* Unmounts it; cb once its server has put every change in the bucket (or
 * kept what it could not in its journal, for later). */
int sbx_bucket_unmount(sbx_sandbox *sb, const char *mount_path, sbx_bucket_cb cb, void *ud, sbx_error *err);
/* A start, root mode: the FUSE mounts of the record's S3 buckets, made
 * before init's clone for init to attach as it builds the root: their
 * paths into paths, copies of their fds into mfds (the caller's to send
 * and close); how many. */
int sbx_bucket_start_mounts(sbx_sandbox *sb, const char *paths[], int mfds[]);
/* Once init has them: their servers start while it builds the root. */
void sbx_bucket_start_servers(sbx_sandbox *sb);
/* After a start: every mount of the record again (what init attached, of
 * those sbx_bucket_start_mounts gave it: a '1' in `in` for each, in order,
 * is kept). Failures are warned of. */
void sbx_bucket_start_all(sbx_sandbox *sb, const char *in);
/* The sandbox is being destroyed: its caches go once their servers have
 * uploaded everything. */
void sbx_bucket_destroyed(sbx_sandbox *sb);
void sbx_bucket_free_all(sbx_sandbox *sb);
/* At engine start: changes journaled by servers of earlier daemons go up. */
void sbx_bucket_init(void);
/* The daemon stops: its sandboxes go from memory, not from the state dir;
 * a bucket server that ends from here on keeps its cache (the next daemon
 * start removes those no mount has). */
void sbx_bucket_shutdown(void);

json_t *sbx_bucket_to_json(const sbx_bucket *b);
int sbx_bucket_from_json(json_t *j, sbx_bucket *b);
