#include "schema.h"

#include <regex.h>
#include <stdio.h>
#include <string.h>

/* Compiled patterns, kept: the catalog has a handful. */
static regex_t *compiled(const char *pat) {
  static struct {
    char *pat;
    regex_t re;
  } cache[32];
  static int n;
  for (int i = 0; i < n; i++)
    if (!strcmp(cache[i].pat, pat)) return &cache[i].re;
  if (n == 32) return NULL;
  if (regcomp(&cache[n].re, pat, REG_EXTENDED | REG_NOSUB) != 0) return NULL;
  cache[n].pat = strdup(pat);
  return &cache[n++].re;
}

static bool fail(char *msg, size_t len, const char *path, const char *what) {
  snprintf(msg, len, "%s%s%s", path[0] ? path : "", path[0] ? ": " : "", what);
  return false;
}

static bool type_ok(const char *t, const json_t *v) {
  if (!strcmp(t, "string")) return json_is_string(v);
  if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
  if (!strcmp(t, "number")) return json_is_number(v);
  if (!strcmp(t, "boolean")) return json_is_boolean(v);
  if (!strcmp(t, "object")) return json_is_object(v);
  if (!strcmp(t, "array")) return json_is_array(v);
  if (!strcmp(t, "null")) return json_is_null(v);
  return true;
}

static bool validate(const json_t *s, const json_t *v, const char *path, char *msg, size_t len) {
  if (!json_is_object(s)) return true;
  char what[256];
  const char *t = json_string_value(json_object_get(s, "type"));
  if (t && !type_ok(t, v)) {
    snprintf(what, sizeof what, "must be %s %s", strchr("aeiou", t[0]) ? "an" : "a", t);
    return fail(msg, len, path, what);
  }
  const json_t *en = json_object_get(s, "enum");
  if (json_is_array(en)) {
    size_t i;
    const json_t *e;
    bool found = false;
    json_array_foreach(en, i, e) if (json_equal((json_t *)e, (json_t *)v)) found = true;
    if (!found) {
      char *list = json_dumps(en, JSON_COMPACT);
      snprintf(what, sizeof what, "must be one of %s", list ? list : "the listed values");
      free(list);
      return fail(msg, len, path, what);
    }
  }
  if (json_is_string(v)) {
    const json_t *ml = json_object_get(s, "minLength");
    if (json_is_integer(ml) && json_string_length(v) < (size_t)json_integer_value(ml)) {
      if (json_integer_value(ml) == 1) snprintf(what, sizeof what, "must not be empty");
      else snprintf(what, sizeof what, "must be at least %lld characters", (long long)json_integer_value(ml));
      return fail(msg, len, path, what);
    }
    const json_t *xl = json_object_get(s, "maxLength");
    if (json_is_integer(xl)) { /* in characters (code points), as JSON Schema counts them */
      size_t chars = 0;
      for (const char *c = json_string_value(v), *e = c + json_string_length(v); c < e; c++)
        chars += ((unsigned char)*c & 0xc0) != 0x80;
      if (chars > (size_t)json_integer_value(xl)) {
        snprintf(what, sizeof what, "must be at most %lld characters", (long long)json_integer_value(xl));
        return fail(msg, len, path, what);
      }
    }
    if (strlen(json_string_value(v)) != json_string_length(v)) return fail(msg, len, path, "must not contain NUL characters");
    const char *pat = json_string_value(json_object_get(s, "pattern"));
    if (pat) {
      regex_t *re = compiled(pat);
      if (re) {
        int r = regexec(re, json_string_value(v), 0, NULL, 0);
        if (r != 0) {
          snprintf(what, sizeof what, "must match %s", pat);
          return fail(msg, len, path, what);
        }
      }
    }
  }
  if (json_is_number(v)) {
    double d = json_number_value(v);
    const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum"),
                 *emn = json_object_get(s, "exclusiveMinimum");
    if ((mn && d < json_number_value(mn)) || (mx && d > json_number_value(mx)) || (emn && d <= json_number_value(emn))) {
      if (mn && mx) snprintf(what, sizeof what, "must be from %.15g to %.15g", json_number_value(mn), json_number_value(mx));
      else if (mn) snprintf(what, sizeof what, "must be at least %.15g", json_number_value(mn));
      else if (emn) snprintf(what, sizeof what, "must be more than %.15g", json_number_value(emn));
      else snprintf(what, sizeof what, "must be at most %.15g", json_number_value(mx));
      return fail(msg, len, path, what);
    }
  }
  if (json_is_object(v)) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *addl = json_object_get(s, "additionalProperties");
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
      if (json_is_string(r) && !json_object_get(v, json_string_value(r))) {
        snprintf(what, sizeof what, "'%s' is required", json_string_value(r));
        return fail(msg, len, path, what);
      }
    }
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)v, k, val) {
      char sub[512];
      snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k);
      const json_t *ps = props ? json_object_get(props, k) : NULL;
      if (ps) {
        if (!validate(ps, val, sub, msg, len)) return false;
      } else if (json_is_false(addl)) {
        snprintf(what, sizeof what, "unknown property '%s'", k);
        return fail(msg, len, path, what);
      } else if (json_is_object(addl)) {
        if (!validate(addl, val, sub, msg, len)) return false;
      }
    }
  }
  if (json_is_array(v)) {
    const json_t *items = json_object_get(s, "items");
    size_t i;
    json_t *e;
    json_array_foreach((json_t *)v, i, e) {
      char sub[512];
      snprintf(sub, sizeof sub, "%s[%zu]", path, i);
      if (!validate(items, e, sub, msg, len)) return false;
    }
  }
  return true;
}

bool mcp_schema_validate(const json_t *schema, const json_t *value, char *msg, size_t msglen) {
  return validate(schema, value, "", msg, msglen);
}
