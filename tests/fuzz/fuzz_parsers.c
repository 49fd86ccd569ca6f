/* libFuzzer target for the other parsers a stranger reaches: HTTP request
 * heads and headers (the daemon's HTTP transport and the preview proxy),
 * preview Host names, and the configuration file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../sandbox-core/config.h"
#include "../../sandbox-core/httpparse.h"
#include "../../sandbox-core/netpolicy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *d = (const char *)data;
  sbx_http_head h;
  long n = sbx_http_parse_head(d, size, &h);
  if (n > 0) {
    if ((size_t)n > size || h.headers < d || h.headers > d + n) abort();
    static const char *const names[] = {"Host", "Content-Length", "Authorization", "Origin", "Connection", "Upgrade"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      size_t len;
      const char *v = sbx_http_header(h.headers, d + n, names[i], &len);
      if (v && (v < d || v + len > d + n)) abort(); /* a value inside the head */
      int port;
      char id[64], token[17];
      if (v && sbx_preview_host_parse(v, len, &port, id, token) && (port < 1 || port > 65535 || strlen(token) != 16))
        abort();
    }
    /* the proxy's framing: a body never reaches past what it was given */
    sbx_http_body b;
    bool up;
    if (sbx_http_request_body(h.headers, d + n - 2, &b, &up) == 0) {
      size_t off = (size_t)n;
      while (off < size && !sbx_http_body_done(&b)) {
        size_t step = (size - off) % 7 + 1; /* fed in uneven pieces */
        if (step > size - off) step = size - off;
        long k = sbx_http_body_feed(&b, d + off, step);
        if (k < 0) break;
        if ((size_t)k > step || (k < (long)step && !sbx_http_body_done(&b))) abort();
        off += (size_t)k;
      }
    }
  }
  int port;
  char id[64], token[17];
  sbx_preview_host_parse(d, size, &port, id, token);
  /* the sandbox's resolver filter reads DNS messages from the sandbox and
   * answers from the network */
  char name[256];
  uint16_t qtype;
  if (sbx_dns_question(data, size, name, &qtype) == 0 && (strlen(name) > 253 || !name[0])) abort();
  uint8_t out[SBX_DNS_MAX];
  size_t rl = sbx_dns_reply(data, size, 3, out, sizeof out);
  if (rl > size || rl > sizeof out) abort();
  sbx_dns_addr addrs[8];
  if (sbx_dns_addresses(data, size, addrs, 8) > 8) abort();
  if (size < 300) {
    char s[300];
    memcpy(s, d, size);
    s[size] = 0;
    if (sbx_dns_name_valid(s)) sbx_dns_name_match(s, "a.example.com");
    struct sockaddr_storage ss;
    socklen_t sl;
    sbx_dns_server_parse(s, &ss, &sl);
  }
  sbx_config c;
  sbx_config_defaults(&c);
  char err[512];
  sbx_config_parse(&c, d, size, err, sizeof err);
  sbx_config_free(&c);
  return 0;
}
