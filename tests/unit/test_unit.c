/* Unit tests of the side-effect-free helpers, as TAP. */
#define _GNU_SOURCE
#include "../../mcp-server/schema.h"
#include "../../sandbox-core/cgroup.h"
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
  OK(sbx_parse_duration_ms("10m") == 600000, "10m");
  OK(sbx_parse_duration_ms("30s") == 30000, "30s");
  OK(sbx_parse_duration_ms("1h") == 3600000, "1h");
  OK(sbx_parse_duration_ms("250") == 250, "bare number is ms");
  OK(sbx_parse_duration_ms("10x") == -1 && sbx_parse_duration_ms("") == -1 && sbx_parse_duration_ms("-1s") == -1,
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
  sbx_env_set(&e, "A", "2");
  OK(!strcmp(sbx_env_get(&e, "A"), "2") && e.n == 3, "env_set replaces");
  sbx_env_unset(&e, "A");
  OK(!sbx_env_get(&e, "A") && e.n == 2 && e.v[2] == NULL, "env_unset keeps the vector terminated");
  sbx_env_clear(&e);
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

int main(void) {
  test_headtail();
  test_utf8();
  test_misc();
  test_env();
  test_cgroup_mapping();
  test_schema();
  printf("1..%d\n", n);
  return failed ? 1 : 0;
}
