/* A sandbox's disk: where its writable root layer and /workspace live, on
 * the host's disk under $SBX_STATE_DIR/sandboxes/<id>/.
 *
 * As root it is a sparse ext4 image (disk.img) of diskMB on a loop device:
 * a hard quota independent of memory. Images are copies of a template
 * formatted once per size (only the few KiB of metadata are data; the
 * rest are holes), and the filesystem is mounted detached (fsmount), so it
 * appears only in the sandbox's own mount namespace. Rootless, it is a
 * plain directory (disk/) and diskMB is not enforced. */
#pragma once
#include "util.h"

#include <uv.h>

#include <stdbool.h>
#include <stdint.h>

/* Prepares the disk layer: the sandboxes/ and templates/ directories, and
 * (root) the loop devices still bound to images of this state dir, which
 * belong to sandboxes of a daemon that died and are being torn down. */
int sbx_disk_init(const char *state_dir, bool rootless, sbx_error *err);
/* Makes sure the template of that size exists (root); slow the first time. */
int sbx_disk_template(uint64_t disk_mb, sbx_error *err);
/* The sandbox's directory ($SBX_STATE_DIR/sandboxes/<id>); out >= 1200. */
void sbx_disk_dir(const char *id, char *out, size_t len);
/* Whether the sandbox's disk exists (its files survive). */
bool sbx_disk_exists(const char *id);
/* Creates the sandbox's disk when it does not exist (fresh and empty). */
int sbx_disk_ensure(const char *id, uint64_t disk_mb, sbx_error *err);
/* Root: attaches the image to a loop device and mounts it detached;
 * returns the mount fd (to be idmapped and moved into the sandbox). */
int sbx_disk_mount(const char *id, sbx_error *err);
/* The same for any image made by sbx_disk_make_image (what names it in
 * errors): one still in use is shared, never mounted twice. */
int sbx_disk_mount_image(const char *path, const char *what, sbx_error *err);
/* Makes an empty sparse ext4 image of mb at path unless one is there. */
int sbx_disk_make_image(const char *path, uint64_t mb, sbx_error *err);
/* Rootless: the directory to bind as the sandbox's disk. */
void sbx_disk_path(const char *id, char *out, size_t len);
/* An fd on the disk's filesystem, or -1: before a discard, to shut it
 * down (nothing of it is written again, and every file still open on it
 * gives EIO, whoever holds it: the sandbox's processes being killed, a
 * host process holding a file of the view in passthrough mode). rootfd:
 * the running sandbox's root (on that filesystem), or -1 when it is not
 * running. Checked: only ever that sandbox's image on its loop device. */
int sbx_disk_fd(const char *id, int rootfd);
/* Discards the disk's contents (idle reset): the image is unlinked (a
 * mount still tearing down keeps its own inode), the directory moved away
 * and removed in the background, where the filesystem of shut (taken, when
 * >= 0) is shut down first. */
void sbx_disk_discard(const char *id, int shut);
/* A running sandbox gone quiet: its disk's journal is checkpointed by the
 * disks' helper (never waited for), which lets the kernel drop the
 * metadata blocks the journal kept pinned in memory (some 110 KiB a
 * sandbox after its start). rootfd: the running sandbox's root (see
 * sbx_disk_fd). */
void sbx_disk_settle(const char *id, int rootfd);
/* Removes everything of the sandbox (destroy), as sbx_disk_discard does. */
void sbx_disk_remove(const char *id, int shut);
/* A helper process that keeps a few fresh disks of one size ready
 * (copied, bound, mounted), so a create does not wait for that; on_fresh
 * is called when one arrives. */
int sbx_disk_pool_start(uv_loop_t *loop, uint64_t disk_mb, void (*on_fresh)(void));
void sbx_disk_pool_stop(void);
/* A fresh disk from the helper, its image moved into the sandbox's
 * directory: its mount fd, or -1 when none of that size is ready. */
int sbx_disk_take_fresh(const char *id, uint64_t disk_mb);
/* Whether a fresh disk of disk_mb is ready to be taken now. */
bool sbx_disk_fresh_ready(uint64_t disk_mb);
/* Files of a sandbox's directory (beside its disk image), made ahead with
 * the disks of the pool for a new sandbox: its /proc files and the
 * temporary name its record is written under. */
#define SBX_FILE_MEMINFO "meminfo"
#define SBX_FILE_CPU_ONLINE "cpu-online"
#define SBX_FILE_RECORD "record.json"
/* Whether diskMB is a hard quota here. */
bool sbx_disk_quota_enforced(void);
