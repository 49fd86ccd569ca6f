/* Unit tests of the side-effect-free helpers, as TAP. */
#define _GNU_SOURCE
#include "../../fuse-mount/s3.h"
#include "../../fuse-mount/sha256.h"
#include "../../mcp-server/framing.h"
#include "../../mcp-server/schema.h"
#include "../../sandbox-core/bucket.h"
#include "../../sandbox-core/cgroup.h"
#include "../../sandbox-core/config.h"
#include "../../sandbox-core/exec.h"
#include "../../sandbox-core/httpparse.h"
#include "../../sandbox-core/netpolicy.h"

#include <sys/socket.h>
#include "../../sandbox-core/sandbox.h"
#include "../../sandbox-core/util.h"

static int n, failed;
#define OK(cond, ...)                                                          \
  do {                                                                         \
    n++;                                                                       \
    if (cond) printf("ok %d - ", n);                                           \
    else {                                                                     \
      printf("not ok %d - ", n);                                               \
      failed++;                                                                \
    }                                                                          \
    printf(__VA_ARGS__);                                                       \
    printf("\n");                                                              \
  } while (0)

static void test_headtail(void) {
  sbx_headtail h;
  sbx_headtail_init(&h, 10);
  sbx_headtail_add(&h, "abc", 3);
  size_t len;
  char *s = sbx_headtail_render(&h, &len);
  OK(!sbx_headtail_truncated(&h) && !strcmp(s, "abc"), "headtail keeps short output whole");
  free(s);
  for (int i = 0; i < 100; i++) sbx_headtail_add(&h, "0123456789", 10);
  sbx_headtail_add(&h, "XYZ", 3);
  s = sbx_headtail_render(&h, &len);
  OK(sbx_headtail_truncated(&h), "headtail reports truncation");
  OK(!strncmp(s, "abc01", 5), "headtail keeps the head (%.5s)", s);
  OK(len >= 5 && !strcmp(s + len - 5, "789XYZ" + 1), "headtail keeps the tail (%s)", s + len - 5);
  OK(strstr(s, "bytes omitted") != NULL, "headtail marks the cut");
  free(s);
  sbx_headtail_free(&h);
}

static void test_utf8(void) {
  size_t len;
  char *s = sbx_utf8_repair("a\xff" "b", 3, &len);
  OK(!strcmp(s, "a\xef\xbf\xbd" "b"), "invalid byte becomes U+FFFD");
  free(s);
  s = sbx_utf8_repair("\xc3\xa9\0z", 4, &len);
  OK(len == 6 && !memcmp(s, "\xc3\xa9\xef\xbf\xbdz", 6), "NUL becomes U+FFFD, valid sequences kept");
  free(s);
  s = sbx_utf8_repair("\xed\xa0\x80", 3, &len);
  OK(sbx_utf8_valid(s, len) && len == 9, "surrogates are repaired");
  free(s);
  OK(sbx_utf8_complete_prefix("ab\xe2\x82", 4) == 2, "a cut 3-byte sequence is held back");
  OK(sbx_utf8_complete_prefix("ab\xe2\x82\xac", 5) == 5, "a complete sequence is passed");
  OK(sbx_utf8_complete_prefix("ab\xff", 3) == 3, "an invalid byte is not held back");
  OK(!sbx_utf8_valid("\xc0\x80", 2), "overlong encoding is invalid");
}

static void test_misc(void) {
  OK(sbx_parse_duration_ms("10m", 1) == 600000, "10m");
  OK(sbx_parse_duration_ms("30s", 1) == 30000, "30s");
  OK(sbx_parse_duration_ms("1h", 1) == 3600000, "1h");
  OK(sbx_parse_duration_ms("250", 1) == 250, "bare number in the unit given (ms)");
  OK(sbx_parse_duration_ms("5", 1000) == 5000, "bare number in the unit given (s)");
  OK(sbx_parse_duration_ms("10x", 1) == -1 && sbx_parse_duration_ms("", 1) == -1 && sbx_parse_duration_ms("-1s", 1) == -1,
     "malformed durations refused");
  OK(sbx_valid_id("abc-1") && !sbx_valid_id("") && !sbx_valid_id("A") && !sbx_valid_id("a/b") &&
         !sbx_valid_id("0123456789012345678901234567890123456789012345678901234567890123"),
     "sandbox id rules");
  char id[64], id2[64];
  sbx_default_id("/home/me/My Project!", id);
  sbx_default_id("/other/My Project!", id2);
  OK(sbx_valid_id(id) && !strncmp(id, "my-project-", 11), "default id is a slug of the basename (%s)", id);
  OK(strcmp(id, id2) != 0, "default id differs by full path");
  sbx_default_id("/", id);
  OK(sbx_valid_id(id), "default id of / is valid (%s)", id);
  size_t len;
  char *b = sbx_base64_encode("hello\0x", 7, &len), *d;
  OK(!strcmp(b, "aGVsbG8AeA=="), "base64 encode");
  size_t dl;
  OK(sbx_base64_decode(b, len, &d, &dl) == 0 && dl == 7 && !memcmp(d, "hello\0x", 7), "base64 round trip");
  free(b);
  free(d);
  OK(sbx_base64_decode("a$==", 4, &d, &dl) < 0, "base64 rejects junk");
}

static void test_env(void) {
  sbx_env e = {0};
  const char *t = "export A='1'\nexport B='it'\\''s\nmultiline'\nexport C\nexport _='/bin/x'\nexport D=''\n";
  sbx_env_parse_export(&e, t, strlen(t));
  OK(sbx_env_get(&e, "A") && !strcmp(sbx_env_get(&e, "A"), "1"), "export -p: simple value");
  OK(sbx_env_get(&e, "B") && !strcmp(sbx_env_get(&e, "B"), "it's\nmultiline"), "export -p: quotes and newlines");
  OK(!sbx_env_get(&e, "C") && !sbx_env_get(&e, "_"), "export -p: valueless and _ skipped");
  OK(sbx_env_get(&e, "D") && !*sbx_env_get(&e, "D"), "export -p: empty value");
  const char *b = "declare -x BA=\"q\\\"d \\$x\"\ndeclare -rx BB=$'l1\\nl2\\t\\'\\x41\\101\\E'\n"
                  "declare -- NOT=\"exported\"\ndeclare -x BC\n";
  sbx_env_parse_export(&e, b, strlen(b));
  OK(sbx_env_get(&e, "BA") && !strcmp(sbx_env_get(&e, "BA"), "q\"d $x"), "declare -x: double quotes");
  OK(sbx_env_get(&e, "BB") && !strcmp(sbx_env_get(&e, "BB"), "l1\nl2\t'AA\033"), "declare -rx: $'...' escapes");
  OK(!sbx_env_get(&e, "NOT") && !sbx_env_get(&e, "BC"), "declare without -x and without a value skipped");
  sbx_env_unset(&e, "BA");
  sbx_env_unset(&e, "BB");
  const char *st = "declare -- keep=\"1\"\ndeclare -x EXP=\"2\"\ndeclare -ir RANDOM=\"5\"\ndeclare -a BASH_ARGV=()\n"
                   "declare -- __sbx_cmd=\"x\"\ndeclare -A m=([k]=\"v\" )\nf () \n{ \n    echo hi\n}\nset -o pipefail\n";
  size_t fl;
  char *f = sbx_shell_state_filter(st, strlen(st), &fl);
  OK(f && !strcmp(f, "declare -- keep=\"1\"\ndeclare -A m=([k]=\"v\" )\nf () \n{ \n    echo hi\n}\nset -o pipefail\n") &&
         fl == strlen(f),
     "shell state: exported and bash's own variables dropped, the rest kept");
  free(f);
  sbx_env_set(&e, "A", "2");
  OK(!strcmp(sbx_env_get(&e, "A"), "2") && e.n == 3, "env_set replaces");
  sbx_env_unset(&e, "A");
  OK(!sbx_env_get(&e, "A") && e.n == 2 && e.v[2] == NULL, "env_unset keeps the vector terminated");
  sbx_env_clear(&e);
}

static void test_http_parse(void) {
  sbx_http_head h;
  const char *req = "GET /mcp HTTP/1.1\r\nHost:  127.0.0.1:8788\r\nX-A: 1\r\n\r\nbody";
  long hl = sbx_http_parse_head(req, strlen(req), &h);
  OK(hl == (long)strlen(req) - 4 && !strcmp(h.method, "GET") && !strcmp(h.path, "/mcp"), "http: request line and head length");
  size_t len;
  const char *v = sbx_http_header(h.headers, req + hl, "host", &len);
  OK(v && len == 14 && !strncmp(v, "127.0.0.1:8788", 14), "http: a header, case-insensitive, blanks skipped");
  OK(!sbx_http_header(h.headers, req + hl, "X-B", &len), "http: an absent header");
  OK(sbx_http_parse_head("GET / HTTP/1.1\r\n", 16, &h) == 0, "http: an incomplete head waits");
  OK(sbx_http_parse_head("GET / FTP/1\r\n\r\n", 17, &h) < 0, "http: a malformed request line");
  OK(sbx_http_parse_head("GET  / HTTP/1.1\r\n\r\n", 20, &h) < 0 && sbx_http_parse_head("GET\t/ HTTP/1.1\r\n\r\n", 19, &h) < 0 &&
         sbx_http_parse_head("GET / HTTP/1.1 x\r\n\r\n", 21, &h) < 0,
     "http: two spaces, a tab, a fourth word in the request line are malformed");
  char longreq[3100];
  int ln = snprintf(longreq, sizeof longreq, "GET /%02990d HTTP/1.1\r\nHost: h\r\n\r\n", 0);
  OK(sbx_http_parse_head(longreq, (size_t)ln, &h) == ln && h.path_len == 2991 && strlen(h.path) == sizeof h.path - 1 &&
         !strcmp(h.version, "HTTP/1.1"),
     "http: a target of 2,991 bytes: its length, its start kept");
  int port;
  char id[64], tok[17];
  const char *host = "3000-My-Box-abcdefghijklmnop.LOCALHOST:8787";
  OK(sbx_preview_host_parse(host, strlen(host), &port, id, tok) && port == 3000 && !strcmp(id, "my-box") &&
         !strcmp(tok, "abcdefghijklmnop"),
     "preview host: port, sandbox and token");
  host = "0-box-abcdefghijklmnop.localhost";
  OK(!sbx_preview_host_parse(host, strlen(host), &port, id, tok), "preview host: port 0 is none");
  host = "3000-box-abcdefghijklmno.localhost";
  OK(!sbx_preview_host_parse(host, strlen(host), &port, id, tok), "preview host: a short token is none");
}

/* The framing of `head` (through its blank line), then how much of `rest`
 * is body: -2 when the framing is refused, -1 when the body is broken. */
static long framed(const char *head, const char *rest, bool *up) {
  sbx_http_head h;
  long hl = sbx_http_parse_head(head, strlen(head), &h);
  sbx_http_body b;
  if (hl <= 0 || sbx_http_request_body(h.headers, head + hl - 2, &b, up) < 0) return -2;
  long total = 0;
  for (size_t i = 0; rest[i] && !sbx_http_body_done(&b); i++) { /* a byte at a time */
    long k = sbx_http_body_feed(&b, rest + i, 1);
    if (k < 0) return -1;
    total += k;
  }
  return sbx_http_body_done(&b) ? total : -3;
}

static void test_http_framing(void) {
  bool up;
  OK(framed("GET / HTTP/1.1\r\nHost: h\r\n\r\n", "GET", &up) == 0 && !up, "framing: no length, no body");
  OK(framed("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n", "abcGET", &up) == 3, "framing: Content-Length");
  OK(framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "3;a=b\r\nabc\r\nA\r\n0123456789\r\n0\r\nT: 1\r\n\r\nGET",
            &up) == 38,
     "framing: chunked, with an extension and a trailer");
  OK(framed("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "0\r\n\r\nX", &up) == 5,
     "framing: chunked last in a list of encodings");
  OK(framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "", &up) == -2,
     "framing: both Content-Length and chunked are refused");
  OK(framed("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "", &up) == -2 &&
         framed("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "", &up) == -2,
     "framing: two lengths are refused, equal or not");
  const char *te = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  OK(framed(te, "0\r\n\nGET /x HTTP/1.1\r\n\r\n", &up) == -1 && framed(te, "0\r\n T: 1\r\n\r\n", &up) == -1 &&
         framed(te, "0\r\nT 1\r\n\r\n", &up) == -1 && framed(te, "0\r\nT(: 1\r\n\r\n", &up) == -1 &&
         framed(te, "0\r\nT: 1\n\r\n", &up) == -1,
     "framing: a trailer line that starts with a bare LF or a blank, has no colon, a name of other than token "
     "characters, or ends in a bare LF is broken");
  OK(framed(te, "0\r\nT: a:b\r\nU:\r\n\r\nX", &up) == 17, "framing: trailers with a colon in the value, and empty");
  OK(framed("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "", &up) == -2, "framing: a signed length is refused");
  OK(framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "", &up) == -2,
     "framing: an encoding that does not end in chunked is refused");
  OK(framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "x\r\n", &up) == -1 &&
         framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "1\r\nab\r\n", &up) == -1 &&
         framed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "10000000000000000\r\n", &up) == -1,
     "framing: a broken chunk size, a chunk longer than said, a size past 2^60");
  OK(framed("GET /ws HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n", "", &up) == 0 && up,
     "framing: an upgrade request");
}

static void test_dns(void) {
  OK(sbx_dns_name_valid("api.example.com") && sbx_dns_name_valid("*.example.com") && sbx_dns_name_valid("_srv.x-y.io"),
     "dns: names and *.domain patterns are valid");
  OK(!sbx_dns_name_valid("10.0.0.1") && !sbx_dns_name_valid("a..b") && !sbx_dns_name_valid("a b") &&
         !sbx_dns_name_valid("a.*.b") && !sbx_dns_name_valid("x.") && !sbx_dns_name_valid(""),
     "dns: an address, an empty label, a blank, an inner *, a trailing dot are not names");
  OK(sbx_dns_name_match("*.example.com", "a.b.example.com") && !sbx_dns_name_match("*.example.com", "example.com") &&
         !sbx_dns_name_match("*.example.com", "badexample.com") && sbx_dns_name_match("Example.com", "example.com") &&
         !sbx_dns_name_match("example.com", "a.example.com"),
     "dns: *.domain matches names under it only; a name matches itself only");
  /* id abcd, RD, one question: ok.test A IN */
  static const uint8_t q[] = {0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2, 'O', 'k', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1};
  char name[256];
  uint16_t qt;
  OK(sbx_dns_question(q, sizeof q, name, &qt) == 0 && !strcmp(name, "ok.test") && qt == 1, "dns: a query's name, lowered");
  uint8_t bad[sizeof q];
  memcpy(bad, q, sizeof q);
  bad[14] = '.'; /* "o.": a dot inside a label would fake another name */
  OK(sbx_dns_question(bad, sizeof bad, name, &qt) < 0, "dns: a label with a dot in it is refused");
  memcpy(bad, q, sizeof q);
  bad[2] |= 0x80;
  OK(sbx_dns_question(bad, sizeof bad, name, &qt) < 0 && sbx_dns_question(q, 20, name, &qt) < 0,
     "dns: an answer, or a cut query, is not a query");
  uint8_t r[64];
  size_t rl = sbx_dns_reply(q, sizeof q, 3, r, sizeof r);
  OK(rl == sizeof q && r[0] == 0xab && r[2] == 0x81 && r[3] == 0x83 && r[7] == 0, "dns: NXDOMAIN keeps id and question");
  /* an answer: ok.test CNAME www.ok.test (compressed), www A 100.64.1.2 */
  static const uint8_t a[] = {0xab, 0xcd, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0, 2, 'o', 'k', 4, 't', 'e', 's', 't', 0, 0,
                              1, 0, 1, 0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 6, 3, 'w', 'w', 'w', 0xc0, 12, 0xc0, 37,
                              0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 100, 64, 1, 2};
  sbx_dns_addr ad[4];
  OK(sbx_dns_addresses(a, sizeof a, ad, 4) == 1 && ad[0].family == AF_INET && ad[0].addr[0] == 100 && ad[0].addr[3] == 2,
     "dns: the A record behind a CNAME");
  OK(sbx_dns_addresses(a, sizeof a - 1, ad, 4) < 0, "dns: a record cut short is malformed");
  struct sockaddr_storage ss;
  socklen_t sl;
  OK(sbx_dns_server_parse("127.0.0.1:5353", &ss, &sl) == 0 && ntohs(((struct sockaddr_in *)&ss)->sin_port) == 5353 &&
         sbx_dns_server_parse("[::1]:54", &ss, &sl) == 0 && ss.ss_family == AF_INET6 &&
         sbx_dns_server_parse("2001:db8::1", &ss, &sl) == 0 && ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == 53 &&
         sbx_dns_server_parse("dns.example:53", &ss, &sl) < 0 && sbx_dns_server_parse("1.2.3.4:0", &ss, &sl) < 0,
     "dns: resolver addresses with and without ports");
}

static const char *find(sbx_cg_setting *s, int n, const char *file) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s[i].file, file)) return s[i].value;
  return NULL;
}

static void test_cgroup_mapping(void) {
  sbx_limits l = {.memory_mb = 512, .cpus = 1.5, .pids = 100};
  sbx_cg_setting s[16];
  int k = sbx_cg_limit_settings(true, &l, s, 16);
  OK(k > 0 && find(s, k, "memory.max") && !strcmp(find(s, k, "memory.max"), "536870912"), "v2 memory.max");
  OK(find(s, k, "memory.swap.max") && !strcmp(find(s, k, "memory.swap.max"), "0"), "v2 swap off");
  OK(find(s, k, "pids.max") && !strcmp(find(s, k, "pids.max"), "100"), "v2 pids.max");
  OK(find(s, k, "cpu.max") && !strcmp(find(s, k, "cpu.max"), "150000 100000"), "v2 cpu.max");
  k = sbx_cg_limit_settings(false, &l, s, 16);
  OK(find(s, k, "memory.limit_in_bytes") && !strcmp(find(s, k, "memory.limit_in_bytes"), "536870912"),
     "v1 memory.limit_in_bytes");
  OK(find(s, k, "cpu.cfs_quota_us") && !strcmp(find(s, k, "cpu.cfs_quota_us"), "150000"), "v1 cfs quota");
  OK(find(s, k, "pids.max") && !strcmp(find(s, k, "pids.max"), "100"), "v1 pids.max");
  sbx_limits none = {0};
  OK(sbx_cg_limit_settings(true, &none, s, 16) == 0, "no limits, no settings");
}

static void test_schema(void) {
  json_t *schema = json_loads(
      "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"a\"],\"properties\":{"
      "\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9-]{1,63}$\"},"
      "\"n\":{\"type\":\"integer\",\"minimum\":1},"
      "\"e\":{\"type\":\"string\",\"enum\":[\"x\",\"y\"]},"
      "\"o\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}}}",
      0, NULL);
  char msg[256];
  struct {
    const char *doc;
    bool valid;
  } cases[] = {
      {"{\"a\":\"ok-1\"}", true},          {"{}", false},
      {"{\"a\":\"Bad\"}", false},          {"{\"a\":\"x\",\"zz\":1}", false},
      {"{\"a\":\"x\",\"n\":0}", false},    {"{\"a\":\"x\",\"n\":3}", true},
      {"{\"a\":\"x\",\"n\":\"3\"}", false}, {"{\"a\":\"x\",\"e\":\"z\"}", false},
      {"{\"a\":\"x\",\"o\":{\"k\":1}}", false}, {"{\"a\":\"x\",\"o\":{\"k\":\"v\"}}", true},
  };
  for (size_t i = 0; i < SBX_ARRAY_SIZE(cases); i++) {
    json_t *v = json_loads(cases[i].doc, 0, NULL);
    bool r = mcp_schema_validate(schema, v, msg, sizeof msg);
    OK(r == cases[i].valid, "schema: %s is %s%s%s", cases[i].doc, cases[i].valid ? "valid" : "invalid",
       r ? "" : " - ", r ? "" : msg);
    json_decref(v);
  }
  json_decref(schema);
}

/* Each special-purpose range: its first and last address are refused, and
 * the address just below its first and just above its last is not, unless
 * that neighbour is itself in the table. */
static void bump(uint8_t *a, int bytes, int dir) {
  for (int i = bytes - 1; i >= 0; i--) {
    if (dir > 0 ? a[i]++ != 0xff : a[i]-- != 0) return;
  }
}

static void test_special_ranges(void) {
  for (size_t i = 0; i < sbx_special_range_count; i++) {
    const char *cidr = sbx_special_ranges[i].cidr;
    sbx_cidr c;
    if (sbx_cidr_parse(cidr, &c) < 0) {
      OK(0, "special range %s parses", cidr);
      continue;
    }
    int bytes = c.family == AF_INET ? 4 : 16;
    uint8_t first[16], last[16], below[16], above[16];
    memcpy(first, c.addr, 16);
    memcpy(last, c.addr, 16);
    for (int b = c.prefix; b < bytes * 8; b++) last[b / 8] |= (uint8_t)(0x80 >> (b % 8));
    memcpy(below, first, 16);
    bump(below, bytes, -1);
    memcpy(above, last, 16);
    bump(above, bytes, +1);
    bool wrap_below = !memcmp(first, (uint8_t[16]){0}, bytes), wrap_above = true;
    for (int k = 0; k < bytes; k++) wrap_above &= last[k] == 0xff;
    bool ok = sbx_addr_special(c.family, first) && sbx_addr_special(c.family, last);
    /* the neighbours: outside this range (and public unless another entry has them) */
    bool out = (wrap_below || !sbx_cidr_contains(&c, c.family, below)) && (wrap_above || !sbx_cidr_contains(&c, c.family, above));
    OK(ok && out, "egress refuses %s (%s): first and last address in, neighbours out", cidr, sbx_special_ranges[i].what);
  }
  static const char *const public_addrs[] = {"1.1.1.1", "8.8.8.8", "93.184.216.34", "2606:4700:4700::1111",
                                             "2a00:1450:4001::200e", "192.0.1.1", "198.20.0.1"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(public_addrs); i++) {
    sbx_cidr c;
    sbx_cidr_parse(public_addrs[i], &c);
    OK(!sbx_addr_special(c.family, c.addr), "egress reaches public %s", public_addrs[i]);
  }
  sbx_cidr c;
  OK(sbx_cidr_parse("10.1.2.3/8", &c) == 0 && c.addr[1] == 0 && c.prefix == 8, "a CIDR is masked to its prefix");
  OK(sbx_cidr_parse("10.0.0.0/33", &c) < 0 && sbx_cidr_parse("nope", &c) < 0 && sbx_cidr_parse("::/129", &c) < 0 &&
         sbx_cidr_parse("1.2.3.4/", &c) < 0,
     "malformed CIDRs are refused");
  char v4[2048];
  OK(sbx_special_nft(AF_INET, v4, sizeof v4) == 0 && strstr(v4, "198.18.0.0/15") && !strchr(v4, ':'),
     "the nftables set is made from the table");
}

static void test_config(void) {
  static const struct {
    const char *doc;
    const char *err; /* NULL: valid */
  } cases[] = {
      {"{}", NULL},
      {"{\"maxSandboxes\": 5, \"limits\": {\"memoryMB\": 256, \"cpus\": 0.5}, \"previewPort\": 0}", NULL},
      {"{\"buckets\": {\"allowedEndpoints\": [\"http://127.0.0.1:\"], \"profiles\": {\"r2\": "
       "{\"accessKeyId\": \"a\", \"secretAccessKey\": \"b\", \"endpoint\": \"https://x.example\"}}}}",
       NULL},
      {"{\"maxSandboxes\": 0}", "maxSandboxes must be an integer from 1"},
      {"{\"maxSandboxes\": 1e9}", "maxSandboxes must be an integer"},
      {"{\"limits\": {\"memoryMB\": \"lots\"}}", "limits.memoryMB must be"},
      {"{\"limits\": {\"swap\": 1}}", "limits: 'swap' is not a known key"},
      {"{\"nonsense\": 1}", "'nonsense' is not a known key"},
      {"{\"maxSandboxes\": 1, \"maxSandboxes\": 2}", "duplicate"},
      {"{\"mount\": \"relative/path\"}", "mount must be an absolute path"},
      {"{\"buckets\": {\"allowedEndpoints\": [\"ftp://x\"]}}", "allowedEndpoints[0] must be"},
      {"{\"buckets\": {\"profiles\": {\"Bad Name\": {}}}}", "profile name"},
      {"{\"buckets\": {\"profiles\": {\"p\": {\"accessKeyId\": \"a\"}}}}", "are required"},
      {"[1]", "must be a JSON object"},
      {"{\n\"limits\": {", "line 2"},
  };
  for (size_t i = 0; i < SBX_ARRAY_SIZE(cases); i++) {
    sbx_config c;
    sbx_config_defaults(&c);
    char err[400] = "";
    int r = sbx_config_parse(&c, cases[i].doc, strlen(cases[i].doc), err, sizeof err);
    char shown[200];
    snprintf(shown, sizeof shown, "%s", cases[i].doc);
    for (char *p = shown; *p; p++)
      if (*p == '\n') *p = ' ';
    if (!cases[i].err) OK(r == 0, "config %s is valid%s%s", shown, r ? ": " : "", err);
    else OK(r < 0 && strstr(err, cases[i].err), "config %s is refused naming the key (%s)", shown, err);
    sbx_config_free(&c);
  }
  sbx_config c;
  sbx_config_defaults(&c);
  char err[400];
  const char *doc = "{\"buckets\": {\"profiles\": {\"r2\": {\"accessKeyId\": \"AK\", \"secretAccessKey\": \"SECRET\"}}}}";
  sbx_config_parse(&c, doc, strlen(doc), err, sizeof err);
  json_t *j = sbx_config_json(&c);
  char *text = json_dumps(j, 0);
  OK(!strstr(text, "SECRET") && strstr(text, "AK") && strstr(text, "********"), "doctor's view masks secrets: %s", text);
  free(text);
  json_decref(j);
  OK(c.max_sandboxes == 1024 && c.limits.disk_mb == 8192 && c.preview_port == 8787, "defaults");
  sbx_config_free(&c);
}

static bool peeked_buf(const char *prefix, size_t len, const char *want) {
  json_t *id = mcp_peek_id(prefix, len);
  char *s = id ? json_dumps(id, JSON_ENCODE_ANY) : NULL;
  bool ok = want ? s && !strcmp(s, want) : !s;
  free(s);
  json_decref(id);
  return ok;
}

static bool peeked(const char *prefix, const char *want) { return peeked_buf(prefix, strlen(prefix), want); }

static bool framed_count(void *ud, const char *msg, size_t len) {
  (void)msg, (void)len;
  ++*(int *)ud;
  return true;
}

static void test_peek_id(void) {
  OK(peeked("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"x\":\"aaa", "5"),
     "peek id: an integer before a cut-off params");
  OK(peeked(" { \"id\" : \"a\\\"b\" ,", "\"a\\\"b\""), "peek id: a string with an escaped quote, spaces around");
  OK(peeked("{\"params\":{\"id\":7,\"s\":\"}\"},\"id\":8,", "8"), "peek id: an id nested in params is not the message's");
  OK(peeked("{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"s\":\"aaa", NULL), "peek id: none before the cut");
  OK(peeked("{\"id\":12", NULL), "peek id: a number cut off may be longer");
  OK(peeked("{\"id\":{\"a\":1},", NULL) && peeked("{\"id\":null,", NULL) && peeked("{\"id\":1.5,", NULL),
     "peek id: only a string or an integer is an id");
  OK(peeked("[{\"id\":1},", NULL) && peeked("", NULL) && peeked("{\"id\" 1,", NULL), "peek id: not an object, empty, no colon");
  mcp_framer f;
  mcp_framer_init(&f, 64);
  int calls = 0;
  char big[200];
  memset(big, 'x', sizeof big);
  memcpy(big, "{\"id\":\"q\",\"p\":\"", 14);
  mcp_framer_feed(&f, big, 40, framed_count, &calls);
  mcp_framer_feed(&f, big + 40, sizeof big - 40, framed_count, &calls);
  mcp_framer_feed(&f, "\n{}\n", 4, framed_count, &calls);
  OK(calls == 2 && f.head_len >= 14 && peeked_buf(f.head, f.head_len, "\"q\""),
     "framer: an oversized message split across reads keeps its head, and the next message is read");
  mcp_framer_free(&f);
}

static void digest(const void *p, size_t len, size_t step, char out[65]) {
  sha256_ctx c;
  uint8_t d[32];
  sha256_init(&c);
  for (size_t o = 0; o < len; o += step) sha256_update(&c, (const char *)p + o, len - o < step ? len - o : step);
  sha256_final(&c, d);
  sha256_tohex(d, out);
}

static void test_sha256(void) {
  static char a[1000000], r[70000];
  memset(a, 'a', sizeof a);
  uint64_t x = 88172645463325252ULL;
  for (size_t i = 0; i < sizeof r; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, r[i] = (char)x;
  for (int portable = 1; portable >= 0; portable--) {
    bool ni = sha256_force_portable(portable);
    const char *which = portable ? "portable" : ni ? "SHA-NI" : "portable (no SHA-NI here)";
    char h[65];
    digest("", 0, 1, h);
    OK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "sha256 %s: empty", which);
    digest("abc", 3, 3, h);
    OK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "sha256 %s: abc", which);
    digest(a, sizeof a, 4097, h);
    OK(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "sha256 %s: a million a",
       which);
  }
  /* the CPU's rounds against the portable ones, every length to 300 and
   * larger ones fed in odd pieces */
  int same = 0, total = 0;
  for (size_t len = 0; len < sizeof r; len = len < 300 ? len + 1 : len * 2 + 13) {
    char h1[65], h2[65];
    sha256_force_portable(true);
    digest(r, len, len % 7 + 61, h1);
    sha256_force_portable(false);
    digest(r, len, len % 7 + 61, h2);
    same += !strcmp(h1, h2);
    total++;
  }
  OK(same == total, "sha256: the CPU's rounds and the portable ones agree on %d of %d inputs", same, total);
}

static void test_s3_body_protected(void) {
  static const struct {
    const char *endpoint;
    bool unsigned_ok;
  } cases[] = {{"https://abc.r2.cloudflarestorage.com", true}, {"HTTPS://s3.amazonaws.com", true},
               {"http://127.0.0.1:9000", true}, {"http://localhost:9000", true}, {"http://[::1]:9000", true},
               {"http://127.0.0.1", true}, {"http://10.0.0.5:9000", false}, {"http://s3.example.com", false},
               {"http://127.evil.example:80", false}, {"http://127.0.0.1.5:80", false}, {"http://127.1:80", false},
               {"http://127.255.0.9/", true}, {"http://localhost.evil.example", false},
               {"http://[::1].x", false}, {"http://[::1", false}, {"ftp://127.0.0.1", false}, {"127.0.0.1:9000", false}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    s3_conf c = {0};
    snprintf(c.endpoint, sizeof c.endpoint, "%s", cases[i].endpoint);
    OK(s3_body_protected(&c) == cases[i].unsigned_ok, "s3: a body to %s is %s", cases[i].endpoint,
       cases[i].unsigned_ok ? "sent unsigned (TLS or this host)" : "signed with its hash");
  }
}

static void test_s3_url(void) {
  char url[1024];
  s3_conf c = {.endpoint = "http://127.0.0.1:9000", .bucket = "test", .path_style = true};
  s3_url(&c, "dir/a b.txt", "", url, sizeof url);
  OK(!strcmp(url, "http://127.0.0.1:9000/test/dir/a%20b.txt"), "s3: a path-style URL: endpoint/bucket/key (%s)", url);
  c = (s3_conf){.endpoint = "https://s3.eu-west-1.amazonaws.com", .bucket = "logs"};
  s3_url(&c, "x/y", "list-type=2", url, sizeof url);
  OK(!strcmp(url, "https://logs.s3.eu-west-1.amazonaws.com/x/y?list-type=2"),
     "s3: a virtual-host URL: bucket.host/key, the query after it (%s)", url);
  /* which style a mount gets: AWS by virtual host (but for a bucket with a
   * dot, which its certificate would not cover), every other endpoint
   * (R2, MinIO, this host's) by path */
  static const struct {
    const char *endpoint, *bucket;
    bool path_style;
    const char *region; /* when the request names none */
  } cases[] = {{"https://s3.eu-west-1.amazonaws.com", "logs", false, "eu-west-1"},
               {"https://s3.us-east-1.amazonaws.com", "my.logs", true, "us-east-1"},
               {"https://abc.r2.cloudflarestorage.com", "logs", true, "auto"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sbx_bucket_req r = {.bucket = cases[i].bucket, .mount_path = "/workspace/b", .endpoint = cases[i].endpoint,
                        .access_key = "AKIAEXAMPLE", .secret_key = "secret", .local = -1};
    sbx_bucket b = {0};
    char ak[256], sk[256];
    sbx_error err = {0};
    int rc = sbx_bucket_prepare(&r, &b, ak, sk, &err);
    OK(rc == 0 && b.path_style == cases[i].path_style && !strcmp(b.region, cases[i].region),
       "s3: bucket %s at %s is mounted %s, region %s (%s)", cases[i].bucket, cases[i].endpoint,
       cases[i].path_style ? "path-style" : "by virtual host", cases[i].region, err.message);
  }
}

static void test_s3_etag_hash(void) {
  uint64_t h = s3_etag_hash("\"9b2cf535f27731c974343645a3985328\"");
  OK(h != 0, "s3: an ETag hashes to a number that is not 0");
  OK(s3_etag_hash("&quot;9b2cf535f27731c974343645a3985328&quot;") == h &&
         s3_etag_hash(" \"9B2CF535F27731C974343645A3985328\"\r\n") == h &&
         s3_etag_hash("9b2cf535f27731c974343645a3985328") == h,
     "s3: the same ETag quoted as a header, as a listing's XML, in capitals or bare hashes the same");
  OK(s3_etag_hash("\"9b2cf535f27731c974343645a3985329\"") != h &&
         s3_etag_hash("\"9b2cf535f27731c974343645a3985328-2\"") != h,
     "s3: another ETag, or the multipart one of the same digits, hashes otherwise");
  OK(s3_etag_hash(NULL) == 0 && s3_etag_hash("") == 0 && s3_etag_hash("\"\"") == 0 && s3_etag_hash("&quot;&quot;") == 0,
     "s3: no ETag (none, empty, an empty quoted one) is 0: not known");
}

int main(void) {
  test_sha256();
  test_s3_body_protected();
  test_s3_etag_hash();
  test_s3_url();
  test_headtail();
  test_utf8();
  test_misc();
  test_env();
  test_http_parse();
  test_http_framing();
  test_dns();
  test_cgroup_mapping();
  test_schema();
  test_special_ranges();
  test_config();
  test_peek_id();
  printf("1..%d\n", n);
  return failed ? 1 : 0;
}
