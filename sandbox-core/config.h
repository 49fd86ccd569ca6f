/* The daemon's configuration: one JSON file holding what a person decides
 * and an agent may not (DESIGN, "Configuration"). Absent means defaults;
 * invalid means the daemon refuses to start and says where. */
#pragma once
#include "cgroup.h"
#include "util.h"

#include <jansson.h>

#define SBX_MAX_SANDBOXES_CAP 32768 /* what the uid space above 0x40000000 holds */

typedef struct sbx_bucket_profile {
  char *name;
  char *endpoint; /* may be NULL: the request's endpoint applies */
  char *region;   /* may be NULL */
  char *access_key_id;
  char *secret_access_key;
} sbx_bucket_profile;

typedef struct sbx_config {
  char path[1024]; /* the file read, or the one that would be read */
  bool found;      /* the file existed */
  int max_sandboxes;
  sbx_limits limits; /* defaults for new sandboxes */
  /* the most a create may ask for; 0: what the host has (sbx_limits_max) */
  sbx_limits max_limits;
  int preview_port;  /* 0: no preview proxy */
  char *http;        /* listen address of the HTTP transport, or NULL */
  char *mount;       /* a FUSE view the daemon runs, or NULL */
  char *dns_server;  /* what allowedHosts names are asked of, or NULL: the host's resolver */
  char **allowed_endpoints; /* URL prefixes a bucket endpoint may start with */
  size_t n_allowed;
  sbx_bucket_profile *profiles;
  size_t n_profiles;
  uint64_t local_mb; /* what all local buckets' images may take together */
#define SBX_LOCAL_MB_DEFAULT 65536
} sbx_config;

/* Where the configuration lives: $SBX_CONFIG, else /etc/sbx/config.json
 * (root) or $XDG_CONFIG_HOME/sbx/config.json ($HOME/.config/...). */
void sbx_config_path(char *out, size_t len);
void sbx_config_defaults(sbx_config *c);
/* Parses a configuration document (pure: unit-tested and fuzzed). On error
 * returns -1 with `err` saying which key and why. */
int sbx_config_parse(sbx_config *c, const char *text, size_t len, char *err, size_t errlen);
/* Loads sbx_config_path(): defaults when the file does not exist. */
int sbx_config_load(sbx_config *c, char *err, size_t errlen);
void sbx_config_free(sbx_config *c);
/* The configuration in force as JSON, secrets masked (for doctor). */
json_t *sbx_config_json(const sbx_config *c);
const sbx_bucket_profile *sbx_config_profile(const sbx_config *c, const char *name);
/* The most limits a create may ask for: maxLimits, else the host's memory
 * (sbx_host_ram), three quarters of its tasks (sbx_host_tasks_cap) and the size
 * of the filesystem that holds state_dir (the disks). */
sbx_limits sbx_limits_max(const sbx_config *c, const char *state_dir);
/* The process-wide configuration of the daemon (set once at start). */
const sbx_config *sbx_config_get(void);
void sbx_config_set(sbx_config *c);
