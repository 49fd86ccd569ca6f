#define _GNU_SOURCE
#include "netpolicy.h"
#include "util.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <strings.h>

/* The IANA IPv4 and IPv6 Special-Purpose Address Registries, with the
 * multicast and deprecated blocks, as refused destinations of "egress".
 * Reviewed as a table; each entry has a unit test. */
const sbx_special_range sbx_special_ranges[] = {
    {"0.0.0.0/8", "this network"},
    {"10.0.0.0/8", "private"},
    {"100.64.0.0/10", "shared address space (CGNAT)"},
    {"127.0.0.0/8", "loopback"},
    {"169.254.0.0/16", "link local (cloud metadata services)"},
    {"172.16.0.0/12", "private"},
    {"192.0.0.0/24", "IETF protocol assignments (DS-Lite, PCP, TURN, NAT64 discovery)"},
    {"192.0.2.0/24", "documentation (TEST-NET-1)"},
    {"192.31.196.0/24", "AS112-v4"},
    {"192.52.193.0/24", "AMT"},
    {"192.88.99.0/24", "deprecated 6to4 relay anycast"},
    {"192.168.0.0/16", "private"},
    {"192.175.48.0/24", "direct delegation AS112 service"},
    {"198.18.0.0/15", "benchmarking"},
    {"198.51.100.0/24", "documentation (TEST-NET-2)"},
    {"203.0.113.0/24", "documentation (TEST-NET-3)"},
    {"224.0.0.0/4", "multicast"},
    {"240.0.0.0/4", "reserved, and limited broadcast"},
    {"::/96", "unspecified, loopback and deprecated IPv4-compatible"},
    {"::ffff:0:0/96", "IPv4-mapped"},
    {"64:ff9b::/96", "IPv4/IPv6 translation (NAT64)"},
    {"64:ff9b:1::/48", "local-use IPv4/IPv6 translation"},
    {"100::/64", "discard-only"},
    {"100:0:0:1::/64", "dummy prefix"},
    {"2001::/23", "IETF protocol assignments (Teredo, benchmarking, ORCHID, AMT, AS112)"},
    {"2001:db8::/32", "documentation"},
    {"2002::/16", "6to4"},
    {"2620:4f:8000::/48", "direct delegation AS112 service"},
    {"3fff::/20", "documentation"},
    {"5f00::/16", "segment routing SIDs"},
    {"fc00::/7", "unique local (ULA)"},
    {"fe80::/10", "link local"},
    {"fec0::/10", "deprecated site local"},
    {"ff00::/8", "multicast"},
};
const size_t sbx_special_range_count = SBX_ARRAY_SIZE(sbx_special_ranges);

int sbx_cidr_parse(const char *s, sbx_cidr *out) {
  char buf[64];
  if (!s || strlen(s) >= sizeof buf) return -1;
  strcpy(buf, s);
  char *slash = strchr(buf, '/');
  int prefix = -1;
  if (slash) {
    *slash = 0;
    char *end;
    long p = strtol(slash + 1, &end, 10);
    if (!slash[1] || *end || p < 0 || p > 128) return -1;
    prefix = (int)p;
  }
  *out = (sbx_cidr){0};
  if (inet_pton(AF_INET, buf, out->addr) == 1) {
    out->family = AF_INET;
    if (prefix > 32) return -1;
    out->prefix = prefix < 0 ? 32 : prefix;
  } else if (inet_pton(AF_INET6, buf, out->addr) == 1) {
    out->family = AF_INET6;
    out->prefix = prefix < 0 ? 128 : prefix;
  } else {
    return -1;
  }
  int bytes = out->family == AF_INET ? 4 : 16;
  for (int i = 0; i < bytes; i++) {
    int keep = out->prefix - i * 8;
    uint8_t mask = keep >= 8 ? 0xff : keep <= 0 ? 0 : (uint8_t)(0xff << (8 - keep));
    out->addr[i] &= mask;
  }
  return 0;
}

bool sbx_cidr_contains(const sbx_cidr *c, int family, const void *addr) {
  if (c->family != family) return false;
  const uint8_t *a = addr;
  for (int i = 0; i * 8 < c->prefix; i++) {
    int keep = c->prefix - i * 8;
    uint8_t mask = keep >= 8 ? 0xff : (uint8_t)(0xff << (8 - keep));
    if ((a[i] & mask) != c->addr[i]) return false;
  }
  return true;
}

bool sbx_addr_special(int family, const void *addr) {
  for (size_t i = 0; i < sbx_special_range_count; i++) {
    sbx_cidr c;
    if (sbx_cidr_parse(sbx_special_ranges[i].cidr, &c) == 0 && sbx_cidr_contains(&c, family, addr)) return true;
  }
  return false;
}

int sbx_special_nft(int family, char *out, size_t len) {
  size_t o = 0;
  out[0] = 0;
  for (size_t i = 0; i < sbx_special_range_count; i++) {
    bool v6 = strchr(sbx_special_ranges[i].cidr, ':') != NULL;
    if (v6 != (family == AF_INET6)) continue;
    int n = snprintf(out + o, len - o, "%s%s", o ? ", " : "", sbx_special_ranges[i].cidr);
    if (n < 0 || (size_t)n >= len - o) return -ENOSPC;
    o += n;
  }
  return 0;
}

static bool label_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

bool sbx_dns_name_valid(const char *s) {
  if (!s) return false;
  if (!strncmp(s, "*.", 2)) s += 2;
  size_t n = strlen(s), label = 0;
  if (!n || n > 253 || s[n - 1] == '.') return false;
  bool alpha = false; /* an address is not a name */
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '.') {
      if (!label) return false;
      label = 0;
    } else if (!label_char((unsigned char)s[i]) || ++label > 63) {
      return false;
    } else if (!(s[i] >= '0' && s[i] <= '9')) {
      alpha = true;
    }
  }
  return alpha;
}

bool sbx_dns_name_match(const char *pattern, const char *name) {
  if (!strncmp(pattern, "*.", 2)) {
    size_t pl = strlen(pattern + 1), nl = strlen(name); /* ".example.com" */
    return nl > pl && !strcasecmp(name + nl - pl, pattern + 1);
  }
  return !strcasecmp(pattern, name);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

int sbx_dns_question(const uint8_t *m, size_t len, char name[256], uint16_t *qtype) {
  if (len < 12 || (m[2] & 0x80) || (m[2] & 0x78)) return -1; /* a query, opcode QUERY */
  return sbx_dns_question_of(m, len, name, qtype);
}

int sbx_dns_question_of(const uint8_t *m, size_t len, char name[256], uint16_t *qtype) {
  if (len < 12 || get16(m + 4) != 1) return -1; /* one question */
  size_t off = 12, o = 0;
  for (;;) {
    if (off >= len) return -1;
    size_t l = m[off++];
    if (!l) break;
    if (l > 63 || off + l > len || o + l + 1 > 254) return -1; /* no compression in a question */
    if (o) name[o++] = '.';
    for (size_t i = 0; i < l; i++) {
      unsigned char c = m[off + i];
      if (!label_char(c)) return -1;
      name[o++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    off += l;
  }
  if (!o || off + 4 > len) return -1;
  name[o] = 0;
  *qtype = get16(m + off);
  return get16(m + off + 2) == 1 ? 0 : -1; /* class IN */
}

/* The end of the question section, or 0. */
static size_t question_end(const uint8_t *m, size_t len) {
  size_t off = 12;
  while (off < len && m[off]) {
    if (m[off] > 63) return 0;
    off += 1 + m[off];
  }
  return off + 5 <= len ? off + 5 : 0;
}

size_t sbx_dns_reply(const uint8_t *q, size_t qlen, int rcode, uint8_t *out, size_t outlen) {
  size_t end = qlen >= 12 ? question_end(q, qlen) : 0;
  if (!end || end > outlen) return 0;
  memcpy(out, q, end);
  out[2] = (uint8_t)(0x80 | (q[2] & 0x01)); /* QR, the query's RD */
  out[3] = (uint8_t)(0x80 | (rcode & 0x0f)); /* RA */
  out[4] = 0, out[5] = 1;                     /* one question */
  memset(out + 6, 0, 6);                      /* no records */
  return end;
}

/* Past a name at off (labels, or a compression pointer ending it): the
 * offset after it, or 0. */
static size_t skip_name(const uint8_t *m, size_t len, size_t off) {
  for (int n = 0; n < 128; n++) {
    if (off >= len) return 0;
    uint8_t l = m[off];
    if (!l) return off + 1;
    if ((l & 0xc0) == 0xc0) return off + 2 <= len ? off + 2 : 0;
    if (l > 63) return 0;
    off += 1 + (size_t)l;
  }
  return 0;
}

int sbx_dns_addresses(const uint8_t *m, size_t len, sbx_dns_addr *out, int max) {
  if (len < 12) return -1;
  unsigned qd = get16(m + 4), an = get16(m + 6);
  size_t off = 12;
  for (unsigned i = 0; i < qd; i++) {
    if (!(off = skip_name(m, len, off)) || (off += 4) > len) return -1;
  }
  int n = 0;
  for (unsigned i = 0; i < an; i++) {
    if (!(off = skip_name(m, len, off)) || off + 10 > len) return -1;
    uint16_t type = get16(m + off), class = get16(m + off + 2), rdlen = get16(m + off + 8);
    off += 10;
    if (off + rdlen > len) return -1;
    if (class == 1 && n < max && ((type == 1 && rdlen == 4) || (type == 28 && rdlen == 16))) {
      out[n].family = type == 1 ? AF_INET : AF_INET6;
      memcpy(out[n].addr, m + off, rdlen);
      n++;
    }
    off += rdlen;
  }
  return n;
}

int sbx_dns_server_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
  char host[64];
  int port = 53;
  const char *colon = strrchr(s, ':');
  memset(ss, 0, sizeof *ss);
  if (s[0] == '[') { /* [v6]:port */
    const char *close = strchr(s, ']');
    if (!close || (size_t)(close - s - 1) >= sizeof host) return -1;
    snprintf(host, sizeof host, "%.*s", (int)(close - s - 1), s + 1);
    if (close[1] && close[1] != ':') return -1;
    colon = close[1] ? close + 1 : NULL;
  } else if (colon && strchr(s, ':') == colon) { /* v4:port */
    if ((size_t)(colon - s) >= sizeof host) return -1;
    snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
  } else { /* v4, or v6 without a port */
    if (strlen(s) >= sizeof host) return -1;
    snprintf(host, sizeof host, "%s", s);
    colon = NULL;
  }
  if (colon) {
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || p < 1 || p > 65535) return -1;
    port = (int)p;
  }
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *len = sizeof *a4;
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    *len = sizeof *a6;
  } else {
    return -1;
  }
  return 0;
}
