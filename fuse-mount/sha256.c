/* SHA-256 (FIPS 180-4), for the x-amz-content-sha256 of S3 requests whose
 * body is signed: the bucket checks what it stored is what was sent. */
#include "sha256.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block_c(sha256_ctx *c, const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | p[4 * i + 1] << 16 | p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
    h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
  }
  c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e, c->h[5] += f, c->h[6] += g, c->h[7] += h;
}

static void blocks_c(sha256_ctx *c, const uint8_t *p, size_t n) {
  for (; n; n--, p += 64) block_c(c, p);
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

/* The same rounds with the CPU's SHA extensions (SHA-NI: Intel since Ice
 * Lake and Goldmont, AMD since Zen), about three times the speed of the C
 * above: every byte a bucket mount uploads over plain HTTP to another host
 * is hashed for its signature.
 * The state lives as ABEF and CDGH, the order sha256rnds2 works on. */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_ni(sha256_ctx *c, const uint8_t *p, size_t n) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i dcba = _mm_loadu_si128((const __m128i *)&c->h[0]), hgfe = _mm_loadu_si128((const __m128i *)&c->h[4]);
  __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1), efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8), cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; n; n--, p += 64) {
    __m128i abef0 = abef, cdgh0 = cdgh, w[4];
    for (int i = 0; i < 16; i++) { /* four rounds a turn; w[i % 4] holds W[4i .. 4i+3] */
      __m128i x;
      if (i < 4) {
        x = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
      } else { /* from W[t-16], W[t-15], W[t-7], W[t-2] */
        __m128i t16 = w[i & 3], t12 = w[(i + 1) & 3], t8 = w[(i + 2) & 3], t4 = w[(i + 3) & 3];
        x = _mm_sha256msg1_epu32(t16, t12);
        x = _mm_add_epi32(x, _mm_alignr_epi8(t4, t8, 4));
        x = _mm_sha256msg2_epu32(x, t4);
      }
      w[i & 3] = x;
      __m128i k = _mm_add_epi32(x, _mm_loadu_si128((const __m128i *)&K[4 * i]));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(k, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B), dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)&c->h[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&c->h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static bool has_sha_ni(void) {
  unsigned a, b, cx, d;
  if (!__get_cpuid(1, &a, &b, &cx, &d) || !(cx & bit_SSE4_1) || !(cx & bit_SSSE3)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &cx, &d) && (b & (1u << 29)); /* CPUID.7.0:EBX.SHA */
}
#endif

/* The CPU's own rounds where it has them. */
static void (*blocks)(sha256_ctx *, const uint8_t *, size_t);

static void pick(void) {
  blocks = blocks_c;
#if defined(__x86_64__)
  if (has_sha_ni()) blocks = blocks_ni;
#endif
}

static pthread_once_t picked = PTHREAD_ONCE_INIT;

bool sha256_force_portable(bool on) {
  pthread_once(&picked, pick);
  if (on) blocks = blocks_c;
  else pick();
  return blocks != blocks_c;
}

void sha256_init(sha256_ctx *c) {
  pthread_once(&picked, pick);
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->len = 0;
  c->n = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len) {
  const uint8_t *p = data;
  c->len += len;
  if (c->n) {
    size_t take = 64 - c->n < len ? 64 - c->n : len;
    memcpy(c->buf + c->n, p, take);
    c->n += take, p += take, len -= take;
    if (c->n < 64) return;
    blocks(c, c->buf, 1);
    c->n = 0;
  }
  if (len >= 64) {
    blocks(c, p, len / 64);
    p += len / 64 * 64;
    len %= 64;
  }
  memcpy(c->buf, p, len);
  c->n = len;
}

void sha256_final(sha256_ctx *c, uint8_t out[32]) {
  uint64_t bits = c->len * 8;
  uint8_t pad = 0x80, zero = 0;
  sha256_update(c, &pad, 1);
  while (c->n != 56) sha256_update(c, &zero, 1);
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha256_update(c, lenb, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(c->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)c->h[i];
  }
}

void sha256_hex(const void *data, size_t len, char out[65]) {
  sha256_ctx c;
  uint8_t d[32];
  sha256_init(&c);
  sha256_update(&c, data, len);
  sha256_final(&c, d);
  sha256_tohex(d, out);
}

void sha256_tohex(const uint8_t d[32], char out[65]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) out[2 * i] = hex[d[i] >> 4], out[2 * i + 1] = hex[d[i] & 15];
  out[64] = 0;
}
