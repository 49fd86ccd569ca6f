/* The daemon's configuration file: strict JSON (no unknown keys, no
 * duplicates), every value checked, errors naming the key. */
#define _GNU_SOURCE
#include "config.h"
#include "netpolicy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

static sbx_config *current;

void sbx_config_path(char *out, size_t len) {
  const char *env = getenv("SBX_CONFIG"), *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
  if (env && *env) snprintf(out, len, "%s", env);
  else if (geteuid() == 0) snprintf(out, len, "/etc/sbx/config.json");
  else if (xdg && *xdg) snprintf(out, len, "%s/sbx/config.json", xdg);
  else snprintf(out, len, "%s/.config/sbx/config.json", home ? home : "/");
}

void sbx_config_defaults(sbx_config *c) {
  *c = (sbx_config){
      .max_sandboxes = 1024,
      .limits = {.memory_mb = 2048, .cpus = 1, .pids = 1024, .disk_mb = 8192},
      .preview_port = 8787,
      .local_mb = SBX_LOCAL_MB_DEFAULT,
  };
  sbx_config_path(c->path, sizeof c->path);
}

void sbx_config_free(sbx_config *c) {
  free(c->http);
  free(c->mount);
  free(c->dns_server);
  for (size_t i = 0; i < c->n_allowed; i++) free(c->allowed_endpoints[i]);
  free(c->allowed_endpoints);
  for (size_t i = 0; i < c->n_profiles; i++) {
    sbx_bucket_profile *p = &c->profiles[i];
    free(p->name), free(p->endpoint), free(p->region), free(p->access_key_id), free(p->secret_access_key);
  }
  free(c->profiles);
  c->http = c->mount = NULL;
  c->allowed_endpoints = NULL;
  c->profiles = NULL;
  c->n_allowed = c->n_profiles = 0;
}

#define FAIL(...)                                                              \
  do {                                                                         \
    snprintf(err, errlen, __VA_ARGS__);                                        \
    return -1;                                                                 \
  } while (0)

/* Every key of obj must be in `known` (NULL-terminated). */
static int only_keys(json_t *obj, const char *where, const char *const *known, char *err, size_t errlen) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    bool ok = false;
    for (const char *const *p = known; *p && !ok; p++) ok = !strcmp(*p, k);
    if (!ok) {
      char list[256] = "";
      for (const char *const *p = known; *p; p++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", p == known ? "" : ", ", *p);
      FAIL("%s%s'%s' is not a known key (known: %s)", where, *where ? ": " : "", k, list);
    }
  }
  return 0;
}

static int get_int(json_t *obj, const char *key, const char *where, long long min, long long max, long long *out,
                   char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    FAIL("%s%s must be an integer from %lld to %lld", where, key, min, max);
  *out = json_integer_value(v);
  return 1;
}

static int get_string(json_t *obj, const char *key, const char *where, char **out, char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  if (!json_is_string(v) || !json_string_length(v) || strlen(json_string_value(v)) != json_string_length(v))
    FAIL("%s%s must be a non-empty string", where, key);
  free(*out);
  *out = strdup(json_string_value(v));
  return 1;
}

/* "limits" or "maxLimits" (name) into *out. */
static int parse_limits(sbx_limits *out, const char *name, json_t *l, char *err, size_t errlen) {
  static const char *const keys[] = {"memoryMB", "cpus", "pids", "diskMB", NULL};
  char where[32];
  snprintf(where, sizeof where, "%s.", name);
  if (!json_is_object(l)) FAIL("%s must be an object", name);
  if (only_keys(l, name, keys, err, errlen) < 0) return -1;
  long long v;
  int r;
  if ((r = get_int(l, "memoryMB", where, 16, 1048576, &v, err, errlen)) < 0) return -1;
  if (r) out->memory_mb = v;
  if ((r = get_int(l, "pids", where, 8, 4194304, &v, err, errlen)) < 0) return -1;
  if (r) out->pids = v;
  if ((r = get_int(l, "diskMB", where, 16, 1048576, &v, err, errlen)) < 0) return -1;
  if (r) out->disk_mb = v;
  json_t *cpus = json_object_get(l, "cpus");
  if (cpus) {
    if (!json_is_number(cpus) || json_number_value(cpus) <= 0 || json_number_value(cpus) > 1024)
      FAIL("%scpus must be a number above 0 and at most 1024", where);
    out->cpus = json_number_value(cpus);
  }
  return 0;
}

static int parse_buckets(sbx_config *c, json_t *b, char *err, size_t errlen) {
  static const char *const keys[] = {"allowedEndpoints", "profiles", "localMB", NULL};
  static const char *const pkeys[] = {"endpoint", "region", "accessKeyId", "secretAccessKey", NULL};
  if (!json_is_object(b)) FAIL("buckets must be an object");
  if (only_keys(b, "buckets", keys, err, errlen) < 0) return -1;
  json_t *a = json_object_get(b, "allowedEndpoints");
  if (a) {
    if (!json_is_array(a)) FAIL("buckets.allowedEndpoints must be an array of URL prefixes");
    c->allowed_endpoints = calloc(json_array_size(a) + 1, sizeof(char *));
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
      const char *s = json_string_value(v);
      if (!s || (strncmp(s, "https://", 8) && strncmp(s, "http://", 7)))
        FAIL("buckets.allowedEndpoints[%zu] must be a string starting with https:// or http://", i);
      c->allowed_endpoints[c->n_allowed++] = strdup(s);
    }
  }
  json_t *lm = json_object_get(b, "localMB");
  if (lm) {
    if (!json_is_integer(lm) || json_integer_value(lm) < 1 || json_integer_value(lm) > (1 << 30))
      FAIL("buckets.localMB must be an integer of MB from 1 to 1073741824");
    c->local_mb = (uint64_t)json_integer_value(lm);
  }
  json_t *p = json_object_get(b, "profiles");
  if (p) {
    if (!json_is_object(p)) FAIL("buckets.profiles must be an object of named credentials");
    c->profiles = calloc(json_object_size(p) + 1, sizeof *c->profiles);
    const char *name;
    json_t *v;
    json_object_foreach(p, name, v) {
      char where[160];
      snprintf(where, sizeof where, "buckets.profiles.%.100s", name);
      if (!sbx_valid_id(name)) FAIL("%s: a profile name is 1-63 of [a-z0-9-]", where);
      if (!json_is_object(v)) FAIL("%s must be an object", where);
      if (only_keys(v, where, pkeys, err, errlen) < 0) return -1;
      sbx_bucket_profile *pr = &c->profiles[c->n_profiles++];
      pr->name = strdup(name);
      strcat(where, ".");
      if (get_string(v, "endpoint", where, &pr->endpoint, err, errlen) < 0 ||
          get_string(v, "region", where, &pr->region, err, errlen) < 0 ||
          get_string(v, "accessKeyId", where, &pr->access_key_id, err, errlen) < 0 ||
          get_string(v, "secretAccessKey", where, &pr->secret_access_key, err, errlen) < 0)
        return -1;
      if (!pr->access_key_id || !pr->secret_access_key) FAIL("%saccessKeyId and secretAccessKey are required", where);
      if (pr->endpoint && strncmp(pr->endpoint, "https://", 8) && strncmp(pr->endpoint, "http://", 7))
        FAIL("%sendpoint must be an http(s) URL", where);
    }
  }
  return 0;
}

int sbx_config_parse(sbx_config *c, const char *text, size_t len, char *err, size_t errlen) {
  static const char *const keys[] = {"maxSandboxes", "limits", "maxLimits", "previewPort", "http", "mount", "buckets",
                                     "dnsServer", NULL};
  json_error_t je;
  json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!doc) {
    snprintf(err, errlen, "line %d, column %d: %s", je.line, je.column, je.text);
    return -1;
  }
  int r = -1;
  long long v;
  if (!json_is_object(doc)) {
    snprintf(err, errlen, "the configuration must be a JSON object");
    goto out;
  }
  if (only_keys(doc, "", keys, err, errlen) < 0) goto out;
  int got = get_int(doc, "maxSandboxes", "", 1, SBX_MAX_SANDBOXES_CAP, &v, err, errlen);
  if (got < 0) goto out;
  if (got) c->max_sandboxes = (int)v;
  if ((got = get_int(doc, "previewPort", "", 0, 65535, &v, err, errlen)) < 0) goto out;
  if (got) c->preview_port = (int)v;
  json_t *l = json_object_get(doc, "limits");
  if (l && parse_limits(&c->limits, "limits", l, err, errlen) < 0) goto out;
  if ((l = json_object_get(doc, "maxLimits")) && parse_limits(&c->max_limits, "maxLimits", l, err, errlen) < 0) goto out;
  if (get_string(doc, "http", "", &c->http, err, errlen) < 0) goto out;
  if (get_string(doc, "mount", "", &c->mount, err, errlen) < 0) goto out;
  if (c->mount && c->mount[0] != '/') {
    snprintf(err, errlen, "mount must be an absolute path");
    goto out;
  }
  if (get_string(doc, "dnsServer", "", &c->dns_server, err, errlen) < 0) goto out;
  struct sockaddr_storage ss;
  socklen_t sl;
  if (c->dns_server && sbx_dns_server_parse(c->dns_server, &ss, &sl) < 0) {
    snprintf(err, errlen, "dnsServer must be an address with an optional port (\"192.0.2.53\", \"127.0.0.1:5353\", "
                          "\"[2001:db8::53]:53\")");
    goto out;
  }
  json_t *b = json_object_get(doc, "buckets");
  if (b && parse_buckets(c, b, err, errlen) < 0) goto out;
  r = 0;
out:
  json_decref(doc);
  return r;
}

int sbx_config_load(sbx_config *c, char *err, size_t errlen) {
  sbx_config_defaults(c);
  const char *env_port = getenv("SBX_PREVIEW_PORT");
  int fd = open(c->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      snprintf(err, errlen, "%s: %s", c->path, strerror(errno));
      return -1;
    }
  } else {
    c->found = true;
    sbx_buf b = {0};
    char chunk[65536];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof chunk)) > 0 && b.len < 1024 * 1024) sbx_buf_append(&b, chunk, n);
    close(fd);
    char why[400];
    if (n < 0 || b.len >= 1024 * 1024) {
      snprintf(err, errlen, "%s: %s", c->path, n < 0 ? strerror(errno) : "larger than 1 MiB");
      sbx_buf_free(&b);
      return -1;
    }
    int r = sbx_config_parse(c, b.data ? b.data : "", b.len, why, sizeof why);
    sbx_buf_free(&b);
    if (r < 0) {
      snprintf(err, errlen, "%s: %s", c->path, why);
      sbx_config_free(c);
      return -1;
    }
  }
  if (env_port && *env_port) { /* the environment wins over the file, for tests and one-off runs */
    char *end;
    long p = strtol(env_port, &end, 10);
    if (*end || p < 0 || p > 65535) {
      snprintf(err, errlen, "SBX_PREVIEW_PORT must be a port number (0 turns the preview proxy off)");
      return -1;
    }
    c->preview_port = (int)p;
  }
  return 0;
}

static json_t *strings(char **v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_string(v[i]));
  return a;
}

json_t *sbx_config_json(const sbx_config *c) {
  json_t *profiles = json_object();
  for (size_t i = 0; i < c->n_profiles; i++) {
    const sbx_bucket_profile *p = &c->profiles[i];
    json_t *o = json_pack("{s:s, s:s}", "accessKeyId", p->access_key_id, "secretAccessKey", "********");
    if (p->endpoint) json_object_set_new(o, "endpoint", json_string(p->endpoint));
    if (p->region) json_object_set_new(o, "region", json_string(p->region));
    json_object_set_new(profiles, p->name, o);
  }
  json_t *j = json_pack("{s:i, s:{s:I, s:f, s:I, s:I}, s:i, s:{s:o, s:o}}", "maxSandboxes", c->max_sandboxes, "limits",
                        "memoryMB", (json_int_t)c->limits.memory_mb, "cpus", c->limits.cpus, "pids",
                        (json_int_t)c->limits.pids, "diskMB", (json_int_t)c->limits.disk_mb, "previewPort",
                        c->preview_port, "buckets", "allowedEndpoints",
                        c->n_allowed ? strings(c->allowed_endpoints, c->n_allowed) : json_string("public https only"),
                        "profiles", profiles);
  json_object_set_new(json_object_get(j, "buckets"), "localMB", json_integer((json_int_t)c->local_mb));
  sbx_limits m = sbx_limits_max(c, NULL);
  json_t *ml = json_pack("{s:I, s:f, s:I}", "memoryMB", (json_int_t)m.memory_mb, "cpus", m.cpus, "pids",
                         (json_int_t)m.pids);
  json_object_set_new(ml, "diskMB", c->max_limits.disk_mb ? json_integer((json_int_t)c->max_limits.disk_mb)
                                                         : json_string("the size of the disks' filesystem"));
  json_object_set_new(j, "maxLimits", ml);
  if (c->http) json_object_set_new(j, "http", json_string(c->http));
  if (c->mount) json_object_set_new(j, "mount", json_string(c->mount));
  json_object_set_new(j, "dnsServer", json_string(c->dns_server ? c->dns_server : "the host's resolver"));
  return j;
}

sbx_limits sbx_limits_max(const sbx_config *c, const char *state_dir) {
  sbx_limits m = c ? c->max_limits : (sbx_limits){0};
  if (!m.memory_mb && sbx_host_ram() != UINT64_MAX) m.memory_mb = sbx_host_ram() >> 20;
  if (!m.pids) m.pids = sbx_host_tasks_cap();
  if (m.cpus <= 0) m.cpus = 1024; /* more cpus than there are is none */
  struct statvfs sv;
  if (!m.disk_mb && state_dir && statvfs(state_dir, &sv) == 0) m.disk_mb = (uint64_t)sv.f_blocks * sv.f_frsize >> 20;
  return m;
}

const sbx_bucket_profile *sbx_config_profile(const sbx_config *c, const char *name) {
  for (size_t i = 0; c && name && i < c->n_profiles; i++)
    if (!strcmp(c->profiles[i].name, name)) return &c->profiles[i];
  return NULL;
}

const sbx_config *sbx_config_get(void) {
  static sbx_config defaults;
  if (!current) {
    sbx_config_defaults(&defaults);
    current = &defaults;
  }
  return current;
}

void sbx_config_set(sbx_config *c) { current = c; }
