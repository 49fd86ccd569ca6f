#define _GNU_SOURCE
#include "netpolicy.h"
#include "util.h"

#include <arpa/inet.h>
#include <sys/socket.h>

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
