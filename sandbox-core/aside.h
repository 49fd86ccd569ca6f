/* Moving aside what a sandbox left where sbx makes a directory or a file
 * of its own (a symlink, a FIFO): sbx-init (built alone, statically) and
 * the layout of a sandbox's disk share it. */
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>

/* What stands at path (under dfd) renamed to path.sbx-N, the first N of
 * 1..64 free. 0 or -errno. */
static inline int sbx_move_aside(int dfd, const char *path) {
  char aside[4200];
  for (int n = 1; n <= 64; n++) {
    snprintf(aside, sizeof aside, "%s.sbx-%d", path, n);
    if (renameat2(dfd, path, dfd, aside, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}
