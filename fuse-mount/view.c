/* `sbx mount MOUNTPOINT`: every sandbox's /workspace on the host, live, as
 * MOUNTPOINT/<sandboxId>/. A low-level, multithreaded FUSE filesystem in
 * the manner of libfuse's passthrough_ll: each inode holds an O_PATH fd of
 * the file in the sandbox, reached one name at a time with O_NOFOLLOW from
 * the fd of the sandbox's /workspace that the daemon hands over. Nothing
 * is ever resolved by path, so no symlink, `..` or rename inside a sandbox
 * can lead the server out of it.
 *
 * What the host sees is untrusted content:
 * - symlink targets that are absolute or climb with `..` are rewritten to
 *   absolute paths inside MOUNTPOINT/<id>/ (or to a dangling name there
 *   when they lead outside /workspace), so the host kernel, which follows
 *   them in the host's namespace, can never leave the sandbox's view;
 * - files show their real host owner (the sandbox's own unprivileged uid;
 *   rootless, nobody), never the mounting user, so git refuses a
 *   repository in the view as "dubious ownership" and a planted hook or
 *   core.fsmonitor cannot run; the mounting user may still read and write
 *   everything (the server decides, not the mode bits);
 * - the mount is nosuid and nodev.
 *
 * Coherence: as root, one fanotify group watches every sandbox's disk and
 * each change made inside is pushed to the kernel as an invalidation, so
 * caches stay on and stay right; rootless, cache timeouts are short. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 314
#include "view.h"
#include "fuseutil.h"
#include "passthrough.h"
#include "uring.h"
#include "viewlink.h"
#include "../sandbox-core/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/fanotify.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <linux/limits.h>

#define HASH_SIZE 65536
#define OUTSIDE ".sbx-outside-workspace"

struct sbox;

typedef struct vnode {
  uint64_t nlookup; /* the kernel's references */
  int fd;           /* O_PATH; a dead node's fd is an O_PATH of /dev/null */
  dev_t dev;
  ino_t ino;
  struct sbox *sb;  /* NULL: the view's root */
  uint64_t gen;     /* the sandbox's generation it belongs to */
  bool dead;
  bool lazy;        /* a sandbox's root, not opened yet (it is not running) */
  bool counted;     /* one of its sandbox's nodes (sbox.nodes) */
  bool dir;         /* a directory (deep_flush reads it) */
  struct vnode *parent; /* symlinks: the directory they were found in */
  uid_t owner;      /* its owner and group when last seen (act_as_node) */
  gid_t group;
  struct vnode *hnext;
  int backing;      /* passthrough: the kernel's id of its backing file, or 0 */
  unsigned nbacked; /* open files using it */
  unsigned ncached; /* open files served here (the kernel takes one mode at a time) */
  bool listed;      /* a directory not watched, whose listing the kernel may keep (relisted) */
} vnode;

typedef struct vfile { /* an open file or directory */
  int fd;
  vnode *vn;
  DIR *dir;
  struct dirent *entry;
  off_t offset;
  bool backed; /* in passthrough mode, on its node's backing id */
  bool cached; /* served here, on a node that passthrough may serve */
  struct vfile *next;
} vfile;

typedef struct sbox {
  char id[64];
  unsigned index; /* stable while the view runs: high bits of inode numbers */
  uid_t uid;      /* sandbox root on the host: what the server acts as */
  gid_t gid;
  unsigned uids;  /* host ids it has from uid and gid on (0: not known yet) */
  uint64_t gen;   /* bumped on reset, destroy, restart: older nodes are dead */
  vnode *root;
  dev_t dev;
  __fsid_t fsid;
  bool own_disk; /* its /workspace is on a filesystem of its own (an ext4 image on a loop device) */
  bool present;
  unsigned long nodes; /* nodes holding an fd (see too_many_nodes) */
  time_t flushed;      /* when its cached tree was last dropped for holding too many */
  _Atomic int64_t used_ms; /* when the daemon was last told it is in use (box_used) */
  struct sbox *next;
} sbox;

static struct {
  pthread_mutex_t lock;
  struct fuse_session *se;
  char mountpoint[PATH_MAX];
  vnode root;
  vnode *hash[HASH_SIZE];
  sbox *boxes;
  unsigned next_index;
  vfile *files;
  int null_path; /* O_PATH /dev/null: what a dead node's fd becomes */
  int null_rw;   /* /dev/null open for I/O: what a dead file's fd becomes */
  uid_t uid;     /* the mounting user */
  gid_t gid;
  bool rootless;
  bool allow_other;
  double timeout; /* attribute and entry cache */
  unsigned long all_nodes, max_all; /* every sandbox's together: seven eighths of the fds (open files need some) */
  bool soft_armed; /* below three quarters of the fds since the last drop there (too_many_nodes) */
  unsigned long events; /* how many of the daemon's events have come (do_lookup) */
  bool stateless_dirs; /* no opendir (v_opendir) */
  int fan;        /* fanotify (root), or -1 */
  bool passthrough; /* as root: regular files in FUSE passthrough mode */
  /* invalidations are sent from a thread of their own: never from one that
   * the kernel may be waiting for */
  pthread_t notifier;
  pthread_cond_t notify_cond;
  struct inval {
    fuse_ino_t parent, ino;
    struct sbox *deep; /* instead: every name of this sandbox the kernel may hold (deep_flush) */
    char name[256];
    struct inval *next;
    struct inval *pnext; /* in pending[] */
    unsigned bucket;
    bool expire; /* the name is only marked expired (see sbx_fuse_notify_expire_entry) */
  } *inval_head, *inval_tail;
  /* the invalidations queued and not sent yet, by what they invalidate: one
   * the same as a pending one is not queued again (a sandbox making and
   * removing one name in a loop queued two a turn, and the view spent most
   * of a CPU sending them) */
  struct inval *pending[1024];
  unsigned long nlisted; /* directories listed that no invalidation keeps right (vnode.listed) */
  bool stopping;
} V = {.lock = PTHREAD_MUTEX_INITIALIZER, .notify_cond = PTHREAD_COND_INITIALIZER, .fan = -1};

/* ---- identity ----------------------------------------------------------- */

/* File operations run with the filesystem identity of the sandbox's root:
 * what the view creates is owned by it inside, and the server can do no
 * more than it could. Every one, those on open files too: without
 * CAP_FSETID (which a non-zero fsuid drops) the sandbox's filesystem
 * drops set-id bits on writes, as the kernel expects of this server
 * (handle_killpriv_v2, see passthrough.c). fsuid is per thread. */
static __thread uid_t cur_fsuid = (uid_t)-1;
static __thread gid_t cur_fsgid = (gid_t)-1;
static void act_with(uid_t u, gid_t g) {
  if (cur_fsuid == u && cur_fsgid == g) return;
  setfsgid(g);
  setfsuid(u);
  cur_fsuid = u;
  cur_fsgid = g;
}

static void act_as(const sbox *sb) { act_with(sb ? sb->uid : V.uid, sb ? sb->gid : V.gid); }

/* An operation on an existing file or directory of another of the
 * sandbox's users (its owner a uid of the sandbox's range, not its root's)
 * acts as that user: the sandbox's root may read, search and change such
 * files (its capabilities inside), the server acting as the root's host uid
 * may not, and acting as one of the sandbox's own uids gives nothing
 * outside it. New files are still made as the sandbox's root. */
static void act_as_node(const vnode *v) {
  const sbox *sb = v->sb;
  uid_t o = v->owner;
  gid_t g = v->group;
  if (V.rootless || !sb || o == sb->uid || o - sb->uid >= sb->uids) return act_as(sb);
  act_with(o, g - sb->gid < sb->uids ? g : sb->gid);
}

/* ---- filesystems inside a sandbox's disk (bucket mounts) --------------- */

/* A thread of the view in a filesystem mounted inside a sandbox's
 * /workspace (a bucket) waits as long as that filesystem's server, and the
 * endpoint behind it, make it: an endpoint that stalls or trickles held
 * every thread of the view, and no sandbox's files answered. So requests
 * into such filesystems take a slot of their filesystem's: FOREIGN_MAX at
 * once in one, FOREIGN_WAIT more waiting for one of those to end (until
 * FOREIGN_WAIT_S; one whose caller is interrupted, killed, ends with
 * EINTR), and FOREIGN_ALL held or waiting in all of them together; a
 * request past those fails at once with EAGAIN ("Resource temporarily
 * unavailable"). A stalled bucket holds 48 of the view's threads at most
 * (64 a CPU), and the other buckets and every sandbox's own files go on
 * answering. */
#define FOREIGN_MAX 16
#define FOREIGN_WAIT 32
#define FOREIGN_ALL 64
#define FOREIGN_WAIT_S 30
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int all; /* held or waiting, in every filesystem */
  struct fslots {
    dev_t dev;
    int inside, waiting;
  } fs[FOREIGN_ALL]; /* the filesystems with a slot held or waited for */
} fg = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

typedef struct {
  struct fslots *fs; /* the slot held, or NULL */
} foreign_slot;

static bool foreign(const vnode *v) { return v && v->sb && v->dev != v->sb->dev && !v->lazy; }

/* Lock held. There is always room: each entry in use has a request (and
 * FOREIGN_ALL requests at most). */
static struct fslots *slots_of(dev_t dev) {
  struct fslots *free_one = NULL;
  for (int i = 0; i < FOREIGN_ALL; i++) {
    struct fslots *f = &fg.fs[i];
    if ((f->inside || f->waiting) && f->dev == dev) return f;
    if (!f->inside && !f->waiting && !free_one) free_one = f;
  }
  free_one->dev = dev;
  return free_one;
}

static uint64_t mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec;
}

/* 0, or the error the request ends with. */
static int slot_take(fuse_req_t req, const vnode *a, const vnode *b, foreign_slot *s) {
  const vnode *v = foreign(a) ? a : foreign(b) ? b : NULL;
  if (!v) return 0;
  int err = 0;
  pthread_mutex_lock(&fg.lock);
  if (fg.all >= FOREIGN_ALL) {
    pthread_mutex_unlock(&fg.lock);
    return EAGAIN;
  }
  struct fslots *f = slots_of(v->dev);
  if (f->inside >= FOREIGN_MAX && f->waiting >= FOREIGN_WAIT) err = EAGAIN;
  else {
    fg.all++;
    f->waiting++;
    for (uint64_t until = mono_s() + FOREIGN_WAIT_S; f->inside >= FOREIGN_MAX && !err;) {
      struct timespec t;
      clock_gettime(CLOCK_REALTIME, &t);
      t.tv_sec++;
      pthread_cond_timedwait(&fg.cond, &fg.lock, &t);
      if (fuse_req_interrupted(req)) err = EINTR;
      else if (f->inside >= FOREIGN_MAX && mono_s() >= until) err = EAGAIN;
    }
    f->waiting--;
    if (err) fg.all--;
    else f->inside++, s->fs = f;
  }
  pthread_mutex_unlock(&fg.lock);
  return err;
}

static void slot_give(foreign_slot *s) {
  if (!s->fs) return;
  pthread_mutex_lock(&fg.lock);
  s->fs->inside--;
  fg.all--;
  pthread_cond_broadcast(&fg.cond); /* the waiters of this filesystem among others */
  pthread_mutex_unlock(&fg.lock);
}

/* First in an operation on node a (and b): its slot is given back as the
 * operation returns, its answer sent. */
#define FOREIGN_GATE(req, a, b)                                                                                        \
  __attribute__((cleanup(slot_give))) foreign_slot slot_ = {0};                                                       \
  int gate_err_ = slot_take((req), (a), (b), &slot_);                                                                 \
  if (gate_err_) return (void)fuse_reply_err((req), gate_err_)

/* ---- nodes -------------------------------------------------------------- */

static size_t hash_of(dev_t dev, ino_t ino) { return (size_t)((dev * 0x9e3779b97f4a7c15ull) ^ ino) % HASH_SIZE; }

static vnode *node_of(fuse_ino_t ino) { return ino == FUSE_ROOT_ID ? &V.root : (vnode *)(uintptr_t)ino; }

/* The live node of (dev, ino) of sb, or NULL. Lock held. */
static vnode *node_at(const sbox *sb, dev_t dev, ino_t ino) {
  for (vnode *v = V.hash[hash_of(dev, ino)]; v; v = v->hnext)
    if (!v->dead && v->dev == dev && v->ino == ino && v->sb == sb) return v;
  return NULL;
}

/* The same, with a reference for the kernel taken. Lock held. */
static vnode *node_find(sbox *sb, const struct stat *st) {
  vnode *v = node_at(sb, st->st_dev, st->st_ino);
  if (v) v->nlookup++;
  return v;
}

/* A copy of a live node's fd, or -1: it stays that node's inode when a
 * reset or destroy puts /dev/null under the node's own fd (box_kill). For
 * work done as root. Lock held. */
static int node_fd_copy(const vnode *v) { return v->dead || v->fd < 0 ? -1 : fcntl(v->fd, F_DUPFD_CLOEXEC, 0); }

/* What a stat of the node said of its owner (act_as_node). */
static void node_seen(vnode *v, const struct stat *st) {
  v->owner = st->st_uid;
  v->group = st->st_gid;
}

/* Finds the live node of (dev, ino) or adopts fd as a new one; a reference
 * for the kernel is taken. Lock held. */
static vnode *node_get(sbox *sb, int fd, const struct stat *st, bool *used_fd) {
  size_t h = hash_of(st->st_dev, st->st_ino);
  vnode *v = node_find(sb, st);
  *used_fd = false;
  if (v) return v;
  v = calloc(1, sizeof *v);
  if (!v) return NULL;
  *v = (vnode){.nlookup = 1, .fd = fd, .dev = st->st_dev, .ino = st->st_ino, .sb = sb, .gen = sb->gen, .counted = true,
               .dir = S_ISDIR(st->st_mode), .owner = st->st_uid, .group = st->st_gid};
  sb->nodes++;
  __atomic_add_fetch(&V.all_nodes, 1, __ATOMIC_RELAXED); /* read without the lock in too_many_nodes */
  v->hnext = V.hash[h];
  V.hash[h] = v;
  *used_fd = true;
  return v;
}

static void node_unhash(vnode *v) {
  if (v->listed) v->listed = false, V.nlisted--;
  if (v->lazy) return;
  for (vnode **pp = &V.hash[hash_of(v->dev, v->ino)]; *pp; pp = &(*pp)->hnext)
    if (*pp == v) {
      *pp = v->hnext;
      return;
    }
}

static void node_forget(vnode *v, uint64_t n) {
  if (v == &V.root) return;
  pthread_mutex_lock(&V.lock);
  if (v->nlookup <= n) {
    node_unhash(v);
    if (v->sb && v->sb->root == v) v->sb->root = NULL;
    if (v->counted) v->sb->nodes--, __atomic_sub_fetch(&V.all_nodes, 1, __ATOMIC_RELAXED);
    if (v->fd >= 0) close(v->fd);
    free(v);
  } else {
    v->nlookup -= n;
  }
  pthread_mutex_unlock(&V.lock);
}

static sbox *box_find(const char *id) {
  for (sbox *b = V.boxes; b; b = b->next)
    if (!strcmp(b->id, id)) return b;
  return NULL;
}

/* Inode numbers are unique across sandboxes (each has its own disk), and
 * across the filesystems of one (a bucket mounted under /workspace): bits
 * 32-39 tell those apart, 0 for its own disk. */
static void present_attr(const sbox *sb, struct stat *st) {
  uint64_t other = 0;
  if (sb && st->st_dev != sb->dev) {
    uint64_t h = (uint64_t)st->st_dev * 0x9e3779b97f4a7c15ull;
    other = ((h >> 56) | 1) << 32;
  }
  st->st_ino = ((uint64_t)(sb ? sb->index : 0) << 40) ^ other ^ st->st_ino;
  if (V.rootless) st->st_uid = st->st_gid = 65534; /* foreign to every host user */
}

/* Whether changes inside to files of this filesystem are pushed to the
 * kernel (fanotify watches the sandbox's own disk): then caches are long,
 * else (a bucket mounted under /workspace, or rootless) a second. */
static bool watched(const sbox *sb, dev_t dev) { return V.fan >= 0 && sb && dev == sb->dev; }
static double cache_time(const sbox *sb, dev_t dev) { return watched(sb, dev) ? V.timeout : 1.0; }

/* A lazy root node takes fd, its sandbox's /workspace as the daemon gave
 * it (closed if another thread resolved the node first). */
static int root_adopt(vnode *v, int fd, uid_t uid, gid_t gid, unsigned uids) {
  struct stat st;
  struct statfs sf;
  if (fstat(fd, &st) < 0 || fstatfs(fd, &sf) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  pthread_mutex_lock(&V.lock);
  if (v->lazy && !v->dead) {
    v->fd = fd;
    v->dev = st.st_dev;
    v->ino = st.st_ino;
    v->dir = true;
    v->lazy = false;
    v->sb->uid = uid;
    v->sb->gid = gid;
    v->sb->uids = uids;
    v->sb->dev = st.st_dev;
    v->sb->fsid = sf.f_fsid;
    v->sb->own_disk = major(st.st_dev) == 7 /* LOOP_MAJOR */ && sf.f_type == 0xEF53 /* EXT4_SUPER_MAGIC */;
    size_t h = hash_of(st.st_dev, st.st_ino);
    v->hnext = V.hash[h];
    V.hash[h] = v;
    fd = -1;
    if (V.fan >= 0) /* every change made inside it, from now on */
      fanotify_mark(V.fan, FAN_MARK_ADD | FAN_MARK_FILESYSTEM,
                    FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_ATTRIB | FAN_MODIFY |
                        FAN_CLOSE_WRITE | FAN_ONDIR,
                    v->fd, ".");
  }
  bool dead = v->dead;
  pthread_mutex_unlock(&V.lock);
  if (fd >= 0) close(fd);
  return dead ? -ENOENT : 0;
}

/* A sandbox's root node, opened through the daemon when it was lazy. */
static int resolve_root(vnode *v) {
  if (!v->lazy) return 0;
  uid_t uid;
  gid_t gid;
  unsigned uids;
  int fd = viewlink_open(v->sb->id, &uid, &gid, &uids);
  return fd < 0 ? fd : root_adopt(v, fd, uid, gid, uids);
}

/* Work on a sandbox's files through the view is activity, as a tool call
 * is: the daemon does not reset the sandbox for being idle while a host
 * editor works in it. Told at most twice a second (the shortest sleepAfter
 * is a second), without waiting. */
static void box_used(sbox *sb) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  int64_t now = (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000, was = atomic_load_explicit(&sb->used_ms, memory_order_relaxed);
  if (now - was >= 500 && atomic_compare_exchange_strong(&sb->used_ms, &was, now)) viewlink_touch(sb->id);
}

/* The fd of a node for an operation, or -errno: dead nodes are gone. The
 * fd stays valid (a dead node's becomes /dev/null, never another file).
 * Every operation on a sandbox's files comes here. */
static int node_fd(vnode *v) {
  if (v->dead) return -ENOENT;
  if (v->sb) box_used(v->sb);
  if (v->lazy) {
    int r = resolve_root(v);
    if (r < 0) return r;
  }
  return v->dead ? -ENOENT : v->fd;
}

static void queue_inval(fuse_ino_t parent, const char *name, fuse_ino_t ino);

/* Everything of a sandbox goes: its nodes and open files point at /dev/null
 * from now on (the fd numbers stay valid for threads using them), and its
 * disk is no longer held. Files open in passthrough mode are the kernel's:
 * the daemon shuts a discarded disk down, so they give EIO too. Lock held. */
static void box_kill(sbox *sb) {
  for (size_t h = 0; h < HASH_SIZE; h++)
    for (vnode *v = V.hash[h]; v; v = v->hnext)
      if (v->sb == sb && !v->dead) {
        v->dead = true;
        dup3(V.null_path, v->fd, O_CLOEXEC);
        queue_inval(0, NULL, (fuse_ino_t)(uintptr_t)v); /* its cached pages go too */
      }
  if (sb->root && sb->root->lazy) sb->root->dead = true;
  for (vfile *f = V.files; f; f = f->next)
    if (f->vn && f->vn->sb == sb && f->fd >= 0) dup3(V.null_rw, f->fd, O_CLOEXEC);
  sb->root = NULL;
  sb->gen++;
}

/* ---- invalidations ------------------------------------------------------ */

/* For the notifier thread, which takes all that is queued at once: it is
 * woken when the queue stops being empty, and what comes while it waits
 * for the lock (the rest of a batch of events) goes out with it. Lock held. */
static void queue_inval_of(struct inval *i) {
  if (V.inval_tail) V.inval_tail->next = i;
  else {
    V.inval_head = i;
    pthread_cond_signal(&V.notify_cond);
  }
  V.inval_tail = i;
}

/* A node an invalidation names is kept (a reference of the view's own)
 * until the invalidation has gone out: freed meanwhile (the kernel forgot
 * it), its address could be a new node's by then, and the invalidation
 * would drop that one's names (opens in a new sandbox got ENOENT while a
 * destroyed sandbox's 20,000 nodes were let go). Lock held. */
static void node_pin(fuse_ino_t ino) {
  if (ino && ino != FUSE_ROOT_ID) node_of(ino)->nlookup++;
}

/* Lock not held. */
static void node_unpin(fuse_ino_t ino) {
  if (ino && ino != FUSE_ROOT_ID) node_forget(node_of(ino), 1);
}

static void queue_inval_as(fuse_ino_t parent, const char *name, fuse_ino_t ino, bool expire) {
  uint64_t h = (parent * 0x9e3779b97f4a7c15ull) ^ (ino * 0xc2b2ae3d27d4eb4full);
  for (const char *c = name ? name : ""; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
  unsigned b = (unsigned)(h % SBX_ARRAY_SIZE(V.pending));
  for (struct inval *p = V.pending[b]; p; p = p->pnext)
    if (p->parent == parent && p->ino == ino && p->expire == expire && !strcmp(p->name, name ? name : ""))
      return; /* it will go out anyway */
  struct inval *i = calloc(1, sizeof *i);
  if (!i) return;
  i->parent = parent;
  i->ino = ino;
  node_pin(parent);
  node_pin(ino);
  if (name) snprintf(i->name, sizeof i->name, "%s", name);
  i->bucket = b;
  i->expire = expire;
  i->pnext = V.pending[b];
  V.pending[b] = i;
  queue_inval_of(i);
}

static void queue_inval(fuse_ino_t parent, const char *name, fuse_ino_t ino) { queue_inval_as(parent, name, ino, false); }

/* Drops every name of a sandbox the kernel may hold, one by one: each
 * directory the view has a node for is read, and each of its names that
 * is a node the view holds is invalidated. Dropping the sandbox's entry in
 * the view's root is not enough once a host process works in a directory
 * inside (its cwd): the kernel keeps that directory, cut off from the
 * root, and a walk from there fills the view's nodes again under it, where
 * the root's entry no longer reaches (it is gone already: the invalidation
 * fails), and every sandbox's new names got ENFILE until something looked
 * the sandbox up again. On the notifier thread, as root: reading a
 * directory is not a request to the view. */
static void deep_flush(sbox *sb) {
  struct dir_node {
    fuse_ino_t ino;
    int fd;
    dev_t dev;
  } *dirs = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&V.lock);
  for (size_t h = 0; h < HASH_SIZE; h++)
    for (vnode *v = V.hash[h]; v; v = v->hnext) {
      if (v->sb != sb || v->dead || !v->dir) continue;
      if (n == cap) {
        struct dir_node *d = realloc(dirs, (cap = cap ? 2 * cap : 64) * sizeof *dirs);
        if (!d) break;
        dirs = d;
      }
      int fd = node_fd_copy(v); /* the node may be forgotten and its fd number reused meanwhile */
      if (fd >= 0) {
        node_pin((fuse_ino_t)(uintptr_t)v); /* and its address a new node's: kept until done */
        dirs[n++] = (struct dir_node){.ino = (fuse_ino_t)(uintptr_t)v, .fd = fd, .dev = v->dev};
      }
    }
  pthread_mutex_unlock(&V.lock);
  for (size_t k = 0; k < n; k++) {
    int dfd = openat(dirs[k].fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    close(dirs[k].fd);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d && dfd >= 0) close(dfd);
    for (struct dirent *e; d && (e = readdir(d));) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      pthread_mutex_lock(&V.lock);
      bool held = node_at(sb, dirs[k].dev, e->d_ino) != NULL;
      pthread_mutex_unlock(&V.lock);
      if (held) fuse_lowlevel_notify_inval_entry(V.se, dirs[k].ino, e->d_name, strlen(e->d_name));
    }
    if (d) closedir(d);
    node_unpin(dirs[k].ino);
  }
  free(dirs);
}

/* The listings the kernel keeps of directories no invalidation reaches
 * (a bucket's, with opendir answered ENOSYS: see v_opendir) are dropped
 * every second, as their names' entries and attributes expire: a file a
 * sandbox adds to its bucket shows in a listing through the view within
 * a second, as a change to it does. Lock held. */
static void relist(void) {
  for (size_t h = 0; h < HASH_SIZE && V.nlisted; h++)
    for (vnode *v = V.hash[h]; v; v = v->hnext)
      if (v->listed) {
        v->listed = false;
        V.nlisted--;
        if (!v->dead) queue_inval(0, NULL, (fuse_ino_t)(uintptr_t)v);
      }
}

static void *notifier_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&V.lock);
  struct timespec due = {0};
  bool armed = false; /* due is a second after the first listing of those */
  while (!V.stopping) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!V.nlisted) armed = false;
    else if (!armed) armed = true, due = (struct timespec){now.tv_sec + 1, now.tv_nsec};
    else if (now.tv_sec > due.tv_sec || (now.tv_sec == due.tv_sec && now.tv_nsec >= due.tv_nsec)) {
      relist();
      due = (struct timespec){now.tv_sec + 1, now.tv_nsec};
    }
    struct inval *list = V.inval_head;
    if (!list) {
      if (V.nlisted) pthread_cond_timedwait(&V.notify_cond, &V.lock, &due);
      else pthread_cond_wait(&V.notify_cond, &V.lock);
      continue;
    }
    /* all queued so far, sent without the lock: new events for them
     * queue them again */
    V.inval_head = V.inval_tail = NULL;
    for (struct inval *i = list; i; i = i->next)
      if (!i->deep)
        for (struct inval **pp = &V.pending[i->bucket]; *pp; pp = &(*pp)->pnext)
          if (*pp == i) {
            *pp = i->pnext;
            break;
          }
    pthread_mutex_unlock(&V.lock);
    while (list) {
      struct inval *i = list;
      list = i->next;
      if (V.se && i->deep) deep_flush(i->deep);
      else if (V.se) {
        /* a kernel before 6.2 refuses the flag: the name is dropped there */
        if (i->name[0] && (!i->expire || sbx_fuse_notify_expire_entry(i->parent, i->name) == -EINVAL))
          fuse_lowlevel_notify_inval_entry(V.se, i->parent, i->name, strlen(i->name));
        if (i->ino) fuse_lowlevel_notify_inval_inode(V.se, i->ino, 0, 0);
      }
      if (!i->deep) {
        node_unpin(i->parent);
        node_unpin(i->ino);
      }
      free(i);
    }
    pthread_mutex_lock(&V.lock);
  }
  pthread_mutex_unlock(&V.lock);
  return NULL;
}

/* ---- the daemon's events ------------------------------------------------- */

static sbox *box_add(const char *id) {
  sbox *b = box_find(id);
  if (b) {
    b->present = true;
    return b;
  }
  b = calloc(1, sizeof *b);
  if (!b) return NULL;
  snprintf(b->id, sizeof b->id, "%s", id);
  b->index = ++V.next_index;
  b->present = true;
  b->next = V.boxes;
  V.boxes = b;
  return b;
}

static void on_reset_all(void *ud, const char *const *ids, size_t n) {
  (void)ud;
  pthread_mutex_lock(&V.lock);
  V.events++;
  for (sbox *b = V.boxes; b; b = b->next) b->present = false;
  for (size_t i = 0; i < n; i++) box_add(ids[i]);
  for (sbox *b = V.boxes; b; b = b->next)
    if (!b->present) {
      box_kill(b);
      queue_inval(FUSE_ROOT_ID, b->id, 0);
    }
  queue_inval(0, NULL, FUSE_ROOT_ID);
  pthread_mutex_unlock(&V.lock);
}

static void on_changed(void *ud, const char *id, const char *event) {
  (void)ud;
  pthread_mutex_lock(&V.lock);
  V.events++;
  sbox *b = box_find(id);
  if (!strcmp(event, "created")) {
    box_add(id);
  } else if (b && (!strcmp(event, "destroyed") || !strcmp(event, "reset"))) {
    box_kill(b);
    if (!strcmp(event, "destroyed")) b->present = false;
    queue_inval(FUSE_ROOT_ID, id, 0);
  }
  queue_inval(0, NULL, FUSE_ROOT_ID); /* the listing changed */
  pthread_mutex_unlock(&V.lock);
}

static void on_lost(void *ud) {
  (void)ud;
  /* a daemon that stops takes its sandboxes' mounts down: let them go */
  pthread_mutex_lock(&V.lock);
  V.events++;
  for (sbox *b = V.boxes; b; b = b->next) {
    box_kill(b);
    queue_inval(FUSE_ROOT_ID, b->id, 0);
  }
  pthread_mutex_unlock(&V.lock);
}

/* ---- fanotify: changes made inside a sandbox ----------------------------- */

static sbox *box_by_fsid(const __fsid_t *fsid) {
  for (sbox *b = V.boxes; b; b = b->next)
    if (b->root && !b->root->lazy && !memcmp(&b->fsid, fsid, sizeof *fsid)) return b;
  return NULL;
}

/* ext4 file handles (FILEID_INO32_GEN*) start with the inode number. */
static vnode *node_by_handle(sbox *sb, const struct file_handle *fh) {
  if (fh->handle_bytes < 4) return NULL;
  uint32_t ino;
  memcpy(&ino, fh->f_handle, 4);
  return node_at(sb, sb->dev, ino);
}

static void *fanotify_main(void *arg) {
  (void)arg;
  static char buf[65536] __attribute__((aligned(8)));
  pid_t self = getpid();
  while (!V.stopping) {
    struct pollfd pf = {.fd = V.fan, .events = POLLIN};
    if (poll(&pf, 1, 500) <= 0) continue;
    ssize_t n = read(V.fan, buf, sizeof buf);
    if (n <= 0) continue;
    pthread_mutex_lock(&V.lock);
    for (struct fanotify_event_metadata *m = (void *)buf; FAN_EVENT_OK(m, n); m = FAN_EVENT_NEXT(m, n)) {
      uint64_t mask; /* events are 4-byte aligned (their file handles' lengths): not read as a u64 */
      memcpy(&mask, (char *)m + offsetof(struct fanotify_event_metadata, mask), sizeof mask);
      if (mask & FAN_Q_OVERFLOW) { /* changes were lost: every cached name and page of every sandbox goes */
        for (sbox *b = V.boxes; b; b = b->next)
          if (b->present) queue_inval(FUSE_ROOT_ID, b->id, 0); /* its whole tree of dentries */
        for (size_t h = 0; h < HASH_SIZE; h++)
          for (vnode *v = V.hash[h]; v; v = v->hnext)
            if (!v->dead) queue_inval(0, NULL, (fuse_ino_t)(uintptr_t)v);
        continue;
      }
      if (m->pid == self) continue; /* our own doing: the kernel knows already */
      /* only these change a directory; a write or a chmod changes the
       * file alone, and the host's dentry of it stays right */
      bool names = mask & (FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO);
      for (char *p = (char *)(m + 1); p < (char *)m + m->event_len;) {
        struct fanotify_event_info_fid *fid = (void *)p;
        if (fid->hdr.len == 0) break;
        p += fid->hdr.len;
        sbox *sb = box_by_fsid((__fsid_t *)&fid->fsid);
        if (!sb) continue;
        struct file_handle *fh = (void *)fid->handle;
        vnode *v = node_by_handle(sb, fh);
        if (!v) continue; /* the kernel does not know it: nothing cached */
        fuse_ino_t ino = (fuse_ino_t)(uintptr_t)v;
        if (fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME) {
          if (!names) continue;
          const char *name = (const char *)fh->f_handle + fh->handle_bytes;
          /* the name (expired, not dropped: a host process may be in a
           * directory below it), and the directory's cached listing */
          queue_inval_as(ino, name, ino, true);
        } else {
          queue_inval(0, NULL, ino); /* its data and attributes */
        }
      }
    }
    pthread_mutex_unlock(&V.lock);
    /* events come a few at a time, each wakeup of this thread and of the
     * notifier a context switch: a sandbox making and removing a file in a
     * loop (26,000 a second) cost the view 65-75 % of a CPU. Read at most
     * every 2 ms: batches grow, names repeated in one go out once. */
    nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
  }
  return NULL;
}

/* ---- how many nodes ------------------------------------------------------ */

/* Every node the kernel knows holds an fd, and as root the kernel keeps
 * names for a day. Past three quarters of the fds, the tree of the
 * sandbox holding the most nodes is dropped from the kernel's cache, once
 * each time the nodes go past that line: the FORGETs of what nothing uses
 * give the fds back before a create needs them (20,000 files made in a
 * loop through the view, with a limit of 20,000 fds, got ENFILE at the
 * 17,500th). Once the nodes of all sandboxes take seven eighths of the
 * fds, a new name gets ENFILE, and the biggest tree is dropped again (at
 * most once a second): no sandbox keeps the others from being served, and
 * a host walk of a huge tree goes on after a moment. A share per sandbox
 * would fail ordinary work (git status of a big repository) where the fd
 * limit cannot be raised. */
static void drop_biggest(bool soft) {
  sbox *flush = NULL;
  for (sbox *b = V.boxes; b; b = b->next)
    if (!flush || b->nodes > flush->nodes) flush = b;
  time_t now = time(NULL);
  if (!flush || !flush->present || (!soft && flush->flushed == now)) return;
  flush->flushed = now;
  queue_inval(FUSE_ROOT_ID, flush->id, 0); /* all of its tree no process is in */
  struct inval *deep = calloc(1, sizeof *deep);
  if (deep) { /* and what a process's cwd keeps (deep_flush) */
    deep->deep = flush;
    queue_inval_of(deep);
  }
}

static bool too_many_nodes(void) {
  /* the common answer without the lock: a lookup is a hot path */
  unsigned long n = __atomic_load_n(&V.all_nodes, __ATOMIC_RELAXED), soft = V.max_all / 7 * 6;
  if (n < soft) {
    if (!__atomic_load_n(&V.soft_armed, __ATOMIC_RELAXED)) __atomic_store_n(&V.soft_armed, true, __ATOMIC_RELAXED);
    return false;
  }
  pthread_mutex_lock(&V.lock);
  bool full = V.all_nodes >= V.max_all;
  if (full || (V.all_nodes >= soft && __atomic_load_n(&V.soft_armed, __ATOMIC_RELAXED))) {
    drop_biggest(!full);
    __atomic_store_n(&V.soft_armed, false, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&V.lock);
  return full;
}

/* ---- replies ----------------------------------------------------------- */

static vfile *file_of(struct fuse_file_info *fi) { return (vfile *)(uintptr_t)fi->fh; }

static int entry_at(vnode *parent, int pfd, const char *name, const struct stat *made, struct fuse_entry_param *e);

static int do_lookup(fuse_req_t req, vnode *parent, const char *name, struct fuse_entry_param *e) {
  memset(e, 0, sizeof *e);
  e->attr_timeout = e->entry_timeout = V.timeout;
  if (parent == &V.root) {
    int opened = -1; /* the sandbox's /workspace, when the daemon was asked for it */
    uid_t uid;
    gid_t gid;
    unsigned uids;
    pthread_mutex_lock(&V.lock);
    sbox *sb = box_find(name);
    if ((!sb || !sb->present) && sbx_valid_id(name) && viewlink_connected()) {
      /* the daemon's event of a sandbox made a moment ago may not have
       * come yet (3 lookups in 100 right after createSandbox's answer
       * missed it): a name a sandbox can have is asked for, while the
       * daemon is there (none to start for a name that may be nothing) */
      unsigned long events = V.events;
      pthread_mutex_unlock(&V.lock);
      int fd = viewlink_open(name, &uid, &gid, &uids);
      pthread_mutex_lock(&V.lock);
      sb = box_find(name);
      /* taken as the daemon's answer says only when no event came since
       * (one that did may be this sandbox's own, destroyed meanwhile); its
       * root then keeps the fd the daemon gave */
      if (fd >= 0 && events == V.events && !(sb && sb->present) && (sb = box_add(name))) opened = fd;
      else if (fd >= 0) close(fd);
    }
    if (!sb || !sb->present) {
      pthread_mutex_unlock(&V.lock);
      return ENOENT;
    }
    vnode *v = sb->root;
    if (!v) { /* a lazy root: opened on first use inside it, so listing the view wakes nothing */
      v = calloc(1, sizeof *v);
      if (!v) {
        pthread_mutex_unlock(&V.lock);
        if (opened >= 0) close(opened);
        return ENOMEM;
      }
      *v = (vnode){.fd = -1, .sb = sb, .gen = sb->gen, .lazy = true};
      sb->root = v;
    }
    v->nlookup++;
    pthread_mutex_unlock(&V.lock);
    e->ino = (uintptr_t)v;
    e->entry_timeout = 1.0; /* the list of sandboxes changes */
    int r = opened >= 0 ? root_adopt(v, opened, uid, gid, uids) : 0;
    if (r < 0) {
      node_forget(v, 1);
      return -r;
    }
    if (v->lazy) {
      e->attr.st_mode = S_IFDIR | 0755;
      e->attr.st_nlink = 2;
      e->attr.st_uid = V.rootless ? 65534 : V.uid;
      e->attr.st_gid = V.rootless ? 65534 : V.gid;
      e->attr.st_ino = (uint64_t)sb->index << 40;
      clock_gettime(CLOCK_REALTIME, &e->attr.st_mtim); /* the view's own time, as getattr says: not 1970 */
      e->attr.st_ctim = e->attr.st_atim = e->attr.st_mtim;
      e->attr_timeout = 1.0;
      return 0;
    }
    act_as(sb);
    if (fstatat(v->fd, "", &e->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
      int err = errno;
      node_forget(v, 1);
      return err;
    }
    present_attr(sb, &e->attr);
    return 0;
  }
  int pfd = node_fd(parent);
  if (pfd < 0) return -pfd;
  act_as_node(parent); /* search permission: the directory's owner's */
  return entry_at(parent, pfd, name, NULL, e);
}

/* The entry of parent's name (parent_fd pfd), with a reference for the
 * kernel. made: what the caller just opened or made by that name, then
 * looked for as it is (EAGAIN if the name is another file by now: renamed
 * over meanwhile, inside). */
static int entry_at(vnode *parent, int pfd, const char *name, const struct stat *made, struct fuse_entry_param *e) {
  memset(e, 0, sizeof *e);
  struct stat st;
  /* a file that already has a node (the kernel forgot the name, or a
   * listing names it again) is found by what it is, with no fd opened:
   * the node's fd holds that very inode, so its number is not reused */
  if (made) st = *made;
  else if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno;
  pthread_mutex_lock(&V.lock);
  vnode *v = parent->dead || parent->gen != parent->sb->gen ? NULL : node_find(parent->sb, &st);
  pthread_mutex_unlock(&V.lock);
  int fd = -1;
  bool used = false;
  if (!v) {
    /* past the fds the view has for nodes: see too_many_nodes */
    if (too_many_nodes()) return ENFILE;
    if ((fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) < 0) return errno;
    if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) { /* what the fd is, raced or not */
      int err = errno;
      close(fd);
      return err;
    }
    if (made && (st.st_dev != made->st_dev || st.st_ino != made->st_ino)) {
      close(fd);
      return EAGAIN;
    }
  }
  pthread_mutex_lock(&V.lock);
  if (parent->dead || parent->gen != parent->sb->gen) {
    pthread_mutex_unlock(&V.lock);
    if (v) node_forget(v, 1); /* the reference taken above */
    if (fd >= 0) close(fd);
    return ENOENT;
  }
  if (!v) v = node_get(parent->sb, fd, &st, &used);
  if (v && S_ISLNK(st.st_mode)) v->parent = parent;
  if (v) node_seen(v, &st);
  pthread_mutex_unlock(&V.lock);
  if (!used && fd >= 0) close(fd);
  if (!v) return ENOMEM;
  e->ino = (uintptr_t)v;
  e->attr = st;
  e->attr_timeout = e->entry_timeout = cache_time(parent->sb, st.st_dev);
  present_attr(parent->sb, &e->attr);
  return 0;
}

static void v_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  FOREIGN_GATE(req, node_of(parent), NULL);
  struct fuse_entry_param e;
  int err = do_lookup(req, node_of(parent), name, &e);
  if (err == ENOENT && !V.rootless && parent != FUSE_ROOT_ID) {
    /* "not there" is cached as well: a creation inside pushes an
     * invalidation of the name */
    memset(&e, 0, sizeof e);
    e.entry_timeout = cache_time(node_of(parent)->sb, node_of(parent)->dev);
    return (void)fuse_reply_entry(req, &e);
  }
  if (err) fuse_reply_err(req, err);
  else fuse_reply_entry(req, &e);
}

static void v_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  node_forget(node_of(ino), n);
  fuse_reply_none(req);
}

static void v_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f) {
  for (size_t i = 0; i < count; i++) node_forget(node_of(f[i].ino), f[i].nlookup);
  fuse_reply_none(req);
}

static void root_attr(struct stat *st) {
  *st = (struct stat){.st_mode = S_IFDIR | 0755, .st_nlink = 2, .st_uid = V.uid, .st_gid = V.gid, .st_ino = FUSE_ROOT_ID};
  clock_gettime(CLOCK_REALTIME, &st->st_mtim);
  st->st_ctim = st->st_atim = st->st_mtim;
}

static void v_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  struct stat st;
  if (v == &V.root) { /* what it says never changes: cached as long as the rest */
    root_attr(&st);
    return (void)fuse_reply_attr(req, &st, V.timeout);
  }
  if (v->lazy && !v->dead) { /* not opened yet: say a directory, wake nothing */
    root_attr(&st); /* the view's own: not 1970 */
    st.st_ino = (uint64_t)v->sb->index << 40;
    return (void)fuse_reply_attr(req, &st, 1.0);
  }
  int fd = fi && file_of(fi)->fd >= 0 ? file_of(fi)->fd : node_fd(v);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(v->sb);
  if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) return (void)fuse_reply_err(req, errno);
  if (v->dead) return (void)fuse_reply_err(req, ENOENT);
  node_seen(v, &st);
  double t = cache_time(v->sb, st.st_dev);
  present_attr(v->sb, &st);
  fuse_reply_attr(req, &st, t);
}

static void proc_path(int fd, char out[64]) { snprintf(out, 64, "/proc/self/fd/%d", fd); }

/* truncate(2), without waiting for a lease's break (see open_flags) */
static int truncate_now(const char *path, off_t size) {
  int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENXIO ? (errno = EINVAL, -1) : -1; /* a FIFO */
  struct stat st;
  int r = fstat(fd, &st);
  if (r == 0 && !S_ISREG(st.st_mode)) r = -1, errno = EINVAL;
  if (r == 0) r = ftruncate(fd, size);
  int e = errno;
  close(fd);
  errno = e;
  return r;
}

/* Setattr acts as the file's owner as it is now (see act_as_node). */
static void act_as_owner(vnode *v, int fd) {
  struct stat st;
  if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0) node_seen(v, &st);
  act_as_node(v);
}

/* An id of another sandbox's range becomes the same id of this one's: a
 * file moved or copied with its owner (mv, cp -a) from one sandbox to
 * another through the view is owned inside the second as it was inside the
 * first (the kernel refused the first one's host ids, and cp -a failed). */
static uint32_t own_id(const sbox *sb, uint32_t id, bool gid) {
  pthread_mutex_lock(&V.lock);
  for (const sbox *b = V.boxes; b; b = b->next) {
    uint32_t base = gid ? b->gid : b->uid;
    if (b != sb && b->uids > 1 && id - base < b->uids && id - base < sb->uids) {
      id = (gid ? sb->gid : sb->uid) + (id - base);
      break;
    }
  }
  pthread_mutex_unlock(&V.lock);
  return id;
}

static void v_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid, struct fuse_file_info *fi) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  if (v == &V.root) return (void)fuse_reply_err(req, EPERM);
  int ifd = node_fd(v);
  if (ifd < 0) return (void)fuse_reply_err(req, -ifd);
  int ffd = fi ? ((vfile *)(uintptr_t)fi->fh)->fd : -1;
  char pp[64];
  proc_path(ifd, pp);
  act_as_owner(v, ifd);
  int r = 0;
  if (valid & FUSE_SET_ATTR_MODE) r = ffd >= 0 ? fchmod(ffd, attr->st_mode) : chmod(pp, attr->st_mode);
  if (!r && (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
    /* the mounting user stands for the sandbox's root (what it creates
     * is owned by it too); other host ids mean nothing inside */
    uid_t u = valid & FUSE_SET_ATTR_UID ? attr->st_uid : (uid_t)-1;
    gid_t g = valid & FUSE_SET_ATTR_GID ? attr->st_gid : (gid_t)-1;
    if (u == V.uid) u = v->sb->uid;
    else if (u != (uid_t)-1) u = own_id(v->sb, u, false);
    if (g == V.gid) g = v->sb->gid;
    else if (g != (gid_t)-1) g = own_id(v->sb, g, true);
    /* the sandbox's root may give a file any of the sandbox's ids; acting
     * as its root's host uid the server has no CAP_CHOWN, so a chown within
     * that range is done as root, and no other */
    bool own = !V.rootless && (u == (uid_t)-1 || u - v->sb->uid < v->sb->uids) &&
               (g == (gid_t)-1 || g - v->sb->gid < v->sb->uids);
    if (own) {
      /* as root, only ever on the node's own inode: a reset or destroy
       * (box_kill) may put the host's /dev/null under a node's fd number
       * at any moment, so the chown goes through a copy of the fd taken
       * while the node was alive, and checked to be its inode */
      struct stat st;
      pthread_mutex_lock(&V.lock);
      int mine = node_fd_copy(v);
      pthread_mutex_unlock(&V.lock);
      if (mine < 0 || fstat(mine, &st) < 0 || st.st_dev != v->dev || st.st_ino != v->ino) {
        r = -1;
        errno = ENOENT;
      } else {
        act_with(0, 0);
        r = fchownat(mine, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
      }
      int e = errno;
      if (mine >= 0) close(mine);
      errno = e;
    } else {
      r = fchownat(ifd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
    }
    int e = errno;
    act_as_owner(v, ifd); /* its new owner, for what follows */
    errno = e;
    if (r < 0 && errno == EOVERFLOW) errno = EPERM;
  }
  if (!r && (valid & FUSE_SET_ATTR_SIZE)) r = ffd >= 0 ? ftruncate(ffd, attr->st_size) : truncate_now(pp, attr->st_size);
  if (!r && (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
    struct timespec tv[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
    if (valid & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    else if (valid & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (valid & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    else if (valid & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    r = ffd >= 0 ? futimens(ffd, tv) : utimensat(AT_FDCWD, pp, tv, 0);
  }
  if (r < 0) return (void)fuse_reply_err(req, errno);
  v_getattr(req, ino, fi);
}

/* access(2) and chdir, which the kernel leaves to the server (no
 * default_permissions, see v_init): answered as the server would act, as
 * the sandbox's root, so X_OK of a file without an x bit is EACCES. */
static void v_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  if (v == &V.root || (v->lazy && !v->dead)) return (void)fuse_reply_err(req, 0); /* wakes nothing */
  int fd = node_fd(v);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  char pp[64];
  proc_path(fd, pp);
  act_as_node(v);
  fuse_reply_err(req, faccessat(AT_FDCWD, pp, mask, AT_EACCESS) < 0 ? errno : 0);
}

/* ---- symlinks ---------------------------------------------------------- */

static bool climbs_or_absolute(const char *t) {
  if (t[0] == '/') return true;
  for (const char *p = t; *p;) {
    if (p[0] == '.' && p[1] == '.' && (p[2] == '/' || p[2] == 0)) return true;
    const char *slash = strchr(p, '/');
    if (!slash) break;
    p = slash + 1;
  }
  return false;
}

static void v_readlink(fuse_req_t req, fuse_ino_t ino) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  int fd = node_fd(v);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(v->sb);
  char target[PATH_MAX];
  ssize_t n = readlinkat(fd, "", target, sizeof target - 1);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  target[n] = 0;
  /* descending only: followed from where it is, it stays below it */
  if (!climbs_or_absolute(target)) return (void)fuse_reply_readlink(req, target);
  /* absolute or climbing: pinned to an absolute path inside this
   * sandbox's view, which no rename inside can make climb out */
  char where[PATH_MAX] = "/workspace", abs[2 * PATH_MAX + 2], norm[2 * PATH_MAX + 2];
  if (target[0] != '/') {
    vnode *parent = v->parent;
    int pfd = parent ? node_fd(parent) : -ENOENT;
    char pp[64];
    proc_path(pfd, pp);
    /* the directory's path as the sandbox sees it (its mount is the
     * sandbox's root) */
    ssize_t k = pfd >= 0 ? readlink(pp, where, sizeof where - 1) : -1;
    if (k <= 0) return (void)fuse_reply_err(req, EIO);
    where[k] = 0;
    if (strstr(where, " (deleted)")) return (void)fuse_reply_err(req, ENOENT);
    snprintf(abs, sizeof abs, "%s/%s", where, target);
  } else {
    snprintf(abs, sizeof abs, "%s", target);
  }
  sbx_path_clean(abs, norm, sizeof norm);
  char out[4 * PATH_MAX + 128];
  if (!strcmp(norm, "/workspace") || !strncmp(norm, "/workspace/", 11))
    snprintf(out, sizeof out, "%s/%s%s", V.mountpoint, v->sb->id, norm + 10);
  else /* outside the sandbox's /workspace: a name inside the view that leads nowhere */
    snprintf(out, sizeof out, "%s/%s/" OUTSIDE "%s", V.mountpoint, v->sb->id, norm);
  fuse_reply_readlink(req, out);
}

/* ---- making and removing ------------------------------------------------ */

static void reply_made(fuse_req_t req, vnode *parent, const char *name, int r) {
  if (r < 0) return (void)fuse_reply_err(req, errno);
  struct fuse_entry_param e;
  int err = do_lookup(req, parent, name, &e);
  if (err) fuse_reply_err(req, err);
  else fuse_reply_entry(req, &e);
}

static int parent_fd(vnode *p) {
  if (p == &V.root) return -EPERM; /* sandboxes are made by the daemon, not the view */
  return node_fd(p);
}

static void v_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int fd = parent_fd(p);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  if (!S_ISREG(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode)) return (void)fuse_reply_err(req, EPERM);
  act_as(p->sb);
  reply_made(req, p, name, mknodat(fd, name, mode, rdev));
}

static void v_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int fd = parent_fd(p);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(p->sb);
  reply_made(req, p, name, mkdirat(fd, name, mode));
}

static void v_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int fd = parent_fd(p);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(p->sb);
  reply_made(req, p, name, symlinkat(link, fd, name));
}

static void v_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name) {
  vnode *v = node_of(ino), *p = node_of(parent);
  FOREIGN_GATE(req, v, p);
  int fd = node_fd(v), pfd = parent_fd(p);
  if (fd < 0 || pfd < 0) return (void)fuse_reply_err(req, fd < 0 ? -fd : -pfd);
  if (v->sb != p->sb) return (void)fuse_reply_err(req, EXDEV);
  act_as(p->sb);
  char pp[64];
  proc_path(fd, pp);
  reply_made(req, p, name, linkat(AT_FDCWD, pp, pfd, name, AT_SYMLINK_FOLLOW));
}

static void v_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int fd = parent_fd(p);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(p->sb);
  fuse_reply_err(req, unlinkat(fd, name, 0) < 0 ? errno : 0);
}

static void v_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int fd = parent_fd(p);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as(p->sb);
  fuse_reply_err(req, unlinkat(fd, name, AT_REMOVEDIR) < 0 ? errno : 0);
}

static void v_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
                     unsigned int flags) {
  vnode *p = node_of(parent), *np = node_of(newparent);
  FOREIGN_GATE(req, p, np);
  int fd = parent_fd(p), nfd = parent_fd(np);
  if (fd < 0 || nfd < 0) return (void)fuse_reply_err(req, fd < 0 ? -fd : -nfd);
  if (p->sb != np->sb) return (void)fuse_reply_err(req, EXDEV);
  act_as(p->sb);
  fuse_reply_err(req, renameat2(fd, name, nfd, newname, flags) < 0 ? errno : 0);
}

/* ---- files -------------------------------------------------------------- */

static vfile *file_new(vnode *v, int fd) {
  vfile *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->fd = fd;
  f->vn = v;
  pthread_mutex_lock(&V.lock);
  f->next = V.files;
  V.files = f;
  pthread_mutex_unlock(&V.lock);
  return f;
}

/* Passthrough: the kernel reads, writes and maps the sandbox's file itself,
 * with the credentials this thread has now (the sandbox's root). Every open
 * of a node shares one backing id: the kernel refuses a second backing
 * file, or a cached open, beside a passthrough one, so a node takes the
 * mode its open files have. Served by this server instead (here): a file
 * just created, mostly written once, in order, which it does as fast (a backing
 * file costs two more system calls and a second open in the kernel, a
 * fifth of a create's time); and other users' opens (allow_other): a
 * backing file is the one thing a reset or destroy cannot take back, and
 * it keeps a discarded disk allocated until it is closed. Returns the id,
 * or 0 to serve the file through this server. */
static int file_backing(fuse_req_t req, vfile *f, dev_t dev, bool here) {
  vnode *v = f->vn;
  if (fuse_req_ctx(req)->uid != V.uid) here = true;
  /* only on a sandbox's own disk (one the daemon shuts down when it
   * discards it), never the host's filesystem that directory disks are on */
  if (!V.passthrough || !v->sb || !v->sb->own_disk || dev != v->sb->dev) return 0;
  pthread_mutex_lock(&V.lock);
  /* a failed backing file leaves the node served here */
  if (!v->backing && !v->ncached && !here && !v->dead) {
    int id = sbx_passthrough_open(f->fd);
    if (id > 0) v->backing = id;
    else if (id == -EPERM || id == -EOPNOTSUPP) V.passthrough = false; /* not to be had here */
  }
  if (v->backing) {
    v->nbacked++;
    f->backed = true;
  } else {
    v->ncached++;
    f->cached = true;
  }
  int id = v->backing;
  pthread_mutex_unlock(&V.lock);
  return id;
}

static void file_free(vfile *f) {
  int backing = 0;
  pthread_mutex_lock(&V.lock);
  for (vfile **pp = &V.files; *pp; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  if (f->cached) f->vn->ncached--;
  if (f->backed && --f->vn->nbacked == 0) {
    backing = f->vn->backing;
    f->vn->backing = 0;
  }
  pthread_mutex_unlock(&V.lock);
  sbx_passthrough_close(backing);
  if (f->dir) closedir(f->dir);
  else if (f->fd >= 0) close(f->fd);
  free(f);
}

/* Whether a file handle still belongs to a live sandbox. */
static bool file_live(vfile *f) { return f->vn && !f->vn->dead; }

/* Files are opened with O_NONBLOCK, so that no open waits on the
 * sandbox: not for the other end of a FIFO swapped in under a name, not for
 * a lease the sandbox's root holds on its own file (its break would take
 * the kernel's lease-break-time, 45 s, of one of the server's threads: the
 * host's open gets EAGAIN instead). O_NONBLOCK is taken off again unless
 * asked for. */
static void open_flags(struct fuse_file_info *fi, int *flags) {
  /* O_DIRECT is the kernel's to keep on the view's side (it then sends
   * reads and writes as they come, or passes them through with it): the
   * server's own buffers are not aligned as direct I/O to the sandbox's
   * disk would want (every write was EINVAL) */
  *flags = fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_NOFOLLOW | O_DIRECT);
  *flags |= O_CLOEXEC | O_NONBLOCK;
}

/* 0 for a regular file just opened (now blocking as asked), else an errno
 * (only regular files are served). */
static int opened_regular(int fd, const struct fuse_file_info *fi, struct stat *st) {
  if (fstat(fd, st) < 0) return errno;
  if (!S_ISREG(st->st_mode)) return S_ISDIR(st->st_mode) ? EISDIR : EACCES;
  if (!(fi->flags & O_NONBLOCK)) fcntl(fd, F_SETFL, fi->flags & ~O_DIRECT); /* what F_SETFL takes of them is as opened */
  return 0;
}

static void v_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  int fd = node_fd(v);
  if (fd < 0) return (void)fuse_reply_err(req, -fd);
  act_as_node(v);
  int flags;
  open_flags(fi, &flags);
  char pp[64];
  proc_path(fd, pp);
  int nfd = open(pp, flags);
  if (nfd < 0) return (void)fuse_reply_err(req, errno);
  struct stat st;
  int err = opened_regular(nfd, fi, &st);
  if (err) {
    close(nfd);
    return (void)fuse_reply_err(req, err);
  }
  vfile *f = file_new(v, nfd);
  if (!f) {
    close(nfd);
    return (void)fuse_reply_err(req, ENOMEM);
  }
  fi->fh = (uintptr_t)f;
  int backing = file_backing(req, f, st.st_dev, false);
  /* the page cache stays valid between opens: changes from inside are
   * pushed as invalidations (as root); rootless it is dropped each open;
   * in passthrough mode the sandbox's own page cache serves */
  fi->keep_cache = !V.rootless && !backing && watched(v->sb, st.st_dev);
  fi->noflush = 1; /* writes are not cached here: a close has nothing to flush */
  if (backing) sbx_passthrough_reply_open(req, fi, backing);
  else fuse_reply_open(req, fi);
}

static void v_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi) {
  vnode *p = node_of(parent);
  FOREIGN_GATE(req, p, NULL);
  int pfd = parent_fd(p);
  if (pfd < 0) return (void)fuse_reply_err(req, -pfd);
  act_as(p->sb);
  int flags;
  open_flags(fi, &flags);
  /* the kernel found the name absent: made new, a regular file no open
   * waits on (O_NONBLOCK is not needed), in one system call; a name that
   * came meanwhile is opened as open does */
  int fd = openat(pfd, name, (flags & ~O_NONBLOCK) | (fi->flags & O_NONBLOCK) | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
  bool made = fd >= 0;
  if (!made && errno == EEXIST && !(fi->flags & O_EXCL)) fd = openat(pfd, name, flags | O_CREAT | O_NOFOLLOW, mode);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  struct stat st;
  int err = made ? (fstat(fd, &st) < 0 ? errno : 0) : opened_regular(fd, fi, &st);
  struct fuse_entry_param e;
  if (!err) err = entry_at(p, pfd, name, &st, &e);
  if (err) {
    /* made here for this create: not left behind (unless the name is
     * another file by now) */
    if (made && err != EAGAIN) unlinkat(pfd, name, 0);
    close(fd);
    return (void)fuse_reply_err(req, err);
  }
  vfile *f = file_new(node_of(e.ino), fd);
  if (!f) {
    close(fd);
    node_forget(node_of(e.ino), 1);
    return (void)fuse_reply_err(req, ENOMEM);
  }
  fi->fh = (uintptr_t)f;
  int backing = file_backing(req, f, e.attr.st_dev, true);
  fi->keep_cache = !V.rootless && !backing && watched(p->sb, e.attr.st_dev);
  fi->noflush = 1;
  if (backing) sbx_passthrough_reply_create(req, &e, fi, backing);
  else fuse_reply_create(req, &e, fi);
}

static void v_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  file_free(file_of(fi));
  fuse_reply_err(req, 0);
}

static void v_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  int d = dup(f->fd); /* closing a dup reports write-back errors, as close() would */
  fuse_reply_err(req, d >= 0 && close(d) < 0 ? errno : 0);
}

static void v_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, f->vn, NULL);
  act_as(f->vn->sb);
  int r = datasync ? fdatasync(f->fd) : fsync(f->fd);
  fuse_reply_err(req, r < 0 ? errno : 0);
}

static void v_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, f->vn, NULL);
  act_as(f->vn->sb);
  /* a plain copy: splicing big reads through a pipe is slower here */
  static __thread char *rbuf;
  static __thread size_t rcap;
  if (rcap < size) {
    free(rbuf);
    rbuf = malloc(size);
    rcap = rbuf ? size : 0;
  }
  if (!rbuf) return (void)fuse_reply_err(req, ENOMEM);
  ssize_t n = pread(f->fd, rbuf, size, off);
  if (n < 0) fuse_reply_err(req, errno);
  else fuse_reply_buf(req, rbuf, (size_t)n);
}

static void v_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, f->vn, NULL);
  struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
  out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
  out.buf[0].fd = f->fd;
  out.buf[0].pos = off;
  act_as(f->vn->sb); /* writes are charged to the file's owner quota-wise */
  ssize_t r = fuse_buf_copy(&out, in, 0);
  if (r < 0) fuse_reply_err(req, (int)-r);
  else fuse_reply_write(req, (size_t)r);
}

static void v_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, f->vn, NULL);
  act_as(f->vn->sb);
  fuse_reply_err(req, fallocate(f->fd, mode, off, len) < 0 ? errno : 0);
}

static void v_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi) {
  (void)ino;
  vfile *f = file_of(fi);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, f->vn, NULL);
  act_as(f->vn->sb);
  off_t r = lseek(f->fd, off, whence);
  if (r < 0) fuse_reply_err(req, errno);
  else fuse_reply_lseek(req, r);
}

#define COPY_PIECE (64u << 20)

static void v_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
                              fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len, int flags) {
  (void)ino_in;
  (void)ino_out;
  vfile *a = file_of(fi_in), *b = file_of(fi_out);
  if (!file_live(a) || !file_live(b)) return (void)fuse_reply_err(req, EIO);
  FOREIGN_GATE(req, a->vn, b->vn);
  act_as(b->vn->sb);
  /* a request at a time holds one of a few threads of its caller's CPU
   * (uring.c): a copy of gigabytes is done a piece a request, as a copy
   * that ends short is taken up again by its caller */
  ssize_t r = copy_file_range(a->fd, &off_in, b->fd, &off_out, len < COPY_PIECE ? len : COPY_PIECE, flags);
  if (r < 0) fuse_reply_err(req, errno);
  else fuse_reply_write(req, (size_t)r);
}

static void v_statfs(fuse_req_t req, fuse_ino_t ino) {
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  struct statvfs sv = {.f_bsize = 4096, .f_frsize = 4096, .f_namemax = 255};
  if (v != &V.root) {
    int fd = node_fd(v);
    if (fd < 0) return (void)fuse_reply_err(req, -fd);
    if (fstatvfs(fd, &sv) < 0) return (void)fuse_reply_err(req, errno);
  }
  fuse_reply_statfs(req, &sv);
}

/* ---- directories -------------------------------------------------------- */

/* A directory stream of a node: 0 or an errno. */
static int dir_open(vnode *v, vfile **out) {
  int fd = node_fd(v);
  if (fd < 0) return -fd;
  act_as_node(v);
  int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return errno;
  vfile *f = file_new(v, dfd);
  if (!f) return close(dfd), ENOMEM;
  if (!(f->dir = fdopendir(dfd))) {
    int e = errno;
    file_free(f);
    return e;
  }
  *out = f;
  return 0;
}

/* With invalidations pushed (as root), directories are not opened at all:
 * opendir answers ENOSYS once, and from then on the kernel sends neither
 * opendir nor releasedir and keeps every listing cached until a change
 * (ours or an invalidation) drops it; each readdir opens the directory at
 * the offset asked. That takes two round trips of three off every
 * directory a program walks (git status: one per directory). */
static void v_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  if (V.stateless_dirs) return (void)fuse_reply_err(req, ENOSYS);
  vnode *v = node_of(ino);
  FOREIGN_GATE(req, v, NULL);
  vfile *f = NULL;
  if (v == &V.root) {
    if (!(f = file_new(NULL, -1))) return (void)fuse_reply_err(req, ENOMEM);
  } else {
    int e = dir_open(v, &f);
    if (e) return (void)fuse_reply_err(req, e);
  }
  fi->fh = (uintptr_t)f;
  /* listings stay cached between opens (as root: a change inside pushes
   * an invalidation of the directory) */
  fi->cache_readdir = fi->keep_cache = !V.rootless && v != &V.root && watched(v->sb, v->dev);
  fuse_reply_open(req, fi);
}

/* One entry of the view's root; in readdirplus with no node (the kernel
 * looks it up when it needs to, which wakes nothing). */
static size_t root_entry(fuse_req_t req, char *p, size_t rem, const char *name, const struct stat *st, off_t next,
                         bool plus) {
  if (!plus) return fuse_add_direntry(req, p, rem, name, st, next);
  struct fuse_entry_param e = {.ino = 0, .attr = *st};
  return fuse_add_direntry_plus(req, p, rem, name, &e, next);
}

/* The view's root: the sandboxes the daemon lists, in a stable order. */
static void root_readdir(fuse_req_t req, size_t size, off_t off, bool plus) {
  char *buf = calloc(1, size), *p = buf;
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  size_t rem = size;
  pthread_mutex_lock(&V.lock);
  off_t i = 0;
  struct stat st = {.st_mode = S_IFDIR, .st_ino = FUSE_ROOT_ID}; /* readdir(3) skips an inode number 0 */
  const char *dots[] = {".", ".."};
  for (int k = 0; k < 2; k++, i++) {
    if (i < off) continue;
    size_t e = root_entry(req, p, rem, dots[k], &st, i + 1, plus);
    if (e > rem) goto full;
    p += e, rem -= e;
  }
  for (sbox *b = V.boxes; b; b = b->next) {
    if (!b->present) continue;
    if (i++ < off) continue;
    st.st_ino = (uint64_t)b->index << 40;
    size_t e = root_entry(req, p, rem, b->id, &st, i, plus);
    if (e > rem) break;
    p += e, rem -= e;
  }
full:
  pthread_mutex_unlock(&V.lock);
  fuse_reply_buf(req, buf, size - rem);
  free(buf);
}

static void readdir_from(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, vfile *f, bool plus);

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi, bool plus) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  vfile *f = file_of(fi);
  if (f) return readdir_from(req, ino, size, off, f, plus);
  vnode *v = node_of(ino); /* no opendir: a stream for this request alone */
  if (v == &V.root) return root_readdir(req, size, off, plus);
  if (!watched(v->sb, v->dev) && !v->listed) { /* what the kernel keeps of it is dropped in a second (relist) */
    pthread_mutex_lock(&V.lock);
    if (!v->listed && !v->dead) {
      v->listed = true;
      if (V.nlisted++ == 0) pthread_cond_signal(&V.notify_cond);
    }
    pthread_mutex_unlock(&V.lock);
  }
  int e = dir_open(v, &f);
  if (e) return (void)fuse_reply_err(req, e);
  readdir_from(req, ino, size, off, f, plus);
  file_free(f);
}

static void readdir_from(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, vfile *f, bool plus) {
  if (!f->vn) return root_readdir(req, size, off, plus);
  if (!file_live(f)) return (void)fuse_reply_err(req, EIO);
  act_as_node(f->vn);
  char *buf = calloc(1, size), *p = buf;
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  size_t rem = size;
  int err = 0;
  if (off != f->offset) {
    seekdir(f->dir, off);
    f->entry = NULL;
    f->offset = off;
  }
  for (;;) {
    if (!f->entry) {
      errno = 0;
      f->entry = readdir(f->dir);
      if (!f->entry) {
        err = errno;
        break;
      }
    }
    const char *name = f->entry->d_name;
    off_t next = f->entry->d_off;
    size_t e;
    fuse_ino_t looked = 0;
    if (plus) {
      struct fuse_entry_param ep;
      if (!strcmp(name, ".") || !strcmp(name, "..")) {
        ep = (struct fuse_entry_param){.attr.st_ino = f->entry->d_ino, .attr.st_mode = f->entry->d_type << 12};
      } else {
        err = do_lookup(req, node_of(ino), name, &ep);
        if (err) break;
        looked = ep.ino;
      }
      e = fuse_add_direntry_plus(req, p, rem, name, &ep, next);
    } else {
      struct stat st = {.st_ino = ((uint64_t)f->vn->sb->index << 40) ^ f->entry->d_ino,
                        .st_mode = f->entry->d_type << 12};
      e = fuse_add_direntry(req, p, rem, name, &st, next);
    }
    if (e > rem) {
      if (looked) node_forget(node_of(looked), 1);
      break;
    }
    p += e, rem -= e;
    f->entry = NULL;
    f->offset = next;
  }
  if (err && rem == size) fuse_reply_err(req, err);
  else fuse_reply_buf(req, buf, size - rem);
  free(buf);
}

static void v_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  do_readdir(req, ino, size, off, fi, false);
}

static void v_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  do_readdir(req, ino, size, off, fi, true);
}

static void v_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  file_free(file_of(fi));
  fuse_reply_err(req, 0);
}

static void v_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  vfile *f = file_of(fi), *tmp = NULL;
  if (!f && node_of(ino) != &V.root) {
    int e = dir_open(node_of(ino), &tmp);
    if (e) return (void)fuse_reply_err(req, e);
    f = tmp;
  }
  if (!f || !f->vn) return (void)fuse_reply_err(req, 0);
  int r = !file_live(f) ? (errno = EIO, -1) : datasync ? fdatasync(f->fd) : fsync(f->fd);
  fuse_reply_err(req, r < 0 ? errno : 0);
  if (tmp) file_free(tmp);
}

/* ---- extended attributes ------------------------------------------------- */

/* On the file the node holds (never a symlink's target: those have none of
 * their own here). */
static int xattr_path(fuse_req_t req, fuse_ino_t ino, char pp[64]) {
  vnode *v = node_of(ino);
  if (v == &V.root) return -ENOTSUP;
  int fd = node_fd(v);
  if (fd < 0) return fd;
  struct stat st;
  if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) return -errno;
  if (S_ISLNK(st.st_mode)) return -ENOTSUP;
  node_seen(v, &st);
  act_as_node(v);
  proc_path(fd, pp);
  (void)req;
  return 0;
}

static void reply_xattr(fuse_req_t req, size_t size, ssize_t (*fn)(const char *, const char *, void *, size_t),
                        const char *pp, const char *name) {
  if (size == 0) {
    ssize_t n = fn(pp, name, NULL, 0);
    if (n < 0) fuse_reply_err(req, errno);
    else fuse_reply_xattr(req, (size_t)n);
    return;
  }
  char *buf = malloc(size);
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  ssize_t n = fn(pp, name, buf, size);
  if (n < 0) fuse_reply_err(req, errno);
  else fuse_reply_buf(req, buf, (size_t)n);
  free(buf);
}

static ssize_t get_fn(const char *p, const char *name, void *buf, size_t size) { return getxattr(p, name, buf, size); }

/* Attributes the view does not have, and says so as a filesystem without
 * them does (EOPNOTSUPP; `ls -l` remembers that per device and stops
 * asking each file, where ENODATA costs a round trip a file):
 * - SELinux labels: a sandbox cannot set one (security.* is the host's);
 * - POSIX ACLs, unless the view is mounted with allow_other: the kernel
 *   then checks no permission on the view (the mounting user may do what
 *   the sandbox's root may, see v_init), so an ACL would grant or deny
 *   nothing here. Inside the sandbox ACLs work as on any disk; with
 *   allow_other the kernel checks and caches them, as anywhere. */
static bool not_here(const char *name) {
  if (!strcmp(name, "security.selinux")) return true;
  return !V.allow_other && (!strcmp(name, "system.posix_acl_access") || !strcmp(name, "system.posix_acl_default"));
}

/* The list without the names the view does not have (not_here): read whole
 * and filtered, so that its size with a NULL buffer is the filtered one. */
static ssize_t list_fn(const char *p, const char *name, void *buf, size_t size) {
  (void)name;
  char all[XATTR_LIST_MAX];
  ssize_t n = listxattr(p, all, sizeof all);
  if (n < 0) return -1;
  size_t kept = 0;
  for (ssize_t i = 0; i < n;) {
    size_t len = strnlen(all + i, (size_t)(n - i)) + 1;
    if (!not_here(all + i)) {
      if (buf && kept + len > size) return errno = ERANGE, -1;
      if (buf) memcpy((char *)buf + kept, all + i, len);
      kept += len;
    }
    i += (ssize_t)len;
  }
  return (ssize_t)kept;
}

static void v_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  if (not_here(name)) return (void)fuse_reply_err(req, EOPNOTSUPP);
  char pp[64];
  int r = xattr_path(req, ino, pp);
  if (r < 0) return (void)fuse_reply_err(req, -r);
  reply_xattr(req, size, get_fn, pp, name);
}

static void v_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  char pp[64];
  int r = xattr_path(req, ino, pp);
  if (r < 0) return (void)fuse_reply_err(req, -r);
  reply_xattr(req, size, list_fn, pp, NULL);
}

static void v_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  if (not_here(name)) return (void)fuse_reply_err(req, EOPNOTSUPP);
  char pp[64];
  int r = xattr_path(req, ino, pp);
  if (r < 0) return (void)fuse_reply_err(req, -r);
  fuse_reply_err(req, setxattr(pp, name, value, size, flags) < 0 ? errno : 0);
}

static void v_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) {
  FOREIGN_GATE(req, node_of(ino), NULL);
  if (not_here(name)) return (void)fuse_reply_err(req, EOPNOTSUPP);
  char pp[64];
  int r = xattr_path(req, ino, pp);
  if (r < 0) return (void)fuse_reply_err(req, -r);
  fuse_reply_err(req, removexattr(pp, name) < 0 ? errno : 0);
}

/* ---- session ------------------------------------------------------------- */

static void v_init(void *ud, struct fuse_conn_info *conn) {
  (void)ud;
  /* locks stay in the kernel: they hold between host processes using the
   * view (not against processes inside the sandbox) */
  conn->want &= ~(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS | FUSE_CAP_WRITEBACK_CACHE);
  /* no splicing: through a pipe it costs more than a copy on the sizes
   * seen here (measured: bench/bench.py view) */
  conn->want &= ~(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_READ);
  /* the kernel's readahead goes out in the background, 12 requests at
   * once for the whole view by default: readers of a stalled bucket held
   * all 12, and no sandbox's file read anything more. Those into buckets
   * are bounded by their slots (FOREIGN_GATE), far below this. */
  conn->max_background = 256;
  conn->congestion_threshold = 192;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (!V.rootless && (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA)) {
    conn->want |= FUSE_CAP_EXPLICIT_INVAL_DATA; /* our invalidations decide, not mtime guesses */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
  }
  if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
  /* only where invalidations keep cached listings right (see v_opendir) */
  V.stateless_dirs = !V.rootless && V.fan >= 0 && (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT);
  /* Permissions: the mounting user may do whatever the sandbox's root may,
   * and the server acts as that root, so the kernel has nothing to check:
   * with its checks on (default_permissions) it fetches every new file's
   * ACL and, after each change in a directory, the directory's attributes
   * and ACL again: three round trips of a create's six. Only with
   * allow_other, where other users meet mode bits and ACLs as anywhere,
   * does the kernel check (and cache ACLs). */
  if (V.allow_other && (conn->capable & FUSE_CAP_POSIX_ACL)) conn->want |= FUSE_CAP_POSIX_ACL;
  else conn->want &= ~FUSE_CAP_POSIX_ACL;
  conn->max_write = 1024 * 1024;
  conn->max_readahead = 1024 * 1024;
  conn->time_gran = 1;
}

static const struct fuse_lowlevel_ops ops = {
    .init = v_init,
    .lookup = v_lookup,
    .forget = v_forget,
    .forget_multi = v_forget_multi,
    .getattr = v_getattr,
    .setattr = v_setattr,
    .access = v_access,
    .readlink = v_readlink,
    .mknod = v_mknod,
    .mkdir = v_mkdir,
    .symlink = v_symlink,
    .link = v_link,
    .unlink = v_unlink,
    .rmdir = v_rmdir,
    .rename = v_rename,
    .open = v_open,
    .create = v_create,
    .read = v_read,
    .write_buf = v_write_buf,
    .flush = v_flush,
    .release = v_release,
    .fsync = v_fsync,
    .fallocate = v_fallocate,
    .lseek = v_lseek,
    .copy_file_range = v_copy_file_range,
    .statfs = v_statfs,
    .opendir = v_opendir,
    .readdir = v_readdir,
    .readdirplus = v_readdirplus,
    .releasedir = v_releasedir,
    .fsyncdir = v_fsyncdir,
    .getxattr = v_getxattr,
    .listxattr = v_listxattr,
    .setxattr = v_setxattr,
    .removexattr = v_removexattr,
};

/* The place of a killed view's mount, which cannot be resolved through
 * (sbx_fuse_mount takes it over): its parent resolved, and its name. */
static bool dead_place(const char *mountpoint) {
  char copy[PATH_MAX], parent[PATH_MAX];
  snprintf(copy, sizeof copy, "%s", mountpoint);
  char *slash = strrchr(copy, '/');
  const char *name = slash ? slash + 1 : copy;
  if (slash) *slash = 0;
  if (!*name || !realpath(slash ? (*copy ? copy : "/") : ".", parent)) return false;
  return snprintf(V.mountpoint, sizeof V.mountpoint, "%s/%s", strcmp(parent, "/") ? parent : "", name) <
         (int)sizeof V.mountpoint;
}

static int view_main(const char *mountpoint, const sbx_view_opts *o) {
  V.uid = getuid();
  V.gid = getgid();
  V.rootless = geteuid() != 0;
  V.timeout = V.rootless ? 1.0 : 86400.0; /* as root, invalidations keep long caches right */
  V.root = (vnode){.nlookup = 2, .fd = -1};
  /* every node holds an fd: as many as the kernel allows */
  struct rlimit nofile;
  unsigned long nr_open = 0;
  FILE *nf = fopen("/proc/sys/fs/nr_open", "re");
  if (nf && fscanf(nf, "%lu", &nr_open) != 1) nr_open = 0;
  if (nf) fclose(nf);
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (!V.rootless && nr_open > nofile.rlim_max) nofile.rlim_max = nr_open;
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0) getrlimit(RLIMIT_NOFILE, &nofile);
    V.max_all = nofile.rlim_cur / 8 * 7;
  }
  if (V.max_all < 448) V.max_all = 448;
  V.null_path = open("/dev/null", O_PATH | O_CLOEXEC);
  V.null_rw = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (!realpath(mountpoint, V.mountpoint) && !(sbx_fuse_dead(errno) && dead_place(mountpoint))) {
    fprintf(stderr, "sbx mount: %s: %s\n", mountpoint, strerror(errno));
    return 1;
  }
  if (!V.rootless) {
    V.fan = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME | FAN_REPORT_FID | FAN_CLOEXEC | FAN_NONBLOCK,
                          O_RDONLY | O_CLOEXEC);
    if (V.fan < 0) V.timeout = 1.0; /* no invalidations to push: keep caches short */
  }
  char err[600];
  viewlink_cb cb = {.reset_all = on_reset_all, .changed = on_changed, .lost = on_lost};
  if (viewlink_connect(&cb, err, sizeof err) < 0) {
    fprintf(stderr, "sbx mount: %s\n", err);
    return 1;
  }
  sbx_fuse_args fa;
  V.allow_other = o->allow_other;
  sbx_fuse_args_init(&fa, "sbx-view", o->allow_other, false, o->debug);
  V.se = fuse_session_new(&fa.args, &ops, sizeof ops, NULL);
  if (!V.se) {
    fprintf(stderr, "sbx mount: cannot start a FUSE session\n");
    return 1;
  }
  /* the kernel offers io_uring in the INIT it sends at mount */
  bool uring = !o->no_uring && sbx_uring_enabled(true);
  sbx_uring_guard(true); /* killed before its INIT is answered, it still sets it back */
  if (sbx_fuse_mount(V.se, V.mountpoint, err, sizeof err) < 0) {
    fprintf(stderr, "sbx mount: %s\n", err);
    return 1;
  }
  /* backing files need CAP_SYS_ADMIN: as root only */
  bool passthrough = !V.rootless && !o->no_passthrough;
  V.passthrough = sbx_fuse_io_attach(V.se, passthrough, uring) == 0 && passthrough;
  if (!o->foreground && sbx_fuse_daemonize(o->ready_fd) < 0) return 1;
  /* threads only now: they would not survive the fork to the background */
  if (viewlink_run() < 0) return 1;
  pthread_create(&V.notifier, NULL, notifier_main, NULL);
  pthread_t fant;
  if (V.fan >= 0) pthread_create(&fant, NULL, fanotify_main, NULL);
  viewlink_wait_listed(10000);
  sbx_uring_guard(false); /* the loop's own handlers from now on */
  int r = sbx_fuse_loop(V.se, o->ready_fd);
  bool settled = sbx_uring_stop(); /* before anything its handlers use goes */
  pthread_mutex_lock(&V.lock);
  V.stopping = true;
  pthread_cond_broadcast(&V.notify_cond);
  pthread_mutex_unlock(&V.lock);
  pthread_join(V.notifier, NULL);
  if (V.fan >= 0) pthread_join(fant, NULL);
  if (settled) viewlink_stop();
  fuse_session_unmount(V.se);
  if (V.rootless) sbx_fuse_unmount(V.mountpoint, true, err, sizeof err); /* fusermount3 mounted it */
  if (!settled) {
    /* a handler still waits (on the daemon, up to a minute): the session
     * stays its own, the place is let go and the process ends (freed, the
     * session's reply made a use after free) */
    sbx_uring_restore();
    fflush(NULL);
    _exit(r < 0 ? 1 : 0);
  }
  fuse_session_destroy(V.se);
  fuse_opt_free_args(&fa.args);
  return r < 0 ? 1 : 0;
}

int sbx_view_main(const char *mountpoint, const sbx_view_opts *o) {
  int r = view_main(mountpoint, o);
  sbx_uring_restore(); /* whichever way it ended, if it turned it on */
  return r;
}
