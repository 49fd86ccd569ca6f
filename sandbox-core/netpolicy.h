/* What network "egress" may reach: the IANA special-purpose address
 * registries (v4 and v6) as one table, refused unless allowed, and the
 * parsing of allowedHosts entries. Pure: unit-tested entry by entry. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

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

/* allowedHosts names: "example.com" (that name) or "*.example.com" (any
 * name under it): letters, digits, '-' and '_' labels, at most 253 bytes. */
bool sbx_dns_name_valid(const char *s);
/* Whether `name` (lower case, no trailing dot) is one a pattern allows. */
bool sbx_dns_name_match(const char *pattern, const char *name);

/* DNS messages as the sandbox's resolver filter reads them: from anything
 * in the sandbox, so pure and fuzzed. */
#define SBX_DNS_MAX 4096 /* a message over UDP, EDNS included */
/* The question of a standard query: its name (lower case, dotted, no
 * trailing dot; labels of [a-z0-9_-] only) and type. -1 when it is not
 * exactly one question of a standard query, or a label has other bytes. */
int sbx_dns_question(const uint8_t *m, size_t len, char name[256], uint16_t *qtype);
/* The same for any message (an answer too), its flags unchecked. */
int sbx_dns_question_of(const uint8_t *m, size_t len, char name[256], uint16_t *qtype);
/* An answer to query q (its header and question) with rcode and no
 * records: the length written to out, 0 when q is too short. */
size_t sbx_dns_reply(const uint8_t *q, size_t qlen, int rcode, uint8_t *out, size_t outlen);
/* The A and AAAA records of an answer section, at most max: their count,
 * -1 when the message is malformed. */
typedef struct sbx_dns_addr {
  int family;
  uint8_t addr[16];
} sbx_dns_addr;
int sbx_dns_addresses(const uint8_t *m, size_t len, sbx_dns_addr *out, int max);

/* A resolver's address: "192.0.2.53", "192.0.2.53:5353", "2001:db8::53" or
 * "[2001:db8::53]:5353" (port 53 unless said). -1 when malformed. */
int sbx_dns_server_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len);
