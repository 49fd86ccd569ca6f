/* HTTP/1.x request heads, parsed without the network: the daemon's HTTP
 * transport and the preview proxy both read them from anyone who connects,
 * so this is pure and fuzzed (tests/fuzz/fuzz_parsers.c). */
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct sbx_http_head {
  size_t len;          /* of the head, through the blank line */
  char method[16], path[1024], version[16];
  const char *headers; /* the first header line, inside the buffer */
} sbx_http_head;

/* 0 while the head is incomplete, its length once it is there, -1 when its
 * request line is malformed. */
long sbx_http_parse_head(const char *buf, size_t len, sbx_http_head *h);
/* The value of header `name` (case-insensitive) among header lines ending
 * with "\r\n" up to `end` (or a NUL), without leading blanks; NULL if absent. */
const char *sbx_http_header(const char *headers, const char *end, const char *name, size_t *len);
/* A preview Host, {port}-{sandboxId}-{token}.localhost[:port], in pieces;
 * false when it is not one. */
bool sbx_preview_host_parse(const char *host, size_t len, int *port, char id[64], char token[17]);
