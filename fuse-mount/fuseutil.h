/* What the FUSE servers of sbx (the view, the bucket filesystem) share:
 * their mount options, taking over a mount point a dead server left, going
 * to the background, and the multithreaded loop. */
#pragma once
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sbx_fuse_args {
  struct fuse_args args;
} sbx_fuse_args;

/* nosuid, nodev, the filesystem's name, allow_other when asked. */
void sbx_fuse_args_init(sbx_fuse_args *a, const char *subtype, bool allow_other, bool kernel_perms, bool debug);
/* Whether an errno is what a killed server's mount point answers:
 * ENOTCONN, or over io_uring ECONNABORTED or ECANCELED. */
bool sbx_fuse_dead(int err);
/* Mounts the session, first detaching what a killed server left there
 * ("Transport endpoint is not connected"); refuses a live mount. */
int sbx_fuse_mount(struct fuse_session *se, const char *mountpoint, char *err, size_t errlen);
int sbx_fuse_daemonize(int ready_fd);
/* Serves until the session ends (SIGTERM, SIGINT, unmount); writes a byte
 * to ready_fd first when it is >= 0. */
int sbx_fuse_loop(struct fuse_session *se, int ready_fd);
/* fn for each sbx filesystem mounted in this mount namespace (its mount
 * point, unescaped, and its type: fuse.sbx-view, fuse.sbx-bucket...) until
 * fn returns true; whether one did. */
bool sbx_fuse_each_mount(bool (*fn)(const char *mnt, const char *fstype, void *ud), void *ud);
/* Whether an sbx filesystem (the view, a bucket) is mounted there (an
 * absolute path without symlinks, as /proc/self/mountinfo has it). */
bool sbx_fuse_is_ours(const char *mountpoint);
/* Unmounts a mount point (ours or a dead server's): umount2 as root,
 * fusermount3 -u otherwise. */
int sbx_fuse_unmount(const char *mountpoint, bool lazy, char *err, size_t errlen);
