#define _GNU_SOURCE
#include "s3.h"
#include "sha256.h"
#include "../sandbox-core/netpolicy.h"
#include "../sandbox-core/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_XML (16u * 1024 * 1024) /* a listing page or an error: bounded */
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* libcurl is loaded by the first request that needs it, not when sbx is
 * executed: its thirty libraries were most of the 17 ms any `sbx` took to
 * start, a bucket server's (which a wake with a bucket mount waits for)
 * and `sbx mcp`'s among them; a server that serves from its cache never
 * loads it. The way systemd loads its optional libraries. */
static struct {
  CURLcode (*global_init)(long);
  CURL *(*easy_init)(void);
  void (*easy_cleanup)(CURL *);
  void (*easy_reset)(CURL *);
  CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
  CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
  CURLcode (*easy_perform)(CURL *);
  const char *(*easy_strerror)(CURLcode);
  struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
  void (*slist_free_all)(struct curl_slist *);
  bool ready;
  char why[256]; /* when not */
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void) {
  void *l = dlopen(SBX_LIBCURL, RTLD_NOW | RTLD_LOCAL);
  if (!l) {
    snprintf(cu.why, sizeof cu.why, "%s", dlerror());
    return;
  }
  static const struct {
    const char *name;
    size_t off;
  } syms[] = {
#define SYM(n) {"curl_" #n, offsetof(typeof(cu), n)}
      SYM(global_init),   SYM(easy_init),    SYM(easy_cleanup),  SYM(easy_reset),   SYM(easy_setopt),
      SYM(easy_getinfo),  SYM(easy_perform), SYM(easy_strerror), SYM(slist_append), SYM(slist_free_all),
#undef SYM
  };
  for (size_t i = 0; i < SBX_ARRAY_SIZE(syms); i++) {
    void *f = dlsym(l, syms[i].name);
    if (!f) {
      snprintf(cu.why, sizeof cu.why, SBX_LIBCURL " has no %s", syms[i].name);
      return;
    }
    memcpy((char *)&cu + syms[i].off, &f, sizeof f);
  }
  cu.ready = cu.global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!cu.ready) snprintf(cu.why, sizeof cu.why, "curl_global_init failed");
}

static bool cu_ready(void) {
  pthread_once(&cu_once, cu_load);
  return cu.ready;
}

/* Each thread keeps its connection (and a hashing buffer) for its next
 * request; they go when the thread ends, FUSE's workers included. */
typedef struct tls {
  CURL *curl;
  char *buf;
} tls;
static pthread_key_t tls_key;
static __thread tls *tl;

static void tls_free(void *v) {
  tls *t = v;
  if (t->curl) cu.easy_cleanup(t->curl);
  free(t->buf);
  free(t);
  tl = NULL;
}

static tls *tls_get(void) {
  if (!tl && (tl = calloc(1, sizeof *tl))) pthread_setspecific(tls_key, tl);
  return tl;
}

void s3_global_init(void) { pthread_key_create(&tls_key, tls_free); }

void s3_thread_done(void) {
  if (tl) {
    pthread_setspecific(tls_key, NULL);
    tls_free(tl);
  }
}

/* ---- pure helpers --------------------------------------------------------- */

void s3_uri_encode(const char *in, bool keep_slash, char *out, size_t len) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p && o + 4 < len; p++) {
    unsigned char c = *p;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (keep_slash && c == '/'))
      out[o++] = (char)c;
    else
      out[o++] = '%', out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
  }
  out[o] = 0;
}

static void xml_decode(const char *in, size_t n, char *out, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 5 < len; i++) {
    if (in[i] != '&') {
      out[o++] = in[i];
      continue;
    }
    static const struct {
      const char *ent;
      char c;
    } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool done = false;
    for (size_t k = 0; k < SBX_ARRAY_SIZE(ents) && !done; k++) {
      size_t el = strlen(ents[k].ent);
      if (i + el <= n && !memcmp(in + i, ents[k].ent, el)) out[o++] = ents[k].c, i += el - 1, done = true;
    }
    if (!done && i + 2 < n && in[i + 1] == '#') { /* &#NN; &#xNN; as UTF-8 */
      char *end;
      unsigned long cp = in[i + 2] == 'x' ? strtoul(in + i + 3, &end, 16) : strtoul(in + i + 2, &end, 10);
      if ((size_t)(end - in) < n && *end == ';' && cp > 0 && cp < 0x110000) {
        if (cp < 0x80) out[o++] = (char)cp;
        else if (cp < 0x800) out[o++] = (char)(0xc0 | cp >> 6), out[o++] = (char)(0x80 | (cp & 0x3f));
        else if (cp < 0x10000)
          out[o++] = (char)(0xe0 | cp >> 12), out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f)),
          out[o++] = (char)(0x80 | (cp & 0x3f));
        else
          out[o++] = (char)(0xf0 | cp >> 18), out[o++] = (char)(0x80 | ((cp >> 12) & 0x3f)),
          out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[o++] = (char)(0x80 | (cp & 0x3f));
        i = (size_t)(end - in);
        done = true;
      }
    }
    if (!done) out[o++] = '&';
  }
  out[o] = 0;
}

bool s3_xml_element(const char *xml, size_t xlen, size_t *pos, const char *tag, const char **inner, size_t *innerlen) {
  char open[80], close[80];
  int ol = snprintf(open, sizeof open, "<%s>", tag), cl = snprintf(close, sizeof close, "</%s>", tag);
  if (*pos >= xlen) return false;
  const char *s = memmem(xml + *pos, xlen - *pos, open, ol);
  if (!s) return false;
  s += ol;
  const char *e = memmem(s, xlen - (size_t)(s - xml), close, cl);
  if (!e) return false;
  *inner = s;
  *innerlen = (size_t)(e - s);
  *pos = (size_t)(e - xml) + cl;
  return true;
}

bool s3_xml_next(const char *xml, size_t xlen, size_t *pos, const char *tag, char *out, size_t outlen) {
  const char *in;
  size_t n;
  if (!s3_xml_element(xml, xlen, pos, tag, &in, &n)) return false;
  xml_decode(in, n, out, outlen);
  return true;
}

int64_t s3_parse_time(const char *s) {
  struct tm tm = {0};
  int ms = 0;
  const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
  if (end) {
    if (*end == '.') ms = atoi(end + 1) / (strlen(end + 1) > 4 ? 1000 : 1); /* .000Z or .000000Z */
  } else if (!strptime(s, "%a, %d %b %Y %H:%M:%S", &tm)) {
    return -1;
  }
  time_t t = timegm(&tm);
  if (t == (time_t)-1) return -1;
  return (int64_t)t * 1000000000 + (int64_t)(ms % 1000) * 1000000;
}

/* ---- requests ------------------------------------------------------------- */

typedef struct resp {
  sbx_buf body;     /* XML answers and errors */
  char etag[128];   /* the ETag header */
  int fd;           /* GET: where the data goes (-1: into body) */
  uint64_t fd_off, got;
  uint64_t max;     /* GET: what may come into fd, at most */
  bool fd_error, too_long;
  s3_stat *st;      /* HEAD: filled from the headers */
  long status;
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
  resp *r = ud;
  size_t len = sz * n;
  long status = 0;
  cu.easy_getinfo(tl->curl, CURLINFO_RESPONSE_CODE, &status);
  if (r->fd >= 0 && status / 100 == 2) {
    if (r->got + len > r->max) { /* a server that sends more than asked: not into the cache */
      r->too_long = true;
      return 0;
    }
    if (pwrite(r->fd, p, len, (off_t)(r->fd_off + r->got)) != (ssize_t)len) {
      r->fd_error = true;
      return 0;
    }
    r->got += len;
    return len;
  }
  if (r->body.len + len > MAX_XML) return 0;
  sbx_buf_append(&r->body, p, len);
  return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
  resp *r = ud;
  size_t len = sz * n;
  char line[512];
  snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), p);
  char *cr = strpbrk(line, "\r\n");
  if (cr) *cr = 0;
  char *colon = strchr(line, ':');
  if (!colon) return len;
  *colon = 0;
  char *v = colon + 1;
  while (*v == ' ') v++;
  if (!strcasecmp(line, "etag")) snprintf(r->etag, sizeof r->etag, "%s", v);
  if (!r->st) return len;
  if (!strcasecmp(line, "content-length")) r->st->size = strtoull(v, NULL, 10);
  else if (!strcasecmp(line, "last-modified")) r->st->modified_ns = r->st->mtime_ns = s3_parse_time(v);
  else if (!strcasecmp(line, "x-amz-meta-mode")) r->st->meta.mode = (mode_t)strtoul(v, NULL, 8), r->st->meta.valid = true;
  else if (!strcasecmp(line, "x-amz-meta-mtime")) r->st->meta.mtime_ns = strtoll(v, NULL, 10);
  else if (!strcasecmp(line, "x-amz-meta-uid")) r->st->meta.uid = (uid_t)strtoul(v, NULL, 10);
  else if (!strcasecmp(line, "x-amz-meta-gid")) r->st->meta.gid = (gid_t)strtoul(v, NULL, 10);
  return len;
}

/* Connections go only where the policy allows: a name that resolves to a
 * private, loopback or metadata address is refused at connect time (so a
 * DNS answer cannot point the mount at the host's own network). */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  const s3_conf *c = ud;
  (void)purpose;
  if (c->public_only) {
    const void *addr = a->family == AF_INET ? (const void *)&((struct sockaddr_in *)&a->addr)->sin_addr
                                            : (const void *)&((struct sockaddr_in6 *)&a->addr)->sin6_addr;
    if ((a->family == AF_INET || a->family == AF_INET6) && sbx_addr_special(a->family, addr)) return CURL_SOCKET_BAD;
  }
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

typedef struct upload {
  int fd;           /* from this file, */
  const char *mem;  /* or from memory */
  uint64_t off, left;
} upload;

static size_t on_read(char *p, size_t sz, size_t n, void *ud) {
  upload *u = ud;
  size_t want = sz * n < u->left ? sz * n : (size_t)u->left;
  if (!want) return 0;
  if (u->mem) {
    memcpy(p, u->mem + u->off, want);
    u->off += want;
    u->left -= want;
    return want;
  }
  ssize_t k = pread(u->fd, p, want, (off_t)u->off);
  if (k <= 0) return CURL_READFUNC_ABORT;
  u->off += (uint64_t)k;
  u->left -= (uint64_t)k;
  return (size_t)k;
}

void s3_url(const s3_conf *c, const char *key, const char *query, char *out, size_t len) {
  char enc[4096];
  s3_uri_encode(key ? key : "", true, enc, sizeof enc);
  const char *sep = query && *query ? "?" : "";
  if (c->path_style) {
    snprintf(out, len, "%s/%s/%s%s%s", c->endpoint, c->bucket, enc, sep, query ? query : "");
  } else {
    const char *host = strstr(c->endpoint, "://");
    int scheme = host ? (int)(host - c->endpoint) : 0;
    snprintf(out, len, "%.*s://%s.%s/%s%s%s", scheme, c->endpoint, c->bucket, host ? host + 3 : c->endpoint, enc, sep,
             query ? query : "");
  }
}

typedef struct req {
  const char *method;
  const char *key;
  const char *query;   /* already sorted and encoded */
  const char *sha;     /* hex sha256 of the body */
  const s3_meta *meta;
  const char *extra;   /* more headers (copy source, metadata directive) */
  const char *extra2;
  upload *up;          /* body from a file */
  const char *data;    /* body from memory */
  size_t data_len;
} req;

static void fail(s3_err *e, int errnum, int http, const char *code, const char *fmt, ...) SBX_PRINTF(5, 6);
static void fail(s3_err *e, int errnum, int http, const char *code, const char *fmt, ...) {
  if (!e) return;
  e->errnum = errnum;
  e->http = http;
  snprintf(e->code, sizeof e->code, "%s", code);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
}

static int errno_for(long status, const char *code) {
  if (status == 404) return ENOENT;
  if (status == 403 || status == 401) return EACCES;
  if (status == 412) return EAGAIN;
  if (!strcmp(code, "InvalidRange")) return EINVAL;
  return EIO;
}

/* Whether the endpoint's host is this host's loopback, by name or address
 * (localhost, 127/8 as a dotted quad, [::1]). */
static bool endpoint_loopback(const s3_conf *c) {
  const char *h = strstr(c->endpoint, "://");
  if (!h) return false;
  h += 3;
  size_t n = h[0] == '[' ? strcspn(h, "]") : strcspn(h, ":/");
  if (h[0] == '[' && h[n++] != ']') return false;
  if (h[n] && h[n] != ':' && h[n] != '/') return false;
  if ((n == 9 && !strncasecmp(h, "localhost", 9)) || (n == 5 && !strncmp(h, "[::1]", 5))) return true;
  char ip[16];
  struct in_addr a;
  if (n >= sizeof ip) return false;
  memcpy(ip, h, n);
  ip[n] = 0;
  return inet_pton(AF_INET, ip, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* One request, retried a little when the service or the network falters. */
static int perform(const s3_conf *c, const req *q, resp *r, s3_err *e) {
  if (!cu_ready()) {
    fail(e, ENOSYS, 0, "curl", "cannot load libcurl: %s", cu.why);
    return -1;
  }
  tls *t = tls_get();
  if (t && !t->curl) t->curl = cu.easy_init();
  if (!t || !t->curl) {
    fail(e, ENOMEM, 0, "curl", "cannot start curl");
    return -1;
  }
  char url[8192];
  s3_url(c, q->key, q->query, url, sizeof url);
  for (int attempt = 0;; attempt++) {
    CURL *h = t->curl;
    cu.easy_reset(h);
    sbx_buf_free(&r->body);
    r->got = 0;
    r->fd_error = r->too_long = false;
    r->etag[0] = 0;
    if (r->st) *r->st = (s3_stat){0};
    upload up = q->up ? *q->up : (upload){0};
    struct curl_slist *hd = NULL;
    char line[512], region[128];
    /* no "Expect:" to turn 100-continue off: curl 7.88 would sign that
     * header and then not send it, and the signature would not verify */
    snprintf(line, sizeof line, "x-amz-content-sha256: %s", q->sha ? q->sha : EMPTY_SHA);
    hd = cu.slist_append(hd, line);
    if (q->meta && q->meta->valid) {
      snprintf(line, sizeof line, "x-amz-meta-mode: %04o", (unsigned)(q->meta->mode & (S_IFMT | 07777)));
      hd = cu.slist_append(hd, line);
      snprintf(line, sizeof line, "x-amz-meta-mtime: %lld", (long long)q->meta->mtime_ns);
      hd = cu.slist_append(hd, line);
      snprintf(line, sizeof line, "x-amz-meta-uid: %u", (unsigned)q->meta->uid);
      hd = cu.slist_append(hd, line);
      snprintf(line, sizeof line, "x-amz-meta-gid: %u", (unsigned)q->meta->gid);
      hd = cu.slist_append(hd, line);
    }
    if (q->extra) hd = cu.slist_append(hd, q->extra);
    if (q->extra2) hd = cu.slist_append(hd, q->extra2);
    snprintf(region, sizeof region, "aws:amz:%s:s3", c->region[0] ? c->region : "us-east-1");
    cu.easy_setopt(h, CURLOPT_URL, url);
    cu.easy_setopt(h, CURLOPT_PATH_AS_IS, 1L); /* a key is a literal name: its dots are not resolved */
    cu.easy_setopt(h, CURLOPT_AWS_SIGV4, region);
    cu.easy_setopt(h, CURLOPT_USERNAME, c->access_key);
    cu.easy_setopt(h, CURLOPT_PASSWORD, c->secret_key);
    cu.easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    cu.easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (endpoint_loopback(c)) cu.easy_setopt(h, CURLOPT_NOPROXY, "*"); /* this host's: never through a proxy */
    cu.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    cu.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    cu.easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    /* a listing, a HEAD or a DELETE is done in two minutes or failed: a
     * server that trickles a byte a second does not hold it (and its
     * caller) for ever; copies and uploads may take longer */
    if ((!strcmp(q->method, "GET") && r->fd < 0) || !strcmp(q->method, "HEAD") || !strcmp(q->method, "DELETE"))
      cu.easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    cu.easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    cu.easy_setopt(h, CURLOPT_OPENSOCKETDATA, (void *)c);
    cu.easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    cu.easy_setopt(h, CURLOPT_WRITEDATA, r);
    cu.easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    cu.easy_setopt(h, CURLOPT_HEADERDATA, r);
    if (!strcmp(q->method, "HEAD")) {
      cu.easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(q->method, "PUT")) {
      cu.easy_setopt(h, CURLOPT_UPLOAD, 1L);
      if (q->up) {
        cu.easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        cu.easy_setopt(h, CURLOPT_READDATA, &up);
        cu.easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up.left);
      } else {
        cu.easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)0);
      }
    } else if (!strcmp(q->method, "POST")) {
      cu.easy_setopt(h, CURLOPT_POST, 1L);
      cu.easy_setopt(h, CURLOPT_POSTFIELDS, q->data ? q->data : "");
      cu.easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->data_len);
    } else if (strcmp(q->method, "GET")) {
      cu.easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
    }
    CURLcode cr = cu.easy_perform(h);
    cu.slist_free_all(hd);
    long status = 0;
    cu.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    r->status = status;
    if (cr == CURLE_OK && status / 100 == 2 && !r->fd_error) return 0;
    bool retry = r->too_long ? false
                 : cr != CURLE_OK ? cr != CURLE_COULDNT_RESOLVE_HOST && cr != CURLE_SSL_CACERT_BADFILE &&
                                      cr != CURLE_PEER_FAILED_VERIFICATION && cr != CURLE_COULDNT_CONNECT
                                : status >= 500 || status == 429;
    if (retry && attempt < 2) {
      struct timespec ts = {0, (attempt + 1) * 150 * 1000 * 1000}; /* backing off before trying again */
      nanosleep(&ts, NULL);
      continue;
    }
    if (r->too_long) {
      fail(e, EIO, (int)status, "TooLong", "the bucket sent more than the %llu bytes asked for",
           (unsigned long long)r->max);
    } else if (r->fd_error) {
      fail(e, EIO, (int)status, "cache", "writing the local cache failed");
    } else if (cr != CURLE_OK) {
      const char *what = cr == CURLE_COULDNT_RESOLVE_HOST ? "DNS"
                         : cr == CURLE_COULDNT_CONNECT    ? "connect"
                         : (cr == CURLE_SSL_CONNECT_ERROR || cr == CURLE_PEER_FAILED_VERIFICATION ||
                            cr == CURLE_SSL_CACERT_BADFILE)
                             ? "TLS"
                             : "network";
      fail(e, cr == CURLE_COULDNT_CONNECT ? ECONNREFUSED : EHOSTUNREACH, 0, what, "%s: %s", what,
           cu.easy_strerror(cr));
    } else {
      char code[64] = "", msg[256] = "";
      size_t pos = 0;
      if (r->body.data) {
        s3_xml_next(r->body.data, r->body.len, &pos, "Code", code, sizeof code);
        pos = 0;
        s3_xml_next(r->body.data, r->body.len, &pos, "Message", msg, sizeof msg);
      }
      if (!code[0]) snprintf(code, sizeof code, "HTTP%ld", status);
      fail(e, errno_for(status, code), (int)status, code, "%s (HTTP %ld)%s%s", code, status, msg[0] ? ": " : "", msg);
    }
    return -1;
  }
}

static void meta_sha_of_fd(int fd, uint64_t off, uint64_t len, char out[65]) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  tls *t = tls_get();
  if (t && !t->buf) t->buf = malloc(1 << 20);
  char *buf = t ? t->buf : NULL;
  while (len && buf) {
    size_t want = len < (1 << 20) ? (size_t)len : (1 << 20);
    ssize_t k = pread(fd, buf, want, (off_t)off);
    if (k <= 0) break;
    sha256_update(&ctx, buf, (size_t)k);
    off += (uint64_t)k;
    len -= (uint64_t)k;
  }
  uint8_t d[32];
  sha256_final(&ctx, d);
  sha256_tohex(d, out);
}

/* ---- operations ----------------------------------------------------------- */

int s3_check(const s3_conf *c, s3_err *e) {
  resp r = {.fd = -1};
  req q = {.method = "GET", .key = "", .query = "list-type=2&max-keys=1"};
  int rc = perform(c, &q, &r, e);
  if (rc < 0 && e && e->http == 404 && !strcmp(e->code, "NoSuchBucket"))
    snprintf(e->msg, sizeof e->msg, "no bucket '%.63s' at %.200s", c->bucket, c->endpoint);
  sbx_buf_free(&r.body);
  return rc;
}

uint64_t s3_etag_hash(const char *etag) {
  uint64_t h = 14695981039346656037ull; /* FNV-1a */
  bool any = false;
  for (const char *p = etag ? etag : ""; *p; p++) {
    if (!strncmp(p, "&quot;", 6)) {
      p += 5;
      continue;
    }
    if (*p == '"' || isspace((unsigned char)*p)) continue;
    h = (h ^ (uint8_t)tolower((unsigned char)*p)) * 1099511628211ull;
    any = true;
  }
  return !any ? 0 : h ? h : 1;
}

/* HEAD, or GET of the whole object into fd (fd >= 0). */
static int head_or_get(const s3_conf *c, const char *key, int fd, uint64_t max, s3_stat *st, uint64_t *got, s3_err *e) {
  resp r = {.fd = fd, .st = st, .max = max};
  req q = {.method = fd >= 0 ? "GET" : "HEAD", .key = key};
  int rc = perform(c, &q, &r, e);
  if (rc == 0) st->etag = s3_etag_hash(r.etag);
  if (rc == 0 && st->meta.valid && st->meta.mtime_ns) st->mtime_ns = st->meta.mtime_ns;
  if (rc == 0 && st->meta.valid && (st->meta.mode & S_IFMT) != S_IFLNK) st->meta.mode &= 07777;
  if (got) *got = r.got;
  sbx_buf_free(&r.body);
  return rc;
}

int s3_head(const s3_conf *c, const char *key, s3_stat *st, s3_err *e) { return head_or_get(c, key, -1, 0, st, NULL, e); }

int s3_get_object(const s3_conf *c, const char *key, int fd, uint64_t max, s3_stat *st, uint64_t *got, s3_err *e) {
  return head_or_get(c, key, fd, max, st, got, e);
}

int s3_get(const s3_conf *c, const char *key, uint64_t off, uint64_t len, int fd, uint64_t fd_off, uint64_t *got,
           s3_err *e) {
  if (got) *got = 0;
  if (!len) return 0; /* nothing asked (without a range, the whole object would come) */
  char range[96];
  snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
  resp r = {.fd = fd, .fd_off = fd_off, .max = len};
  req q = {.method = "GET", .key = key, .extra = range};
  int rc = perform(c, &q, &r, e);
  if (got) *got = r.got;
  sbx_buf_free(&r.body);
  if (rc < 0 && e && !strcmp(e->code, "InvalidRange")) { /* past the end: nothing */
    if (got) *got = 0;
    return 0;
  }
  return rc;
}

bool s3_body_protected(const s3_conf *c) {
  if (!strncasecmp(c->endpoint, "https://", 8)) return true;
  return !strncasecmp(c->endpoint, "http://", 7) && endpoint_loopback(c);
}

/* One PUT of [off, off+len) of fd: an object, or a part (query names it);
 * etag gets the ETag the service answered. The body's SHA-256 is signed
 * only where nothing else protects it: hashing it reads it twice and took
 * 2.2 s of CPU a GiB (the uploads of a 1 GiB write went 105-109 MiB/s so,
 * 121-145 without, s3fs 97-108 on the same server). */
static int put_range(const s3_conf *c, const char *key, const char *query, int fd, uint64_t off, uint64_t len,
                     const s3_meta *m, char etag[128], s3_err *e) {
  char sha[65] = "UNSIGNED-PAYLOAD";
  if (!s3_body_protected(c)) meta_sha_of_fd(fd, off, len, sha);
  upload up = {.fd = fd, .off = off, .left = len};
  resp r = {.fd = -1};
  req q = {.method = "PUT", .key = key, .query = query, .sha = sha, .meta = m, .up = &up};
  int rc = perform(c, &q, &r, e);
  if (etag) snprintf(etag, 128, "%s", r.etag);
  sbx_buf_free(&r.body);
  return rc;
}

/* The parts of one multipart upload, taken in turn by a few threads (each
 * with its own connection). */
typedef struct parts_job {
  const s3_conf *c;
  const char *key, *enc_id;
  int fd;
  uint64_t size;
  unsigned parts, next;
  pthread_mutex_t lock;
  char (*etags)[128];
  bool failed;
  s3_err err;
} parts_job;

static void *part_worker(void *arg) {
  parts_job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->lock);
    unsigned i = j->failed ? j->parts : j->next++;
    pthread_mutex_unlock(&j->lock);
    if (i >= j->parts) break;
    uint64_t off = (uint64_t)i * S3_PART_SIZE, len = j->size - off < S3_PART_SIZE ? j->size - off : S3_PART_SIZE;
    char query[1800];
    snprintf(query, sizeof query, "partNumber=%u&uploadId=%s", i + 1, j->enc_id);
    s3_err e = {0};
    if (put_range(j->c, j->key, query, j->fd, off, len, NULL, j->etags[i], &e) < 0) {
      pthread_mutex_lock(&j->lock);
      if (!j->failed) j->failed = true, j->err = e;
      pthread_mutex_unlock(&j->lock);
    }
  }
  return NULL;
}

/* Multipart: create, parts of equal size (the last one shorter), complete;
 * aborted on failure so no orphan parts stay billed. */
static int put_multipart(const s3_conf *c, const char *key, int fd, uint64_t size, const s3_meta *m, uint64_t *etag,
                         s3_err *e) {
  resp r = {.fd = -1};
  req q = {.method = "POST", .key = key, .query = "uploads=", .meta = m};
  if (perform(c, &q, &r, e) < 0) {
    sbx_buf_free(&r.body);
    return -1;
  }
  char upload_id[512] = "", enc_id[1600];
  size_t pos = 0;
  if (!r.body.data || !s3_xml_next(r.body.data, r.body.len, &pos, "UploadId", upload_id, sizeof upload_id)) {
    sbx_buf_free(&r.body);
    fail(e, EIO, 200, "MalformedResponse", "no UploadId in the answer to starting a multipart upload");
    return -1;
  }
  sbx_buf_free(&r.body);
  s3_uri_encode(upload_id, false, enc_id, sizeof enc_id);
  unsigned parts = (unsigned)((size + S3_PART_SIZE - 1) / S3_PART_SIZE);
  parts_job job = {.c = c, .key = key, .enc_id = enc_id, .fd = fd, .size = size, .parts = parts,
                   .lock = PTHREAD_MUTEX_INITIALIZER, .etags = calloc(parts, sizeof(char[128]))};
  int rc = job.etags ? 0 : -1;
  if (rc == 0) {
    pthread_t th[S3_PARALLEL];
    int nth = 0;
    for (; nth < S3_PARALLEL - 1 && (unsigned)nth + 1 < parts; nth++)
      if (pthread_create(&th[nth], NULL, part_worker, &job) != 0) break;
    part_worker(&job);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    rc = job.failed ? -1 : 0;
    if (rc < 0 && e) *e = job.err;
  } else {
    fail(e, ENOMEM, 0, "memory", "out of memory");
  }
  sbx_buf done = {0};
  sbx_buf_append(&done, "<CompleteMultipartUpload>", 25);
  for (unsigned i = 0; i < parts && rc == 0; i++) {
    char item[300];
    int k = snprintf(item, sizeof item, "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", i + 1, job.etags[i]);
    sbx_buf_append(&done, item, (size_t)k);
  }
  free(job.etags);
  sbx_buf_append(&done, "</CompleteMultipartUpload>", 26);
  char query[1700];
  snprintf(query, sizeof query, "uploadId=%s", enc_id);
  if (rc == 0) {
    char sha[65];
    sha256_hex(done.data, done.len, sha);
    resp cr = {.fd = -1};
    req cq = {.method = "POST", .key = key, .query = query, .sha = sha, .data = done.data, .data_len = done.len};
    rc = perform(c, &cq, &cr, e);
    /* a 200 can still carry an <Error> */
    if (rc == 0 && cr.body.data && memmem(cr.body.data, cr.body.len, "<Error>", 7)) {
      fail(e, EIO, 200, "CompleteFailed", "completing the multipart upload of a %llu byte object failed",
           (unsigned long long)size);
      rc = -1;
    }
    char tag[128] = "";
    size_t tp = 0;
    if (rc == 0 && etag && cr.body.data && s3_xml_next(cr.body.data, cr.body.len, &tp, "ETag", tag, sizeof tag))
      *etag = s3_etag_hash(tag);
    sbx_buf_free(&cr.body);
  }
  if (rc < 0) {
    resp ar = {.fd = -1};
    req aq = {.method = "DELETE", .key = key, .query = query};
    perform(c, &aq, &ar, NULL);
    sbx_buf_free(&ar.body);
  }
  sbx_buf_free(&done);
  return rc;
}

int s3_put_fd(const s3_conf *c, const char *key, int fd, uint64_t size, const s3_meta *m, uint64_t *etag,
              s3_err *e) {
  if (etag) *etag = 0;
  if (size > S3_PART_SIZE) return put_multipart(c, key, fd, size, m, etag, e);
  char tag[128] = "";
  int rc = put_range(c, key, NULL, fd, 0, size, m, tag, e);
  if (rc == 0 && etag) *etag = s3_etag_hash(tag);
  return rc;
}

int s3_put_empty(const s3_conf *c, const char *key, const s3_meta *m, s3_err *e) {
  resp r = {.fd = -1};
  req q = {.method = "PUT", .key = key, .meta = m};
  int rc = perform(c, &q, &r, e);
  sbx_buf_free(&r.body);
  return rc;
}

int s3_put_data(const s3_conf *c, const char *key, const char *data, size_t len, const s3_meta *m, s3_err *e) {
  char sha[65];
  sha256_hex(data, len, sha);
  upload up = {.fd = -1, .mem = data, .left = len};
  resp r = {.fd = -1};
  req q = {.method = "PUT", .key = key, .sha = sha, .meta = m, .up = &up};
  int rc = perform(c, &q, &r, e);
  sbx_buf_free(&r.body);
  return rc;
}

int s3_delete(const s3_conf *c, const char *key, s3_err *e) {
  resp r = {.fd = -1};
  req q = {.method = "DELETE", .key = key};
  int rc = perform(c, &q, &r, e);
  sbx_buf_free(&r.body);
  if (rc < 0 && e && e->http == 404) return 0; /* gone already */
  return rc;
}

int s3_copy(const s3_conf *c, const char *from, const char *to, const s3_meta *m, s3_err *e) {
  char enc[4096], extra[4400];
  s3_uri_encode(from, true, enc, sizeof enc);
  snprintf(extra, sizeof extra, "x-amz-copy-source: /%s/%s", c->bucket, enc);
  resp r = {.fd = -1};
  req q = {.method = "PUT", .key = to, .meta = m, .extra = extra,
           .extra2 = m && m->valid ? "x-amz-metadata-directive: REPLACE" : NULL};
  int rc = perform(c, &q, &r, e);
  if (rc == 0 && r.body.data && memmem(r.body.data, r.body.len, "<Error>", 7)) {
    fail(e, EIO, 200, "CopyFailed", "copying an object failed");
    rc = -1;
  }
  sbx_buf_free(&r.body);
  return rc;
}

long s3_list(const s3_conf *c, const char *prefix, const char *delim, long max, s3_list_cb cb, void *ud, s3_err *e) {
  char token[1024] = "", last[1024];
  long count = 0;
  size_t plen = strlen(prefix);
  /* a server whose listing never ends (pages said to be truncated, with
   * nothing in them or the same token again) is not asked forever (S3
   * itself may give a run of empty pages, over many delete markers) */
  for (int empty = 0;;) {
    if (empty > 1000) {
      fail(e, EIO, 200, "MalformedResponse", "the bucket's listing of '%.200s' did not end", prefix);
      return -1;
    }
    long before = count;
    /* query keys sorted by hand, valueless keys written key= (curl 7.88's
     * SigV4 signs the query as given) */
    char q[6000], ep[4096], ed[16], et[3000];
    s3_uri_encode(prefix, false, ep, sizeof ep);
    s3_uri_encode(delim ? delim : "", false, ed, sizeof ed);
    s3_uri_encode(token, false, et, sizeof et);
    int n = 0;
    if (token[0]) n += snprintf(q + n, sizeof q - n, "continuation-token=%s&", et);
    if (delim) n += snprintf(q + n, sizeof q - n, "delimiter=%s&", ed);
    snprintf(q + n, sizeof q - n, "list-type=2&max-keys=1000&prefix=%s", ep);
    resp r = {.fd = -1};
    req rq = {.method = "GET", .key = "", .query = q};
    if (perform(c, &rq, &r, e) < 0) {
      sbx_buf_free(&r.body);
      return -1;
    }
    const char *x = r.body.data ? r.body.data : "";
    size_t xl = r.body.len, pos = 0;
    const char *in;
    size_t inl;
    while (s3_xml_element(x, xl, &pos, "Contents", &in, &inl) && count < max) {
      char key[2048], size[32] = "0", mod[64] = "", tag[128] = "";
      size_t p2 = 0;
      if (!s3_xml_next(in, inl, &p2, "Key", key, sizeof key)) continue;
      p2 = 0;
      s3_xml_next(in, inl, &p2, "Size", size, sizeof size);
      p2 = 0;
      s3_xml_next(in, inl, &p2, "LastModified", mod, sizeof mod);
      p2 = 0;
      s3_xml_next(in, inl, &p2, "ETag", tag, sizeof tag);
      if (strncmp(key, prefix, plen)) continue;
      cb(ud, key + plen, false, strtoull(size, NULL, 10), s3_parse_time(mod), s3_etag_hash(tag));
      count++;
    }
    pos = 0;
    while (s3_xml_element(x, xl, &pos, "CommonPrefixes", &in, &inl) && count < max) {
      char p[2048];
      size_t p2 = 0;
      if (!s3_xml_next(in, inl, &p2, "Prefix", p, sizeof p) || strncmp(p, prefix, plen)) continue;
      size_t l = strlen(p);
      if (l > plen && p[l - 1] == '/') p[l - 1] = 0;
      cb(ud, p + plen, true, 0, 0, 0);
      count++;
    }
    char trunc[16] = "";
    pos = 0;
    s3_xml_next(x, xl, &pos, "IsTruncated", trunc, sizeof trunc);
    pos = 0;
    empty = count == before ? empty + 1 : 0;
    memcpy(last, token, sizeof last);
    bool more = !strcmp(trunc, "true") && s3_xml_next(x, xl, &pos, "NextContinuationToken", token, sizeof token);
    sbx_buf_free(&r.body);
    if (more && !strcmp(token, last)) {
      fail(e, EIO, 200, "MalformedResponse", "the bucket's listing of '%.200s' gave the same page again", prefix);
      return -1;
    }
    if (!more || count >= max) return count;
  }
}
