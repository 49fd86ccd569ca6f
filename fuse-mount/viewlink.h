/* The FUSE view's link to the daemon: the list of sandboxes (kept live by
 * the daemon's events) and the fd of a sandbox's /workspace. A thread of
 * its own reads the socket; callers block on replies. The view knows the
 * daemon only through this socket, never through its code. */
#pragma once
#include <stdbool.h>
#include <sys/types.h>

typedef struct viewlink_cb {
  /* the daemon's list as it is now (after a connect or reconnect) */
  void (*reset_all)(void *ud, const char *const *ids, size_t n);
  /* "created", "started", "reset", "destroyed" */
  void (*changed)(void *ud, const char *id, const char *event);
  /* the daemon went away: every fd from it must be let go */
  void (*lost)(void *ud);
  void *ud;
} viewlink_cb;

/* Connects (starting the daemon when none runs) and subscribes: 0 or -1
 * with a message. Then viewlink_run starts the link's thread (after any
 * fork to the background), on which the callbacks run. */
int viewlink_connect(const viewlink_cb *cb, char *err, size_t errlen);
int viewlink_run(void);
/* Until the daemon's first list has arrived (or the daemon went, or
 * timeout_ms passed): a view that says it is ready shows every sandbox. */
void viewlink_wait_listed(int timeout_ms);
/* The O_PATH fd of a sandbox's /workspace (the daemon wakes it when it is
 * stopped or asleep), its root's host uid and gid and how many host ids it
 * has from them; -errno. */
int viewlink_open(const char *id, uid_t *uid, gid_t *gid, unsigned *uids);
/* Tells the daemon that a sandbox's files are in use through the view, so
 * that it is not reset for being idle meanwhile. Never blocks. */
void viewlink_touch(const char *id);
/* Whether the daemon is connected now. */
bool viewlink_connected(void);
void viewlink_stop(void);
