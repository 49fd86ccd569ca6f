/* A small S3 client over libcurl: objects by key, ranged reads into a file,
 * uploads from a file (multipart for large ones, equal part sizes as R2
 * wants), copies, deletes and ListObjectsV2, signed with SigV4 by curl.
 * Each thread keeps its own curl handle (and connections). */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define S3_PART_SIZE (16u * 1024 * 1024) /* multipart above this, in parts of this size */
#define S3_PARALLEL 4                   /* parts of one upload in flight at once */

typedef struct s3_conf {
  char endpoint[512]; /* scheme://host[:port], no trailing slash */
  char region[64];
  char bucket[64];
  char access_key[256];
  char secret_key[256];
  bool path_style;  /* endpoint/bucket/key (else bucket.host/key) */
  bool public_only; /* refuse connecting to private and other special-purpose addresses */
} s3_conf;

/* What sbx keeps in an object's metadata (x-amz-meta-*). */
typedef struct s3_meta {
  bool valid;
  mode_t mode; /* permission bits, and S_IFLNK for a symlink */
  int64_t mtime_ns;
  uid_t uid;
  gid_t gid;
} s3_meta;

typedef struct s3_stat {
  uint64_t size;
  int64_t mtime_ns;    /* from the metadata when there, else Last-Modified */
  int64_t modified_ns; /* Last-Modified (whole seconds) */
  uint64_t etag;       /* s3_etag_hash of its ETag, 0 when none came */
  s3_meta meta;
} s3_stat;

typedef struct s3_err {
  int errnum;     /* ENOENT, EACCES, EIO, EHOSTUNREACH... */
  int http;       /* 0 when no answer came */
  char code[64];  /* S3's error code, or what failed (DNS, TLS, connect) */
  char msg[300];  /* for people; never holds a secret */
} s3_err;

/* Whether a body sent to the endpoint arrives as sent without its SHA-256
 * in the signature: over TLS, or to this host (loopback by name or dotted
 * address, reached without a proxy). Uploads from a file are sent
 * UNSIGNED-PAYLOAD there. */
bool s3_body_protected(const s3_conf *c);
/* A request's URL: endpoint/bucket/key path-style, else the virtual host
 * bucket.host/key; key URI-encoded, query (already encoded) after '?'. */
void s3_url(const s3_conf *c, const char *key, const char *query, char *out, size_t len);

/* A listing entry: a key (relative to the listed prefix) or, for is_dir, a
 * common prefix without its trailing delimiter. etag: s3_etag_hash of the
 * object's ETag (0: none). */
typedef void (*s3_list_cb)(void *ud, const char *name, bool is_dir, uint64_t size, int64_t mtime_ns, uint64_t etag);

/* An ETag as a number that is never 0: the same for the same ETag however
 * it is quoted (a header's "x", a listing's &quot;x&quot;) or cased; 0 for
 * none. Two objects with the same ETag have the same content. */
uint64_t s3_etag_hash(const char *etag);

void s3_global_init(void);
/* Drops the calling thread's connection now (threads that end drop theirs). */
void s3_thread_done(void);
/* Checks that the bucket answers and the credentials work. */
int s3_check(const s3_conf *c, s3_err *e);
int s3_head(const s3_conf *c, const char *key, s3_stat *st, s3_err *e);
/* Reads [off, off+len) of key into fd at fd_off; *got is what came. More
 * than len (a server that ignores the range) is an error (EIO). */
int s3_get(const s3_conf *c, const char *key, uint64_t off, uint64_t len, int fd, uint64_t fd_off, uint64_t *got,
           s3_err *e);
/* Reads the whole of key into fd from offset 0, and its metadata into st
 * (what a HEAD gives): one request where a HEAD and a GET would be two. An
 * object of more than max bytes is an error (EIO). */
int s3_get_object(const s3_conf *c, const char *key, int fd, uint64_t max, s3_stat *st, uint64_t *got, s3_err *e);
/* Uploads the first size bytes of fd as key (multipart when larger than a
 * part, S3_PARALLEL parts at a time); etag (may be NULL) gets the hash of
 * the object's ETag, 0 when the service named none. */
int s3_put_fd(const s3_conf *c, const char *key, int fd, uint64_t size, const s3_meta *m, uint64_t *etag,
              s3_err *e);
int s3_put_empty(const s3_conf *c, const char *key, const s3_meta *m, s3_err *e);
int s3_put_data(const s3_conf *c, const char *key, const char *data, size_t len, const s3_meta *m, s3_err *e);
int s3_delete(const s3_conf *c, const char *key, s3_err *e);
/* Server-side copy; with m the metadata is replaced (chmod, utimens). */
int s3_copy(const s3_conf *c, const char *from, const char *to, const s3_meta *m, s3_err *e);
/* Every key under prefix (all pages, at most max), split at delim when
 * delim is not NULL. Returns the count or -1. */
long s3_list(const s3_conf *c, const char *prefix, const char *delim, long max, s3_list_cb cb, void *ud, s3_err *e);

/* Helpers, pure (unit-tested): RFC 3986 encoding for keys and query
 * values (keep_slash for paths), and the text of an XML element. */
void s3_uri_encode(const char *in, bool keep_slash, char *out, size_t len);
/* The text of the first <tag>...</tag> at or after *pos in xml, entities
 * decoded, into out; advances *pos past it. false when none. */
bool s3_xml_next(const char *xml, size_t xlen, size_t *pos, const char *tag, char *out, size_t outlen);
/* The whole first <tag>...</tag> element (inner text, raw) at or after *pos. */
bool s3_xml_element(const char *xml, size_t xlen, size_t *pos, const char *tag, const char **inner, size_t *innerlen);
int64_t s3_parse_time(const char *s); /* ISO 8601 or RFC 1123 -> ns since the epoch, -1 */
