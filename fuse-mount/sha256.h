/* SHA-256, streaming and one-shot. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t n;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t out[32]);
void sha256_tohex(const uint8_t d[32], char out[65]);
void sha256_hex(const void *data, size_t len, char out[65]);
/* Tests: on, the portable rounds; off, the fastest the CPU has. Whether
 * those are not the portable ones. */
bool sha256_force_portable(bool on);
