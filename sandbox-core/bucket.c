#define _GNU_SOURCE
#include "bucket.h"
#include "exec.h"
#include "config.h"
#include "disk.h"
#include "record.h"
#include "rootfs.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* As root, every bucket server runs as this user: none of the host's, none
 * of a sandbox's (their ranges start at 0x40000000). */
#define BUCKETFS_UID 0x3ffffffeu
#define CHECK_TIMEOUT_MS 45000
#define HELPER_TIMEOUT_MS 5000
#define EXIT_LEFT_JOURNALED 3
#define RESTARTS_PER_MINUTE 3

/* ---- the request, against the configuration ------------------------------ */

/* S3's bucket naming rules (the strict, DNS-compatible ones). */
static bool valid_bucket(const char *b) {
  size_t n = strlen(b);
  if (n < 3 || n > 63 || !isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1])) return false;
  bool all_ip = true;
  for (size_t i = 0; i < n; i++) {
    char c = b[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
    if (c == '.' && (b[i + 1] == '.' || b[i + 1] == '-' || (i && b[i - 1] == '-'))) return false;
    if (!(c == '.' || (c >= '0' && c <= '9'))) all_ip = false;
  }
  return !all_ip; /* not formatted like an IP address */
}

/* scheme://host[:port] with nothing else (a trailing slash is dropped). */
static int parse_endpoint(const char *in, char *out, size_t len, sbx_error *err) {
  const char *host = !strncmp(in, "https://", 8) ? in + 8 : !strncmp(in, "http://", 7) ? in + 7 : NULL;
  if (!host || !*host) return sbx_err(err, "VALIDATION_FAILED", "endpoint must be an https:// (or http://) URL, got '%.200s'", in);
  size_t hl = strcspn(host, "/");
  if (host[hl] && strcmp(host + hl, "/"))
    return sbx_err(err, "VALIDATION_FAILED", "endpoint is scheme://host[:port] without a path, got '%.200s'", in);
  for (size_t i = 0; i < hl; i++)
    if (!(isalnum((unsigned char)host[i]) || strchr(".-:[]", host[i])))
      return sbx_err(err, "VALIDATION_FAILED", "endpoint '%.200s' has a character a host name cannot have", in);
  if ((size_t)(host - in) + hl >= len) return sbx_err(err, "VALIDATION_FAILED", "endpoint is too long");
  snprintf(out, len, "%.*s", (int)((size_t)(host - in) + hl), in);
  return 0;
}

/* Whether the configuration lets a sandbox reach this endpoint, and if so
 * whether only public addresses may be connected to. */
static bool endpoint_allowed(const char *ep, bool *public_only) {
  const sbx_config *c = sbx_config_get();
  if (!c || !c->n_allowed) { /* the default: any https endpoint on a public address */
    *public_only = true;
    return !strncmp(ep, "https://", 8);
  }
  for (size_t i = 0; i < c->n_allowed; i++) {
    const char *p = c->allowed_endpoints[i];
    if (strncmp(ep, p, strlen(p))) continue;
    /* a bare scheme allows public addresses; a named host is trusted */
    *public_only = !strcmp(p, "https://") || !strcmp(p, "http://");
    return true;
  }
  return false;
}

static void default_region(const char *ep, char *out, size_t len) {
  const char *host = strstr(ep, "://");
  host = host ? host + 3 : ep;
  const char *aws = strstr(host, ".amazonaws.com");
  if (strstr(host, ".r2.cloudflarestorage.com")) snprintf(out, len, "auto");
  else if (aws && !strncmp(host, "s3.", 3) && aws > host + 3) snprintf(out, len, "%.*s", (int)(aws - host - 3), host + 3);
  else if (aws && strstr(host, ".s3.") && strstr(host, ".s3.") < aws) {
    const char *r = strstr(host, ".s3.") + 4;
    snprintf(out, len, "%.*s", (int)(aws - r), r);
  } else snprintf(out, len, "us-east-1");
}

static void mount_id(const sbx_bucket *b, char out[17]) {
  char key[2200];
  snprintf(key, sizeof key, "%s\n%s\n%s\n%s\n%d", b->local ? "local" : b->endpoint, b->bucket, b->prefix,
           b->mount_path, b->local);
  snprintf(out, 17, "%016llx", (unsigned long long)sbx_fnv1a(key));
}

int sbx_bucket_prepare(const sbx_bucket_req *r, sbx_bucket *b, char ak[256], char sk[256], sbx_error *err) {
  *b = (sbx_bucket){0};
  ak[0] = sk[0] = 0;
  if (!r->bucket || !valid_bucket(r->bucket))
    return sbx_err(err, "VALIDATION_FAILED",
                   "bucket '%.100s' is not a valid bucket name (3-63 of a-z 0-9 . -, starting and ending with a letter "
                   "or digit)", r->bucket ? r->bucket : "");
  snprintf(b->bucket, sizeof b->bucket, "%s", r->bucket);
  /* where: absolute and plain, never over the system's own directories */
  char abs[4096];
  const char *mp = r->mount_path ? r->mount_path : "";
  if (!*mp) return sbx_err(err, "VALIDATION_FAILED", "mountPath is required");
  if (snprintf(abs, sizeof abs, "%s%s", mp[0] == '/' ? "" : "/workspace/", mp) >= (int)sizeof b->mount_path)
    return sbx_err(err, "VALIDATION_FAILED", "mountPath is too long");
  char norm[1024] = "";
  size_t nl = 0;
  for (char *save = NULL, *c = strtok_r(abs, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (!strcmp(c, ".") || !strcmp(c, ".."))
      return sbx_err(err, "VALIDATION_FAILED", "mountPath '%.200s' must not contain . or .. components", mp);
    nl += (size_t)snprintf(norm + nl, sizeof norm - nl, "/%s", c);
  }
  static const char *const forbidden[] = {"/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64",
                                          "/run", "/tmp/sbx-output", "/opt", "/var/lib/dpkg", "/var/lib/apt"};
  if (!nl) return sbx_err(err, "VALIDATION_FAILED", "mountPath must not be /");
  for (size_t i = 0; i < SBX_ARRAY_SIZE(forbidden); i++) {
    size_t fl = strlen(forbidden[i]);
    if (!strncmp(norm, forbidden[i], fl) && (norm[fl] == 0 || norm[fl] == '/'))
      return sbx_err(err, "VALIDATION_FAILED", "mountPath '%.200s' is under %s, which the sandbox's system needs", norm,
                     forbidden[i]);
    if (!strncmp(forbidden[i], norm, nl) && forbidden[i][nl] == '/') /* /tmp, /var: a mount there would hide it */
      return sbx_err(err, "VALIDATION_FAILED", "mountPath '%.200s' would hide %s, which the sandbox's system needs", norm,
                     forbidden[i]);
  }
  if (!strcmp(norm, "/workspace"))
    return sbx_err(err, "VALIDATION_FAILED", "mountPath must not be /workspace itself (a directory in it, like /workspace/data, is fine)");
  snprintf(b->mount_path, sizeof b->mount_path, "%s", norm);
  if (r->prefix) {
    const char *p = r->prefix;
    while (*p == '/') p++;
    if (strlen(p) > 512 || strstr(p, "//"))
      return sbx_err(err, "VALIDATION_FAILED", "prefix must be at most 512 bytes without empty components");
    snprintf(b->prefix, sizeof b->prefix, "%s%s", p, *p && p[strlen(p) - 1] != '/' ? "/" : "");
  }
  b->read_only = r->read_only;
  const sbx_bucket_profile *prof = NULL;
  if (r->profile) {
    prof = sbx_config_profile(sbx_config_get(), r->profile);
    if (!prof)
      return sbx_err(err, "VALIDATION_FAILED", "no bucket profile '%.63s' in the daemon's configuration (buckets.profiles)",
                     r->profile);
    snprintf(b->profile, sizeof b->profile, "%s", r->profile);
  }
  bool creds = r->access_key || r->secret_key;
  b->local = r->local >= 0 ? r->local : !r->endpoint && !(prof && prof->endpoint);
  if (b->local) {
    if (r->endpoint || creds || prof)
      return sbx_err(err, "VALIDATION_FAILED", "a localBucket takes no endpoint, credentials or profile");
    /* a directory path in it: no part that leads elsewhere */
    for (const char *c = b->prefix; *c;) {
      size_t n = strcspn(c, "/");
      if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
        return sbx_err(err, "VALIDATION_FAILED", "prefix '%s' of a local bucket has a '.' or '..' part", b->prefix);
      c += n + (c[n] == '/');
    }
    mount_id(b, b->id);
    return 0;
  }
  if (creds && (!r->access_key || !r->secret_key || !*r->access_key || !*r->secret_key))
    return sbx_err(err, "VALIDATION_FAILED", "credentials need both accessKeyId and secretAccessKey");
  if (creds && prof) return sbx_err(err, "VALIDATION_FAILED", "give credentials or a profile, not both");
  if (!creds && !prof)
    return sbx_err(err, "VALIDATION_FAILED", "an S3 bucket needs credentials {accessKeyId, secretAccessKey} or a profile");
  char ep[512];
  if (r->endpoint && parse_endpoint(r->endpoint, ep, sizeof ep, err) < 0) return -1;
  if (prof && prof->endpoint) {
    char pep[512];
    if (parse_endpoint(prof->endpoint, pep, sizeof pep, err) < 0) return -1;
    if (r->endpoint && strcmp(ep, pep))
      return sbx_err(err, "VALIDATION_FAILED", "profile '%s' is for %s; its credentials are not sent elsewhere", r->profile, pep);
    snprintf(b->endpoint, sizeof b->endpoint, "%s", pep);
    b->public_only = false; /* the configuration names it: trusted */
  } else if (r->endpoint) {
    snprintf(b->endpoint, sizeof b->endpoint, "%s", ep);
    if (!endpoint_allowed(ep, &b->public_only))
      return sbx_err(err, "PERMISSION_DENIED",
                     "endpoint %.200s is not allowed by the daemon's configuration (buckets.allowedEndpoints: %s)", ep,
                     sbx_config_get() && sbx_config_get()->n_allowed ? "none of its prefixes match"
                                                                     : "by default only https endpoints on public addresses");
  } else {
    return sbx_err(err, "VALIDATION_FAILED", "endpoint is required (or a profile that has one, or localBucket: true)");
  }
  if (r->region && *r->region) {
    if (strlen(r->region) >= sizeof b->region || strspn(r->region, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(r->region))
      return sbx_err(err, "VALIDATION_FAILED", "region '%.64s' is not a region name", r->region);
    snprintf(b->region, sizeof b->region, "%s", r->region);
  } else if (prof && prof->region) {
    snprintf(b->region, sizeof b->region, "%s", prof->region);
  } else {
    default_region(b->endpoint, b->region, sizeof b->region);
  }
  /* virtual-host style where AWS wants it (and the name is a DNS label) */
  b->path_style = !strstr(b->endpoint, ".amazonaws.com") || strchr(b->bucket, '.');
  snprintf(ak, 256, "%s", creds ? r->access_key : prof->access_key_id);
  snprintf(sk, 256, "%s", creds ? r->secret_key : prof->secret_access_key);
  mount_id(b, b->id);
  return 0;
}

/* ---- records ------------------------------------------------------------------ */

json_t *sbx_bucket_to_json(const sbx_bucket *b) {
  json_t *j = json_pack("{s:s, s:s, s:s, s:b, s:b}", "id", b->id, "bucket", b->bucket, "mountPath", b->mount_path,
                        "readOnly", b->read_only, "local", b->local);
  if (!b->local)
    json_object_update_new(j, json_pack("{s:s, s:s, s:s, s:b, s:b}", "endpoint", b->endpoint, "region", b->region,
                                        "prefix", b->prefix, "pathStyle", b->path_style, "publicOnly", b->public_only));
  if (b->profile[0]) json_object_set_new(j, "profile", json_string(b->profile));
  return j;
}

static int copy_str(json_t *j, const char *key, char *out, size_t len, bool required) {
  const char *s = json_string_value(json_object_get(j, key));
  if (!s) return required ? -1 : 0;
  if (strlen(s) >= len) return -1;
  snprintf(out, len, "%s", s);
  return 0;
}

int sbx_bucket_from_json(json_t *j, sbx_bucket *b) {
  *b = (sbx_bucket){0};
  if (copy_str(j, "id", b->id, sizeof b->id, true) < 0 || copy_str(j, "bucket", b->bucket, sizeof b->bucket, true) < 0 ||
      copy_str(j, "mountPath", b->mount_path, sizeof b->mount_path, true) < 0 ||
      copy_str(j, "endpoint", b->endpoint, sizeof b->endpoint, false) < 0 ||
      copy_str(j, "region", b->region, sizeof b->region, false) < 0 ||
      copy_str(j, "prefix", b->prefix, sizeof b->prefix, false) < 0 ||
      copy_str(j, "profile", b->profile, sizeof b->profile, false) < 0)
    return -1;
  if (!valid_bucket(b->bucket) || b->mount_path[0] != '/' || strstr(b->mount_path, "/..") ||
      strspn(b->id, "0123456789abcdef") != 16)
    return -1;
  b->read_only = json_is_true(json_object_get(j, "readOnly"));
  b->local = json_is_true(json_object_get(j, "local"));
  b->path_style = json_is_true(json_object_get(j, "pathStyle"));
  b->public_only = json_is_true(json_object_get(j, "publicOnly"));
  if (!b->local && !b->endpoint[0]) return -1;
  return 0;
}

/* ---- where things are ----------------------------------------------------------- */

static int exe_fd = -1;

static void cache_dir(const char *sandbox, const char *id, char *out, size_t len) {
  snprintf(out, len, "%s/bucket-cache/%s/%s", sbx_engine_cfg()->state_dir, sandbox, id);
}

static void cache_conf(const char *sandbox, const char *id, char *out, size_t len) {
  snprintf(out, len, "%s/bucket-cache/%s/%s.json", sbx_engine_cfg()->state_dir, sandbox, id);
}

static void local_dir(const char *bucket, char *out, size_t len) {
  snprintf(out, len, "%s/buckets/%s", sbx_engine_cfg()->state_dir, bucket);
}

/* What the daemon's log hears of; with id, the sandbox's clients too (a
 * mount it did not get back: files written there meanwhile land on its
 * own disk). */
static void warn_sandbox(const char *id, const char *fmt, ...) SBX_PRINTF(2, 3);
static void warn_sandbox(const char *id, const char *fmt, ...) {
  const sbx_engine_config *c = sbx_engine_cfg();
  char msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (id && c->warn_sandbox) c->warn_sandbox(id, msg);
  else if (c->warn) c->warn(msg);
}

static void remove_cache(const char *sandbox, const char *id) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%s/bucket-cache/%s", sbx_engine_cfg()->state_dir, sandbox);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  char conf[64];
  snprintf(conf, sizeof conf, "%s.json", id);
  unlinkat(dfd, conf, 0);
  sbx_remove_tree_at(dfd, id, true);
  close(dfd);
  rmdir(dir); /* when it was the last */
}

static bool journal_empty(const char *sandbox, const char *id) {
  char dir[1400];
  cache_dir(sandbox, id, dir, sizeof dir);
  strcat(dir, "/journal");
  DIR *d = opendir(dir);
  bool empty = true;
  for (struct dirent *e; d && (e = readdir(d)) && empty;) empty = e->d_name[0] == '.';
  if (d) closedir(d);
  return empty;
}

static bool cache_name(const char *name) { return strlen(name) == 16 && strspn(name, "0123456789abcdef") == 16; }

/* The sandbox's bucket caches other than id's: those of its S3 mounts, and
 * those of mounts gone whose changes still wait for their bucket (kept,
 * and tried again at every start). Each may hold up to diskMB. */
static int caches_besides(const char *sandbox, const char *id) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%s/bucket-cache/%s", sbx_engine_cfg()->state_dir, sandbox);
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (cache_name(e->d_name) && strcmp(e->d_name, id)) n++;
  if (d) closedir(d);
  return n;
}

/* fn for each bucket cache on this machine: its sandbox's id, that
 * sandbox (NULL once destroyed) and the cache's id. */
static void each_cache(void (*fn)(const char *sandbox, sbx_sandbox *sb, const char *id, void *ud), void *ud) {
  char root[1200];
  snprintf(root, sizeof root, "%s/bucket-cache", sbx_engine_cfg()->state_dir);
  DIR *d = opendir(root);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!sbx_valid_id(e->d_name)) continue;
    char sub[1500];
    snprintf(sub, sizeof sub, "%s/%s", root, e->d_name);
    DIR *s = opendir(sub);
    sbx_sandbox *sb = sbx_sandbox_find(e->d_name);
    for (struct dirent *m; s && (m = readdir(s));)
      if (cache_name(m->d_name)) fn(e->d_name, sb, m->d_name, ud);
    if (s) closedir(s);
  }
  if (d) closedir(d);
}

static sbx_bucket *spec_find(sbx_sandbox *sb, const char *id);

static void count_orphan(const char *sandbox, sbx_sandbox *sb, const char *id, void *ud) {
  (void)sandbox;
  *(int *)ud += !spec_find(sb, id);
}

/* Caches on this machine that no mount of a sandbox's record has: what
 * mounts gone, of sandboxes destroyed too, left for their bucket. */
static int orphan_caches(void) {
  int n = 0;
  each_cache(count_orphan, &n);
  return n;
}

/* Whether a mount of cache id may have its cache: at most SBX_MAX_BUCKETS
 * of the sandbox's, and a new one only while the machine keeps fewer than
 * SBX_MAX_ORPHAN_CACHES of mounts gone. */
static int cache_room(const char *sandbox, const char *id, sbx_error *err) {
  if (caches_besides(sandbox, id) >= SBX_MAX_BUCKETS)
    return sbx_err(err, "RESOURCE_LIMIT",
                   "the sandbox has %d bucket caches on this machine already: its S3 mounts, and mounts gone whose "
                   "changes their bucket has not taken yet (mount such a bucket again to have them uploaded)",
                   SBX_MAX_BUCKETS);
  char mine[1400];
  cache_dir(sandbox, id, mine, sizeof mine);
  if (access(mine, F_OK) < 0 && orphan_caches() >= SBX_MAX_ORPHAN_CACHES)
    return sbx_err(err, "RESOURCE_LIMIT",
                   "this machine keeps %d bucket caches of mounts gone (destroyed sandboxes' too) whose changes their "
                   "bucket has not taken: no new bucket cache until some are uploaded or deleted from %s/bucket-cache",
                   SBX_MAX_ORPHAN_CACHES, sbx_engine_cfg()->state_dir);
  return 0;
}

/* ---- the helper: a child inside the sandbox, as its root ----------------------- */

typedef enum { H_ATTACH, H_FUSE_ROOTLESS, H_LOCAL_ROOTLESS, H_UMOUNT } helper_op;

typedef struct helper {
  helper_op op;
  int pidfd;            /* the sandbox's init */
  const char *path;     /* inside */
  int mfd;              /* H_ATTACH: a detached mount; H_UMOUNT: an attached one */
  const char *host_dir; /* H_LOCAL_ROOTLESS, and the part of it mounted: */
  const char *prefix;
  bool read_only;
} helper;

static _Noreturn void helper_fail(int sock, const char *what) {
  char msg[600];
  int n = snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
  send(sock, msg, (size_t)n, MSG_NOSIGNAL);
  _exit(1);
}

static uint64_t mount_flags(bool ro) { return MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (ro ? MOUNT_ATTR_RDONLY : 0); }

/* A new FUSE filesystem for a bucket server, detached: its mount fd, and
 * the /dev/fuse fd the server reads (in *devfd). */
static int fuse_detached(uid_t owner, bool ro, int *devfd) {
  *devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (*devfd < 0) return -1;
  int fs = fsopen("fuse", FSOPEN_CLOEXEC);
  char opt[32];
  int r = fs < 0 ? -1 : 0;
  snprintf(opt, sizeof opt, "%d", *devfd);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_STRING, "fd", opt, 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_STRING, "rootmode", "40000", 0);
  snprintf(opt, sizeof opt, "%u", (unsigned)owner);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_STRING, "user_id", opt, 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_STRING, "group_id", opt, 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_FLAG, "allow_other", NULL, 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_FLAG, "default_permissions", NULL, 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_SET_STRING, "source", "sbx-bucket", 0);
  if (r == 0) r = fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0);
  int mfd = r == 0 ? fsmount(fs, FSMOUNT_CLOEXEC, (unsigned)mount_flags(ro)) : -1;
  int e = errno;
  if (fs >= 0) close(fs);
  if (mfd < 0) {
    close(*devfd);
    *devfd = -1;
  }
  errno = e;
  return mfd;
}

/* path on the sandbox's root filesystem, as its root sees it */
static int walk_root(const char *path) { return sbx_walk_mkdir(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), path); }

/* The part of a local bucket's tree under prefix (made where missing,
 * through no symlink: the sandboxes that mount the bucket write it), as a
 * detached mount of its own; mfd, the whole tree's, is closed. */
static int prefix_tree(int mfd, const char *prefix) {
  int dfd = sbx_walk_mkdir(openat(mfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC), prefix);
  int sub = dfd < 0 ? -1 : open_tree(dfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  int e = errno;
  if (dfd >= 0) close(dfd);
  close(mfd);
  errno = e;
  return sub;
}

/* Makes path (as the sandbox's root, never through a symlink nor into
 * another mount) and moves the mount there. */
static void attach_at(int sock, int mfd, const char *path) {
  int dfd = walk_root(path);
  if (dfd < 0)
    helper_fail(sock, errno == ELOOP  ? "mountPath goes through a symlink"
                      : errno == EXDEV ? "mountPath is inside another mount (a bucket, or a system directory such as /opt)"
                                       : "making mountPath");
  if (move_mount(mfd, "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
    helper_fail(sock, "mounting at mountPath");
}

static _Noreturn void helper_main(const helper *h, int sock) {
  if (setns(h->pidfd, CLONE_NEWUSER) < 0) helper_fail(sock, "joining the sandbox's user namespace");
  if (setgroups(0, NULL) < 0 && errno != EPERM) helper_fail(sock, "setgroups");
  if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) helper_fail(sock, "becoming the sandbox's root");
  int fds[2], nfds = 0, devfd = -1, mfd = h->mfd;
  switch (h->op) {
  case H_FUSE_ROOTLESS: /* /dev/fuse from the host, the filesystem in the sandbox's namespaces */
    if ((devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC)) < 0) helper_fail(sock, "opening /dev/fuse");
    if (setns(h->pidfd, CLONE_NEWNS) < 0) helper_fail(sock, "joining the sandbox's mount namespace");
    close(devfd);
    if ((mfd = fuse_detached(0, h->read_only, &devfd)) < 0) helper_fail(sock, "making the FUSE mount");
    fds[nfds++] = devfd;
    fds[nfds++] = mfd;
    break;
  case H_LOCAL_ROOTLESS: /* a mount namespace of our own, where the host's directory may be cloned */
    if (unshare(CLONE_NEWNS) < 0) helper_fail(sock, "unshare");
    if ((mfd = open_tree(AT_FDCWD, h->host_dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)) < 0)
      helper_fail(sock, "cloning the bucket's directory");
    if (*h->prefix && (mfd = prefix_tree(mfd, h->prefix)) < 0)
      helper_fail(sock, errno == ELOOP ? "prefix goes through a symlink" : "reaching prefix in the bucket");
    struct mount_attr a = {.attr_set = mount_flags(h->read_only)};
    if (mount_setattr(mfd, "", AT_EMPTY_PATH, &a, sizeof a) < 0) helper_fail(sock, "mount_setattr");
    if (setns(h->pidfd, CLONE_NEWNS) < 0) helper_fail(sock, "joining the sandbox's mount namespace");
    attach_at(sock, mfd, h->path);
    fds[nfds++] = mfd; /* the daemon keeps it: how the mount is found again */
    break;
  case H_ATTACH:
    if (setns(h->pidfd, CLONE_NEWNS) < 0) helper_fail(sock, "joining the sandbox's mount namespace");
    attach_at(sock, mfd, h->path);
    break;
  case H_UMOUNT: { /* by its fd, not by a path the sandbox may have moved or redirected */
    int proc = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC); /* the host's: this process is "self" there */
    if (setns(h->pidfd, CLONE_NEWNS) < 0) helper_fail(sock, "joining the sandbox's mount namespace");
    char self[64];
    snprintf(self, sizeof self, "self/fd/%d", h->mfd);
    /* "self" in the host's /proc is this process; EINVAL: not mounted here any more */
    if (proc < 0 || fchdir(proc) < 0 || (umount2(self, MNT_DETACH) < 0 && errno != EINVAL)) helper_fail(sock, "unmounting");
    break;
  }
  }
  sbx_send_fds(sock, "ok", 2, fds, nfds, 0);
  _exit(0);
}

/* Runs the helper and waits for it (briefly: it makes no request anywhere).
 * fds_out gets what it sends back (H_FUSE_ROOTLESS: devfd, mfd). */
static int run_helper(sbx_sandbox *sb, helper *h, int fds_out[2], sbx_error *err) {
  if (sb->init_pidfd < 0) return sbx_err(err, "MOUNT_FAILED", "sandbox '%s' is not running", sb->id);
  h->pidfd = sb->init_pidfd;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return sbx_err_errno(err, "INTERNAL", errno, "socketpair");
  int pidfd = -1;
  pid_t pid = sbx_fork_child(0, &pidfd);
  if (pid < 0) {
    close(sv[0]), close(sv[1]);
    return sbx_err_errno(err, "INTERNAL", errno, "fork");
  }
  if (pid == 0) {
    close(sv[0]);
    helper_main(h, sv[1]);
  }
  close(sv[1]);
  char buf[600] = "";
  struct pollfd p = {.fd = sv[0], .events = POLLIN};
  ssize_t n = -1;
  int got[2] = {-1, -1};
  if (poll(&p, 1, HELPER_TIMEOUT_MS) == 1) n = sbx_recv_fds(sv[0], buf, sizeof buf - 1, got, 2, NULL, 0);
  close(sv[0]);
  sbx_pidfd_send_signal(pidfd, SIGKILL); /* done or stuck: either way gone */
  siginfo_t si;
  while (waitid(P_PIDFD, pidfd, &si, WEXITED) < 0 && errno == EINTR) {
  }
  close(pidfd);
  if (n > 0) buf[n] = 0;
  if (n <= 0 || strcmp(buf, "ok")) {
    for (int i = 0; i < 2; i++)
      if (got[i] >= 0) close(got[i]);
    return sbx_err(err, "MOUNT_FAILED", "%s", n > 0 ? buf : "the mount helper did not answer");
  }
  if (fds_out) fds_out[0] = got[0], fds_out[1] = got[1];
  else
    for (int i = 0; i < 2; i++)
      if (got[i] >= 0) close(got[i]);
  return 0;
}

/* The fd that pinned b's mount is let go (the mount stays where it is). */
static void unpin(sbx_bucket *b) {
  if (b->attached) close(b->mfd);
  b->attached = false;
}

/* b's mount is attached in the running sandbox: a copy of mfd, an fd of
 * that mount, is kept until it is detached or the sandbox stops. */
static void attached(sbx_bucket *b, int mfd) {
  int fd = fcntl(mfd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return; /* it stays until the sandbox stops */
  unpin(b);
  b->mfd = fd;
  b->attached = true;
}

/* Detaches b's mount from the sandbox by its fd, not by its path (which
 * the sandbox can rename, or lead elsewhere with a symlink). */
static int detach(sbx_sandbox *sb, sbx_bucket *b, sbx_error *err) {
  if (!b->attached) return 0; /* nothing of it mounted in this start */
  helper h = {.op = H_UMOUNT, .mfd = b->mfd};
  if (run_helper(sb, &h, NULL, err) < 0) return -1;
  unpin(b);
  return 0;
}

static void unpend(sbx_bucket *b);

void sbx_bucket_stopped(sbx_sandbox *sb) {
  for (sbx_bucket *b = sb->buckets; b; b = b->next) { /* the mount goes with its namespace */
    unpin(b);
    unpend(b);
  }
}

/* A mount taken out of the record. */
static void bucket_free(sbx_bucket *b) {
  unpin(b);
  unpend(b);
  free(b);
}

/* ---- bucket servers ---------------------------------------------------------- */

static bool shutting_down; /* sbx_bucket_shutdown */

typedef struct waiter {
  sbx_bucket_cb cb;
  void *ud;
  struct waiter *next;
} waiter;

typedef struct bproc {
  uv_poll_t exit_poll, status_poll;
  uv_timer_t timer;
  int pidfd, status_fd;
  pid_t pid;
  char sandbox[64];
  char id[17];
  uint64_t incarnation;
  sbx_cgroup cg;
  int mfd;          /* --check: the mount, attached once the bucket answered */
  sbx_bucket_cb cb; /* --check: told of the answer */
  void *ud;
  waiter *waiters;  /* told when it exits (unmountBucket) */
  bool checking, flush_only, exited;
  bool counted; /* --check: in its sandbox's running count until it answers */
  bool refused; /* --check: the bucket did not mount */
  int handles;
  struct bproc *next;
} bproc;

static bproc *procs;
static struct {
  char key[96];
  uint64_t at[RESTARTS_PER_MINUTE];
} restarts[64];

static bproc *proc_find(const char *sandbox, const char *id) {
  for (bproc *p = procs; p; p = p->next)
    if (!p->exited && !strcmp(p->sandbox, sandbox) && !strcmp(p->id, id)) return p;
  return NULL;
}

static sbx_bucket *spec_find(sbx_sandbox *sb, const char *id) {
  for (sbx_bucket *b = sb ? sb->buckets : NULL; b; b = b->next)
    if (!strcmp(b->id, id)) return b;
  return NULL;
}

static void proc_handle_closed(uv_handle_t *h) {
  bproc *p = h->data;
  if (--p->handles) return;
  for (bproc **pp = &procs; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  sbx_cg_free(&p->cg);
  free(p);
}

static void proc_close(bproc *p) {
  if (p->status_fd >= 0) {
    uv_poll_stop(&p->status_poll);
    uv_close((uv_handle_t *)&p->status_poll, proc_handle_closed);
  }
  uv_poll_stop(&p->exit_poll);
  uv_close((uv_handle_t *)&p->exit_poll, proc_handle_closed);
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, proc_handle_closed);
  if (p->status_fd >= 0) close(p->status_fd);
  p->status_fd = -1;
}

/* A mount that did not come about leaves no trace in the record. */
/* Takes b (if any) out of sb's list and frees it. */
static void drop(sbx_sandbox *sb, sbx_bucket *b) {
  for (sbx_bucket **pp = &sb->buckets; b && *pp; pp = &(*pp)->next)
    if (*pp == b) {
      *pp = b->next;
      bucket_free(b);
      return;
    }
}

static void forget_spec(const char *sandbox, const char *id) {
  sbx_sandbox *sb = sbx_sandbox_find(sandbox);
  sbx_bucket *b = spec_find(sb, id);
  if (!b) return;
  drop(sb, b);
  sbx_sandbox_save(sb);
}

static void check_answered(bproc *p, const sbx_error *err) {
  if (!p->checking) return;
  p->checking = false;
  sbx_sandbox *sb = p->counted ? sbx_sandbox_find(p->sandbox) : NULL;
  if (sb && sb->running > 0) sb->running--;
  if (sb) sbx_sandbox_touch(sb); /* its idle time counts from the answer, as a command's from its end */
  p->counted = false;
  p->refused = err != NULL;
  if (err) forget_spec(p->sandbox, p->id);
  if (p->mfd >= 0) close(p->mfd); /* attached by now, or never to be */
  p->mfd = -1;
  uv_timer_stop(&p->timer);
  if (p->cb) p->cb(p->ud, err, err ? NULL : "mounted");
  p->cb = NULL;
}

static void remount(sbx_sandbox *sb, sbx_bucket *b, bool replace);

static bool may_restart(const char *sandbox, const char *id) {
  char key[96];
  snprintf(key, sizeof key, "%s/%s", sandbox, id);
  uint64_t now = sbx_now_ms();
  size_t slot = 0;
  for (size_t i = 0; i < SBX_ARRAY_SIZE(restarts); i++)
    if (!strcmp(restarts[i].key, key)) {
      slot = i;
      goto found;
    } else if (!restarts[i].key[0]) {
      slot = i;
    }
  snprintf(restarts[slot].key, sizeof restarts[slot].key, "%s", key);
  memset(restarts[slot].at, 0, sizeof restarts[slot].at);
found:;
  int recent = 0, oldest = 0;
  for (int i = 0; i < RESTARTS_PER_MINUTE; i++) {
    if (restarts[slot].at[i] && now - restarts[slot].at[i] < 60000) recent++;
    if (restarts[slot].at[i] < restarts[slot].at[oldest]) oldest = i;
  }
  if (recent >= RESTARTS_PER_MINUTE) return false;
  restarts[slot].at[oldest] = now;
  return true;
}

static void proc_exited(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  bproc *p = h->data;
  siginfo_t si = {0};
  if (waitid(P_PIDFD, p->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0) return;
  p->exited = true;
  uv_poll_stop(&p->exit_poll); /* before its fd goes: a new server may get the same number */
  close(p->pidfd);
  p->pidfd = -1;
  bool clean = si.si_code == CLD_EXITED && (si.si_status == 0 || si.si_status == EXIT_LEFT_JOURNALED);
  int code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
  if (p->checking) {
    char msg[600] = "";
    ssize_t n = p->status_fd >= 0 ? read(p->status_fd, msg, sizeof msg - 1) : -1;
    if (n > 4 && !strncmp(msg, "err ", 4)) {
      msg[n] = 0;
      msg[strcspn(msg, "\n")] = 0;
      sbx_error e;
      sbx_err(&e, "MOUNT_FAILED", "bucket did not mount: %s", msg + 4);
      check_answered(p, &e);
    } else {
      sbx_error e;
      sbx_err(&e, "MOUNT_FAILED", "the bucket filesystem ended before the bucket answered (exit %d)", code);
      check_answered(p, &e);
    }
  }
  if (p->cg.n) sbx_cg_remove(&p->cg);
  for (waiter *w = p->waiters, *next; w; w = next) {
    next = w->next;
    w->cb(w->ud, NULL,
          code == 0 ? "unmounted; every change is in the bucket"
                    : code == EXIT_LEFT_JOURNALED ? "unmounted; some changes could not reach the bucket yet: they are kept "
                                                    "and uploaded by the next mount of it or the next daemon start"
                                                  : "unmounted; its server ended abnormally: changes it had not uploaded "
                                                    "are kept and uploaded by the next mount or daemon start");
    free(w);
  }
  p->waiters = NULL;
  sbx_sandbox *sb = sbx_sandbox_find(p->sandbox);
  sbx_bucket *b = spec_find(sb, p->id);
  if (b && b->pending && sb->incarnation == p->incarnation) b->served = false; /* its start mounts it anew */
  if (shutting_down) {
    /* its sandbox's mounts are gone from memory, not from its record: the
     * cache (and the configuration in it) is the next daemon's to mount */
  } else if (!b && code == 0 && !p->flush_only && !proc_find(p->sandbox, p->id)) {
    remove_cache(p->sandbox, p->id); /* unmounted or destroyed, and all of it is in the bucket */
  } else if (!b && p->flush_only && code == 0 && !proc_find(p->sandbox, p->id)) {
    remove_cache(p->sandbox, p->id);
  } else if (!b && p->refused && !proc_find(p->sandbox, p->id) && journal_empty(p->sandbox, p->id)) {
    remove_cache(p->sandbox, p->id); /* a mount that never was: its cache counted against the sandbox's 8 */
  } else if (b && !clean && !p->flush_only && sb->incarnation == p->incarnation && sbx_sandbox_alive(sb)) {
    /* the server died under a live mount: a new one takes over its journal */
    if (may_restart(p->sandbox, p->id)) {
      warn_sandbox(NULL, "bucket server of %s:%s ended (status %d); mounting it again", p->sandbox, b->mount_path, code);
      remount(sb, b, true);
    } else {
      warn_sandbox(p->sandbox, "bucket server of %s:%s keeps ending (status %d); left unmounted", p->sandbox, b->mount_path, code);
    }
  }
  proc_close(p);
}

static void status_readable(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  bproc *p = h->data;
  char msg[600];
  ssize_t n = read(p->status_fd, msg, sizeof msg - 1);
  if (n < 0 && errno == EAGAIN) return;
  uv_poll_stop(h);
  if (n <= 0) return; /* its exit says what happened */
  msg[n] = 0;
  msg[strcspn(msg, "\n")] = 0;
  if (!p->checking) return;
  if (strcmp(msg, "ok")) {
    sbx_error e;
    sbx_err(&e, "MOUNT_FAILED", "bucket did not mount: %s", !strncmp(msg, "err ", 4) ? msg + 4 : msg);
    return check_answered(p, &e);
  }
  /* the bucket answered: the mount goes into the sandbox now */
  sbx_sandbox *sb = sbx_sandbox_find(p->sandbox);
  sbx_bucket *b = spec_find(sb, p->id);
  sbx_error e = {0};
  if (!b || !sb || sb->incarnation != p->incarnation || !sbx_sandbox_alive(sb)) {
    sbx_err(&e, "MOUNT_FAILED", "sandbox '%s' stopped while the bucket was being mounted", p->sandbox);
  } else {
    helper h = {.op = H_ATTACH, .path = b->mount_path, .mfd = p->mfd};
    if (run_helper(sb, &h, NULL, &e) == 0) attached(b, p->mfd);
  }
  check_answered(p, e.code ? &e : NULL); /* a half-made mount goes with its fd, and its server with it */
}

static void check_timeout(uv_timer_t *t) {
  bproc *p = t->data;
  if (!p->checking) return;
  sbx_error e;
  sbx_err(&e, "MOUNT_FAILED", "the bucket did not answer within %d s", CHECK_TIMEOUT_MS / 1000);
  if (p->pidfd >= 0) sbx_pidfd_send_signal(p->pidfd, SIGKILL);
  check_answered(p, &e);
}

/* The configuration a server reads on stdin (with the credentials). */
static char *server_config(const sbx_bucket *b, const char *ak, const char *sk, uid_t uid_base, uint64_t cache_mb) {
  json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:b, s:b, s:s, s:I, s:I}", "endpoint", b->endpoint, "bucket",
                        b->bucket, "region", b->region, "prefix", b->prefix, "accessKeyId", ak, "secretAccessKey", sk,
                        "pathStyle", b->path_style, "publicOnly", b->public_only, "readOnly", b->read_only, "cacheDir",
                        ".", "cacheMaxMB", (json_int_t)cache_mb, "uidBase", (json_int_t)uid_base);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return s;
}

/* Starts `sbx bucketfs` on a cache directory: config on its stdin, the
 * FUSE connection as fd 3 (or none for --flush), "ok"/"err" on fd 4.
 * cpus: the sandbox's own limit, which the server gets too (0: none). */
static bproc *spawn_server(const char *sandbox, const char *id, const char *config, int devfd, const char *mode,
                           double cpus, sbx_error *err) {
  const sbx_engine_config *ec = sbx_engine_cfg();
  char dir[1400];
  cache_dir(sandbox, id, dir, sizeof dir);
  if (exe_fd < 0) exe_fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
  int in[2] = {-1, -1}, st[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(st, O_CLOEXEC | O_NONBLOCK) < 0) {
    sbx_err_errno(err, "INTERNAL", errno, "pipe");
    goto fail;
  }
  bproc *p = calloc(1, sizeof *p);
  if (!p) {
    sbx_err(err, "INTERNAL", "out of memory");
    goto fail;
  }
  snprintf(p->sandbox, sizeof p->sandbox, "%s", sandbox);
  snprintf(p->id, sizeof p->id, "%s", id);
  p->mfd = -1;
  p->status_fd = st[0];
  /* its own cgroup: its memory (the cache's page cache too) is bounded and
   * charged to no sandbox and not to the daemon, and its CPU is bounded
   * as its sandbox's is (what the sandbox makes it do, a listing of a
   * huge directory in a loop, is otherwise free for the sandbox) */
  int cgfds[SBX_CG_MAX], ncg = 0;
  if (!ec->rootless && sbx_cg_available()) {
    static uint64_t seq;
    char name[160];
    snprintf(name, sizeof name, "bucketfs-%s-%s-%llu", sandbox, id, (unsigned long long)++seq);
    sbx_limits lim = {.memory_mb = 512, .pids = 256, .cpus = cpus};
    if (sbx_cg_create(NULL, name, true, &p->cg) == 0 && sbx_cg_apply(&p->cg, &lim) == 0)
      ncg = sbx_cg_open_procs(&p->cg, cgfds);
    if (ncg < 0) ncg = 0;
  }
  int pidfd = -1;
  pid_t pid = sbx_fork_child(0, &pidfd);
  if (pid < 0) {
    sbx_err_errno(err, "INTERNAL", errno, "fork");
    for (int i = 0; i < ncg; i++) close(cgfds[i]);
    if (p->cg.n) sbx_cg_remove(&p->cg);
    sbx_cg_free(&p->cg);
    free(p);
    goto fail;
  }
  if (pid == 0) {
    /* it may outlive the daemon: it finishes its uploads, then ends */
    prctl(PR_SET_PDEATHSIG, 0);
    for (int i = 0; i < ncg; i++)
      if (write(cgfds[i], "0", 1) != 1) _exit(120);
    setsid();
    if (chdir(dir) < 0) _exit(121);
    if (!ec->rootless && (setgroups(0, NULL) < 0 || setresgid(BUCKETFS_UID, BUCKETFS_UID, BUCKETFS_UID) < 0 ||
                          setresuid(BUCKETFS_UID, BUCKETFS_UID, BUCKETFS_UID) < 0))
      _exit(122);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int keep[5] = {in[0], null, 2, devfd >= 0 ? devfd : null, st[1]};
    int tmp[5];
    for (int i = 0; i < 5; i++) tmp[i] = fcntl(keep[i], F_DUPFD_CLOEXEC, 16);
    for (int i = 0; i < 5; i++)
      if (dup2(tmp[i], i) < 0) _exit(123);
    if (dup3(exe_fd, 5, O_CLOEXEC) < 0) _exit(124);
    close_range(6, ~0U, 0);
    sbx_child_unblock();
    char *argv[] = {"sbx", "bucketfs", (char *)mode, NULL};
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", NULL};
    if (!mode[0]) argv[2] = NULL;
    syscall(SYS_execveat, 5, "", argv, envp, AT_EMPTY_PATH);
    _exit(127);
  }
  for (int i = 0; i < ncg; i++) close(cgfds[i]);
  close(in[0]);
  close(st[1]);
  int r = sbx_write_all(in[1], config, strlen(config)); /* far below a pipe's 64 KiB */
  close(in[1]);
  (void)r;
  p->pid = pid;
  p->pidfd = pidfd;
  uv_loop_t *loop = ec->loop;
  p->handles = 2;
  uv_poll_init(loop, &p->exit_poll, pidfd);
  p->exit_poll.data = p;
  uv_poll_start(&p->exit_poll, UV_READABLE, proc_exited);
  uv_timer_init(loop, &p->timer);
  p->timer.data = p;
  if (p->status_fd >= 0) {
    p->handles++;
    uv_poll_init(loop, &p->status_poll, p->status_fd);
    p->status_poll.data = p;
    uv_poll_start(&p->status_poll, UV_READABLE, status_readable);
  }
  p->next = procs;
  procs = p;
  return p;
fail:
  for (int i = 0; i < 2; i++) {
    if (in[i] >= 0) close(in[i]);
    if (st[i] >= 0) close(st[i]);
  }
  return NULL;
}

/* The cache directory of a mount, owned by the servers' user, and beside it
 * the server's configuration (root's, 0600: it holds the credentials). */
static int write_cache_config(const char *sandbox, const sbx_bucket *b, const char *config, sbx_error *err) {
  char dir[1400], conf[1400];
  cache_dir(sandbox, b->id, dir, sizeof dir);
  cache_conf(sandbox, b->id, conf, sizeof conf);
  int r = sbx_mkdir_p(dir, 0700);
  if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "making %s", dir);
  if (!sbx_engine_cfg()->rootless && chown(dir, BUCKETFS_UID, BUCKETFS_UID) < 0)
    return sbx_err_errno(err, "INTERNAL", errno, "chown %s", dir);
  r = sbx_write_atomic(conf, config, strlen(config));
  if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "writing %s", conf);
  return 0;
}

/* A server's saved configuration; for a running sandbox, with the ids of
 * its current uid range (a start may give it another one). */
static char *read_cache_config(const char *sandbox, const char *id, const sbx_sandbox *sb) {
  char conf[1400];
  cache_conf(sandbox, id, conf, sizeof conf);
  json_t *j = json_load_file(conf, 0, NULL);
  if (j && sb) json_object_set_new(j, "uidBase", json_integer(sbx_engine_cfg()->rootless ? 0 : sb->uid_base));
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  return s;
}

/* The FUSE mount of a server, detached, and the fd the server serves. */
static int make_fuse(sbx_sandbox *sb, const sbx_bucket *b, int *devfd, sbx_error *err) {
  if (!sbx_engine_cfg()->rootless) {
    int mfd = fuse_detached(sb->uid_base, b->read_only, devfd);
    if (mfd < 0) return sbx_err_errno(err, "MOUNT_FAILED", errno, "making the FUSE mount");
    return mfd;
  }
  helper h = {.op = H_FUSE_ROOTLESS, .read_only = b->read_only};
  int fds[2] = {-1, -1};
  if (run_helper(sb, &h, fds, err) < 0) {
    if (access("/dev/fuse", R_OK | W_OK) < 0)
      snprintf(err->message + strlen(err->message), sizeof err->message - strlen(err->message),
               " (a rootless daemon needs /dev/fuse readable and writable by its user)");
    return -1;
  }
  *devfd = fds[0];
  return fds[1];
}

static uint64_t local_mb(void) {
  const sbx_config *c = sbx_config_get();
  return c && c->local_mb ? c->local_mb : SBX_LOCAL_MB_DEFAULT;
}

/* What local buckets' images may still take (MB): each can grow to its
 * size, so sizes are counted, not blocks in use. */
static uint64_t local_budget_left(const char *dir) {
  uint64_t used = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    struct stat st;
    if (l > 4 && !strcmp(e->d_name + l - 4, ".img") && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
      used += (uint64_t)st.st_size >> 20;
  }
  if (d) closedir(d);
  return used >= local_mb() ? 0 : local_mb() - used;
}

/* A local bucket, as root with loop devices: an ext4 image of its own
 * ($SBX_STATE_DIR/buckets/NAME.img), sized by the diskMB of the sandbox
 * that made it, so that a sandbox cannot fill the host's disk through it;
 * every sandbox that mounts it shares its filesystem. A directory
 * (buckets/NAME/) where there is one already (a bucket made before), and
 * rootless (made here). Returns a detached mount, -2 rootless (the
 * directory is ready for the helper to bind), or -1. */
static int local_tree(sbx_sandbox *sb, const sbx_bucket *b, const char *parent, const char *dir, sbx_error *err) {
  char img[1410];
  snprintf(img, sizeof img, "%s.img", dir);
  struct stat st;
  if (sbx_disk_quota_enforced() && stat(dir, &st) < 0) {
    if (stat(img, &st) < 0 && local_budget_left(parent) < sb->opts.limits.disk_mb)
      return sbx_err(err, "RESOURCE_LIMIT",
                     "a new local bucket of %llu MB (the sandbox's diskMB) would take the local buckets past "
                     "buckets.localMB (%llu MB): mount one that exists, or have one deleted from %s",
                     (unsigned long long)sb->opts.limits.disk_mb, (unsigned long long)local_mb(), parent);
    if (sbx_disk_make_image(img, sb->opts.limits.disk_mb, err) < 0) return -1;
    char what[200];
    snprintf(what, sizeof what, "local bucket %s", b->bucket);
    int m = sbx_disk_mount_image(img, what, err);
    if (m < 0) return -1;
    unlinkat(m, "lost+found", AT_REMOVEDIR); /* mkfs's, not the bucket's (gone once, while empty) */
    return m;
  }
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) return sbx_err_errno(err, "MOUNT_FAILED", errno, "making %s", dir);
  if (sbx_engine_cfg()->rootless) return -2; /* the directory is ready: the helper binds it */
  int mfd = open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (mfd < 0) return sbx_err_errno(err, "MOUNT_FAILED", errno, "cloning %s", dir);
  return mfd;
}

static int mount_local(sbx_sandbox *sb, sbx_bucket *b, sbx_error *err) {
  char dir[1400], parent[1400];
  local_dir(b->bucket, dir, sizeof dir);
  snprintf(parent, sizeof parent, "%s/buckets", sbx_engine_cfg()->state_dir);
  sbx_mkdir_p(parent, 0700);
  /* stored as the sandbox sees them (root is 0): owners survive a new uid range */
  int mfd = local_tree(sb, b, parent, dir, err);
  if (mfd == -2) {
    helper h = {.op = H_LOCAL_ROOTLESS, .path = b->mount_path, .host_dir = dir, .prefix = b->prefix, .read_only = b->read_only};
    int fds[2] = {-1, -1};
    if (run_helper(sb, &h, fds, err) < 0) return -1;
    if (fds[0] >= 0) attached(b, fds[0]), close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    return 0;
  }
  if (mfd < 0) return -1;
  if (b->prefix[0] && (mfd = prefix_tree(mfd, b->prefix)) < 0)
    return sbx_err_errno(err, "MOUNT_FAILED", errno, "%s prefix %s of local bucket %s",
                         errno == ELOOP ? "a symlink is on the way to" : "reaching", b->prefix, b->bucket);
  char ns[64];
  snprintf(ns, sizeof ns, "/proc/%d/ns/user", sb->init_pid);
  int userns = open(ns, O_RDONLY | O_CLOEXEC);
  struct mount_attr a = {.attr_set = mount_flags(b->read_only) | MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)userns};
  int r = userns < 0 ? -1 : mount_setattr(mfd, "", AT_EMPTY_PATH, &a, sizeof a);
  int e = errno;
  if (userns >= 0) close(userns);
  if (r < 0) {
    close(mfd);
    return sbx_err_errno(err, "MOUNT_FAILED", e, "idmapping local bucket %s", b->bucket);
  }
  helper h = {.op = H_ATTACH, .path = b->mount_path, .mfd = mfd};
  r = run_helper(sb, &h, NULL, err);
  if (r == 0) attached(b, mfd);
  close(mfd);
  return r;
}

/* A server and its mount for a bucket of the record (a start, or a server
 * that died): no check, the bucket may be away and the mount works on. */
static void remount(sbx_sandbox *sb, sbx_bucket *b, bool replace) {
  sbx_error err = {0};
  if (b->local) {
    if (mount_local(sb, b, &err) < 0)
      warn_sandbox(sb->id, "bucket %s at %s:%s is not mounted: %s", b->bucket, sb->id, b->mount_path, err.message);
    return;
  }
  char *config = read_cache_config(sb->id, b->id, sb);
  if (!config) {
    warn_sandbox(sb->id, "bucket %s at %s:%s is not mounted: its configuration is gone from the state dir; unmountBucket "
                 "and mount it again", b->bucket, sb->id, b->mount_path);
    return;
  }
  if (replace) detach(sb, b, NULL); /* the dead server's mount answers "not connected": detach it */
  int devfd = -1;
  int mfd = make_fuse(sb, b, &devfd, &err);
  bproc *p = mfd < 0 ? NULL : spawn_server(sb->id, b->id, config, devfd, "", sb->opts.limits.cpus, &err);
  free(config);
  if (devfd >= 0) close(devfd);
  if (p) {
    p->incarnation = sb->incarnation;
    helper h = {.op = H_ATTACH, .path = b->mount_path, .mfd = mfd};
    if (run_helper(sb, &h, NULL, &err) == 0) attached(b, mfd); /* on failure the mount goes with mfd, and its server ends */
  }
  if (mfd >= 0) close(mfd);
  if (err.code) warn_sandbox(sb->id, "bucket %s at %s:%s is not mounted: %s", b->bucket, sb->id, b->mount_path, err.message);
}

/* A mount whose mountBucket check still runs: the check attaches it, or
 * drops it from the list; a start leaves it alone. */
static bool being_checked(const sbx_sandbox *sb, const sbx_bucket *b) {
  bproc *p = proc_find(sb->id, b->id);
  return p && p->checking;
}

int sbx_bucket_start_mounts(sbx_sandbox *sb, const char *paths[], int mfds[]) {
  int n = 0;
  if (sbx_engine_cfg()->rootless) return 0; /* made in the sandbox's namespaces: after the start */
  for (sbx_bucket *b = sb->buckets; b && n < SBX_INIT_MOUNTS_MAX; b = b->next) {
    if (b->local || b->pending || being_checked(sb, b)) continue;
    sbx_error err = {0};
    char *config = read_cache_config(sb->id, b->id, sb);
    int devfd = -1, mfd = config ? make_fuse(sb, b, &devfd, &err) : -1;
    int copy = mfd < 0 ? -1 : fcntl(mfd, F_DUPFD_CLOEXEC, 3);
    if (copy < 0) { /* the start's end tries again, and says what failed */
      if (mfd >= 0) close(mfd), close(devfd);
      free(config);
      continue;
    }
    b->pending = true;
    b->served = false;
    b->pmfd = mfd;
    b->pdevfd = devfd;
    b->pconfig = config;
    b->init_slot = n;
    paths[n] = b->mount_path;
    mfds[n++] = copy;
  }
  return n;
}

void sbx_bucket_start_servers(sbx_sandbox *sb) {
  for (sbx_bucket *b = sb->buckets; b; b = b->next) {
    if (!b->pending || b->pdevfd < 0) continue;
    sbx_error err = {0};
    bproc *p = spawn_server(sb->id, b->id, b->pconfig, b->pdevfd, "", sb->opts.limits.cpus, &err);
    close(b->pdevfd);
    b->pdevfd = -1;
    free(b->pconfig);
    b->pconfig = NULL;
    if (p) p->incarnation = sb->incarnation;
    b->served = p != NULL;
  }
}

/* A start's mount let go: the start failed, or it is attached (or not)
 * and in b->mfd. */
static void unpend(sbx_bucket *b) {
  if (!b->pending) return;
  close(b->pmfd);
  if (b->pdevfd >= 0) close(b->pdevfd);
  free(b->pconfig);
  b->pending = false;
}

void sbx_bucket_start_all(sbx_sandbox *sb, const char *in) {
  int given = (int)strlen(in);
  for (sbx_bucket *b = sb->buckets; b; b = b->next) {
    if (being_checked(sb, b)) continue;
    if (!b->pending) {
      remount(sb, b, false);
      continue;
    }
    bool there = b->init_slot < given && in[b->init_slot] == '1';
    sbx_error err = {0};
    if (there) {
      attached(b, b->pmfd);
    } else if (b->served) { /* a helper tries: it says why not */
      helper h = {.op = H_ATTACH, .path = b->mount_path, .mfd = b->pmfd};
      if (run_helper(sb, &h, NULL, &err) == 0) attached(b, b->pmfd);
    }
    bool served = b->served;
    unpend(b); /* not attached: the mount goes with its fd, and its server ends */
    if (err.code) warn_sandbox(sb->id, "bucket %s at %s:%s is not mounted: %s", b->bucket, sb->id, b->mount_path, err.message);
    else if (!served) remount(sb, b, there); /* no server (or it died already): all of it again */
  }
}

/* ---- mountBucket / unmountBucket -------------------------------------------- */

static bool nested(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  return la <= lb ? !strncmp(a, b, la) && (b[la] == '/' || !b[la]) : !strncmp(a, b, lb) && a[lb] == '/';
}

int sbx_bucket_mount(sbx_sandbox *sb, const sbx_bucket_req *r, sbx_bucket_cb cb, void *ud, sbx_error *err) {
  sbx_bucket spec;
  char ak[256], sk[256];
  if (sbx_bucket_prepare(r, &spec, ak, sk, err) < 0) return -1;
  int n = 0;
  sbx_bucket *stale = NULL;
  for (sbx_bucket *b = sb->buckets; b; b = b->next, n++) {
    if (!strcmp(b->mount_path, spec.mount_path) && !strcmp(b->id, spec.id) && b->read_only == spec.read_only) {
      if (b->attached || proc_find(sb->id, b->id)) { /* mounted, or being mounted */
        explicit_bzero(sk, sizeof sk);
        cb(ud, NULL, "already mounted");
        return 0;
      }
      /* in the record but not mounted (its server could not start it
       * again: the bucket away, its configuration lost): mounted afresh,
       * with what this call gives; it stays in the record until the new
       * mount takes its place, and its cache (a journal, perhaps) stays */
      stale = b;
      n--;
      continue;
    }
    if (nested(b->mount_path, spec.mount_path)) {
      explicit_bzero(sk, sizeof sk);
      return sbx_err(err, "VALIDATION_FAILED", "bucket %s is mounted at %s already; mountPath %s would %s it (unmountBucket first)",
                     b->bucket, b->mount_path, spec.mount_path,
                     !strcmp(b->mount_path, spec.mount_path) ? "replace" : "overlap");
    }
  }
  if (n >= SBX_MAX_BUCKETS) {
    explicit_bzero(sk, sizeof sk);
    return sbx_err(err, "RESOURCE_LIMIT", "a sandbox has at most %d bucket mounts (unmountBucket one first)", SBX_MAX_BUCKETS);
  }
  if (!spec.local && cache_room(sb->id, spec.id, err) < 0) {
    explicit_bzero(sk, sizeof sk);
    return -1;
  }
  sbx_bucket *b = malloc(sizeof *b);
  if (!b) return sbx_err(err, "INTERNAL", "out of memory");
  *b = spec;
  if (spec.local) {
    int rc = mount_local(sb, b, err);
    if (rc < 0) {
      free(b);
      return -1;
    }
    drop(sb, stale);
    b->next = sb->buckets;
    sb->buckets = b;
    sbx_sandbox_save(sb);
    cb(ud, NULL, "mounted");
    return 0;
  }
  const sbx_engine_config *ec = sbx_engine_cfg();
  char *config = server_config(b, ak, sk, ec->rootless ? 0 : sb->uid_base, sb->opts.limits.disk_mb);
  explicit_bzero(sk, sizeof sk);
  int devfd = -1, mfd = -1;
  bproc *p = NULL;
  if (!config || write_cache_config(sb->id, b, config, err) < 0) goto fail;
  if ((mfd = make_fuse(sb, b, &devfd, err)) < 0) goto fail;
  if (!(p = spawn_server(sb->id, b->id, config, devfd, "--check", sb->opts.limits.cpus, err))) goto fail;
  close(devfd);
  explicit_bzero(config, strlen(config));
  free(config);
  p->checking = true;
  p->mfd = mfd;
  p->cb = cb;
  p->ud = ud;
  p->incarnation = sb->incarnation;
  sb->running++; /* not idle while its mount is being checked: a reset would leave it half made */
  p->counted = true;
  uv_timer_start(&p->timer, check_timeout, CHECK_TIMEOUT_MS, 0);
  drop(sb, stale); /* the new one takes its place */
  b->next = sb->buckets; /* in the record now; taken out again if the check fails */
  sb->buckets = b;
  sbx_sandbox_save(sb);
  return 0;
fail:
  if (config) explicit_bzero(config, strlen(config));
  free(config);
  if (devfd >= 0) close(devfd);
  if (mfd >= 0) close(mfd);
  if (!stale) remove_cache(sb->id, b->id); /* (a stale mount's is its own: kept) */
  free(b);
  return -1;
}

int sbx_bucket_unmount(sbx_sandbox *sb, const char *mount_path, sbx_bucket_cb cb, void *ud, sbx_error *err) {
  char abs[1100];
  snprintf(abs, sizeof abs, "%s%s", mount_path[0] == '/' ? "" : "/workspace/", mount_path);
  size_t l = strlen(abs);
  while (l > 1 && abs[l - 1] == '/') abs[--l] = 0;
  sbx_bucket **pp = &sb->buckets;
  while (*pp && strcmp((*pp)->mount_path, abs)) pp = &(*pp)->next;
  if (!*pp) return sbx_err(err, "VALIDATION_FAILED", "no bucket is mounted at %s", abs);
  sbx_bucket *b = *pp;
  bproc *p = proc_find(sb->id, b->id);
  if (p && p->checking) return sbx_err(err, "VALIDATION_FAILED", "the bucket at %s is still being mounted", abs);
  if (sbx_sandbox_alive(sb)) {
    sbx_exec_shells_leave(sb); /* a session's shell in the mount keeps it from going */
    if (detach(sb, b, err) < 0) return -1;
  }
  *pp = b->next;
  sbx_sandbox_save(sb);
  bool local = b->local;
  char id[17];
  snprintf(id, sizeof id, "%s", b->id);
  bucket_free(b);
  if (p) { /* answered once its server has uploaded what it holds */
    waiter *w = calloc(1, sizeof *w);
    if (w) {
      *w = (waiter){.cb = cb, .ud = ud, .next = p->waiters};
      p->waiters = w;
      return 0;
    }
  }
  if (!local && journal_empty(sb->id, id)) remove_cache(sb->id, id);
  cb(ud, NULL, local ? "unmounted; the files stay in the local bucket" : "unmounted");
  return 0;
}

/* ---- lifecycle ------------------------------------------------------------------ */

void sbx_bucket_free_all(sbx_sandbox *sb) {
  for (bproc *p = procs; p; p = p->next)
    if (!strcmp(p->sandbox, sb->id)) p->counted = false; /* its count goes with it */
  while (sb->buckets) {
    sbx_bucket *b = sb->buckets;
    sb->buckets = b->next;
    bucket_free(b);
  }
}

/* Uploads what a server left journaled, in a server of its own. */
static void flush(const char *sandbox, const char *id) {
  char *config = read_cache_config(sandbox, id, NULL);
  if (!config) return;
  sbx_error err = {0};
  bproc *p = spawn_server(sandbox, id, config, -1, "--flush", 1, &err); /* its sandbox may be gone */
  explicit_bzero(config, strlen(config));
  free(config);
  if (p) p->flush_only = true;
  else warn_sandbox(NULL, "bucket cache %s/%s: %s", sandbox, id, err.message);
}

void sbx_bucket_destroyed(sbx_sandbox *sb) {
  for (sbx_bucket *b = sb->buckets; b; b = b->next) {
    if (b->local || proc_find(sb->id, b->id)) continue; /* a running server cleans up once it is done */
    if (journal_empty(sb->id, b->id)) remove_cache(sb->id, b->id);
    else flush(sb->id, b->id);
  }
  sbx_bucket_free_all(sb);
}

/* What an earlier daemon left: journals go up, caches no mount has go. */
static void start_cache(const char *sandbox, sbx_sandbox *sb, const char *id, void *ud) {
  (void)ud;
  if (!journal_empty(sandbox, id)) flush(sandbox, id);
  else if (!spec_find(sb, id)) remove_cache(sandbox, id);
}

void sbx_bucket_init(void) {
  shutting_down = false;
  each_cache(start_cache, NULL);
}

void sbx_bucket_shutdown(void) { shutting_down = true; }
