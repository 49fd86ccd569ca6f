/* HTTP/1.x request heads, parsed without the network: the daemon's HTTP
 * transport and the preview proxy both read them from anyone who connects,
 * so this is pure and fuzzed (tests/fuzz/fuzz_parsers.c). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_TARGET (16 * 1024) /* a request target's length, at most */

typedef struct sbx_http_head {
  size_t len;          /* of the head, through the blank line */
  char method[16], version[16];
  char path[1024];     /* the target, cut to 1023 bytes when longer */
  size_t path_len;     /* its whole length */
  const char *headers; /* the first header line, inside the buffer */
} sbx_http_head;

/* 0 while the head is incomplete, its length once it is there, -1 when its
 * request line is malformed. */
long sbx_http_parse_head(const char *buf, size_t len, sbx_http_head *h);
/* One header line: the whole of it with its CRLF, its name (the bytes
 * before the first colon; NULL when it has none) and its value (after the
 * colon, leading blanks skipped, up to the CRLF). */
typedef struct sbx_http_field {
  const char *line, *name, *value;
  size_t line_len, name_len, value_len;
} sbx_http_field;
/* The header line at *p, among lines ending with "\r\n" before `end` (or
 * a NUL): false past the last; *p moves past it. */
bool sbx_http_next_field(const char **p, const char *end, sbx_http_field *f);
/* The value of header `name` (case-insensitive) among header lines ending
 * with "\r\n" up to `end` (or a NUL), without leading blanks; NULL if absent. */
const char *sbx_http_header(const char *headers, const char *end, const char *name, size_t *len);
/* A preview Host, {port}-{sandboxId}-{token}.localhost[:port], in pieces;
 * false when it is not one. */
bool sbx_preview_host_parse(const char *host, size_t len, int *port, char id[64], char token[17]);

/* Where a request's body ends, so that a proxy finds the next request on a
 * kept-alive connection (RFC 9112, 6.3). Bytes are counted, never changed. */
typedef struct sbx_http_body {
  int state;      /* below; 0: no body left */
  uint64_t left;  /* bytes of the body, or of the current chunk, still to come */
  unsigned count; /* digits, extension or trailer bytes seen: bounded */
  bool in_value;  /* past the colon of a trailer line */
} sbx_http_body;

/* The framing of the request whose header lines are [headers, end): a
 * Content-Length, chunked, or nothing. -1 when it is ambiguous or
 * malformed (both headers, two Content-Length lines, an encoding that does not end in
 * chunked): such a request is refused, never guessed at. *upgrade says the
 * request asks to switch protocols (Connection: upgrade with Upgrade). */
int sbx_http_request_body(const char *headers, const char *end, sbx_http_body *b, bool *upgrade);
/* Consumes what belongs to the body of buf: the number of bytes (at most
 * len), -1 when the chunked framing is broken. */
long sbx_http_body_feed(sbx_http_body *b, const char *buf, size_t len);
static inline bool sbx_http_body_done(const sbx_http_body *b) { return b->state == 0; }
