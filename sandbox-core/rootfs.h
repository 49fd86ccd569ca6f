/* The sandbox's root filesystem and its init (pid 1), run inside the new
 * namespaces. The mount plan is a table walked in order. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* Host directories layered under the sandbox (lower layers). The order is
 * the order of the fds the daemon sends in root mode. */
#define SBX_LAYERS_MAX 8
typedef struct sbx_layer {
  char host[1024];    /* the directory on the host */
  const char *target; /* path inside the sandbox, without leading '/' */
} sbx_layer;
/* The lower layers: the host's /usr, /opt, package databases and the /etc
 * template, or, with image_dir, the image's own /usr, /opt, /var/lib/dpkg,
 * /var/lib/apt and /etc. Only directories that exist are listed. */
int sbx_rootfs_layers(const char *image_dir, const char *etc_template, sbx_layer out[SBX_LAYERS_MAX]);

/* /dev (and /dev/shm in it): half the sandbox's memory, at most this, so
 * that filling it is ENOSPC rather than an OOM kill */
#define SBX_DEV_MB 256

typedef struct sbx_init_args {
  int sock;           /* SOCK_SEQPACKET to the daemon */
  const char *id;     /* hostname */
  bool ahead;         /* made ahead (sandbox.c): once built, wait on sock
                         for the name a create gives it, then become init */
  bool idmapped;      /* root mode: the disk and the lower layers arrive as
                         idmapped mount fds, the disk first */
  char disk_dir[1200]; /* rootless: the directory that is the sandbox's disk */
  const char *etc_template;
  const char *image_dir; /* NULL: the host's directories */
  /* the lower layers, listed by the daemon (which can see them all) before
   * the clone; in root mode their idmapped mounts arrive in this order */
  sbx_layer layers[SBX_LAYERS_MAX];
  int nlayers;
  int init_exe_fd; /* O_PATH fd of the static sbx-init */
  struct {
    char name[16], target[64];
  } links[8]; /* the root's merged-usr symlinks (bin -> usr/bin...) */
  int nlinks;
  /* usr/lib/NAME/EXTERNALLY-MANAGED of the root's Pythons (pip's marker),
   * to white out: listed on the host, where it costs less than a listing
   * of /usr/lib through the overlay */
#define SBX_PYTHONS_MAX 4
  char pythons[SBX_PYTHONS_MAX][32];
  int npythons;
  /* files to mount over /proc/meminfo and /sys/devices/system/cpu/online
   * (procfiles.h), when these are set: as root detached mounts after the
   * other mount fds, rootless procdir/meminfo and procdir/cpu-online */
  bool meminfo, cpu_online;
  char procdir[1200];
  unsigned dev_mb; /* the size of /dev's tmpfs, /dev/shm's too */
  /* root mode: detached mounts (a wake's bucket mounts, made before the
   * clone) to attach at these paths once the root is built, their fds
   * after the layers'. Attached as a helper would (sbx_walk_mkdir), and
   * told: sbx-init's "ok" carries a '1' or '0' for each, in order. */
#define SBX_INIT_MOUNTS_MAX 8
  const char *mount_paths[SBX_INIT_MOUNTS_MAX];
  int nmounts;
} sbx_init_args;

/* Reads what the sandbox's init needs to know of root (the host's / or an
 * image): its merged-usr symlinks into a->links, its Pythons with pip's
 * marker into a->pythons. */
void sbx_rootfs_scan(const char *root, sbx_init_args *a);

/* Runs in the cloned child: waits for the daemon's go, builds the root,
 * (made ahead: waits for its name), then becomes init, which reports "ok"
 * with the root's fd; an error is reported on the socket. Never returns. */
_Noreturn void sbx_rootfs_init_main(const sbx_init_args *a);

/* The fixed layout of a sandbox's disk below its stage fd: root/ (the
 * sandbox's / with its standard directories) and upper/, work/, lower/
 * for each layer. Idempotent; -errno. */
int sbx_rootfs_layout(int stagefd);

/* What every fresh disk of the host's system starts with beyond the
 * layout: the changes each start would otherwise make on it first. */
int sbx_rootfs_prime(int stagefd);

/* Builds the /etc template (allowlisted host files) into dir. */
int sbx_rootfs_build_etc(const char *dir);
