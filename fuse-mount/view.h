/* `sbx mount`: the live FUSE view of every sandbox's /workspace. */
#pragma once
#include <stdbool.h>

typedef struct sbx_view_opts {
  bool foreground;
  bool allow_other; /* other host users may enter too (as the sandbox's root) */
  bool debug;
  bool no_passthrough; /* serve reads and writes here even where the kernel could pass them through */
  bool no_uring; /* requests through /dev/fuse even where FUSE over io_uring could take them */
  int ready_fd;     /* written to once the view serves (-1: none) */
} sbx_view_opts;

int sbx_view_main(const char *mountpoint, const sbx_view_opts *o);
