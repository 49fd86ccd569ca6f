#define _GNU_SOURCE
#include "httpparse.h"
#include "util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

long sbx_http_parse_head(const char *buf, size_t len, sbx_http_head *h) {
  const char *end = memmem(buf, len, "\r\n\r\n", 4);
  if (!end) return 0;
  const char *eol = memmem(buf, end + 2 - buf, "\r\n", 2);
  size_t line = eol - buf;
  char first[1100];
  if (line >= sizeof first) return -1;
  memcpy(first, buf, line);
  first[line] = 0;
  *h = (sbx_http_head){0};
  char rest[8];
  int n = sscanf(first, "%15s %1023s %15s %7s", h->method, h->path, h->version, rest);
  if (n != 3 || strncmp(h->version, "HTTP/1.", 7) || memchr(first, 0, line)) return -1;
  h->len = end + 4 - buf;
  h->headers = eol + 2;
  return (long)h->len;
}

const char *sbx_http_header(const char *headers, const char *end, const char *name, size_t *len) {
  size_t nl = strlen(name);
  if (!end) end = headers + strlen(headers);
  for (const char *p = headers; p < end && *p;) {
    const char *eol = memmem(p, end - p, "\r\n", 2);
    if (!eol) break;
    if ((size_t)(eol - p) > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
      const char *v = p + nl + 1;
      while (v < eol && (*v == ' ' || *v == '\t')) v++;
      *len = eol - v;
      return v;
    }
    p = eol + 2;
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
