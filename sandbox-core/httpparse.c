#define _GNU_SOURCE
#include "httpparse.h"
#include "util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A header name: one or more token characters (RFC 9110, 5.6.2). */
static bool is_token(const char *s, size_t n) {
  size_t k = 0;
  while (k < n && (isalnum((unsigned char)s[k]) || strchr("!#$%&'*+-.^_`|~", s[k]))) k++;
  return n && k == n;
}

/* A part of the request line: 1 to max bytes, none of them blank or a
 * control character. */
static bool word(const char *s, size_t n, size_t max) {
  if (!n || n > max) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f) return false;
  return true;
}

long sbx_http_parse_head(const char *buf, size_t len, sbx_http_head *h) {
  const char *end = buf ? memmem(buf, len, "\r\n\r\n", 4) : NULL;
  if (!end) return 0;
  const char *eol = memmem(buf, end + 2 - buf, "\r\n", 2);
  *h = (sbx_http_head){0};
  /* METHOD SP TARGET SP VERSION, one space each (RFC 9112, 3); a target
   * of any length (the head's limit bounds it), kept whole up to
   * sizeof h->path - 1 bytes */
  const char *sp1 = memchr(buf, ' ', (size_t)(eol - buf));
  const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
  if (!sp2 || !word(buf, (size_t)(sp1 - buf), sizeof h->method - 1) ||
      !word(sp1 + 1, (size_t)(sp2 - sp1 - 1), MAX_TARGET) || !word(sp2 + 1, (size_t)(eol - sp2 - 1), sizeof h->version - 1))
    return -1;
  memcpy(h->method, buf, (size_t)(sp1 - buf));
  h->path_len = (size_t)(sp2 - sp1 - 1);
  memcpy(h->path, sp1 + 1, h->path_len < sizeof h->path ? h->path_len : sizeof h->path - 1);
  memcpy(h->version, sp2 + 1, (size_t)(eol - sp2 - 1));
  if (strncmp(h->version, "HTTP/1.", 7)) return -1;
  /* no bare CR or LF, no NUL, and every header line a name of token
   * characters right before its colon (no folding): a server behind a
   * proxy must never split the head where the proxy did not */
  size_t hl = (size_t)(end + 4 - buf);
  for (size_t i = 0; i < hl; i++)
    if (!buf[i] || (buf[i] == '\n' && (!i || buf[i - 1] != '\r')) || (buf[i] == '\r' && buf[i + 1] != '\n')) return -1;
  sbx_http_field f;
  for (const char *l = eol + 2; sbx_http_next_field(&l, end + 2, &f);)
    if (!f.name || !is_token(f.name, f.name_len)) return -1;
  h->len = hl;
  h->headers = eol + 2;
  return (long)h->len;
}

bool sbx_http_next_field(const char **p, const char *end, sbx_http_field *f) {
  const char *l = *p;
  if (!l || l >= end || !*l) return false;
  const char *eol = memmem(l, (size_t)(end - l), "\r\n", 2);
  if (!eol) return false;
  const char *colon = memchr(l, ':', (size_t)(eol - l));
  *f = (sbx_http_field){.line = l, .line_len = (size_t)(eol + 2 - l)};
  if (colon) {
    f->name = l;
    f->name_len = (size_t)(colon - l);
    f->value = colon + 1;
    while (f->value < eol && (*f->value == ' ' || *f->value == '\t')) f->value++;
    f->value_len = (size_t)(eol - f->value);
  }
  *p = eol + 2;
  return true;
}

const char *sbx_http_header(const char *headers, const char *end, const char *name, size_t *len) {
  size_t nl = strlen(name);
  sbx_http_field f;
  for (const char *p = headers; sbx_http_next_field(&p, end ? end : headers + strlen(headers), &f);)
    if (f.name_len == nl && !strncasecmp(f.name, name, nl)) {
      *len = f.value_len;
      return f.value;
    }
  return NULL;
}

bool sbx_preview_host_parse(const char *v, size_t len, int *port, char id[64], char token[17]) {
  char host[300];
  size_t n = 0;
  while (n < len && v[n] != ':' && v[n] != ' ' && v[n] != '\r') n++;
  if (n >= sizeof host) return false;
  for (size_t i = 0; i < n; i++) host[i] = (char)tolower((unsigned char)v[i]);
  host[n] = 0;
  static const char suffix[] = ".localhost";
  size_t sl = sizeof suffix - 1;
  if (n < sl + 20 || strcmp(host + n - sl, suffix)) return false;
  host[n - sl] = 0;
  char *dash1 = strchr(host, '-'), *dash2 = strrchr(host, '-');
  if (!dash1 || dash2 == dash1 || strlen(dash2 + 1) != 16) return false;
  memcpy(token, dash2 + 1, 17);
  *dash2 = 0;
  *dash1 = 0;
  char *endp;
  long p = strtol(host, &endp, 10);
  if (*endp || endp == host || p < 1 || p > 65535 || !sbx_valid_id(dash1 + 1)) return false;
  snprintf(id, 64, "%s", dash1 + 1);
  *port = (int)p;
  return true;
}

enum { B_DONE, B_LENGTH, B_SIZE, B_EXT, B_SIZE_LF, B_DATA, B_DATA_CR, B_DATA_LF, B_TRAILER, B_TRAILER_LINE, B_TRAILER_LF, B_END_LF };

#define CHUNK_LINE_MAX 4096 /* a chunk size with its extensions */
#define TRAILER_MAX (16 * 1024)

/* Whether the comma-separated list [v, v+len) holds `token`
 * (case-insensitive), and whether it is the last element. */
static bool list_has(const char *v, size_t len, const char *token, bool *last) {
  size_t tl = strlen(token);
  bool found = false;
  for (size_t i = 0; i < len;) {
    while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t s = i;
    while (i < len && v[i] != ',') i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e == s) continue;
    bool is = e - s == tl && !strncasecmp(v + s, token, tl);
    found |= is;
    if (last) *last = is;
  }
  return found;
}

int sbx_http_request_body(const char *headers, const char *end, sbx_http_body *b, bool *upgrade) {
  *b = (sbx_http_body){0};
  *upgrade = false;
  bool has_len = false, has_te = false, te_chunked = false, conn_upgrade = false, has_upgrade = false;
  uint64_t clen = 0;
  sbx_http_field f;
  for (const char *p = headers; sbx_http_next_field(&p, end, &f);) {
    const char *v = f.value;
    size_t nl = f.name_len, vl = f.value_len;
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
    if (nl == 14 && !strncasecmp(f.name, "Content-Length", nl)) {
      uint64_t n = 0;
      if (!vl || vl > 18) return -1;
      for (size_t i = 0; i < vl; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        n = n * 10 + (uint64_t)(v[i] - '0');
      }
      if (has_len) return -1; /* two lengths, even equal: as the README says */
      has_len = true;
      clen = n;
    } else if (nl == 17 && !strncasecmp(f.name, "Transfer-Encoding", nl)) {
      bool last = false;
      if (!vl) return -1;
      list_has(v, vl, "chunked", &last);
      has_te = true;
      te_chunked = last; /* a later header line continues the list */
    } else if (nl == 10 && !strncasecmp(f.name, "Connection", nl)) {
      conn_upgrade |= list_has(v, vl, "upgrade", NULL);
    } else if (nl == 7 && !strncasecmp(f.name, "Upgrade", nl)) {
      has_upgrade = vl > 0;
    }
  }
  if (has_te && (has_len || !te_chunked)) return -1;
  *upgrade = conn_upgrade && has_upgrade;
  if (has_te) b->state = B_SIZE;
  else if (has_len && clen) b->state = B_LENGTH, b->left = clen;
  return 0;
}

static bool tchar(char c) { return is_token(&c, 1); }

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = (char)(c | 0x20);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

long sbx_http_body_feed(sbx_http_body *b, const char *buf, size_t len) {
  static const struct {
    char want;
    int next;
  } expect[] = {[B_DATA_CR] = {'\r', B_DATA_LF}, [B_DATA_LF] = {'\n', B_SIZE}, [B_TRAILER_LF] = {'\n', B_TRAILER},
                [B_END_LF] = {'\n', B_DONE}};
  size_t i = 0;
  while (i < len && b->state != B_DONE) {
    char ch = buf[i];
    switch (b->state) {
    case B_LENGTH:
    case B_DATA: {
      size_t take = b->left < len - i ? (size_t)b->left : len - i;
      i += take;
      b->left -= take;
      if (!b->left) b->state = b->state == B_LENGTH ? B_DONE : B_DATA_CR;
      continue;
    }
    case B_SIZE: {
      int h = hexval(ch);
      if (h >= 0) {
        if (++b->count > 15) return -1; /* 2^60 bytes: no chunk is that big */
        b->left = b->left * 16 + (uint64_t)h;
      } else if (!b->count) {
        return -1;
      } else if (ch == '\r') {
        b->state = B_SIZE_LF;
      } else if (ch == ';' || ch == ' ' || ch == '\t') {
        b->state = B_EXT;
      } else {
        return -1;
      }
      break;
    }
    case B_EXT:
      if (++b->count > CHUNK_LINE_MAX) return -1;
      if (ch == '\r') b->state = B_SIZE_LF;
      else if (ch == '\n' || !ch) return -1;
      break;
    case B_SIZE_LF:
      if (ch != '\n') return -1;
      b->count = 0;
      b->state = b->left ? B_DATA : B_TRAILER;
      break;
    case B_TRAILER: /* at the start of a trailer line; an empty one ends the body */
      if (++b->count > TRAILER_MAX) return -1;
      b->in_value = false;
      if (ch == '\r') b->state = B_END_LF;
      else if (tchar(ch)) b->state = B_TRAILER_LINE;
      else return -1; /* a bare LF, a folded line: where a lenient server would end the body */
      break;
    case B_TRAILER_LINE: /* a field as in a head: a token name, its colon, a value */
      if (++b->count > TRAILER_MAX) return -1;
      if (ch == '\r' && b->in_value) b->state = B_TRAILER_LF;
      else if (ch == ':' && !b->in_value) b->in_value = true;
      else if (!ch || ch == '\n' || ch == '\r' || (!b->in_value && !tchar(ch))) return -1;
      break;
    default: /* a CR or LF that must come, and the state after it */
      if (b->state >= (int)SBX_ARRAY_SIZE(expect) || !expect[b->state].want || ch != expect[b->state].want) return -1;
      b->state = expect[b->state].next;
    }
    i++;
  }
  return (long)i;
}
