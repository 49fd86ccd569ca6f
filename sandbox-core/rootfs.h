/* The sandbox's root filesystem and its init (pid 1), run inside the new
 * namespaces. The mount plan is a table walked in order. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* Host directories layered under the sandbox (lower layers). The order is
 * the order of the fds the daemon sends in root mode. */
#define SBX_LAYERS_MAX 8
typedef struct sbx_layer {
  const char *host;   /* host path (the /etc template is filled in at run time) */
  const char *target; /* path inside the sandbox, without leading '/' */
} sbx_layer;
int sbx_rootfs_layers(const char *etc_template, sbx_layer out[SBX_LAYERS_MAX]);

typedef struct sbx_init_args {
  int sock;           /* SOCK_SEQPACKET to the daemon */
  const char *id;     /* hostname */
  bool idmapped;      /* root mode: lower layers arrive as idmapped mount fds */
  uint64_t disk_mb;
  const char *etc_template;
} sbx_init_args;

/* Runs in the cloned child: waits for the daemon's go, builds the root,
 * reports "ok" or an error on the socket, then becomes init. Never returns. */
_Noreturn void sbx_rootfs_init_main(const sbx_init_args *a);

/* The argument by which sbx re-executes itself as a sandbox's init. */
#define SBX_INIT_ARG "__sandbox-init"
/* The init loop: reaps orphans forever. */
_Noreturn void sbx_rootfs_init_loop(void);

/* Builds the /etc template (allowlisted host files) into dir. */
int sbx_rootfs_build_etc(const char *dir);
