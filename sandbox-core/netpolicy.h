/* What network "egress" may reach: the IANA special-purpose address
 * registries (v4 and v6) as one table, refused unless allowed, and the
 * parsing of allowedHosts entries. Pure: unit-tested entry by entry. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sbx_cidr {
  int family; /* AF_INET or AF_INET6 */
  uint8_t addr[16];
  int prefix;
} sbx_cidr;

typedef struct sbx_special_range {
  const char *cidr;
  const char *what;
} sbx_special_range;

extern const sbx_special_range sbx_special_ranges[];
extern const size_t sbx_special_range_count;

/* "10.0.0.0/8", "2001:db8::/32", "192.0.2.1" (a /32 or /128). -1 when
 * malformed; the address is masked to its prefix. */
int sbx_cidr_parse(const char *s, sbx_cidr *out);
bool sbx_cidr_contains(const sbx_cidr *c, int family, const void *addr);
/* Whether an address is in a special-purpose range (not the public
 * internet). */
bool sbx_addr_special(int family, const void *addr);
/* Writes the table as nftables set elements for one family: "a/n, b/m". */
int sbx_special_nft(int family, char *out, size_t len);
