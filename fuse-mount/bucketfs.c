#define _GNU_SOURCE
#define FUSE_USE_VERSION 314
#include "bucketfs.h"
#include "fuseutil.h"
#include "s3.h"
#include "sha256.h"
#include "../sandbox-core/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <jansson.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>

/* Reads fetch and cache 4 MiB chunks: against 1 MiB ones, sequential reads
 * of a 1 GiB object went from 170 to 275 MiB/s (each GET costs the server
 * about as much as a MiB of data; bench/bench.py buckets). A sequential
 * reader has the next READAHEAD chunks fetched ahead, up to SPAN of them in
 * one GET: 16 MiB GETs read a 1 GiB object 10-25 % faster than 4 MiB ones,
 * and a read at random still waits for 4 MiB only. */
#define CHUNK (4u << 20)
#define READAHEAD 8 /* chunks fetched ahead of a sequential reader */
#define SPAN 4      /* chunks one GET ahead of a reader asks for, at most */
#define HASH_SIZE 16384
#define UPLOADERS 8
#define FETCHERS 8
/* Small files are fetched ahead, metadata and content in one GET, a few
 * names past the one being looked up in its directory's listing: tar, cp
 * -r, grep -r and ls -l go through a directory in that order, and each
 * file would otherwise cost a HEAD and a GET one after the other. */
#define PREFETCH_MAX (512u * 1024)
#define PREFETCH_AHEAD 32
#define PREFETCH_KEPT 4096 /* fetched ahead and not looked up yet, at most */
#define HELD_MAX 8192      /* files the kernel forgot whose clean cached data stays, at most */
#define LIST_AHEAD 16         /* subdirectories listed ahead when a directory is opened, at most */
#define LIST_AHEAD_KEPT 512   /* directories listed ahead and not looked up yet, at most */
#define LIST_AHEAD_MAX 1000   /* entries of a listing made ahead (one page): a bigger one is read when wanted */
#define LIST_TTL_MS 5000     /* a directory's listing is trusted this long */
#define TREE_MAX 4000        /* keys of a directory's whole tree listed in one go (four pages), at most */
#define TREE_DIRS 256        /* directories in it, at most */
#define TREES 2              /* trees listed at once, at most (the other fetchers read ahead) */
#define TREE_RETRY_MS 60000  /* a tree found bigger is listed directory by directory this long */
#define LIST_SETTLE_MS 2000  /* what we put in a directory this long before a listing began is kept past it */
#define MAX_LIST 200000      /* entries of one directory */
#define LIST_BYTES_MAX (128u << 20) /* what all directories' listings take together: past it the least recently used go */
#define ATTR_TIMEOUT 1.0
#define PBUF 4096            /* paths and keys (a key is at most 1024 bytes) */
#define JOURNAL_INPLACE 4096 /* a journal entry rewritten in place: within one page */
#define MAX_KEY 1024
#define RETRY_MS 1000        /* a failed upload is tried again after this */
#define JOURNAL_COST 4096    /* what a journal entry takes of the host's disk (a block), out of cache_max */
#define EXIT_LEFT_JOURNALED 3 /* exit status: some changes wait in the journal */

typedef enum { T_FILE, T_DIR, T_LINK } ntype;

typedef struct lentry {
  char *name;
  bool dir;
  uint64_t size;
  int64_t modified_ns; /* LastModified */
  uint64_t etag;       /* s3_etag_hash of its ETag (0: not known) */
  uint64_t added_ms;   /* put there by us (not a listing): when */
  int32_t next;        /* the next entry of its chain in an lindex */
} lentry;

/* An array of entries found by name in constant time (a directory of
 * 100,000 files is listed, created in and looked up in without walking
 * it): chains of indices, heads in a table twice the entries' size. With
 * no table (none could be allocated), lookups walk the array. */
typedef struct lindex {
  int32_t *head;
  size_t mask;
} lindex;

/* A listing being made: entries, their index, whether memory ran out. */
typedef struct list_ctx {
  lentry *e;
  size_t n, cap;
  lindex ix;
  bool oom;
} list_ctx;

/* A node's place on a list of nodes, oldest first (B.fds, B.lru). */
typedef struct nlink {
  struct bnode *prev, *next;
  bool on;
} nlink;
typedef struct nlist {
  struct bnode *head, *tail;
} nlist;

typedef struct bnode {
  char *path; /* "" for the root, else "a/b" (no leading or trailing slash) */
  ntype type;
  uint64_t nlookup;
  int opens;
  int busy;      /* a request about it is under way (the lock dropped) */
  int fetching;  /* chunk fetches writing into its cache file */
  bool remote;   /* the bucket has it, as far as we know */
  bool kept;     /* fetched ahead: kept (with no reference) for a lookup to come */
  bool held;     /* forgotten by the kernel: kept for its clean cached data */
  bool listed_ahead; /* a directory listed ahead: kept (with no reference) for a lookup to come */
  bool listing;      /* its listing is being read ahead: a reader waits for that one */
  bool looked;       /* the kernel looked it up once (a directory only listed ahead is not held) */
  bool meta_pending; /* made ahead of its lookup: mode, owner, mtime not known yet */
  bool unlinked; /* removed: only the kernel's references and open files keep it */
  uint64_t size;
  int64_t mtime_ns;
  int64_t remote_modified_ns; /* the object's LastModified when we last saw it (0: not known) */
  uint64_t etag;              /* its ETag's s3_etag_hash then (0: not known) */
  mode_t mode;                /* permission bits */
  uid_t uid, gid;             /* as the sandbox sees them */
  char *target;               /* a symlink's */
  uint64_t version;           /* bumped when the bucket's object changed under us */
  uint64_t open_version;      /* the version the kernel's page cache holds */
  /* the cache file: whole (full) or chunks of the object */
  int cfd;
  nlink fd_link; /* on B.fds while cfd is open */
  bool full;
  uint8_t *present, *inflight;
  size_t nchunks;
  uint64_t cached; /* bytes of the cache file we account for */
  nlink lru_link; /* on B.lru while it has cached data */
  nlink held_link; /* on B.held while held, on B.ahead while listed ahead */
  bool stale;        /* the bucket's object changed: drop the cache when closed */
  uint64_t seq_off; /* where a sequential reader goes next */
  uint64_t uploaded_ms; /* when it last went up (a listing older than that lacks it) */
  /* what is not in the bucket yet */
  bool dirty, queued;
  bool jfile, jattr; /* where its journal entry is: a file of journal/, its cache file's attribute */
  int64_t jat;       /* when that entry was written (recover: the newer of two wins) */
  uint32_t jextra;   /* what its entry takes past JOURNAL_COST (long names, targets) */
  bool tried; /* an upload of it began: the bucket may have it, whatever it said */
  uint64_t gen, up_gen, fail_gen;
  /* a directory's listing as the bucket had it, plus our own changes */
  lentry *list;
  size_t nlist, cap;
  lindex lix; /* over list, made when first wanted */
  size_t list_bytes; /* what list and lix take, counted in B.list_bytes */
  nlink list_link;   /* on B.listed while it has entries */
  uint64_t list_at, list_started;
  uint64_t tree_big_at; /* when a listing of its tree found more than TREE_MAX keys */
  struct bnode *hnext;
} bnode;

/* A deletion the bucket has not seen yet (journaled as a tombstone). */
typedef struct gone {
  char *path;
  bool dir;
  uint32_t jextra; /* what its entry takes past JOURNAL_COST */
  uint64_t done_ms; /* deleted there at; kept until a listing newer than that */
  struct gone *next;
} gone;

typedef enum { OP_PUT, OP_DEL } opkind;
typedef struct qitem {
  char *path;
  opkind kind;
  uint64_t not_before; /* a retry: not before this */
  bool retry;          /* on B.retry, not B.queue */
  struct qitem *next, *hnext;
} qitem;

typedef struct fitem {
  bnode *n;
  size_t chunk, count; /* chunks [chunk, chunk + count), marked in flight when queued */
  bool whole;    /* a small object fetched ahead with its metadata */
  bool list;     /* a directory listed ahead */
  bool tree;     /* a directory's whole tree listed (B.trees[slot] its path) */
  size_t slot;
  struct fitem *next;
} fitem;

/* An fsync answered once its file's content is in the bucket. It holds no
 * thread meanwhile: a sandbox fsyncing many files on a slow bucket would
 * otherwise take every thread of the server, and leave none for the
 * lookups and getattrs that anyone reaching the mount (the daemon among
 * them) waits on. */
typedef struct psync {
  fuse_req_t req;
  bnode *n;
  uint64_t gen;
  struct psync *next;
} psync;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t work, fetched, fetch_work;
  s3_conf s3;
  char prefix[MAX_KEY]; /* "" or "p/" */
  char cache[1024];
  bool read_only;
  uid_t uid_base; /* the host uid of sandbox root (rootless: 0, ids are the namespace's) */
  uint64_t cache_max, cache_used;
  nlist lru; /* nodes with cached data, least recently used first */
  nlist held; /* nodes held with no reference, the oldest first */
  nlist ahead; /* directories listed ahead, not looked up yet, the oldest first */
  nlist listed; /* directories with entries, the least recently used first */
  uint64_t list_bytes;
  size_t nahead;
  uint64_t njournal; /* journal entries: dirty nodes and deletions not done yet */
  uint64_t journal_extra; /* what entries bigger than JOURNAL_COST take past it */
  uint64_t fetching_bytes; /* of fetches under way: theirs already */
  uint64_t njattr;   /* of them, entries in a cache file's attribute */
  bool jmarked;      /* JOURNAL_MARK is there: entries may be in cache files' attributes */
  bnode *hash[HASH_SIZE];
  gone *gone[HASH_SIZE];
  bnode root;
  qitem *queue, **queue_tail; /* to upload, oldest first */
  qitem *retry, **retry_tail; /* failed, to try again: by not_before */
  qitem *qhash[HASH_SIZE];    /* both, by path */
  uint64_t away_until;        /* the bucket did not answer: nothing is tried before */
  struct psync *syncs; /* fsyncs waiting for their upload (answered by the uploaders) */
  char *busy_paths[UPLOADERS]; /* one operation per path at a time, in order */
  fitem *fetchq;   /* chunks a reader wants soon: first */
  fitem *aheadq;   /* small files fetched ahead */
  char *trees[TREES]; /* the directories whose trees are being listed */
  uint64_t renames;    /* renames begun */
  int renaming;        /* renames under way */
  size_t nkept, nheld;
  nlist fds; /* nodes whose cache file is open, oldest first */
  size_t nfds, fds_max;         /* past fds_max, those not in use are closed */
  int inflight;
  bool stopping, fetch_stop;
  struct fuse_session *se;
  char last_error[400];
} B = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .work = PTHREAD_COND_INITIALIZER,
       .fetched = PTHREAD_COND_INITIALIZER,
       .fetch_work = PTHREAD_COND_INITIALIZER};

/* ---- names ---------------------------------------------------------------- */

/* Whether path is in (or is) a directory whose tree is being listed
 * (lock held). */
static bool tree_covers(const char *path) {
  for (size_t i = 0; i < TREES; i++) {
    const char *t = B.trees[i];
    size_t l = t ? strlen(t) : 0;
    if (t && (!l || (!strncmp(path, t, l) && (!path[l] || path[l] == '/')))) return true;
  }
  return false;
}

static void key_of(const char *path, char *out, size_t len) {
  if (snprintf(out, len, "%s%s", B.prefix, path) >= (int)len) out[0] = 0; /* cannot happen: join() bounds paths */
}

static void dir_key_of(const char *path, char *out, size_t len) {
  if (snprintf(out, len, "%s%s%s", B.prefix, path, *path ? "/" : "") >= (int)len) out[0] = 0;
}

static void hashed(const char *dir, const char *kind, const char *path, const char *ext, char *out, size_t len) {
  char h[65];
  sha256_hex(path, strlen(path), h);
  snprintf(out, len, "%s/%s/%s%s%s", B.cache, dir, kind, h, ext);
}

static void cache_path(const char *path, char *out, size_t len) { hashed("data", "", path, "", out, len); }
static void journal_path(const char *path, bool tomb, char *out, size_t len) {
  hashed("journal", tomb ? "t-" : "d-", path, ".json", out, len);
}

/* dir/name, or NULL with errno ENAMETOOLONG when its key (and a directory
 * marker's trailing slash) would pass S3's 1024 bytes, EILSEQ when the name
 * is not UTF-8 (no key can be: S3 would store another name). */
static char *join(const char *dir, const char *name) {
  if (strlen(name) > NAME_MAX || strlen(B.prefix) + strlen(dir) + 1 + strlen(name) + 1 > MAX_KEY) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  if (!sbx_utf8_valid(name, strlen(name))) {
    errno = EILSEQ;
    return NULL;
  }
  errno = ENOMEM;
  return *dir ? sbx_strdup_printf("%s/%s", dir, name) : strdup(name);
}

static const char *base_of(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t name_hash(const char *p) { return (size_t)sbx_fnv1a(p); }

static size_t hash_of(const char *p) { return name_hash(p) % HASH_SIZE; }

/* ---- names in a listing ---------------------------------------------------- */

static void lindex_free(lindex *x) {
  free(x->head);
  *x = (lindex){0};
}

static void lindex_link(lindex *x, lentry *e, size_t i) {
  int32_t *b = &x->head[name_hash(e[i].name) & x->mask];
  e[i].next = *b;
  *b = (int32_t)i;
}

static void lindex_build(lindex *x, lentry *e, size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  lindex_free(x);
  if (!(x->head = malloc(size * sizeof *x->head))) return;
  memset(x->head, 0xff, size * sizeof *x->head);
  x->mask = size - 1;
  for (size_t i = 0; i < n; i++) lindex_link(x, e, i);
}

/* e[i] was just appended (e has i + 1 entries). A few entries are walked
 * instead: the table is made past LINDEX_MIN. */
#define LINDEX_MIN 8
static void lindex_add(lindex *x, lentry *e, size_t i) {
  if (!x->head) {
    if (i + 1 > LINDEX_MIN) lindex_build(x, e, i + 1);
  } else if (2 * (i + 1) > x->mask + 1) {
    lindex_build(x, e, i + 1);
  } else {
    lindex_link(x, e, i);
  }
}

static void lindex_unlink(lindex *x, lentry *e, size_t i) {
  if (!x->head) return;
  for (int32_t *pp = &x->head[name_hash(e[i].name) & x->mask]; *pp >= 0; pp = &e[*pp].next)
    if (*pp == (int32_t)i) {
      *pp = e[i].next;
      return;
    }
}

/* Appends a copy of name to e[0..n), growing it (cap), and indexes it: the
 * new entry, or NULL when memory ran out (nothing changed). */
static lentry *lentry_append(lentry **e, size_t *n, size_t *cap, lindex *x, const char *name) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    lentry *ne = realloc(*e, c * sizeof *ne);
    if (!ne) return NULL;
    *e = ne;
    *cap = c;
  }
  char *copy = strdup(name);
  if (!copy) return NULL;
  (*e)[*n] = (lentry){.name = copy};
  lindex_add(x, *e, (*n)++);
  return &(*e)[*n - 1];
}

/* lentry_append of a copy of entry o (its name and what is known of it). */
static lentry *lentry_append_copy(lentry **e, size_t *n, size_t *cap, lindex *x, const lentry *o) {
  lentry *c = lentry_append(e, n, cap, x, o->name);
  if (c) c->dir = o->dir, c->size = o->size, c->modified_ns = o->modified_ns, c->etag = o->etag, c->added_ms = o->added_ms;
  return c;
}

static lentry *lindex_find(const lindex *x, lentry *e, size_t n, const char *name) {
  if (!x->head) {
    for (size_t i = 0; i < n; i++)
      if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
  }
  for (int32_t i = x->head[name_hash(name) & x->mask]; i >= 0; i = e[i].next)
    if (!strcmp(e[i].name, name)) return &e[i];
  return NULL;
}

/* ---- nodes (lock held) ---------------------------------------------------- */

static bnode *node_find(const char *path) {
  if (!*path) return &B.root;
  for (bnode *n = B.hash[hash_of(path)]; n; n = n->hnext)
    if (!strcmp(n->path, path)) return n;
  return NULL;
}

static void node_hash(bnode *n) {
  size_t h = hash_of(n->path);
  n->hnext = B.hash[h];
  B.hash[h] = n;
}

static void node_unhash(bnode *n) {
  if (n == &B.root) return;
  for (bnode **pp = &B.hash[hash_of(n->path)]; *pp; pp = &(*pp)->hnext)
    if (*pp == n) {
      *pp = n->hnext;
      n->hnext = NULL;
      return;
    }
}

static bnode *node_new(const char *path, ntype type) {
  bnode *n = calloc(1, sizeof *n);
  if (!n || !(n->path = strdup(path))) {
    free(n);
    return NULL;
  }
  n->type = type;
  n->cfd = -1;
  n->mode = type == T_DIR ? 0755 : type == T_LINK ? 0777 : 0644;
  n->mtime_ns = now_ns();
  node_hash(n);
  return n;
}

static bool list_fresh(const bnode *d, uint64_t now) { return d->list_at && now - d->list_at < LIST_TTL_MS; }

static void nlist_remove(nlist *l, bnode *n, size_t off);
#define LIST_LINK offsetof(bnode, list_link)

static void list_free(bnode *d) {
  if (d->list_link.on) nlist_remove(&B.listed, d, LIST_LINK);
  B.list_bytes -= d->list_bytes;
  d->list_bytes = 0;
  for (size_t i = 0; i < d->nlist; i++) free(d->list[i].name);
  free(d->list);
  d->list = NULL;
  d->nlist = d->cap = 0;
  lindex_free(&d->lix);
  d->list_at = 0;
}

static lentry *list_find(bnode *d, const char *name) { return lindex_find(&d->lix, d->list, d->nlist, name); }

/* What an entry of a listing takes (its index's share counted). */
static size_t entry_bytes(const char *name) { return sizeof(lentry) + strlen(name) + 1 + 2 * sizeof(int32_t); }

static void nlist_append(nlist *l, bnode *n, size_t off);

/* An entry of bytes added to d's listing or taken from it, in the count. */
static void list_counted(bnode *d, size_t bytes, bool added) {
  if (!added) bytes = bytes < d->list_bytes ? bytes : d->list_bytes;
  d->list_bytes = added ? d->list_bytes + bytes : d->list_bytes - bytes;
  B.list_bytes = added ? B.list_bytes + bytes : B.list_bytes - bytes;
  if (added && !d->list_link.on) nlist_append(&B.listed, d, LIST_LINK);
}

/* Our own changes, kept in the listing so it stays right until the next
 * one from the bucket (which has them by then, or has them pending). */
/* Its entry, or NULL when d has no listing (or memory ran out). */
static lentry *list_add(bnode *d, const char *name, bool dir) {
  if (!d || !d->list_at) return NULL;
  lentry *e = list_find(d, name);
  if (!e) {
    if (!(e = lentry_append(&d->list, &d->nlist, &d->cap, &d->lix, name))) {
      list_free(d); /* listed again next time */
      return NULL;
    }
    list_counted(d, entry_bytes(name), true);
  }
  e->dir = dir;
  e->added_ms = sbx_now_ms();
  return e;
}

static void list_remove(bnode *d, const char *name) {
  lentry *e = d ? list_find(d, name) : NULL;
  if (!e) return;
  size_t i = (size_t)(e - d->list), last = d->nlist - 1;
  lindex_unlink(&d->lix, d->list, i);
  list_counted(d, entry_bytes(d->list[i].name), false);
  free(d->list[i].name);
  if (i != last) { /* the last entry takes its place */
    lindex_unlink(&d->lix, d->list, last);
    d->list[i] = d->list[last];
    if (d->lix.head) lindex_link(&d->lix, d->list, i);
  }
  d->nlist--;
}

/* d's listing counted in B.list_bytes again, as the one used last (lock
 * held). */
static void list_count(bnode *d) {
  size_t bytes = 0;
  for (size_t i = 0; i < d->nlist; i++) bytes += entry_bytes(d->list[i].name);
  B.list_bytes = B.list_bytes - d->list_bytes + bytes;
  d->list_bytes = bytes;
  if (d->list_link.on) nlist_remove(&B.listed, d, LIST_LINK);
  if (bytes) nlist_append(&B.listed, d, LIST_LINK);
}

/* d used now: the last of its listing to go (lock held). */
static void list_touch(bnode *d) {
  if (!d->list_link.on) return;
  nlist_remove(&B.listed, d, LIST_LINK);
  nlist_append(&B.listed, d, LIST_LINK);
}

/* The names we put in d's listing since LIST_SETTLE_MS before since (the
 * bucket may not list them yet), copied into l where it has them not. */
static void keep_recent(const bnode *d, list_ctx *l, uint64_t since) {
  for (size_t i = 0; i < d->nlist && !l->oom; i++) {
    const lentry *o = &d->list[i];
    if (!o->added_ms || o->added_ms + LIST_SETTLE_MS < since || lindex_find(&l->ix, l->e, l->n, o->name)) continue;
    if (!lentry_append_copy(&l->e, &l->n, &l->cap, &l->ix, o)) break; /* out of memory: fewer kept */
  }
}

/* d's listing goes (read again when next wanted), but for the names we put
 * there in the last LIST_SETTLE_MS (the bucket may not list them yet) (lock
 * held). */
static void list_drop(bnode *d) {
  list_ctx keep = {0};
  keep_recent(d, &keep, sbx_now_ms());
  list_free(d);
  d->list = keep.e, d->nlist = keep.n, d->cap = keep.cap, d->lix = keep.ix;
  list_count(d);
}

/* The directory node of a path's parent, if we have it. */
static bnode *parent_of(const char *path) {
  const char *s = strrchr(path, '/');
  if (!s) return &B.root;
  char p[PBUF];
  snprintf(p, sizeof p, "%.*s", (int)(s - path), path);
  return node_find(p);
}

/* Forgets the node's cached data; never while a file handle or a fetch
 * uses its cache file (callers check opens; fetches are waited for). */
static void cache_close(bnode *n);

/* Lists of nodes through a link of theirs (its offset in bnode). Lock held. */
#define NLINK(n, off) ((nlink *)((char *)(n) + (off)))
#define FD_LINK offsetof(bnode, fd_link)
#define LRU_LINK offsetof(bnode, lru_link)
#define HELD_LINK offsetof(bnode, held_link)

static void nlist_remove(nlist *l, bnode *n, size_t off) {
  nlink *k = NLINK(n, off);
  if (!k->on) return;
  *(k->prev ? &NLINK(k->prev, off)->next : &l->head) = k->next;
  *(k->next ? &NLINK(k->next, off)->prev : &l->tail) = k->prev;
  *k = (nlink){0};
}

/* n goes last (the newest). */
static void nlist_append(nlist *l, bnode *n, size_t off) {
  nlist_remove(l, n, off);
  nlink *k = NLINK(n, off);
  k->prev = l->tail;
  *(l->tail ? &NLINK(l->tail, off)->next : &l->head) = n;
  l->tail = n;
  k->on = true;
}

/* The LRU list of cached data: eviction takes from its head. */
static void lru_out(bnode *n) { nlist_remove(&B.lru, n, LRU_LINK); }

/* n was used (or got data): the most recently used now. */
static void lru_touch(bnode *n) {
  if (n->cached || n->lru_link.on) nlist_append(&B.lru, n, LRU_LINK);
}

static void journal_node(bnode *n);
static void drop_jattr(bnode *n);

/* unlink_file: the cache file of its path goes too, unless that path
 * names another node now (which it is then the file of: this one was
 * removed or renamed over). */
static void cache_drop(bnode *n, bool unlink_file) {
  while (n->fetching) pthread_cond_wait(&B.fetched, &B.lock);
  cache_close(n);
  bnode *owner = unlink_file ? node_find(n->path) : NULL;
  if (unlink_file && (!owner || owner == n)) {
    char p[PBUF];
    cache_path(n->path, p, sizeof p);
    unlink(p);
    if (n->jattr) { /* its journal entry went with the file: written anew */
      drop_jattr(n);
      journal_node(n);
    }
  }
  B.cache_used -= n->cached <= B.cache_used ? n->cached : B.cache_used;
  n->cached = 0;
  lru_out(n);
  n->full = false;
  free(n->present);
  free(n->inflight);
  n->present = n->inflight = NULL;
  n->nchunks = 0;
}

static void unkeep(bnode *n);
static void node_maybe_free(bnode *n);

/* Whether something refers to n: the kernel, an open file, an upload, a
 * fetch, or it is kept for a lookup to come. */
static bool node_referenced(const bnode *n) {
  return n == &B.root || n->nlookup || n->opens || n->busy || n->dirty || n->queued || n->kept || n->held ||
         n->listed_ahead;
}

static void node_free(bnode *n) {
  node_unhash(n); /* by pointer: another node may have its path now */
  cache_drop(n, true); /* its cache file, unless its path names another node now */
  list_free(n);
  free(n->target);
  free(n->path);
  free(n);
}

/* What the kernel forgot stays known for a lookup to come, which then
 * needs no HEAD: a file with clean cached data keeps it (in the cache's
 * LRU like any other's; the listing says then whether the bucket's object
 * is still the one cached), a directory its metadata (of its listing, read
 * again at its next lookup, only the names we put there in the last
 * LIST_SETTLE_MS stay). At most HELD_MAX of them: past that the one held
 * longest goes. Lock held. */
static bool hold(bnode *n) {
  if (!n->remote || n->unlinked || n->stale || n->meta_pending || node_find(n->path) != n) return false;
  if (n->type == T_DIR) { /* only the names we just put there stay (refresh_listing keeps them) */
    if (!n->looked) return false;
    list_drop(n);
  } else if (n->type != T_FILE || !n->cached || (!n->etag && !n->remote_modified_ns)) {
    return false; /* no data, or nothing to tell the bucket's object by */
  }
  if (B.nheld >= HELD_MAX) {
    bnode *old = B.held.head;
    unkeep(old);
    if (!node_referenced(old)) node_free(old);
  }
  cache_close(n); /* its file stays, not its descriptor */
  n->held = true;
  B.nheld++;
  nlist_append(&B.held, n, HELD_LINK);
  return true;
}

/* Freed once nothing refers to it, unless it is held (above). */
static void node_maybe_free(bnode *n) {
  if (!node_referenced(n) && !hold(n)) node_free(n);
}

static bnode *node_of(fuse_ino_t ino) { return ino == FUSE_ROOT_ID ? &B.root : (bnode *)(uintptr_t)ino; }

static void fill_attr(const bnode *n, struct stat *st) {
  *st = (struct stat){0};
  st->st_ino = n == &B.root ? FUSE_ROOT_ID : (ino_t)(uintptr_t)n;
  st->st_mode = (n->type == T_DIR ? S_IFDIR : n->type == T_LINK ? S_IFLNK : S_IFREG) | (n->mode & 07777);
  st->st_nlink = n->type == T_DIR ? 2 : 1;
  st->st_uid = B.uid_base + n->uid;
  st->st_gid = B.uid_base + n->gid;
  st->st_size = n->type == T_DIR ? 4096 : (off_t)n->size;
  st->st_blksize = 128 * 1024;
  st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
  st->st_mtim.tv_sec = n->mtime_ns / 1000000000;
  st->st_mtim.tv_nsec = n->mtime_ns % 1000000000;
  st->st_atim = st->st_ctim = st->st_mtim;
}

static s3_meta meta_of(const bnode *n) {
  mode_t type = n->type == T_LINK ? S_IFLNK : 0;
  return (s3_meta){.valid = true, .mode = type | (n->mode & 07777), .mtime_ns = n->mtime_ns, .uid = n->uid, .gid = n->gid};
}

/* An owner id as the sandbox has it (0-65535); another (an object's
 * metadata from another client, a caller outside the sandbox's range)
 * would be another sandbox's id or the host's on this side: nobody. */
static uint32_t sandbox_id(int64_t id) { return id >= 0 && id <= 65535 ? (uint32_t)id : 65534; }

static void apply_meta(bnode *n, const s3_meta *m) {
  if (!m->valid) return;
  n->mode = m->mode & 07777;
  if (m->mtime_ns) n->mtime_ns = m->mtime_ns;
  n->uid = sandbox_id(m->uid);
  n->gid = sandbox_id(m->gid);
}

/* ---- the journal of what the bucket has not seen yet ---------------------- */

/* A journal entry, rewritten in place: one write from offset 0, padded
 * with spaces (which a JSON reader skips) to what the file held before.
 * A crash of this process leaves the old entry or the new one whole (a
 * write within one page), and a rewrite makes no new inode: a file takes
 * three or four of them in a row (create, close, the mtime tar sets), and
 * a new inode costs up to a millisecond on an ext4 after many deletions.
 * Entries past a page (long symlink targets) go through a new file and a
 * rename instead. */
static void write_json_file(const char *path, const char *s) {
  size_t len = strlen(s), want = len;
  struct stat st;
  int fd = len <= JOURNAL_INPLACE ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) : -1;
  if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size <= JOURNAL_INPLACE) {
    char buf[JOURNAL_INPLACE];
    if ((size_t)st.st_size > want) want = (size_t)st.st_size;
    memcpy(buf, s, len);
    memset(buf + len, ' ', want - len);
    (void)!pwrite(fd, buf, want, 0);
  } else {
    char tmp[PBUF + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int t = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (t >= 0) {
      if (sbx_write_all(t, s, len) == 0) rename(tmp, path);
      close(t);
    }
  }
  if (fd >= 0) close(fd);
}

/* A changed node's journal entry: its metadata (its data is its cache
 * file). A file's entry is an attribute of its cache file (JOURNAL_ATTR):
 * one system call on a file that is there anyway, where an entry of its own
 * is a new file, the most a file written through the mount cost (up to a
 * millisecond on an ext4 after many deletions; `tar -x` of 2,000 files:
 * see BENCHMARKS.md). Directories, links, a filesystem without user
 * attributes and entries too big for one get a file of journal/. Before
 * the first attribute, JOURNAL_MARK is made in journal/: a journal that
 * looks empty from outside (the daemon's check) is empty. */
#define JOURNAL_ATTR "user.sbx.journal"
#define JOURNAL_MARK "in-cache-files"

/* What an entry of len bytes takes of the host's disk past JOURNAL_COST:
 * names and targets with bytes JSON escapes make entries of tens of KB. */
static uint32_t entry_extra(size_t len) {
  size_t blocks = (len + 4095) / 4096 * 4096;
  return blocks > JOURNAL_COST ? (uint32_t)(blocks - JOURNAL_COST) : 0;
}

static void set_jextra(uint32_t *have, uint32_t now) {
  B.journal_extra = B.journal_extra - *have + now;
  *have = now;
}

static json_t *entry_of(const bnode *n, int64_t at) {
  json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:I, s:i, s:i, s:I}", "path", n->path, "type",
                        n->type == T_DIR ? "dir" : n->type == T_LINK ? "link" : "file", "size", (json_int_t)n->size,
                        "mode", (int)n->mode, "mtime", (json_int_t)n->mtime_ns, "uid", (int)n->uid, "gid", (int)n->gid,
                        "at", (json_int_t)at);
  if (j && n->target) json_object_set_new(j, "target", json_string(n->target));
  return j;
}

static bool journal_mark(void) {
  if (B.jmarked) return true;
  char p[PBUF];
  snprintf(p, sizeof p, "%s/journal/" JOURNAL_MARK, B.cache);
  int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  close(fd);
  return B.jmarked = true;
}

static int cache_attr(const bnode *n, const char *value, size_t len) {
  if (n->cfd >= 0) return value ? fsetxattr(n->cfd, JOURNAL_ATTR, value, len, 0) : fremovexattr(n->cfd, JOURNAL_ATTR);
  char cp[PBUF];
  cache_path(n->path, cp, sizeof cp);
  return value ? setxattr(cp, JOURNAL_ATTR, value, len, 0) : removexattr(cp, JOURNAL_ATTR);
}

/* Where the node's entry was goes (lock held). A journal file is named
 * for the path the node had when it was written. */
static void drop_jfile(bnode *n, const char *path) {
  if (!n->jfile) return;
  char jp[PBUF];
  journal_path(path, false, jp, sizeof jp);
  unlink(jp);
  n->jfile = false;
}

static void drop_jattr(bnode *n) {
  if (!n->jattr) return;
  cache_attr(n, NULL, 0);
  n->jattr = false;
  B.njattr--;
}

/* Its entry goes: the bucket has it, or it went. */
static void journal_drop(bnode *n, const char *path) {
  drop_jfile(n, path);
  drop_jattr(n);
}

static void journal_node(bnode *n) {
  if (!n->dirty || n->unlinked) return; /* nothing of it is to go up */
  int64_t at = now_ns();
  json_t *j = entry_of(n, at);
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (s && n->type == T_FILE && journal_mark() && cache_attr(n, s, strlen(s)) == 0) {
    drop_jfile(n, n->path); /* an older entry */
    if (!n->jattr) B.njattr++;
    n->jattr = true;
  } else if (s) {
    char path[PBUF];
    journal_path(n->path, false, path, sizeof path);
    write_json_file(path, s);
    n->jfile = true;
    drop_jattr(n); /* after: a crash between the two leaves both, the newer wins */
  }
  n->jat = at;
  if (s) set_jextra(&n->jextra, entry_extra(strlen(s)));
  free(s);
  json_decref(j);
}

/* ---- the queue: one operation per path at a time, in order ----------------- */

static bool path_busy(const char *path) {
  for (int i = 0; i < UPLOADERS; i++)
    if (B.busy_paths[i] && !strcmp(B.busy_paths[i], path)) return true;
  return false;
}

static int path_take(const char *path) {
  for (int i = 0; i < UPLOADERS; i++)
    if (!B.busy_paths[i]) {
      B.busy_paths[i] = (char *)path;
      return i;
    }
  return -1;
}

/* A failure that says the bucket is away (no answer, or the server's own
 * failure), not that this one request or our own cache went wrong. */
static bool bucket_away(const s3_err *e) {
  if (e->http >= 500) return true;
  return e->http == 0 && (!strcmp(e->code, "DNS") || !strcmp(e->code, "connect") || !strcmp(e->code, "TLS") ||
                          !strcmp(e->code, "network"));
}

static void q_append(qitem **head, qitem ***tail, qitem *q) {
  q->next = NULL;
  if (!*tail) *tail = head;
  **tail = q;
  *tail = &q->next;
}

/* Unlinks *pp (an item of the list head/tail). */
static qitem *q_take(qitem **pp, qitem ***tail) {
  qitem *q = *pp;
  *pp = q->next;
  if (*tail == &q->next) *tail = pp;
  return q;
}

static qitem **q_hash_slot(const char *path, opkind kind) {
  qitem **pp = &B.qhash[hash_of(path)];
  while (*pp && ((*pp)->kind != kind || strcmp((*pp)->path, path))) pp = &(*pp)->hnext;
  return pp;
}

static void q_unhash(qitem *q) {
  qitem **pp = q_hash_slot(q->path, q->kind);
  if (*pp == q) *pp = q->hnext;
}

static void q_hash(qitem *q) {
  qitem **slot = q_hash_slot(q->path, q->kind);
  q->hnext = *slot;
  *slot = q;
}

/* Queues an upload or a delete of path (lock held); one already queued or
 * waiting to be retried is wanted now instead. Constant time: an untar of
 * many files queues each without walking the others. */
static void enqueue(const char *path, opkind kind) {
  if (kind == OP_PUT) {
    bnode *n = node_find(path);
    if (n) n->queued = true;
  }
  qitem *q = *q_hash_slot(path, kind);
  if (q) {
    if (q->retry) { /* wanted now (fsync, or changed again) */
      qitem **pp = &B.retry;
      while (*pp != q) pp = &(*pp)->next;
      q_take(pp, &B.retry_tail);
      q->retry = false;
      q_append(&B.queue, &B.queue_tail, q);
    }
    pthread_cond_broadcast(&B.work);
    return;
  }
  q = calloc(1, sizeof *q);
  if (!q || !(q->path = strdup(path))) {
    free(q);
    return;
  }
  q->kind = kind;
  q_hash(q);
  q_append(&B.queue, &B.queue_tail, q);
  pthread_cond_broadcast(&B.work);
}

/* The next item an uploader may take (lock held): the oldest whose path
 * is not being worked on, then the oldest retry that is due; none while
 * the bucket is away. *wait_ms: when to look again (0: when woken). Taken,
 * it is no longer queued: the path changed again is queued anew. */
static qitem *dequeue(uint64_t now, uint64_t *wait_ms) {
  *wait_ms = 0;
  if (now < B.away_until) {
    *wait_ms = B.away_until - now;
    return NULL;
  }
  qitem *q = NULL;
  for (qitem **pp = &B.queue; *pp; pp = &(*pp)->next)
    if (!path_busy((*pp)->path)) {
      q = q_take(pp, &B.queue_tail);
      break;
    }
  for (qitem **pp = &B.retry; *pp && !q; pp = &(*pp)->next) {
    if ((*pp)->not_before > now) {
      *wait_ms = (*pp)->not_before - now;
      break;
    }
    if (!path_busy((*pp)->path)) {
      q = q_take(pp, &B.retry_tail);
      break;
    }
  }
  if (q) {
    q->retry = false;
    q_unhash(q);
  }
  return q;
}


static gone *gone_find(const char *path) {
  for (gone *g = B.gone[hash_of(path)]; g; g = g->next)
    if (!strcmp(g->path, path)) return g;
  return NULL;
}

static gone *gone_add(const char *path, bool dir) {
  gone *g = gone_find(path);
  if (!g) {
    g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
      free(g);
      return NULL;
    }
    size_t h = hash_of(path);
    g->next = B.gone[h];
    B.gone[h] = g;
    g->done_ms = 1; /* not pending yet */
  }
  if (g->done_ms) B.njournal++; /* pending now: journaled by the caller */
  g->dir = dir;
  g->done_ms = 0;
  return g;
}

/* The deletion is done: its journal entry goes (the caller unlinks it). */
static void gone_done(gone *g) {
  if (!g->done_ms) B.njournal--;
  set_jextra(&g->jextra, 0);
  g->done_ms = sbx_now_ms();
}

static void gone_drop(const char *path) {
  for (gone **pp = &B.gone[hash_of(path)]; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->path, path)) {
      gone *g = *pp;
      *pp = g->next;
      if (!g->done_ms) B.njournal--;
      set_jextra(&g->jextra, 0);
      free(g->path);
      free(g);
      return;
    }
}

/* The object (or directory marker) at path is to be deleted from the
 * bucket: journaled first, so it happens even after a crash. */
static void tombstone(const char *path, bool dir) {
  gone *g = gone_add(path, dir);
  if (!g) return;
  char jp[PBUF];
  journal_path(path, true, jp, sizeof jp);
  json_t *j = json_pack("{s:s, s:b}", "path", path, "dir", dir);
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (s) {
    set_jextra(&g->jextra, entry_extra(strlen(s)));
    write_json_file(jp, s);
  }
  free(s);
  json_decref(j);
  enqueue(path, OP_DEL);
}

static void mark_dirty(bnode *n) {
  n->gen++;
  if (n->unlinked) return; /* open after its removal: nothing of it goes up */
  if (!n->dirty) {
    n->dirty = true;
    B.njournal++;
    journal_node(n);
  }
}

/* Its journal entry goes: the bucket has it, or it went. */
static void mark_clean(bnode *n) {
  if (!n->dirty) return;
  journal_drop(n, n->path);
  n->dirty = false;
  B.njournal--;
  set_jextra(&n->jextra, 0);
}

/* ---- the cache -------------------------------------------------------------- */

/* Opens the node's cache file (lock held): a new or fully cached file is
 * whole; a remote one gets a map of which chunks are present. */
/* Closes the node's cache file; what it holds stays (lock held). */
static void cache_close(bnode *n) {
  if (n->cfd < 0) return;
  close(n->cfd);
  n->cfd = -1;
  nlist_remove(&B.fds, n, FD_LINK);
  B.nfds--;
}

/* A mount remembers more files than it may hold open: past B.fds_max,
 * the cache files of the oldest nodes nothing uses are closed (and opened
 * again, by their path, when needed). Lock held. */
static void cache_trim(bnode *keep) {
  for (bnode *n = B.fds.head, *next; n && B.nfds > B.fds_max; n = next) {
    next = n->fd_link.next;
    if (n != keep && !n->opens && !n->busy && !n->fetching) cache_close(n);
  }
}

static int cache_open(bnode *n) {
  if (n->cfd >= 0) return 0;
  /* removed (or renamed over) and not open: its data went with its name,
   * and the file at that path is another node's (reached again through
   * an O_PATH descriptor, say) */
  if (n->unlinked || node_find(n->path) != n) return -ENOENT;
  char p[PBUF];
  cache_path(n->path, p, sizeof p);
  n->cfd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (n->cfd < 0 && (errno == EMFILE || errno == ENFILE) && B.nfds > 16) {
    B.fds_max = B.nfds * 3 / 4; /* fewer than we thought: from now on */
    cache_trim(n);
    n->cfd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (n->cfd < 0) return -errno;
  nlist_append(&B.fds, n, FD_LINK);
  B.nfds++;
  cache_trim(n);
  if (n->full || n->present) return 0; /* closed by cache_trim, opened again: its data is there */
  if (!n->remote || n->dirty) {
    n->full = true;
    return 0;
  }
  n->full = false;
  n->nchunks = (size_t)((n->size + CHUNK - 1) / CHUNK);
  n->present = calloc(n->nchunks / 8 + 1, 1);
  n->inflight = calloc(n->nchunks / 8 + 1, 1);
  if (!n->present || !n->inflight || ftruncate(n->cfd, 0) < 0 || ftruncate(n->cfd, (off_t)n->size) < 0) {
    int e = errno ? errno : ENOMEM;
    cache_drop(n, true);
    return -e;
  }
  return 0;
}

static bool bit(const uint8_t *m, size_t i) { return m && (m[i / 8] >> (i % 8)) & 1; }
static void set_bit(uint8_t *m, size_t i, bool v) {
  if (!m) return;
  if (v) m[i / 8] |= (uint8_t)(1u << (i % 8));
  else m[i / 8] &= (uint8_t)~(1u << (i % 8));
}

/* A node fetched ahead, held or listed ahead is no longer kept for a lookup: it lives on
 * as any other (node_maybe_free frees it once nothing refers to it). Lock
 * held. */
static void unkeep(bnode *n) {
  if (n->kept) n->kept = false, B.nkept--;
  if (n->held) n->held = false, B.nheld--, nlist_remove(&B.held, n, HELD_LINK);
  if (n->listed_ahead) n->listed_ahead = false, B.nahead--, nlist_remove(&B.ahead, n, HELD_LINK);
}

/* What the mount takes of its cap: cached data and the journal. */
static uint64_t budget_used(void) {
  return B.cache_used + B.fetching_bytes + B.njournal * JOURNAL_COST + B.journal_extra;
}

/* Whether bytes more stay within the cap. */
static bool fits(uint64_t bytes) { return budget_used() + bytes <= B.cache_max; }

/* Least recently used clean data goes when the cache is past its cap:
 * that of files nothing holds open (what open files have stays theirs:
 * they read what they had; past the cap a read goes to the bucket
 * uncached, see b_read). */
static void evict(uint64_t want) {
  while (!fits(want)) {
    bnode *victim = B.lru.head; /* only a node its path names: its cache file is the one of that path */
    while (victim && (!victim->cached || victim->dirty || victim->opens || victim->busy || node_find(victim->path) != victim))
      victim = victim->lru_link.next;
    if (!victim) return;
    cache_drop(victim, true);
    if (victim->kept || victim->held) { /* no reference to it: goes whole */
      unkeep(victim);
      node_maybe_free(victim);
    }
  }
}

static void account(bnode *n, uint64_t bytes) {
  n->cached += bytes;
  B.cache_used += bytes;
  if (!n->lru_link.on) lru_touch(n);
}

/* Fetches chunks [i, i + count) into the cache file with one GET (lock
 * held, dropped meanwhile). queued: a readahead, whose chunks were marked
 * in flight when it was queued; else one chunk a reader waits for. */
/* f at the end of queue q, for a fetcher (lock held). */
static void fetch_queue(fitem **q, fitem *f) {
  while (*q) q = &(*q)->next;
  *q = f;
  pthread_cond_signal(&B.fetch_work);
}

static int fetch_span(bnode *n, size_t i, size_t count, bool queued) {
  if (!queued) {
    if (i >= n->nchunks) return 0; /* past the layout of its cache file: see ensure_range */
    while (bit(n->inflight, i)) pthread_cond_wait(&B.fetched, &B.lock);
    if (n->full || bit(n->present, i) || i >= n->nchunks) return 0;
    if (n->cfd < 0) return -EIO;
    if (!fits(CHUNK)) return -ENOBUFS; /* taken meanwhile: read uncached */
    set_bit(n->inflight, i, true);
  } else if (n->full || n->unlinked || n->cfd < 0 || !n->inflight || i + count > n->nchunks ||
             !fits(count * CHUNK)) { /* no room now: a reader fetches it, or reads it uncached */
    for (size_t k = i; k < i + count && k < n->nchunks; k++) set_bit(n->inflight, k, false);
    pthread_cond_broadcast(&B.fetched); /* nothing fetched: readers waiting on them fetch for themselves */
    return 0;
  }
  n->fetching++;
  uint64_t off = (uint64_t)i * CHUNK, end = (uint64_t)(i + count) * CHUNK;
  if (end > n->size) end = n->size;
  uint64_t len = end - off;
  char key[PBUF];
  key_of(n->path, key, sizeof key);
  int fd = n->cfd;
  n->busy++;
  B.fetching_bytes += len; /* counted before it lands: fetches side by side do not pass the cap together */
  pthread_mutex_unlock(&B.lock);
  s3_err e = {0};
  uint64_t got = 0;
  int r = s3_get(&B.s3, key, off, len, fd, off, &got, &e);
  pthread_mutex_lock(&B.lock);
  B.fetching_bytes -= len;
  n->busy--;
  n->fetching--;
  for (size_t k = i; k < i + count; k++) {
    set_bit(n->inflight, k, false);
    if (r == 0 && got == len && !n->full && n->present && !bit(n->present, k)) {
      set_bit(n->present, k, true);
      uint64_t ko = (uint64_t)k * CHUNK;
      account(n, n->size - ko < CHUNK ? n->size - ko : CHUNK);
    }
  }
  if (r == 0 && got == len) {
    lru_touch(n);
  } else if (r == 0) { /* shorter than we knew it: it changed in the bucket */
    r = -EIO;
    snprintf(B.last_error, sizeof B.last_error, "%s changed in the bucket while being read", n->path);
  } else {
    snprintf(B.last_error, sizeof B.last_error, "%s", e.msg);
    r = -e.errnum;
  }
  pthread_cond_broadcast(&B.fetched);
  return r;
}

/* Makes [off, off+len) of a remote object present in its cache file;
 * a sequential reader gets the next chunks fetched ahead (lock held). */
static int ensure_range(bnode *n, uint64_t off, uint64_t len, bool ahead) {
  int r = cache_open(n);
  if (r < 0 || n->full || off >= n->size || !len) return r;
  if (off + len > n->size) len = n->size - off;
  /* only the chunks its cache file was laid out for: an object that
   * changed in the bucket while open keeps that layout (open files read
   * what they had) while its size says the new one */
  uint64_t mapped = (uint64_t)n->nchunks * CHUNK;
  if (off >= mapped) return 0;
  if (off + len > mapped) len = mapped - off;
  size_t first = off / CHUNK, last = (off + len - 1) / CHUNK, missing = 0;
  for (size_t i = first; i <= last; i++) missing += !bit(n->present, i) && !bit(n->inflight, i);
  n->busy++; /* not evicted while it fills */
  evict(missing * CHUNK);
  if (missing && !fits(missing * CHUNK)) { /* no room: the caller reads it uncached */
    n->busy--;
    return -ENOBUFS;
  }
  for (size_t i = first; i <= last && r == 0; i++) r = fetch_span(n, i, 1, false);
  n->busy--;
  if (!ahead || r < 0) return r;
  /* the chunks ahead not there nor coming, in runs of at most span; a
   * short run far ahead waits until it can be a whole one (one GET). What
   * is ahead stays within a quarter of the cache. */
  size_t window = B.cache_max / 4 / CHUNK < READAHEAD ? B.cache_max / 4 / CHUNK : READAHEAD;
  size_t span = window < SPAN ? window : SPAN;
  size_t end = last + window < n->nchunks ? last + window : n->nchunks - 1;
  for (size_t i = last + 1; i <= end;) {
    if (bit(n->present, i) || bit(n->inflight, i)) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < end && j + 1 - i < span && !bit(n->present, j + 1) && !bit(n->inflight, j + 1)) j++;
    size_t count = j - i + 1;
    if (count < span && j + 1 < n->nchunks && i > last + window - span) break;
    if (!fits(count * CHUNK)) break; /* no room: nothing fetched ahead */
    fitem *f = calloc(1, sizeof *f);
    if (!f) break;
    *f = (fitem){.n = n, .chunk = i, .count = count};
    for (size_t k = i; k <= j; k++) set_bit(n->inflight, k, true);
    n->busy++;
    fetch_queue(&B.fetchq, f); /* in the order the reader will want them */
    i = j + 1;
  }
  return r;
}

/* A small object, whole, with its metadata, into a node made ahead of its
 * lookup (lock held, dropped meanwhile). */
static void fetch_ahead(bnode *n) {
  if (n->unlinked || n->dirty || n->opens || n->cfd >= 0 || !n->meta_pending) return; /* in use already */
  if (cache_open(n) < 0 || n->full) return;
  for (size_t i = 0; i < n->nchunks; i++) set_bit(n->inflight, i, true);
  n->fetching++;
  int fd = n->cfd;
  char key[PBUF];
  key_of(n->path, key, sizeof key);
  uint64_t len = n->size;
  B.fetching_bytes += len;
  pthread_mutex_unlock(&B.lock);
  s3_stat st = {0};
  s3_err e = {0};
  uint64_t got = 0;
  int r = s3_get_object(&B.s3, key, fd, len, &st, &got, &e); /* (more than listed: not this file) */
  pthread_mutex_lock(&B.lock);
  B.fetching_bytes -= len;
  n->fetching--;
  for (size_t i = 0; i < n->nchunks; i++) set_bit(n->inflight, i, false);
  /* what the listing said, still: the data and metadata are the file's */
  if (r == 0 && got == st.size && st.size == n->size && n->cfd == fd && n->meta_pending && !n->dirty) {
    n->remote_modified_ns = st.modified_ns;
    n->etag = st.etag;
    n->mtime_ns = st.mtime_ns;
    apply_meta(n, &st.meta);
    n->meta_pending = false;
    if (st.meta.valid && S_ISLNK(st.meta.mode)) { /* a symlink: its content is the target */
      char target[PATH_MAX];
      ssize_t k = st.size < sizeof target ? pread(fd, target, st.size, 0) : -1;
      target[k > 0 ? k : 0] = 0;
      n->type = T_LINK;
      free(n->target);
      n->target = strdup(target);
      n->size = strlen(target);
      cache_drop(n, true);
    } else {
      for (size_t i = 0; i < n->nchunks; i++) set_bit(n->present, i, true);
      account(n, n->size);
    }
  }
  pthread_cond_broadcast(&B.fetched);
}

/* Work for the fetching threads after what readers wait for, in order. */

/* Queues the small files listed after position i of directory d to be
 * fetched ahead (lock held). Never evicts for it. */
static void fetch_after(bnode *d, size_t i) {
  for (size_t j = i + 1; j <= i + PREFETCH_AHEAD && j < d->nlist && B.nkept < PREFETCH_KEPT && !B.fetch_stop; j++) {
    lentry *e = &d->list[j];
    if (e->dir || e->size > PREFETCH_MAX || budget_used() + e->size > B.cache_max / 2) continue;
    char *path = join(d->path, e->name);
    if (!path) return;
    bnode *n = node_find(path) || gone_find(path) ? NULL : node_new(path, T_FILE);
    free(path);
    fitem *f = n ? calloc(1, sizeof *f) : NULL;
    if (!f) {
      if (n) node_unhash(n), node_maybe_free(n);
      continue;
    }
    n->remote = n->kept = n->meta_pending = true;
    n->size = e->size;
    n->remote_modified_ns = e->modified_ns;
    n->etag = e->etag;
    if (e->modified_ns > 0) n->mtime_ns = e->modified_ns;
    B.nkept++;
    n->busy++;
    *f = (fitem){.n = n, .whole = true};
    fetch_queue(&B.aheadq, f);
  }
}

static int list_dir(bnode *d, long max);
static int head_into(bnode *n, bool dir);

/* A directory listed ahead: its listing (one page at most) and its
 * marker's metadata, so that a walker's lookup and readdir of it find
 * them (lock held, dropped meanwhile). */
static void list_ahead(bnode *n) {
  if (n->unlinked || n->type != T_DIR || n->listing || B.fetch_stop) return;
  bool made = n->meta_pending; /* made ahead: a lookup of it waits for this (see lookup_node) */
  if (made) n->fetching++;
  n->listing = true;
  int r = list_dir(n, LIST_AHEAD_MAX);
  n->listing = false;
  pthread_cond_broadcast(&B.fetched);
  if (r == 0 && n->meta_pending && !n->unlinked) {
    r = head_into(n, true);
    if (r == 0 || r == -ENOENT) n->meta_pending = false; /* -ENOENT: a directory without a marker */
  }
  if (made) n->fetching--;
  pthread_cond_broadcast(&B.fetched);
}

/* Queues the listing of the subdirectories of d whose listing is not
 * known or old: what a walker of the tree (tar, find, cp -r) opens next.
 * One not known at all is made, and kept for its lookup as one held is
 * (at most LIST_AHEAD_KEPT: their listings stay while they are). When
 * its tree is small enough, one listing of all its keys gives every
 * directory's in it instead (list_tree) (lock held). */
static bool list_tree(bnode *d);

/* n kept among the directories listed ahead (made: not known before, its
 * metadata to come), the oldest of them going past LIST_AHEAD_KEPT (lock
 * held). */
static void keep_ahead(bnode *n, bool made) {
  if (B.nahead >= LIST_AHEAD_KEPT) { /* the oldest, never looked up, goes */
    bnode *old = B.ahead.head;
    unkeep(old);
    if (!node_referenced(old)) node_free(old);
  }
  if (made) n->remote = n->meta_pending = true;
  n->listed_ahead = true;
  B.nahead++;
  nlist_append(&B.ahead, n, HELD_LINK);
}

static void list_after(bnode *d) {
  if (tree_covers(d->path)) return; /* its listing and theirs come with its tree's */
  size_t queued = 0;
  uint64_t now = sbx_now_ms();
  bool tree = !d->tree_big_at || now - d->tree_big_at >= TREE_RETRY_MS;
  for (size_t i = 0; i < d->nlist && queued < LIST_AHEAD && !B.fetch_stop; i++) {
    if (!d->list[i].dir) continue;
    char *path = join(d->path, d->list[i].name);
    if (!path) return;
    bnode *n = node_find(path);
    bool made = false;
    if (!n) {
      if (!gone_find(path) && (n = node_new(path, T_DIR))) made = true;
    } else if (n->type != T_DIR || n->unlinked || n->busy || n->listing || n->kept || n->listed_ahead ||
               list_fresh(n, now)) {
      n = NULL; /* listed lately, or in use */
    }
    free(path);
    if (n && tree && list_tree(d)) { /* one listing for all of them */
      if (made) node_free(n);
      return;
    }
    tree = false;
    fitem *f = n ? calloc(1, sizeof *f) : NULL;
    if (!f) {
      if (made) node_free(n);
      continue;
    }
    if (made || n->held) { /* no reference: kept among the LIST_AHEAD_KEPT listed ahead, for a lookup */
      unkeep(n);               /* a held one is listed ahead now */
      keep_ahead(n, made);
    }
    n->busy++;
    *f = (fitem){.n = n, .list = true};
    fetch_queue(&B.aheadq, f);
    queued++;
  }
}

static void tree_ahead(bnode *d, size_t slot);

static void *fetcher(void *arg) {
  (void)arg;
  pthread_mutex_lock(&B.lock);
  for (;;) {
    while (!B.fetchq && !B.aheadq && !B.fetch_stop) pthread_cond_wait(&B.fetch_work, &B.lock);
    fitem **q = B.fetchq ? &B.fetchq : &B.aheadq;
    if (!*q) break;
    fitem *f = *q;
    *q = f->next;
    if (f->tree) tree_ahead(f->n, f->slot);
    else if (f->list) list_ahead(f->n);
    else if (f->whole && !B.fetch_stop) fetch_ahead(f->n);
    else if (!f->whole) fetch_span(f->n, f->chunk, f->count, true);
    f->n->busy--;
    node_maybe_free(f->n);
    free(f);
  }
  pthread_mutex_unlock(&B.lock);
  return NULL;
}

/* The whole object in the cache (before it is written to). Lock held. */
static int ensure_full(bnode *n) {
  int r = ensure_range(n, 0, n->size, false);
  if (r == -ENOBUFS) r = -ENOSPC; /* it is written whole into the cache: it must fit */
  if (r < 0 || n->full) return r;
  n->full = true;
  uint64_t missing = n->size - (n->cached < n->size ? n->cached : n->size);
  account(n, missing);
  free(n->present);
  free(n->inflight);
  n->present = n->inflight = NULL;
  return 0;
}

/* The node becomes an empty file of ours (O_TRUNC, truncate to 0): no
 * download, and open handles read the truncation as everywhere (lock held). */
static int truncate_to_empty(bnode *n) {
  int r = cache_open(n);
  if (r < 0) return r;
  while (n->fetching) pthread_cond_wait(&B.fetched, &B.lock);
  if (ftruncate(n->cfd, 0) < 0) return -errno;
  free(n->present);
  free(n->inflight);
  n->present = n->inflight = NULL;
  n->full = true;
  B.cache_used -= n->cached <= B.cache_used ? n->cached : B.cache_used;
  n->cached = 0;
  n->size = 0;
  n->mtime_ns = now_ns();
  mark_dirty(n);
  return 0;
}

/* ---- uploads ---------------------------------------------------------------- */

/* Puts a node's content (file, link target, directory marker). Lock held,
 * dropped during the request. */
static int put_node(bnode *n, const char *key, uint64_t *etag, s3_err *e) {
  s3_meta m = meta_of(n);
  uint64_t size = n->size;
  ntype type = n->type;
  char *target = n->target ? strdup(n->target) : NULL;
  char cpath[PBUF];
  cache_path(n->path, cpath, sizeof cpath);
  pthread_mutex_unlock(&B.lock);
  int rc;
  if (type == T_DIR) {
    char dkey[PBUF + 2];
    snprintf(dkey, sizeof dkey, "%s/", key);
    rc = s3_put_empty(&B.s3, dkey, &m, e);
  } else if (type == T_LINK) {
    rc = s3_put_data(&B.s3, key, target ? target : "", target ? strlen(target) : 0, &m, e);
  } else {
    int fd = open(cpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      e->errnum = errno;
      snprintf(e->msg, sizeof e->msg, "the cache file of %s is gone", key);
      rc = -1;
    } else {
      rc = s3_put_fd(&B.s3, key, fd, size, &m, etag, e);
      close(fd);
    }
  }
  free(target);
  pthread_mutex_lock(&B.lock);
  return rc;
}

static void syncs_settle(void);

static void *uploader(void *arg) {
  (void)arg;
  pthread_mutex_lock(&B.lock);
  for (;;) {
    uint64_t now = sbx_now_ms(), wait_ms;
    qitem *q = dequeue(now, &wait_ms);
    if (!q) {
      /* stopping: done when nothing is left, or when all that is left
       * waits for a bucket that is away (it stays journaled) */
      bool all_waiting = now < B.away_until || (!B.queue && (!B.retry || B.retry->not_before > now));
      if (B.stopping && !B.inflight && all_waiting) break;
      if (wait_ms) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(wait_ms / 1000);
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&B.work, &B.lock, &ts);
      } else {
        pthread_cond_wait(&B.work, &B.lock);
      }
      continue;
    }
    B.inflight++;
    int slot = path_take(q->path);
    char key[PBUF];
    key_of(q->path, key, sizeof key);
    s3_err e = {0};
    int rc = 0;
    bnode *n = q->kind == OP_PUT ? node_find(q->path) : NULL;
    if (q->kind == OP_PUT && n && n != &B.root && n->dirty && !n->unlinked) {
      uint64_t gen = n->gen;
      n->busy++;
      n->tried = true;
      uint64_t etag = 0;
      rc = put_node(n, key, &etag, &e);
      n->busy--;
      if (rc == 0) {
        n->remote = true;
        n->uploaded_ms = sbx_now_ms();
        if (n->gen == gen && !strcmp(n->path, q->path)) { /* else it goes up again under its new name */
          mark_clean(n);
          n->up_gen = gen;
          /* the object is what we cached: its ETag says so to a listing
           * (its LastModified is the server's, known from the next one) */
          n->etag = etag;
          n->remote_modified_ns = 0;
          /* in the bucket now: a listing read before that (while a
           * restart's journal went up) would make it vanish once the node
           * is freed, until the listing is read again */
          bnode *d = parent_of(n->path);
          /* (list_add marks it added now: a listing begun before may lack it) */
          lentry *le = n->unlinked ? NULL : list_add(d, base_of(n->path), n->type == T_DIR);
          if (le) le->size = n->type == T_DIR ? 0 : n->size, le->etag = n->etag;
        }
        if (strcmp(n->path, q->path) || n->unlinked) {
          /* renamed or removed while it went up: what went up is stale */
          if (!node_find(q->path) && (!gone_find(q->path) || gone_find(q->path)->done_ms)) {
            pthread_mutex_unlock(&B.lock);
            s3_delete(&B.s3, key, NULL);
            pthread_mutex_lock(&B.lock);
          }
        }
      } else {
        n->fail_gen = gen;
      }
      n->queued = false;
      if (rc == 0 && n->dirty && !n->unlinked) enqueue(n->path, OP_PUT); /* changed meanwhile */
      else if (rc < 0 && !n->unlinked) n->queued = true;
    } else if (q->kind == OP_DEL) {
      gone *g = gone_find(q->path);
      if (g) {
        char k[PBUF + 2];
        snprintf(k, sizeof k, "%s%s", key, g->dir ? "/" : "");
        pthread_mutex_unlock(&B.lock);
        rc = s3_delete(&B.s3, k, &e);
        pthread_mutex_lock(&B.lock);
        if (rc == 0 && (g = gone_find(q->path)) && !g->done_ms) {
          char jp[PBUF];
          journal_path(q->path, true, jp, sizeof jp);
          unlink(jp);
          gone_done(g);
          list_remove(parent_of(q->path), base_of(q->path));
        }
      }
    }
    if (slot >= 0) B.busy_paths[slot] = NULL;
    if (rc < 0) { /* the bucket is away or refused: kept, tried again later */
      snprintf(B.last_error, sizeof B.last_error, "%s", e.msg);
      uint64_t later = sbx_now_ms() + RETRY_MS;
      /* no answer, or the server's own failure: the bucket is away, and
       * what else is queued waits too instead of failing one by one */
      if (bucket_away(&e)) B.away_until = later;
      if (*q_hash_slot(q->path, q->kind)) { /* queued again meanwhile: that one does it */
        free(q->path);
        free(q);
      } else {
        q->not_before = later;
        q->retry = true;
        q_hash(q);
        q_append(&B.retry, &B.retry_tail, q);
      }
      if (n && n->unlinked) node_maybe_free(n); /* replaced meanwhile: not kept for the retry */
    } else {
      if (n) node_maybe_free(n);
      free(q->path);
      free(q);
    }
    B.inflight--;
    syncs_settle();
    pthread_cond_broadcast(&B.work);
  }
  syncs_settle(); /* stopping: what is left is EIO */
  pthread_cond_broadcast(&B.work);
  pthread_mutex_unlock(&B.lock);
  return NULL;
}

/* Answers req once the node's content as of now is in the bucket (0) or
 * the try to put it there failed (EIO); lock held. */
static void sync_when_uploaded(fuse_req_t req, bnode *n) {
  if (!n->dirty || n->unlinked) return (void)fuse_reply_err(req, 0);
  psync *s = malloc(sizeof *s);
  if (!s) return (void)fuse_reply_err(req, ENOMEM);
  *s = (psync){.req = req, .n = n, .gen = n->gen, .next = B.syncs};
  B.syncs = s;
  journal_node(n);
  n->fail_gen = 0;
  n->busy++;
  enqueue(n->path, OP_PUT);
}

/* Answers the fsyncs whose upload is over (lock held). */
static void syncs_settle(void) {
  for (psync **pp = &B.syncs; *pp;) {
    psync *s = *pp;
    bnode *n = s->n;
    if (n->up_gen < s->gen && n->fail_gen < s->gen && !n->unlinked && !B.stopping) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    fuse_reply_err(s->req, n->up_gen >= s->gen || n->unlinked ? 0 : EIO);
    n->busy--;
    node_maybe_free(n);
    free(s);
  }
}

/* ---- listings and lookups ------------------------------------------------------ */

/* A name a listing can give a file or directory: not a directory's own
 * marker (""), nor what no file name can be ("a//b", "../x"). */
static bool list_name_ok(const char *name, size_t len) {
  return len && len <= NAME_MAX && !memchr(name, '/', len) && !(len == 1 && name[0] == '.') &&
         !(len == 2 && name[0] == '.' && name[1] == '.');
}

static void list_cb(void *ud, const char *name, bool dir, uint64_t size, int64_t modified, uint64_t etag) {
  list_ctx *l = ud;
  if (l->oom || !list_name_ok(name, strlen(name))) return;
  lentry *same = lindex_find(&l->ix, l->e, l->n, name);
  if (same) { /* a name both a file and a directory: the directory wins */
    same->dir |= dir;
    return;
  }
  lentry *e = lentry_append(&l->e, &l->n, &l->cap, &l->ix, name);
  if (!e) {
    l->oom = true;
    return;
  }
  e->dir = dir;
  e->size = size;
  e->modified_ns = modified;
  e->etag = etag;
}

static void list_ctx_free(list_ctx *l) {
  for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
  free(l->e);
  lindex_free(&l->ix);
}

/* Makes l, a listing of the bucket begun at started, d's (taking what l
 * holds; lock held). */
static void list_install(bnode *d, list_ctx *l, uint64_t started) {
  /* what we added while the bucket was being listed (an upload that ended
   * meanwhile), or just before (a server may list an object a moment after
   * it answered its PUT), may not be in the new listing: kept, else a name
   * uploaded and forgotten would be ENOENT to a lookup (an rm of it would
   * fail, and leave it in the bucket) until the next listing */
  keep_recent(d, l, started);
  list_free(d);
  d->list = l->e;
  d->nlist = l->n;
  d->cap = l->cap;
  d->lix = l->ix;
  d->list_at = sbx_now_ms();
  d->list_started = started;
  *l = (list_ctx){0};
  list_count(d);
  /* past LIST_BYTES_MAX, the listings used least recently go (d's not):
   * a walk of a bucket of millions of keys, or a server that lists
   * without end, does not take the mount's memory */
  for (bnode *kept = NULL; B.list_bytes > LIST_BYTES_MAX && B.listed.head && B.listed.head != d && B.listed.head != kept;) {
    bnode *old = B.listed.head;
    list_drop(old);
    if (old->list_link.on && !kept) kept = old; /* names it keeps: once round the list at most */
  }
}

/* Deletions the bucket had done before a listing began are in it: their
 * records go, where the directory's listing is one begun at started (a
 * directory's, or each of a tree's) (lock held). */
static void gone_listed(uint64_t started) {
  for (size_t h = 0; h < HASH_SIZE; h++)
    for (gone **pp = &B.gone[h]; *pp;) {
      gone *g = *pp;
      const bnode *p = g->done_ms && g->done_ms < started ? parent_of(g->path) : NULL;
      if (p && p->list_at && p->list_started == started) {
        *pp = g->next;
        free(g->path);
        free(g);
      } else {
        pp = &g->next;
      }
    }
}

/* The directory's listing from the bucket, trusted for LIST_TTL_MS (lock
 * held, dropped during the request). When the bucket is away, an older
 * listing still serves. */
static int refresh_listing(bnode *d) {
  d->busy++;
  /* read ahead right now, alone or with its tree: that one serves */
  while (d->listing || (!list_fresh(d, sbx_now_ms()) && tree_covers(d->path))) pthread_cond_wait(&B.fetched, &B.lock);
  d->busy--;
  int r = list_dir(d, MAX_LIST);
  if (r == 0) list_touch(d);
  return r;
}

/* The same, with at most max entries: a listing that has max is not taken
 * (-E2BIG) unless max is MAX_LIST. */
static int list_dir(bnode *d, long max) {
  uint64_t started = sbx_now_ms();
  if (d->list_at && (list_fresh(d, started) || started < B.away_until)) return 0; /* away: the last one serves */
  char prefix[PBUF];
  dir_key_of(d->path, prefix, sizeof prefix);
  d->busy++;
  pthread_mutex_unlock(&B.lock);
  list_ctx l = {0};
  s3_err e = {0};
  long k = s3_list(&B.s3, prefix, "/", max, list_cb, &l, &e);
  pthread_mutex_lock(&B.lock);
  d->busy--;
  if (max < MAX_LIST && k >= max) { /* maybe not all of it */
    list_ctx_free(&l);
    return -E2BIG;
  }
  if (k < 0 || l.oom) {
    list_ctx_free(&l);
    snprintf(B.last_error, sizeof B.last_error, "%s", l.oom ? "out of memory" : e.msg);
    if (k < 0 && bucket_away(&e)) B.away_until = sbx_now_ms() + RETRY_MS; /* as for uploads */
    return d->list_at ? 0 : l.oom ? -ENOMEM : -e.errnum;
  }
  list_install(d, &l, started);
  gone_listed(started);
  return 0;
}

/* ---- a directory's whole tree in one listing ------------------------------ */

/* A walker of a tree (tar, find, cp -r, git status) opens its directories
 * one after the other, and each wants its listing. When a directory's
 * tree holds at most TREE_MAX keys, one listing of them all without a
 * delimiter (a few pages) gives every directory's listing at once: the
 * same names a listing of each would give, at the same moment. */
typedef struct tree_dir {
  char *rel; /* relative to the listed directory: "" or "a/b" */
  list_ctx l;
  struct tree_dir *hnext, *next;
} tree_dir;

typedef struct tree_ctx {
  tree_dir *hash[TREE_DIRS], *all, **tail; /* all: in the order first named (the keys' order) */
  size_t ndirs;
  bool failed; /* out of memory, or more than TREE_DIRS directories */
} tree_ctx;

/* The directory key[0, len) of the tree, made when first named. */
static tree_dir *tree_dir_of(tree_ctx *t, const char *key, size_t len) {
  char rel[PBUF];
  if (len >= sizeof rel) { /* cannot be: a key is at most MAX_KEY */
    t->failed = true;
    return NULL;
  }
  memcpy(rel, key, len);
  rel[len] = 0;
  tree_dir **slot = &t->hash[name_hash(rel) % TREE_DIRS];
  for (tree_dir *d = *slot; d; d = d->hnext)
    if (!strcmp(d->rel, rel)) return d;
  tree_dir *d = t->ndirs < TREE_DIRS ? calloc(1, sizeof *d) : NULL;
  if (!d || !(d->rel = strdup(rel))) {
    free(d);
    t->failed = true;
    return NULL;
  }
  d->hnext = *slot, *slot = d;
  *(t->tail ? t->tail : &t->all) = d;
  t->tail = &d->next;
  t->ndirs++;
  return d;
}

/* A key under the listed directory: a name in each directory on its way
 * (a directory's marker "a/b/" names b in a, and makes b known, empty). */
static void tree_cb(void *ud, const char *key, bool is_dir, uint64_t size, int64_t modified, uint64_t etag) {
  tree_ctx *t = ud;
  (void)is_dir; /* no delimiter: every entry is a key */
  for (size_t start = 0; !t->failed;) {
    const char *slash = strchr(key + start, '/');
    size_t end = slash ? (size_t)(slash - key) : strlen(key);
    tree_dir *d = tree_dir_of(t, key, start ? start - 1 : 0);
    if (!d || !list_name_ok(key + start, end - start)) return; /* a marker, or a name no walk reaches */
    char name[NAME_MAX + 1];
    memcpy(name, key + start, end - start);
    name[end - start] = 0;
    if (slash) list_cb(&d->l, name, true, 0, 0, 0);
    else list_cb(&d->l, name, false, size, modified, etag);
    if (d->l.oom) t->failed = true;
    if (!slash) return;
    start = end + 1;
  }
}

static void tree_free(tree_ctx *t) {
  if (!t) return;
  while (t->all) {
    tree_dir *d = t->all;
    t->all = d->next;
    list_ctx_free(&d->l);
    free(d->rel);
    free(d);
  }
  free(t);
}

/* Queues the listing of d's tree, unless TREES trees are being listed
 * already. From now until it is done, a listing of a directory in it
 * waits for it (lock held). */
static bool list_tree(bnode *d) {
  size_t slot = 0;
  while (slot < TREES && B.trees[slot]) slot++;
  fitem *f = slot < TREES ? calloc(1, sizeof *f) : NULL;
  if (!f || !(B.trees[slot] = strdup(d->path))) {
    free(f);
    return false;
  }
  d->busy++;
  *f = (fitem){.n = d, .tree = true, .slot = slot};
  fetch_queue(&B.fetchq, f); /* a walker waits for it */
  return true;
}

/* Every directory's listing of t, a listing of d's tree begun at started:
 * to the nodes known, or made ahead (kept as list_after's are, their
 * markers' metadata fetched ahead) for those not known (lock held). */
static void tree_install(bnode *d, tree_ctx *t, uint64_t started) {
  for (tree_dir *td = t->all; td; td = td->next) {
    size_t rl = strlen(td->rel);
    if (strlen(B.prefix) + strlen(d->path) + 1 + rl + 1 > MAX_KEY || !sbx_utf8_valid(td->rel, rl)) continue; /* as join() */
    char *path = !rl ? strdup(d->path) : *d->path ? sbx_strdup_printf("%s/%s", d->path, td->rel) : strdup(td->rel);
    if (!path) continue;
    bnode *n = node_find(path);
    bool made = false;
    if (!n && !gone_find(path) && (n = node_new(path, T_DIR))) made = true;
    free(path);
    /* a listing under way, or begun since, serves instead */
    if (!n || n->type != T_DIR || n->unlinked || n->listing || (n->list_at && n->list_started >= started)) continue;
    fitem *f = made ? calloc(1, sizeof *f) : NULL;
    if (made && !f) {
      node_free(n);
      continue;
    }
    list_install(n, &td->l, started);
    if (made) {
      keep_ahead(n, true);
      n->busy++;
      *f = (fitem){.n = n, .list = true};
      fetch_queue(&B.aheadq, f);
    }
  }
  gone_listed(started);
}

/* The fetcher's part of list_tree. A tree with more than TREE_MAX keys
 * (or TREE_DIRS directories) has its directories listed one by one
 * instead, and is not tried again for TREE_RETRY_MS (lock held, dropped
 * during the request). */
static void tree_ahead(bnode *d, size_t slot) {
  char *path = B.trees[slot], prefix[PBUF];
  uint64_t started = sbx_now_ms(), renames = B.renames;
  bool quiet = !B.renaming; /* no rename under way as it begins (and, below, none begun since) */
  tree_ctx *t = calloc(1, sizeof *t);
  s3_err e = {0};
  long k = -1;
  if (t && !B.fetch_stop && !d->unlinked) {
    dir_key_of(path, prefix, sizeof prefix);
    pthread_mutex_unlock(&B.lock);
    k = s3_list(&B.s3, prefix, NULL, TREE_MAX, tree_cb, t, &e);
    pthread_mutex_lock(&B.lock);
  }
  B.trees[slot] = NULL;
  bool whole = k >= 0 && k < TREE_MAX && !t->failed;
  if (whole && !d->unlinked && quiet && B.renames == renames) tree_install(d, t, started); /* (a rename: walkers list) */
  if (k < 0 && bucket_away(&e)) B.away_until = sbx_now_ms() + RETRY_MS; /* as list_dir */
  tree_free(t);
  free(path);
  pthread_cond_broadcast(&B.fetched);
  if (whole || k < 0 || d->unlinked) return;
  d->tree_big_at = sbx_now_ms();
  list_after(d);
}

/* Ours and in the bucket, but maybe not in a listing that began before
 * it went up (lock held). */
static bool newer_than_listing(const bnode *n, const bnode *d) {
  return !n->unlinked && (n->dirty || n->queued || !n->remote || n->uploaded_ms >= d->list_started);
}

/* Whether the bucket's object (size, LastModified, ETag hash: 0 when not
 * known) is another than the one n last knew: by its size, then by the
 * ETags where both are known (an object we uploaded has one before its
 * LastModified is known), else by LastModified; with neither known, only
 * a size tells. */
static bool content_changed(const bnode *n, uint64_t size, int64_t modified_ns, uint64_t etag) {
  if (size != n->size) return true;
  if (!n->remote_modified_ns && !n->etag) return false;
  if (n->etag && etag) return n->etag != etag;
  return modified_ns > 0 && modified_ns / 1000000000 != n->remote_modified_ns / 1000000000;
}

/* Reads an object's metadata into a node (lock held, dropped meanwhile). */
static int head_into(bnode *n, bool dir) {
  char key[PBUF + 2];
  if (dir) dir_key_of(n->path, key, sizeof key);
  else key_of(n->path, key, sizeof key);
  s3_stat st;
  s3_err e = {0};
  n->busy++;
  pthread_mutex_unlock(&B.lock);
  int r = s3_head(&B.s3, key, &st, &e);
  char target[PATH_MAX] = "";
  if (r == 0 && !dir && st.meta.valid && S_ISLNK(st.meta.mode) && st.size < sizeof target) {
    int fd = -1; /* a symlink's target is its content */
    char tmpl[] = "/tmp/sbx-link-XXXXXX";
    fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd >= 0) {
      unlink(tmpl);
      uint64_t got = 0;
      if (st.size && s3_get(&B.s3, key, 0, st.size, fd, 0, &got, &e) == 0 && got == st.size) {
        ssize_t k = pread(fd, target, st.size, 0);
        target[k > 0 ? k : 0] = 0;
      }
      close(fd);
    }
  }
  pthread_mutex_lock(&B.lock);
  n->busy--;
  if (r < 0) return -e.errnum;
  if (n->dirty) return 0; /* ours is newer */
  if (dir) {
    apply_meta(n, &st.meta);
    return 0;
  }
  if (content_changed(n, st.size, st.modified_ns, st.etag)) {
    n->version++; /* changed in the bucket: the cached data is stale */
    if (n->opens) n->stale = true; /* open files keep reading what they had */
    else cache_drop(n, true);
  }
  n->type = st.meta.valid && S_ISLNK(st.meta.mode) ? T_LINK : T_FILE;
  n->size = st.size;
  n->remote_modified_ns = st.modified_ns;
  n->etag = st.etag;
  n->mtime_ns = st.mtime_ns;
  apply_meta(n, &st.meta);
  if (n->type == T_LINK) {
    free(n->target);
    n->target = strdup(target);
    n->size = strlen(target);
  }
  n->remote = true;
  return 0;
}

/* The node of parent/name (lock held). The parent's listing says whether
 * the name exists; a file's metadata comes from a HEAD of its object. */
static int lookup_node(bnode *parent, const char *name, bnode **out) {
  if (parent->type != T_DIR) return -ENOTDIR;
  char *path = join(parent->path, name);
  if (!path) return errno == EILSEQ ? -ENOENT : -errno; /* not a name the bucket can have */
  bnode *n = node_find(path);
  int r = 0;
  if (n && !n->unlinked && (n->dirty || n->queued || !n->remote)) goto found; /* ours: the bucket knows less */
  r = refresh_listing(parent);
  if (r < 0) goto out;
  n = node_find(path); /* may have come meanwhile */
  if (n && n->meta_pending && n->fetching) { /* fetched ahead right now: its metadata comes with it */
    n->busy++;
    while (n->fetching) pthread_cond_wait(&B.fetched, &B.lock);
    n->busy--;
    n = node_find(path);
    if (!parent->list_at && (r = refresh_listing(parent)) < 0) goto out; /* (dropped meanwhile, past LIST_BYTES_MAX) */
  }
  if (n && n->unlinked) n = NULL;
  lentry *e = list_find(parent, name);
  if (e) fetch_after(parent, (size_t)(e - parent->list));
  /* what the listing says (the listing may be replaced while the lock is
   * dropped below) */
  lentry le = e ? (lentry){.dir = e->dir, .size = e->size, .modified_ns = e->modified_ns, .etag = e->etag} : (lentry){0};
  if (n && newer_than_listing(n, parent)) {
    if (!e) list_add(parent, name, n->type == T_DIR);
    goto found;
  }
  if (!e || (gone_find(path) && !n)) {
    if (n) { /* deleted in the bucket by someone else */
      n->unlinked = true;
      node_unhash(n);
      unkeep(n);
      node_maybe_free(n);
    }
    r = -ENOENT;
    goto out;
  }
  bool fresh = !n;
  if (!n && !(n = node_new(path, le.dir ? T_DIR : T_FILE))) {
    r = -ENOMEM;
    goto out;
  }
  bool retyped = le.dir && n->type != T_DIR;
  if (retyped) { /* a file here before: what we knew of it goes */
    n->version++;
    if (n->opens) n->stale = true;
    else cache_drop(n, true);
    n->type = T_DIR;
    n->size = 0;
    n->etag = 0;
    n->remote_modified_ns = 0;
    n->mode = 0755;
    n->meta_pending = true; /* until a HEAD says more */
  }
  n->remote = true;
  /* a file whose listing entry disagrees with what we know is looked at
   * again; one we uploaded (its ETag known, not its LastModified) that the
   * listing names by that ETag learns its LastModified from it */
  bool same_etag = n->etag && n->etag == le.etag;
  bool stale = !le.dir && (le.size != n->size || (n->etag && le.etag && !same_etag) ||
                           (le.modified_ns > 0 && (n->remote_modified_ns ? le.modified_ns / 1000000000 !=
                                                                               n->remote_modified_ns / 1000000000
                                                                         : !same_etag)));
  if (!le.dir && !stale && same_etag && !n->remote_modified_ns) n->remote_modified_ns = le.modified_ns;
  bool unknown = fresh || retyped || n->meta_pending; /* a fetch ahead that has not come (or failed) */
  if (unknown || stale) {
    r = head_into(n, le.dir);
    if (r == -ENOENT && le.dir) r = 0; /* a directory without a marker */
    if (r < 0 && r != -ENOENT && !le.dir && unknown) { /* the bucket is away: what the listing says */
      n->size = le.size;
      n->remote_modified_ns = le.modified_ns;
      if (le.modified_ns > 0) n->mtime_ns = le.modified_ns;
      r = 0;
    }
    if (r == 0) n->meta_pending = false;
    if (r < 0) {
      unkeep(n);
      node_maybe_free(n);
      goto out;
    }
  }
found:
  unkeep(n); /* the caller takes a reference now */
  *out = n;
out:
  free(path);
  return r;
}

static void reply_entry(fuse_req_t req, bnode *n) {
  struct fuse_entry_param e = {.attr_timeout = ATTR_TIMEOUT, .entry_timeout = ATTR_TIMEOUT};
  n->nlookup++;
  n->looked = true;
  e.ino = (uintptr_t)n;
  fill_attr(n, &e.attr);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_entry(req, &e);
}

static void b_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  bnode *n;
  pthread_mutex_lock(&B.lock);
  int r = lookup_node(node_of(parent), name, &n);
  if (r == 0) return reply_entry(req, n);
  pthread_mutex_unlock(&B.lock);
  if (r == -ENOENT) { /* not there: remembered for a moment */
    struct fuse_entry_param e = {.entry_timeout = ATTR_TIMEOUT};
    return (void)fuse_reply_entry(req, &e);
  }
  fuse_reply_err(req, -r);
}

static void forget_one(fuse_ino_t ino, uint64_t nl) {
  bnode *n = node_of(ino);
  n->nlookup = n->nlookup > nl ? n->nlookup - nl : 0;
  node_maybe_free(n);
}

static void b_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nl) {
  pthread_mutex_lock(&B.lock);
  forget_one(ino, nl);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_none(req);
}

static void b_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f) {
  pthread_mutex_lock(&B.lock);
  for (size_t i = 0; i < count; i++) forget_one(f[i].ino, f[i].nlookup);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_none(req);
}

static void b_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)fi;
  struct stat st;
  pthread_mutex_lock(&B.lock);
  fill_attr(node_of(ino), &st);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

/* New metadata for a node: a clean object the bucket has is copied onto
 * itself with the metadata replaced (its data is not sent again); anything
 * else goes up whole, later (lock held). */
static void meta_changed(bnode *n) {
  if (n == &B.root) return;
  if (n->dirty || n->type != T_FILE || !n->remote) {
    mark_dirty(n);
    journal_node(n);
    if (!n->opens) enqueue(n->path, OP_PUT);
    return;
  }
  char key[PBUF];
  key_of(n->path, key, sizeof key);
  s3_meta m = meta_of(n);
  s3_err e = {0};
  n->busy++;
  pthread_mutex_unlock(&B.lock);
  int r = s3_copy(&B.s3, key, key, &m, &e);
  pthread_mutex_lock(&B.lock);
  n->busy--;
  if (r < 0 && ensure_full(n) == 0) { /* the bucket is away: the whole object goes up later */
    mark_dirty(n);
    if (!n->opens) enqueue(n->path, OP_PUT);
  }
}

static void b_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int valid, struct fuse_file_info *fi) {
  (void)fi;
  bnode *n = node_of(ino);
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  pthread_mutex_lock(&B.lock);
  int r = 0;
  bool meta = false;
  if (n == &B.root && (valid & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) r = -EPERM;
  if (!r && (valid & FUSE_SET_ATTR_SIZE) && n->type != T_FILE) r = n->type == T_DIR ? -EISDIR : -EINVAL;
  if (!r && (valid & FUSE_SET_ATTR_UID)) {
    if (a->st_uid < B.uid_base || a->st_uid - B.uid_base > 65535) r = -EPERM;
    else if (n->uid != a->st_uid - B.uid_base) n->uid = a->st_uid - B.uid_base, meta = true;
  }
  if (!r && (valid & FUSE_SET_ATTR_GID)) {
    if (a->st_gid < B.uid_base || a->st_gid - B.uid_base > 65535) r = -EPERM;
    else if (n->gid != a->st_gid - B.uid_base) n->gid = a->st_gid - B.uid_base, meta = true;
  }
  if (!r && (valid & FUSE_SET_ATTR_MODE)) n->mode = a->st_mode & 07777, meta = true;
  if (!r && (valid & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW))) {
    n->mtime_ns = valid & FUSE_SET_ATTR_MTIME_NOW ? now_ns()
                                                   : (int64_t)a->st_mtim.tv_sec * 1000000000 + a->st_mtim.tv_nsec;
    meta = true;
  }
  if (!r && (valid & FUSE_SET_ATTR_SIZE)) {
    uint64_t to = (uint64_t)a->st_size;
    /* growing a file is a write of zeros: the cache's cap bounds it too */
    if (to > n->size) evict(to - n->size);
    if (to > n->size && !fits(to - n->size)) r = -ENOSPC;
    if (!r) r = to ? ensure_full(n) : truncate_to_empty(n); /* what stays is kept */
    if (!r && ftruncate(n->cfd, a->st_size) < 0) r = -errno;
    if (!r) {
      if (to > n->size) account(n, to - n->size);
      else if (n->cached >= n->size - to) n->cached -= n->size - to, B.cache_used -= n->size - to;
      n->size = to;
      n->mtime_ns = now_ns();
      mark_dirty(n);
      journal_node(n);
      if (!n->opens) enqueue(n->path, OP_PUT);
      meta = false;
    }
  }
  if (!r && meta) meta_changed(n);
  struct stat st;
  fill_attr(n, &st);
  pthread_mutex_unlock(&B.lock);
  if (r < 0) fuse_reply_err(req, -r);
  else fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

/* ---- files ------------------------------------------------------------------ */

/* A new node at parent/name, replacing a removed one (lock held). */
static int make_node(bnode *p, const char *name, ntype type, mode_t mode, const struct fuse_ctx *ctx, bnode **out) {
  if (!fits(JOURNAL_COST)) return -ENOSPC; /* its journal entry would pass the cap */
  char *path = join(p->path, name);
  if (!path) return -errno;
  bnode *n = node_find(path);
  if (n && !n->unlinked) {
    free(path);
    return -EEXIST;
  }
  if (n) node_unhash(n);
  gone *g = gone_find(path);
  /* the bucket may have an object of that name: removing the new node
   * deletes it, sent or not */
  bool shadows = (g && g->dir == (type == T_DIR) && !g->done_ms) || (p->list_at && list_find(p, name));
  if (g && g->dir == (type == T_DIR)) { /* the new one replaces the old object: no deletion */
    char jp[PBUF];
    journal_path(path, true, jp, sizeof jp);
    unlink(jp);
    gone_drop(path);
  }
  n = node_new(path, type);
  free(path);
  if (!n) return -ENOMEM;
  n->mode = mode & 07777;
  n->tried = shadows;
  n->uid = sandbox_id(ctx->uid >= B.uid_base ? (int64_t)ctx->uid - B.uid_base : 0);
  n->gid = sandbox_id(ctx->gid >= B.uid_base ? (int64_t)ctx->gid - B.uid_base : 0);
  if (p->mode & S_ISGID) n->gid = p->gid;
  list_add(p, name, type == T_DIR);
  *out = n;
  return 0;
}

static void b_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  bnode *p = node_of(parent), *n;
  pthread_mutex_lock(&B.lock);
  int r = make_node(p, name, T_FILE, mode, fuse_req_ctx(req), &n);
  if (r == 0) {
    r = cache_open(n);
    if (r == 0 && ftruncate(n->cfd, 0) < 0) r = -errno;
    if (r < 0) {
      n->unlinked = true;
      node_unhash(n);
      list_remove(p, name);
      node_maybe_free(n);
    }
  }
  if (r < 0) {
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, -r);
  }
  mark_dirty(n);
  n->opens++;
  n->nlookup++;
  struct fuse_entry_param e = {.ino = (uintptr_t)n, .attr_timeout = ATTR_TIMEOUT, .entry_timeout = ATTR_TIMEOUT};
  fill_attr(n, &e.attr);
  n->open_version = n->version;
  pthread_mutex_unlock(&B.lock);
  fi->fh = (uintptr_t)n;
  fi->keep_cache = 1;
  fi->noflush = 1;
  fuse_reply_create(req, &e, fi);
}

static void b_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  bnode *n = node_of(ino);
  if (n->type == T_DIR) return (void)fuse_reply_err(req, EISDIR);
  bool writing = (fi->flags & O_ACCMODE) != O_RDONLY;
  if (writing && B.read_only) return (void)fuse_reply_err(req, EROFS);
  pthread_mutex_lock(&B.lock);
  /* a removed file opened again (through /proc/self/fd) is gone, also
   * while a handle of it is still being closed (its cache file open) */
  int r = 0;
  if (n->stale && !n->opens) cache_drop(n, true), n->stale = false;
  if (n->unlinked) {
    r = -ENOENT;
  } else if (writing && (fi->flags & O_TRUNC)) {
    r = truncate_to_empty(n);
  } else if (writing) {
    r = ensure_full(n); /* what is written goes up whole */
  } else {
    r = cache_open(n);
  }
  if (!r) n->opens++;
  lru_touch(n);
  /* the kernel keeps its cached pages unless the object changed */
  fi->keep_cache = n->open_version == n->version;
  n->open_version = n->version;
  pthread_mutex_unlock(&B.lock);
  if (r < 0) return (void)fuse_reply_err(req, -r);
  fi->fh = (uintptr_t)n;
  fi->noflush = 1;
  fuse_reply_open(req, fi);
}


/* A FUSE worker's read buffer, freed when the worker ends. */
static pthread_key_t read_key;
static pthread_once_t read_once = PTHREAD_ONCE_INIT;
static void read_key_make(void) { pthread_key_create(&read_key, free); }

static char *read_buf(size_t size) {
  pthread_once(&read_once, read_key_make);
  size_t *b = pthread_getspecific(read_key);
  if (b && b[0] >= size) return (char *)(b + 1);
  free(b);
  b = malloc(sizeof *b + size);
  pthread_setspecific(read_key, b);
  if (!b) return NULL;
  b[0] = size;
  return (char *)(b + 1);
}
/* A read the cache has no room for (the cap is taken by files held open
 * and changes not uploaded yet): straight from the bucket into memory (a
 * worker's own memfd), nothing kept. */
static void read_uncached(fuse_req_t req, const char *key, size_t size, off_t off, uint64_t fsize) {
  static __thread int mfd = -1;
  if ((uint64_t)off >= fsize) return (void)fuse_reply_buf(req, NULL, 0);
  if ((uint64_t)off + size > fsize) size = (size_t)(fsize - (uint64_t)off);
  if (mfd < 0 && (mfd = memfd_create("sbx-bucketfs-read", MFD_CLOEXEC)) < 0) return (void)fuse_reply_err(req, errno);
  char *buf = read_buf(size);
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  s3_err e = {0};
  uint64_t got = 0;
  if (s3_get(&B.s3, key, (uint64_t)off, size, mfd, 0, &got, &e) < 0) {
    pthread_mutex_lock(&B.lock);
    snprintf(B.last_error, sizeof B.last_error, "%s", e.msg);
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, e.errnum ? e.errnum : EIO);
  }
  ssize_t k = pread(mfd, buf, got < size ? got : size, 0);
  ftruncate(mfd, 0); /* its pages go back */
  if (k < 0) fuse_reply_err(req, errno);
  else fuse_reply_buf(req, buf, (size_t)k);
}

static void b_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)fi;
  bnode *n = node_of(ino);
  pthread_mutex_lock(&B.lock);
  bool seq = n->seq_off == (uint64_t)off;
  n->seq_off = (uint64_t)off + size;
  int r = n->full ? 0 : ensure_range(n, (uint64_t)off, size, seq);
  int fd = n->cfd;
  uint64_t fsize = n->size;
  char key[PBUF];
  if (r == -ENOBUFS) {
    key_of(n->path, key, sizeof key);
    n->fetching++; /* a rename deletes the old name only after this read */
  }
  lru_touch(n);
  pthread_mutex_unlock(&B.lock);
  if (r == -ENOBUFS) {
    read_uncached(req, key, size, off, fsize);
    pthread_mutex_lock(&B.lock);
    n->fetching--;
    pthread_cond_broadcast(&B.fetched);
    pthread_mutex_unlock(&B.lock);
    return;
  }
  if (r < 0) return (void)fuse_reply_err(req, -r);
  if ((uint64_t)off >= fsize) return (void)fuse_reply_buf(req, NULL, 0);
  if ((uint64_t)off + size > fsize) size = (size_t)(fsize - (uint64_t)off);
  char *buf = read_buf(size);
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  ssize_t k = pread(fd, buf, size, off);
  if (k < 0) fuse_reply_err(req, errno);
  else fuse_reply_buf(req, buf, (size_t)k);
}

static void b_write(fuse_req_t req, fuse_ino_t ino, const char *data, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)fi;
  bnode *n = node_of(ino);
  pthread_mutex_lock(&B.lock);
  int fd = n->cfd;
  uint64_t end = (uint64_t)off + size, grow = end > n->size ? end - n->size : 0;
  if (grow) evict(grow);
  bool full = grow && !fits(grow);
  pthread_mutex_unlock(&B.lock);
  if (full) return (void)fuse_reply_err(req, ENOSPC); /* the cache holds only changes not uploaded yet */
  ssize_t k = pwrite(fd, data, size, off); /* into the cache file: journaled, uploaded on close */
  if (k < 0) return (void)fuse_reply_err(req, errno);
  pthread_mutex_lock(&B.lock);
  end = (uint64_t)off + (uint64_t)k;
  if (end > n->size) {
    account(n, end - n->size);
    n->size = end;
  }
  n->mtime_ns = now_ns();
  mark_dirty(n);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_write(req, (size_t)k);
}

static void b_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)fi;
  bnode *n = node_of(ino);
  pthread_mutex_lock(&B.lock);
  n->opens--;
  if (n->dirty && !n->unlinked) {
    journal_node(n);
    if (!n->opens) enqueue(n->path, OP_PUT); /* uploaded on close, in the background */
  }
  node_maybe_free(n);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_err(req, 0);
}

static void b_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
  (void)datasync;
  (void)fi;
  bnode *n = node_of(ino);
  pthread_mutex_lock(&B.lock);
  sync_when_uploaded(req, n); /* 0 only once the object is in the bucket */
  pthread_mutex_unlock(&B.lock);
}

static void b_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
  (void)fi;
  bnode *n = node_of(ino);
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  pthread_mutex_lock(&B.lock);
  int fd = n->cfd;
  uint64_t end = (uint64_t)off + (uint64_t)len;
  if ((mode & FALLOC_FL_KEEP_SIZE) && end > n->size) {
    /* blocks past the end: an object has no such thing, and the cache's
     * cap counts sizes; a later write there is counted as it comes */
    len = (uint64_t)off < n->size ? (off_t)(n->size - (uint64_t)off) : 0;
    end = (uint64_t)off + (uint64_t)len;
    if (!len) {
      pthread_mutex_unlock(&B.lock);
      return (void)fuse_reply_err(req, 0);
    }
  }
  bool grow = end > n->size;
  if (grow) evict(end - n->size);
  bool nospace = grow && !fits(end - n->size);
  pthread_mutex_unlock(&B.lock);
  if (nospace) return (void)fuse_reply_err(req, ENOSPC);
  if (fallocate(fd, mode, off, len) < 0) return (void)fuse_reply_err(req, errno);
  pthread_mutex_lock(&B.lock);
  struct stat st;
  if (fstat(fd, &st) == 0 && (uint64_t)st.st_size != n->size) { /* grown, or a range collapsed */
    if ((uint64_t)st.st_size > n->size) account(n, (uint64_t)st.st_size - n->size);
    n->size = (uint64_t)st.st_size;
  }
  mark_dirty(n);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_err(req, 0);
}

/* ---- symlinks: objects whose content is the target ---------------------------- */

static void b_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  if (strlen(link) >= PATH_MAX) return (void)fuse_reply_err(req, ENAMETOOLONG);
  if (!sbx_utf8_valid(link, strlen(link))) return (void)fuse_reply_err(req, EILSEQ); /* as names: see join */
  bnode *n;
  pthread_mutex_lock(&B.lock);
  int r = make_node(node_of(parent), name, T_LINK, 0777, fuse_req_ctx(req), &n);
  if (r < 0) {
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, -r);
  }
  n->target = strdup(link);
  n->size = strlen(link);
  mark_dirty(n);
  enqueue(n->path, OP_PUT);
  reply_entry(req, n);
}

static void b_readlink(fuse_req_t req, fuse_ino_t ino) {
  bnode *n = node_of(ino);
  pthread_mutex_lock(&B.lock);
  char *t = n->type == T_LINK && n->target ? strdup(n->target) : NULL;
  pthread_mutex_unlock(&B.lock);
  if (!t) return (void)fuse_reply_err(req, EINVAL);
  fuse_reply_readlink(req, t);
  free(t);
}

static void b_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name) {
  (void)ino, (void)parent, (void)name;
  fuse_reply_err(req, EPERM); /* an object store has no hard links */
}

/* ---- directories -------------------------------------------------------------- */

static void b_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  bnode *p = node_of(parent), *n;
  pthread_mutex_lock(&B.lock);
  int r = lookup_node(p, name, &n);
  if (r == 0 || r != -ENOENT) {
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, r == 0 ? EEXIST : -r);
  }
  r = make_node(p, name, T_DIR, mode, fuse_req_ctx(req), &n);
  if (r < 0) {
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, -r);
  }
  n->list_at = sbx_now_ms(); /* new: nothing in it, as far as anyone knows */
  mark_dirty(n);             /* its marker keeps it while it is empty */
  enqueue(n->path, OP_PUT);
  reply_entry(req, n);
}

/* Whether a directory holds anything: the bucket's entries not deleted,
 * or our own not uploaded yet or uploaded after the listing began (lock
 * held). */
static int dir_empty(bnode *d) {
  d->list_at = 0; /* ask the bucket now */
  int r = refresh_listing(d);
  if (r < 0) return r;
  for (size_t i = 0; i < d->nlist; i++) {
    char *path = join(d->path, d->list[i].name);
    if (!path) return 0;
    bnode *c = node_find(path);
    bool there = c ? !c->unlinked : !gone_find(path);
    free(path);
    if (there) return 0;
  }
  size_t l = strlen(d->path);
  for (size_t h = 0; h < HASH_SIZE; h++)
    for (bnode *n = B.hash[h]; n; n = n->hnext)
      if (!strncmp(n->path, d->path, l) && n->path[l] == '/' && newer_than_listing(n, d)) return 0;
  return 1;
}

static void remove_node(bnode *p, bnode *n) {
  n->unlinked = true;
  bool was_remote = n->remote;
  mark_clean(n);
  char cp[PBUF];
  cache_path(n->path, cp, sizeof cp);
  unlink(cp); /* open handles keep reading and writing their fd */
  if (n->opens == 0) cache_drop(n, false);
  n->uploaded_ms = 0;
  list_remove(p, base_of(n->path));
  if (was_remote || n->tried) tombstone(n->path, n->type == T_DIR); /* never sent: nothing to delete */
  node_unhash(n);
  syncs_settle();
}

static void b_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  bnode *p = node_of(parent), *n;
  pthread_mutex_lock(&B.lock);
  int r = lookup_node(p, name, &n);
  if (r == 0 && n->type != T_DIR) r = -ENOTDIR;
  if (r == 0) {
    n->busy++;
    r = dir_empty(n);
    n->busy--;
    r = r < 0 ? r : r == 0 ? -ENOTEMPTY : 0;
  }
  if (r == 0) {
    remove_node(p, n);
    list_free(n);
    node_maybe_free(n);
  }
  pthread_mutex_unlock(&B.lock);
  fuse_reply_err(req, -r);
}

static void b_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  bnode *p = node_of(parent), *n;
  pthread_mutex_lock(&B.lock);
  int r = lookup_node(p, name, &n);
  if (r == 0 && n->type == T_DIR) r = -EISDIR;
  if (r == 0) {
    remove_node(p, n);
    node_maybe_free(n);
  }
  pthread_mutex_unlock(&B.lock);
  fuse_reply_err(req, -r);
}

typedef struct dirh {
  lentry *e;
  size_t n;
  lindex ix; /* while it is filled */
  size_t bytes; /* what it holds of DIRH_MAX */
} dirh;

/* Each open directory holds a copy of its listing (readdir with seek over
 * a listing that changes): all of them together hold at most this, past
 * which opendir is ENOMEM (a sandbox holding a big directory open many
 * times over would take the host's memory otherwise: about 120 bytes an
 * entry, so this is 1,000,000 entries, five handles of the biggest
 * directory a mount lists). */
#define DIRH_MAX (128u << 20)
static size_t dirh_total;

/* What entries of names bytes (their NULs included) take in a handle. */
static size_t dirh_size(size_t nentries, size_t names) { return nentries * (sizeof(lentry) + 16) + names; }

static void dirh_add(dirh *h, size_t *cap, const char *name, bool dir) {
  if (lindex_find(&h->ix, h->e, h->n, name)) return;
  lentry *e = lentry_append(&h->e, &h->n, cap, &h->ix, name);
  if (e) e->dir = dir, h->bytes += dirh_size(1, strlen(name) + 1);
}

static void b_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  bnode *d = node_of(ino);
  pthread_mutex_lock(&B.lock);
  int r = refresh_listing(d);
  if (r == 0) list_after(d);
  dirh *h = r == 0 ? calloc(1, sizeof *h) : NULL;
  if (!h) {
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, r ? -r : ENOMEM);
  }
  /* the bucket's entries less what was removed and not yet deleted there,
   * then what only we have so far */
  size_t cap = 0, l = strlen(d->path), names = 0;
  for (size_t i = 0; i < d->nlist; i++) names += strlen(d->list[i].name) + 1;
  h->bytes = sizeof *h;
  if (dirh_total + h->bytes + dirh_size(d->nlist, names) > DIRH_MAX) { /* at most this, before it is made */
    free(h);
    pthread_mutex_unlock(&B.lock);
    return (void)fuse_reply_err(req, ENOMEM);
  }
  for (size_t i = 0; i < d->nlist; i++) {
    char *path = join(d->path, d->list[i].name);
    bnode *n = path ? node_find(path) : NULL;
    bool hidden = path && ((gone_find(path) && !n) || (n && n->unlinked));
    free(path);
    if (!hidden) dirh_add(h, &cap, d->list[i].name, d->list[i].dir);
  }
  for (size_t b = 0; b < HASH_SIZE; b++)
    for (bnode *n = B.hash[b]; n; n = n->hnext) {
      if (!newer_than_listing(n, d)) continue;
      const char *rest = l ? (strncmp(n->path, d->path, l) || n->path[l] != '/' ? NULL : n->path + l + 1) : n->path;
      if (rest && !strchr(rest, '/')) dirh_add(h, &cap, rest, n->type == T_DIR);
    }
  lindex_free(&h->ix);
  dirh_total += h->bytes;
  pthread_mutex_unlock(&B.lock);
  fi->fh = (uintptr_t)h;
  fuse_reply_open(req, fi);
}

static void b_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  dirh *h = (dirh *)(uintptr_t)fi->fh;
  char *buf = calloc(1, size), *p = buf;
  if (!buf) return (void)fuse_reply_err(req, ENOMEM);
  size_t rem = size;
  for (size_t i = (size_t)off; i < h->n + 2; i++) {
    struct stat st = {.st_ino = (ino_t)(i + 2)};
    const char *name = i == 0 ? "." : i == 1 ? ".." : h->e[i - 2].name;
    st.st_mode = i < 2 || h->e[i - 2].dir ? S_IFDIR : S_IFREG;
    size_t e = fuse_add_direntry(req, p, rem, name, &st, (off_t)(i + 1));
    if (e > rem) break;
    p += e, rem -= e;
  }
  fuse_reply_buf(req, buf, size - rem);
  free(buf);
}

static void b_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  dirh *h = (dirh *)(uintptr_t)fi->fh;
  pthread_mutex_lock(&B.lock);
  dirh_total -= h->bytes;
  pthread_mutex_unlock(&B.lock);
  bool big = h->bytes > (1u << 20);
  for (size_t i = 0; i < h->n; i++) free(h->e[i].name);
  free(h->e);
  free(h);
  if (big) malloc_trim(0); /* a big listing's memory goes back to the system */
  fuse_reply_err(req, 0);
}

/* ---- rename: copy, then delete (not atomic) --------------------------------- */

typedef struct keys {
  char **k;
  size_t n, cap;
} keys;

/* A key under a directory (relative to it) whose every part is a name a
 * walk can reach, and a marker's trailing slash: a key such as
 * "x/../../../other/f" is no file of the directory, and a request naming it
 * could reach another key once its dots were resolved. */
static bool key_below(const char *rel) {
  for (const char *p = rel; *p;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (!list_name_ok(p, len)) return false;
    if (!slash) break;
    p = slash + 1;
  }
  return true;
}

static void keys_cb(void *ud, const char *name, bool dir, uint64_t size, int64_t mtime, uint64_t etag) {
  (void)dir, (void)size, (void)mtime, (void)etag;
  keys *k = ud;
  if (!key_below(name)) return;
  if (k->n == k->cap) {
    k->cap = k->cap ? 2 * k->cap : 64;
    char **nk = realloc(k->k, k->cap * sizeof *nk);
    if (!nk) return;
    k->k = nk;
  }
  k->k[k->n++] = strdup(name);
}

/* Moves one node's state to a new path (lock held). */
static void move_node(bnode *n, const char *to) {
  char from_cache[PBUF], to_cache[PBUF];
  cache_path(n->path, from_cache, sizeof from_cache);
  cache_path(to, to_cache, sizeof to_cache);
  rename(from_cache, to_cache);
  if (n->dirty) drop_jfile(n, n->path); /* an attribute went with the file: rewritten below */
  node_unhash(n);
  char *np = strdup(to);
  if (np) free(n->path), n->path = np;
  node_hash(n);
  if (n->dirty) journal_node(n);
}

/* Whatever was at `to` is replaced (lock held). */
static void replace_target(const char *to) {
  bnode *old = node_find(to);
  if (!old) return;
  old->unlinked = true;
  mark_clean(old);
  old->queued = false; /* what is queued for the name serves the node moved there */
  node_unhash(old);
  syncs_settle();
  unkeep(old);
  node_maybe_free(old);
}

static int rename_file(bnode *p, bnode *np, bnode *n, const char *to) {
  char from[PBUF];
  snprintf(from, sizeof from, "%s", n->path);
  if (n->dirty || n->queued || !n->remote || n->type == T_LINK) {
    /* not in the bucket as it is: it goes up under the new name */
    bool was_sent = n->remote || n->tried;
    bnode *old = node_find(to);
    /* the new name may be in the bucket already: what it replaces, or a
     * name the listing has */
    bool shadows = (old && (old->remote || old->tried)) || (np->list_at && list_find(np, base_of(to)));
    replace_target(to);
    move_node(n, to);
    n->remote = false;
    n->tried = shadows;
    mark_dirty(n);
    journal_node(n);
    if (!n->opens) enqueue(to, OP_PUT);
    if (was_sent) tombstone(from, false);
  } else {
    char kf[PBUF], kt[PBUF];
    key_of(from, kf, sizeof kf);
    key_of(to, kt, sizeof kt);
    s3_err e = {0};
    n->busy++;
    pthread_mutex_unlock(&B.lock);
    int r = s3_copy(&B.s3, kf, kt, NULL, &e);
    pthread_mutex_lock(&B.lock);
    if (r < 0) {
      n->busy--;
      return -e.errnum;
    }
    replace_target(to);
    move_node(n, to); /* reads fetch the new name's object from now on */
    n->uploaded_ms = sbx_now_ms();
    /* the old name goes once the reads that began on it are over: an open
     * file reads on through a rename, and must not meet its name deleted */
    while (n->fetching) pthread_cond_wait(&B.fetched, &B.lock);
    pthread_mutex_unlock(&B.lock);
    r = s3_delete(&B.s3, kf, &e);
    pthread_mutex_lock(&B.lock);
    n->busy--;
    if (r < 0) {
      tombstone(from, false); /* renamed here; the old name goes later */
    } else {
      gone *g = gone_add(from, false); /* deleted there already: a listing begun before says otherwise */
      if (g) gone_done(g);
    }
  }
  list_remove(p, base_of(from));
  list_add(np, base_of(to), false);
  return 0;
}

static int rename_dir(bnode *p, bnode *np, bnode *n, const char *to) {
  char kf[PBUF], kt[PBUF], oldp[PBUF];
  snprintf(oldp, sizeof oldp, "%s", n->path);
  dir_key_of(oldp, kf, sizeof kf);
  dir_key_of(to, kt, sizeof kt);
  keys k = {0};
  s3_err e = {0};
  n->busy++;
  pthread_mutex_unlock(&B.lock);
  int r = s3_list(&B.s3, kf, NULL, MAX_LIST, keys_cb, &k, &e) < 0 ? -e.errnum : 0;
  pthread_mutex_lock(&B.lock);
  for (size_t i = 0; i < k.n && r == 0; i++) { /* every key below: copied, then deleted */
    char a[2 * PBUF], b[2 * PBUF], rel[2 * PBUF];
    snprintf(a, sizeof a, "%s%s", kf, k.k[i]);
    snprintf(b, sizeof b, "%s%s", kt, k.k[i]);
    snprintf(rel, sizeof rel, "%s/%s", oldp, k.k[i]);
    size_t rl = strlen(rel);
    if (rl && rel[rl - 1] == '/') rel[rl - 1] = 0;
    if (gone_find(rel)) continue; /* deleted here, not yet there: not carried along */
    pthread_mutex_unlock(&B.lock);
    if (s3_copy(&B.s3, a, b, NULL, &e) < 0 || s3_delete(&B.s3, a, &e) < 0) r = -e.errnum;
    pthread_mutex_lock(&B.lock);
  }
  n->busy--;
  for (size_t i = 0; i < k.n; i++) free(k.k[i]);
  free(k.k);
  if (r < 0) return r;
  size_t l = strlen(oldp);
  for (size_t h = 0; h < HASH_SIZE; h++)
    for (bnode *c = B.hash[h], *next; c; c = next) {
      next = c->hnext;
      if (c == n || strncmp(c->path, oldp, l) || c->path[l] != '/') continue;
      char *cp = sbx_strdup_printf("%s%s", to, c->path + l);
      if (!cp) continue;
      replace_target(cp); /* a node left there (held, or the bucket's object gone) */
      next = c->hnext;      /* which may have been the next one */
      move_node(c, cp);
      list_free(c);
      if (c->dirty) c->gen++, enqueue(cp, OP_PUT); /* an upload under way went to the old name */
      free(cp);
    }
  replace_target(to);
  move_node(n, to);
  list_free(n);
  mark_dirty(n); /* the new name's marker */
  enqueue(to, OP_PUT);
  list_remove(p, base_of(oldp));
  list_add(np, base_of(to), true);
  return 0;
}

static void b_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
                     unsigned int flags) {
  if (B.read_only) return (void)fuse_reply_err(req, EROFS);
  if (flags & RENAME_EXCHANGE) return (void)fuse_reply_err(req, EINVAL); /* objects cannot swap atomically */
  bnode *p = node_of(parent), *np = node_of(newparent), *n = NULL, *t;
  pthread_mutex_lock(&B.lock);
  char *to = NULL;
  int r = lookup_node(p, name, &n);
  bnode *held = r == 0 ? n : NULL;
  if (held) held->busy++;
  int rt = r == 0 ? lookup_node(np, newname, &t) : -ENOENT;
  if (r == 0 && rt == 0 && t == n) goto out; /* the same file: nothing to do */
  if (r == 0 && rt == 0) {
    if (flags & RENAME_NOREPLACE) r = -EEXIST;
    else if (t->type == T_DIR && n->type != T_DIR) r = -EISDIR;
    else if (t->type != T_DIR && n->type == T_DIR) r = -ENOTDIR;
    else if (t->type == T_DIR) {
      t->busy++;
      int empty = dir_empty(t);
      t->busy--;
      if (empty <= 0) r = empty < 0 ? empty : -ENOTEMPTY;
      else remove_node(np, t);
    }
  } else if (r == 0 && rt != -ENOENT) {
    r = rt;
  }
  if (r == 0 && !(to = join(np->path, newname))) r = -errno;
  if (r == 0 && n->type == T_DIR) {
    size_t l = strlen(n->path);
    if (!strncmp(to, n->path, l) && to[l] == '/') r = -EINVAL; /* into itself */
  }
  if (r == 0) {
    B.renames++, B.renaming++; /* (a tree being listed meanwhile may show a half-moved state: not installed) */
    r = n->type == T_DIR ? rename_dir(p, np, n, to) : rename_file(p, np, n, to);
    B.renaming--;
  }
out:
  if (held) {
    held->busy--;
    node_maybe_free(held);
  }
  free(to);
  pthread_mutex_unlock(&B.lock);
  fuse_reply_err(req, -r);
}

static void b_statfs(fuse_req_t req, fuse_ino_t ino) {
  (void)ino;
  pthread_mutex_lock(&B.lock);
  uint64_t total = B.cache_max / 4096, used = budget_used() / 4096;
  pthread_mutex_unlock(&B.lock);
  /* what may be written before uploads must catch up: the cache */
  struct statvfs sv = {.f_bsize = 4096, .f_frsize = 4096, .f_blocks = total, .f_bfree = total - (used < total ? used : total),
                       .f_files = 1ull << 32, .f_ffree = 1ull << 32, .f_namemax = 255};
  sv.f_bavail = sv.f_bfree;
  fuse_reply_statfs(req, &sv);
}

static void b_init(void *ud, struct fuse_conn_info *conn) {
  (void)ud;
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_WRITEBACK_CACHE);
  conn->max_write = 1024 * 1024;
  conn->max_readahead = 1024 * 1024;
}

static const struct fuse_lowlevel_ops ops = {
    .init = b_init,
    .lookup = b_lookup,
    .forget = b_forget,
    .forget_multi = b_forget_multi,
    .getattr = b_getattr,
    .setattr = b_setattr,
    .readlink = b_readlink,
    .symlink = b_symlink,
    .link = b_link,
    .create = b_create,
    .open = b_open,
    .read = b_read,
    .write = b_write,
    .release = b_release,
    .fsync = b_fsync,
    .fallocate = b_fallocate,
    .mkdir = b_mkdir,
    .rmdir = b_rmdir,
    .unlink = b_unlink,
    .opendir = b_opendir,
    .readdir = b_readdir,
    .releasedir = b_releasedir,
    .rename = b_rename,
    .statfs = b_statfs,
};

/* ---- start ------------------------------------------------------------------ */

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

/* One journal entry of a changed node, read back: from a file of
 * journal/ (jp), or from its cache file's attribute (jp NULL). Of two
 * entries for one node (a crash between writing one and removing the
 * other), the newer wins. False: nothing of it was acknowledged. */
static bool recover_node(json_t *j, size_t len, const char *path, const char *jp) {
  const char *type = json_string_value(json_object_get(j, "type"));
  ntype t = type && !strcmp(type, "dir") ? T_DIR : type && !strcmp(type, "link") ? T_LINK : T_FILE;
  int64_t at = json_integer_value(json_object_get(j, "at"));
  bnode *n = node_find(path);
  if (!n) n = node_new(path, t);
  char cp[PBUF];
  cache_path(path, cp, sizeof cp);
  struct stat st;
  if (!n || (t == T_FILE && stat(cp, &st) < 0)) {
    if (n) node_maybe_free(n);
    return false;
  }
  if (jp) n->jfile = true;
  else if (!n->jattr) n->jattr = true, B.njattr++;
  if (n->dirty && n->jat > at) return true; /* the other entry is newer */
  n->jat = at;
  n->type = t;
  n->size = t == T_FILE ? (uint64_t)st.st_size : 0; /* the cache file is the truth */
  n->mode = (mode_t)json_integer_value(json_object_get(j, "mode")) & 07777;
  n->mtime_ns = json_integer_value(json_object_get(j, "mtime"));
  n->uid = sandbox_id(json_integer_value(json_object_get(j, "uid")));
  n->gid = sandbox_id(json_integer_value(json_object_get(j, "gid")));
  const char *target = json_string_value(json_object_get(j, "target"));
  free(n->target);
  n->target = NULL;
  if (t == T_LINK) n->target = strdup(target ? target : ""), n->size = strlen(n->target);
  n->full = true;
  n->tried = true; /* an earlier run may have sent it */
  set_jextra(&n->jextra, entry_extra(len));
  if (!n->dirty) {
    B.njournal++;
    if (t == T_FILE) account(n, n->size);
    enqueue(path, OP_PUT);
  }
  n->dirty = true;
  n->gen = 1;
  return true;
}

/* The entry in the attribute of the cache file dir/name, recovered: false
 * when it has none, or one naming a path whose cache file it is not. */
static bool recover_attr(const char *dir, const char *name) {
  char v[8192], cp[PBUF + 300];
  snprintf(cp, sizeof cp, "%s/%s", dir, name);
  ssize_t k = getxattr(cp, JOURNAL_ATTR, v, sizeof v - 1);
  if (k <= 0) return false;
  v[k] = 0;
  json_t *j = json_loads(v, 0, NULL);
  const char *path = json_string_value(json_object_get(j, "path"));
  char h[65];
  bool ok = path && *path && strlen(path) < MAX_KEY && (sha256_hex(path, strlen(path), h), !strcmp(h, name)) &&
            recover_node(j, (size_t)k, path, NULL);
  json_decref(j);
  return ok;
}

/* What an earlier run left journaled goes up first; cached data it did
 * not journal was clean, and goes (lock held). */
static void recover(void) {
  char dir[PBUF];
  snprintf(dir, sizeof dir, "%s/journal", B.cache);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!strcmp(e->d_name, JOURNAL_MARK)) B.jmarked = true;
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
    char p[PBUF + 300];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    json_t *j = json_load_file(p, 0, NULL);
    const char *path = json_string_value(json_object_get(j, "path"));
    struct stat st;
    if (!path || !*path || strlen(path) >= MAX_KEY || fstatat(dirfd(d), e->d_name, &st, 0) < 0) {
      unlink(p);
    } else if (e->d_name[0] == 't') {
      tombstone(path, json_is_true(json_object_get(j, "dir")));
    } else if (!recover_node(j, (size_t)st.st_size, path, p)) {
      unlink(p); /* no data for it: nothing was acknowledged */
    }
    json_decref(j);
  }
  if (d) closedir(d);
  /* the cache files of the nodes recovered stay: their names, sorted, so
   * that a cache of many files is cleaned in n log n, not n squared */
  size_t nw = 0, cap = 0;
  char(*wanted)[65] = NULL;
  bool oom = false;
  for (size_t h = 0; h < HASH_SIZE && !oom; h++)
    for (bnode *n = B.hash[h]; n && !oom; n = n->hnext) {
      if (nw == cap) {
        void *m = realloc(wanted, (cap = cap ? cap * 2 : 256) * sizeof *wanted);
        if (!m) {
          oom = true;
          break;
        }
        wanted = m;
      }
      sha256_hex(n->path, strlen(n->path), wanted[nw++]);
    }
  if (wanted) qsort(wanted, nw, sizeof *wanted, by_name);
  /* one walk of the cache files: those with an entry in their attribute
   * (if any was ever written) are recovered, the others nobody claims go
   * (short of memory, stale files stay: only space) */
  snprintf(dir, sizeof dir, "%s/data", B.cache);
  d = B.jmarked || !oom ? opendir(dir) : NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.' || (B.jmarked && recover_attr(dir, e->d_name))) continue;
    if (!oom && !(wanted && bsearch(e->d_name, wanted, nw, sizeof *wanted, by_name))) unlinkat(dirfd(d), e->d_name, 0);
  }
  if (d) closedir(d);
  free(wanted);
}

static int load_config(char *err, size_t errlen) {
  json_error_t je;
  json_t *c = json_loadf(stdin, JSON_DISABLE_EOF_CHECK, &je);
  if (!c) {
    snprintf(err, errlen, "configuration: %s", je.text);
    return -1;
  }
  const char *ep = json_string_value(json_object_get(c, "endpoint")),
             *bucket = json_string_value(json_object_get(c, "bucket")),
             *cache = json_string_value(json_object_get(c, "cacheDir"));
  if (!ep || !bucket || !cache || strlen(cache) >= sizeof B.cache - 100) {
    json_decref(c);
    snprintf(err, errlen, "configuration: endpoint, bucket and cacheDir are required");
    return -1;
  }
  snprintf(B.s3.endpoint, sizeof B.s3.endpoint, "%s", ep);
  size_t el = strlen(B.s3.endpoint);
  while (el && B.s3.endpoint[el - 1] == '/') B.s3.endpoint[--el] = 0;
  snprintf(B.s3.bucket, sizeof B.s3.bucket, "%s", bucket);
  const char *region = json_string_value(json_object_get(c, "region"));
  snprintf(B.s3.region, sizeof B.s3.region, "%s", region ? region : "us-east-1");
  const char *ak = json_string_value(json_object_get(c, "accessKeyId")),
             *sk = json_string_value(json_object_get(c, "secretAccessKey"));
  snprintf(B.s3.access_key, sizeof B.s3.access_key, "%s", ak ? ak : "");
  snprintf(B.s3.secret_key, sizeof B.s3.secret_key, "%s", sk ? sk : "");
  B.s3.path_style = !json_is_false(json_object_get(c, "pathStyle"));
  B.s3.public_only = json_is_true(json_object_get(c, "publicOnly"));
  const char *prefix = json_string_value(json_object_get(c, "prefix"));
  if (prefix && *prefix) {
    while (*prefix == '/') prefix++;
    if (strlen(prefix) > 512) {
      json_decref(c);
      snprintf(err, errlen, "configuration: prefix is longer than 512 bytes");
      return -1;
    }
    snprintf(B.prefix, sizeof B.prefix, "%s%s", prefix, *prefix && prefix[strlen(prefix) - 1] != '/' ? "/" : "");
  }
  snprintf(B.cache, sizeof B.cache, "%s", cache);
  B.read_only = json_is_true(json_object_get(c, "readOnly"));
  B.uid_base = (uid_t)json_integer_value(json_object_get(c, "uidBase"));
  json_int_t mb = json_integer_value(json_object_get(c, "cacheMaxMB"));
  B.cache_max = (uint64_t)(mb > 0 ? mb : 2048) << 20;
  json_decref(c);
  char sub[PBUF];
  snprintf(sub, sizeof sub, "%s/data", B.cache);
  sbx_mkdir_p(sub, 0700);
  snprintf(sub, sizeof sub, "%s/journal", B.cache);
  sbx_mkdir_p(sub, 0700);
  return 0;
}

/* What stays journaled at the end; the mark goes when no attribute holds
 * an entry (uploaders stopped). */
static size_t journal_left(void) {
  size_t n = B.njattr;
  char dir[PBUF];
  snprintf(dir, sizeof dir, "%s/journal", B.cache);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.' && strcmp(e->d_name, JOURNAL_MARK);
  if (d) closedir(d);
  char mark[PBUF + 32];
  snprintf(mark, sizeof mark, "%s/" JOURNAL_MARK, dir);
  if (!B.njattr && B.jmarked && unlink(mark) == 0) B.jmarked = false;
  return n;
}

static void report(FILE **status, const char *fmt, ...) SBX_PRINTF(2, 3);
static void report(FILE **status, const char *fmt, ...) {
  if (!*status) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(*status, fmt, ap);
  va_end(ap);
  fclose(*status);
  *status = NULL;
}

static struct {
  pthread_t t[UPLOADERS + FETCHERS];
  int n;
} workers;

static void *start_workers(void *unused) {
  (void)unused;
  for (int i = 0; i < UPLOADERS + FETCHERS; i++)
    if (pthread_create(&workers.t[workers.n], NULL, i < UPLOADERS ? uploader : fetcher, NULL) == 0) workers.n++;
  return NULL;
}

int sbx_bucketfs_main(int argc, char **argv) {
  bool flush_only = false, check = false;
  const char *mountpoint = NULL; /* mounted by us (benchmarks, by hand), not handed over on fd 3 */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--flush")) flush_only = true;
    else if (!strcmp(argv[i], "--check")) check = true;
    else if (argv[i][0] != '-' && !mountpoint) mountpoint = argv[i];
    else {
      fprintf(stderr, "usage: sbx bucketfs [--check|--flush] [MOUNTPOINT] < config.json\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_NAME, "sbx-bucketfs");
  prctl(PR_SET_DUMPABLE, 0); /* its memory holds credentials */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) nofile.rlim_cur = nofile.rlim_max, setrlimit(RLIMIT_NOFILE, &nofile);
  getrlimit(RLIMIT_NOFILE, &nofile);
  B.fds_max = nofile.rlim_cur / 4 > 64 ? nofile.rlim_cur / 4 : 64; /* the rest: open files, fetches, uploads */
  s3_global_init();
  char err[600];
  FILE *status = fcntl(4, F_GETFD) >= 0 ? fdopen(4, "w") : NULL;
  if (load_config(err, sizeof err) < 0) {
    report(&status, "err config: %s\n", err);
    fprintf(stderr, "sbx bucketfs: %s\n", err);
    return 1;
  }
  /* one server per cache at a time: a mount coming back waits for the
   * last one to finish its uploads */
  char lockp[PBUF];
  snprintf(lockp, sizeof lockp, "%s/lock", B.cache);
  int lockfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lockfd < 0 || flock(lockfd, flush_only ? LOCK_EX | LOCK_NB : LOCK_EX) < 0) {
    report(&status, "err cache: %s is in use\n", B.cache);
    return flush_only ? 0 : 1; /* a flush finds another server on it: that one uploads */
  }
  B.root = (bnode){.nlookup = 2, .type = T_DIR, .path = "", .cfd = -1, .mode = 0755, .remote = true};
  B.root.mtime_ns = now_ns();
  if (check) { /* a new mount: say whether the bucket answers, in words without secrets */
    s3_err e = {0};
    if (s3_check(&B.s3, &e) < 0) {
      report(&status, "err %s\n", e.msg);
      return 1;
    }
  }
  /* the workers are started beside the mount, not before it: sixteen
   * threads took 4-13 ms of a wake that waits for the mount to answer */
  pthread_t starter;
  bool starting = pthread_create(&starter, NULL, start_workers, NULL) == 0;
  if (!starting) start_workers(NULL);
  pthread_mutex_lock(&B.lock);
  recover();
  pthread_mutex_unlock(&B.lock);
  int rc = 0;
  if (!flush_only) {
    sbx_fuse_args fa;
    sbx_fuse_args_init(&fa, "bucket", mountpoint != NULL, geteuid() == 0, false);
    struct fuse_args args = fa.args;
    B.se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    char merr[600] = "cannot serve the mount";
    if (!B.se || (mountpoint ? sbx_fuse_mount(B.se, mountpoint, merr, sizeof merr) : fuse_session_mount(B.se, "/dev/fd/3")) != 0) {
      report(&status, "err FUSE: %s\n", merr);
      fprintf(stderr, "sbx bucketfs: %s\n", merr);
      return 1;
    }
    report(&status, "ok\n");
    rc = sbx_fuse_loop(B.se, -1);
    fuse_session_unmount(B.se);
    fuse_session_destroy(B.se);
    fuse_opt_free_args(&args);
  } else {
    report(&status, "ok\n");
  }
  /* the mount is gone (unmounted, or its sandbox stopped): what is not
   * uploaded yet still goes; what cannot go now stays journaled */
  pthread_mutex_lock(&B.lock);
  B.stopping = true;
  B.fetch_stop = true;
  pthread_cond_broadcast(&B.work);
  pthread_cond_broadcast(&B.fetch_work);
  pthread_mutex_unlock(&B.lock);
  if (starting) pthread_join(starter, NULL);
  for (int i = 0; i < workers.n; i++) pthread_join(workers.t[i], NULL);
  size_t left = journal_left();
  if (left) fprintf(stderr, "sbx bucketfs %s: %zu changes stay journaled (%s)\n", B.s3.bucket, left, B.last_error);
  s3_thread_done();
  return left ? EXIT_LEFT_JOURNALED : rc < 0 ? 1 : 0;
}
