/* main(): the `sbx` subcommands. Everything but `daemon` and `doctor` is an
 * MCP client of the daemon's socket. */
#define _GNU_SOURCE
#include "client.h"
#include "cp.h"
#include "../mcp-server/mcp.h"
#include "../mcp-server/server.h"
#include "../sandbox-core/doctor.h"
#include "../sandbox-core/config.h"
#include "../fuse-mount/fuseutil.h"
#include "../fuse-mount/bucketfs.h"
#include "../fuse-mount/view.h"

#include <dirent.h>
#include <strings.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/stat.h>
#include <sys/wait.h>

static volatile sig_atomic_t interrupted;
static void on_sigint(int s) {
  (void)s;
  interrupted = 1;
}

#define MOUNT_USAGE "sbx mount [-f] [-o allow_other,nopassthrough,nouring] MOUNTPOINT"

static const struct help {
  const char *name, *synopsis, *text;
} helps[] = {
    {"mcp", "sbx mcp [--sandbox ID] [--tools a,b] [--read-only]",
     "An MCP server on stdio, for agents: it relays to the daemon (started when none runs) and\n"
     "reconnects when the daemon restarts. Without --sandbox, calls with no sandboxId go to the\n"
     "sandbox of the current directory. --tools keeps only the named tools; --read-only only\n"
     "the tools that change nothing."},
    {"daemon", "sbx daemon [--http ADDR:PORT [--http-allow-remote]] [--mount DIR] | sbx daemon stop",
     "Runs the daemon that owns the sandboxes (sbx mcp and the other commands start one when\n"
     "none runs). --http also serves Streamable HTTP at /mcp (bearer token in\n"
     "$SBX_STATE_DIR/http-token); given while a daemon runs, that daemon starts serving it.\n"
     "--mount runs a view (sbx mount) with the daemon. `sbx daemon stop` stops it; sandboxes\n"
     "and their files stay, and each starts again on its next call."},
    {"exec", "sbx exec [-s ID] [-i|-d] [--session S] [--cwd DIR] [--timeout T] [-e K=V]... [--] CMD...",
     "Runs CMD with bash in the sandbox (created on first use) and prints its output as it\n"
     "comes. Several words are quoted for the shell; one word is a shell command line. The\n"
     "session (default: \"default\") keeps cwd, variables, functions, aliases and options\n"
     "between calls. -i streams this command's stdin to it. What CMD leaves running ends with\n"
     "it; -d (detach) runs CMD in the background instead, for servers and long jobs, and prints\n"
     "its process id (see sbx ps, sbx logs, sbx kill). --timeout takes 30s, 2m, 500ms or\n"
     "seconds. Exit code: the command's; 124 when it timed out; 130 when interrupted."},
    {"ps", "sbx ps [-s ID]", "Lists the sandbox's background processes (sbx exec -d): id, pid, status, exit code, command."},
    {"logs", "sbx logs [-s ID] [-f] PROCESS",
     "Prints what a background process wrote so far: its stdout, then its stderr on stderr.\n"
     "-f follows it: what it writes next, as it comes, until it ends."},
    {"kill", "sbx kill [-s ID] [--signal SIG] PROCESS",
     "Stops a background process and everything it started (SIGTERM unless --signal says SIGKILL,\n"
     "SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2)."},
    {"session", "sbx session [-s ID] ls | create NAME [--cwd DIR] [-e K=V]... | rm NAME",
     "Lists, creates or deletes the sessions of a sandbox: each has its own shell state.\n"
     "`sbx exec --session NAME` runs in one."},
    {"ls", "sbx ls", "Lists the sandboxes: status (running, stopped, sleeping), creation and last activity."},
    {"create", "sbx create ID [--network egress [--allow HOST]...] [--memory MB] [--cpus N] [--pids N] [--disk MB]\n"
               "                 [--sleep-after T] [--keep-alive] [--image NAME] [-e K=V]...",
     "Creates a sandbox with options (other commands create one with the defaults on first use).\n"
     "--network egress gives it a network, narrowed to the --allow names or CIDRs when given. On\n"
     "a sandbox that exists it changes what can change live (sleep-after, keep-alive, env) and\n"
     "says which options need a new sandbox (and exits 1 when it was asked to change one)."},
    {"destroy", "sbx destroy ID...", "Destroys sandboxes: their processes, files and records."},
    {"cp", "sbx cp SRC DST",
     "Copies files between the host and a sandbox, as docker cp does; ID:PATH names a path in\n"
     "sandbox ID (relative paths are under /workspace), which must exist. Directories are\n"
     "copied whole; modes, mtimes and symlinks are kept. Into an existing directory DST gets\n"
     "SRC's name inside it; else DST becomes that name. - is a tar stream: `sbx cp ID:PATH -`\n"
     "writes one, `sbx cp - ID:DIR` unpacks one into DIR."},
    {"expose", "sbx expose ID PORT", "Prints a preview URL that opens PORT of sandbox ID in a browser (ID must exist)."},
    {"unexpose", "sbx unexpose ID PORT", "Takes the preview URL of PORT of sandbox ID away (it answers 410 from then on)."},
    {"doctor", "sbx doctor", "Says what this machine offers sbx (namespaces, cgroups, FUSE...) and the configuration."},
    {"mount", MOUNT_USAGE,
     "Shows every sandbox's /workspace at MOUNTPOINT/<sandboxId>/, live (MOUNTPOINT is made if\n"
     "missing). Files show the sandbox's own host owner (so git treats them as foreign); you\n"
     "read and write them all.\n"
     "-f stays in the foreground; SIGTERM or `sbx umount MOUNTPOINT` ends it. As root, reads\n"
     "and writes of open files go straight to the sandbox's disk (FUSE passthrough) where\n"
     "the kernel offers it; -o nopassthrough serves them through sbx instead. Requests come\n"
     "on rings of the CPUs their callers run on (FUSE over io_uring, Linux 6.14+: as root sbx\n"
     "mount turns the fuse module's enable_uring on while it mounts); -o nouring reads them\n"
     "from /dev/fuse instead."},
    {"umount", "sbx umount MOUNTPOINT", "Ends a view made by sbx mount."},
    {"version", "sbx --version", "Prints the version."},
    {"help", "sbx help [COMMAND]", "Says how to use sbx or one of its commands."},
};

static const char exit_codes[] = "Exit codes: 0 done; 1 failed (the daemon said why, or could not be reached); 2 bad usage;\n"
                                 "3 a daemon runs already; sbx exec: the command's own, 124 timed out, 130 interrupted.\n";

static void usage(FILE *f) {
  fputs("usage: sbx COMMAND ...\n", f);
  for (size_t i = 0; i < SBX_ARRAY_SIZE(helps); i++) fprintf(f, "  %s\n", helps[i].synopsis);
  fputs("`sbx help COMMAND` or `sbx COMMAND --help` tells more.\n", f);
  fputs(exit_codes, f);
}

/* A command's usage line, as `sbx help` gives it. */
static int usage_of(const char *cmd) {
  for (size_t i = 0; i < SBX_ARRAY_SIZE(helps); i++)
    if (!strcmp(helps[i].name, cmd)) fprintf(stderr, "usage: %s\n", helps[i].synopsis);
  return 2;
}

static int help(const char *cmd) {
  for (size_t i = 0; i < SBX_ARRAY_SIZE(helps); i++)
    if (!strcmp(helps[i].name, cmd)) {
      printf("usage: %s\n\n%s\n\n%s", helps[i].synopsis, helps[i].text, exit_codes);
      return 0;
    }
  fprintf(stderr, "sbx help: no command '%s'\n", cmd);
  usage(stderr);
  return 2;
}

/* -h or --help among a command's options (for exec, before its command). */
static bool asks_help(const char *cmd, int argc, char **argv) {
  static const char *const valued[] = {"-s", "--sandbox", "--session", "--cwd", "--timeout", "-e", "--env", "-o"};
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--")) return false;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    bool takes = false;
    for (size_t k = 0; k < SBX_ARRAY_SIZE(valued); k++) takes |= !strcmp(argv[i], valued[k]);
    if (takes) i++;
    else if (argv[i][0] != '-' && !strcmp(cmd, "exec")) return false; /* the command's own words */
  }
  return false;
}

struct view_search {
  const char *cwd;
  char best[4096]; /* the deepest view the cwd is in */
};

static bool view_above(const char *mnt, const char *fstype, void *ud) {
  struct view_search *s = ud;
  size_t l = strlen(mnt);
  if (!strcmp(fstype, "fuse.sbx-view") && !strncmp(s->cwd, mnt, l) && (s->cwd[l] == '/' || !s->cwd[l]) &&
      l >= strlen(s->best))
    snprintf(s->best, sizeof s->best, "%s", mnt);
  return false;
}

/* In a sandbox's directory of a view (`sbx mount`)? Its id, and the
 * directory inside the sandbox that the current one shows; at the view's
 * own root, true with an empty id. Looked up once. */
static bool view_place(char id[64], char inside[4096]) {
  static int looked; /* 0 not yet, 1 found, -1 not in a view, -2 at a view's root */
  static char found_id[64], found_inside[4096];
  if (!looked) {
    char cwd[4096];
    struct view_search s = {.cwd = cwd};
    looked = -1;
    if (getcwd(cwd, sizeof cwd)) sbx_fuse_each_mount(view_above, &s);
    if (*s.best && !strcmp(cwd, s.best)) {
      /* the view's own root: no sandbox (one named after this directory
       * would be a surprise) */
      looked = -2;
    } else if (*s.best) {
      const char *rest = cwd + strlen(s.best) + 1, *slash = strchrnul(rest, '/');
      if ((size_t)(slash - rest) < sizeof found_id) {
        memcpy(found_id, rest, slash - rest);
        found_id[slash - rest] = 0;
        snprintf(found_inside, sizeof found_inside, "/workspace%s", slash);
        if (sbx_valid_id(found_id)) looked = 1;
      }
    }
  }
  if (looked == -2) {
    id[0] = 0;
    return true;
  }
  if (looked < 0) return false;
  memcpy(id, found_id, sizeof found_id);
  memcpy(inside, found_inside, sizeof found_inside);
  return true;
}

/* -e KEY=VALUE into env; false without an = or a KEY. */
static bool env_arg(json_t *env, char *kv) {
  char *eq = strchr(kv, '=');
  if (!eq || eq == kv) return false;
  *eq = 0; /* argv is ours to cut */
  json_object_set_new(env, kv, json_string(eq + 1));
  return true;
}

static bool bad_usage; /* a refusal that is a usage error, found past the parsing (a bad sandbox id) */

/* A connection to the daemon (started when none runs), for sandbox (NULL:
 * none of its own: ls, create and destroy with their ids, daemon --http). */
static int open_daemon(sbx_client *c, const char *sandbox) {
  char err[600];
  if (sbx_client_open(c, sandbox, err, sizeof err) < 0) {
    fprintf(stderr, "sbx: %s\n", err);
    return -1;
  }
  return 0;
}

static int open_client(sbx_client *c, const char *sandbox) {
  char view_id[64], view_cwd[4096];
  if (!sandbox && view_place(view_id, view_cwd)) { /* in a sandbox's directory of a view */
    if (!view_id[0]) {
      fprintf(stderr, "sbx: this is the root of a view (sbx mount): cd into a sandbox's directory there, or name one "
                      "with -s ID\n");
      bad_usage = true;
      return -1;
    }
    sandbox = view_id;
  }
  if (sandbox && !sbx_valid_id(sandbox)) { /* never a guess: a bad id is not some other sandbox */
    fprintf(stderr, "sbx: invalid sandbox id '%.100s': ids are 1-63 of [a-z0-9-]\n", sandbox);
    bad_usage = true;
    return -1;
  }
  return open_daemon(c, sandbox);
}

/* The daemon's messages name tools and their arguments, for agents: here,
 * the commands and their options. The tool's name before an argument's
 * error goes: the line names the tool already. */
static const char *for_the_cli(const char *tool, const char *msg) {
  static const char *const names[][2] = {{"see listProcesses", "sbx ps lists them"},
                                         {"destroySandbox, then createSandbox", "sbx destroy, then sbx create"},
                                         {"createSandbox", "sbx create"}, {"destroySandbox", "sbx destroy"},
                                         {"limits.memoryMB", "--memory (MB)"}, {"limits.diskMB", "--disk (MB)"},
                                         {"limits.pids", "--pids"}, {"limits.cpus", "--cpus"}};
  static char out[1024];
  size_t tl = strlen(tool);
  if (msg && !strncmp(msg, tool, tl) && !strncmp(msg + tl, ": ", 2)) msg += tl + 2;
  snprintf(out, sizeof out, "%s", msg ? msg : "");
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++)
    for (char *at; (at = strstr(out, names[i][0]));) {
      char rest[1024];
      snprintf(rest, sizeof rest, "%s", at + strlen(names[i][0]));
      snprintf(at, sizeof out - (at - out), "%s%s", names[i][1], rest);
    }
  return out;
}

/* Calls a tool; prints a tool error; returns the result or NULL. */
static char last_code[64]; /* the error code of the last call that failed */

static json_t *call(sbx_client *c, const char *tool, json_t *args, sbx_progress_fn pf, void *ud) {
  char err[600];
  last_code[0] = 0;
  char id[80]; /* args goes with the call */
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(args, "sandboxId")) ?: c->default_sandbox);
  json_t *r = sbx_client_call(c, tool, args, pf, ud, &interrupted, err, sizeof err);
  if (!r) {
    fprintf(stderr, "sbx: %s: %s\n", tool, err);
    return NULL;
  }
  /* what the daemon tells an agent beside the result, told on stderr */
  json_t *st = json_object_get(r, "structuredContent");
  if (json_is_true(json_object_get(st, "reset")))
    fprintf(stderr, "sbx: sandbox %s had been reset after being idle: its earlier files and processes are gone "
                    "(bucket mounts keep theirs)\n", id);
  else if (json_is_true(json_object_get(st, "restarted")))
    fprintf(stderr, "sbx: sandbox %s was started again (the daemon or its init had stopped): files and sessions "
                    "kept, its processes ended\n", id);
  const char *hint = json_string_value(json_object_get(st, "hint"));
  if (hint) fprintf(stderr, "sbx: hint: %s\n", hint);
  if (json_is_true(json_object_get(r, "isError"))) {
    json_t *e = json_object_get(json_object_get(r, "structuredContent"), "error");
    const char *code = json_string_value(json_object_get(e, "code")) ?: "";
    if (!strcmp(code, "SANDBOX_NOT_FOUND") && *id) /* the daemon's advice is for agents */
      fprintf(stderr, "sbx: no sandbox '%s' (`sbx ls` lists them)\n", id);
    else
      fprintf(stderr, "sbx: %s: %s: %s\n", tool, code, for_the_cli(tool, json_string_value(json_object_get(e, "message"))));
    snprintf(last_code, sizeof last_code, "%s", json_string_value(json_object_get(e, "code")) ?: "");
    json_decref(r);
    return NULL;
  }
  return r;
}

static json_t *sc(json_t *r) { return json_object_get(r, "structuredContent"); }

static void exec_progress(void *ud, json_t *params) {
  (void)ud;
  json_t *meta = json_object_get(params, "_meta");
  const char *stream = json_string_value(json_object_get(meta, "sbx/stream"));
  json_t *data = json_object_get(meta, "sbx/data"), *m = json_object_get(params, "message");
  FILE *f = stream && !strcmp(stream, "stderr") ? stderr : stdout;
  char *bytes = NULL;
  size_t n = 0;
  if (data && sbx_base64_decode(json_string_value(data), json_string_length(data), &bytes, &n) == 0) {
    fwrite(bytes, 1, n, f);
    free(bytes);
  } else {
    fwrite(json_string_value(m), 1, json_string_length(m), f);
  }
  fflush(f);
}

/* Words after `--` are quoted for the shell unless there is just one. */
static char *join_command(int argc, char **argv) {
  if (argc == 1) return strdup(argv[0]);
  sbx_buf b = {0};
  for (int i = 0; i < argc; i++) {
    if (i) sbx_buf_append(&b, " ", 1);
    sbx_buf_append(&b, "'", 1);
    for (const char *p = argv[i]; *p; p++) {
      if (*p == '\'') sbx_buf_append(&b, "'\\''", 4);
      else sbx_buf_append(&b, p, 1);
    }
    sbx_buf_append(&b, "'", 1);
  }
  return b.data;
}

static int cmd_exec(int argc, char **argv) {
  static const struct option opts[] = {{"sandbox", required_argument, 0, 's'}, {"session", required_argument, 0, 'S'},
                                       {"cwd", required_argument, 0, 'C'},     {"timeout", required_argument, 0, 1000},
                                       {"env", required_argument, 0, 'e'},     {"interactive", no_argument, 0, 'i'},   {"tty", no_argument, 0, 't'},
                                       {"detach", no_argument, 0, 'd'},        {0, 0, 0, 0}};
  const char *sandbox = NULL, *session = NULL, *cwd = NULL;
  bool with_stdin = false, detach = false;
  long timeout = 0;
  json_t *env = json_object();
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "+s:e:itd", opts, NULL)) != -1) {
    switch (o) {
    case 'i': with_stdin = true; break;
    case 'd': detach = true; break;
    case 't': /* said, not ignored: docker exec -t gives a terminal, and sbx has none to give */
      fprintf(stderr, "sbx exec: -t: sandboxes have no terminal (commands run with pipes); use -i for stdin\n");
      return 2;
    case 's': sandbox = optarg; break;
    case 'S': session = optarg; break;
    case 'C': cwd = optarg; break;
    case 1000:
      /* 30s, 2m, 500ms, or whole milliseconds */
      timeout = sbx_parse_duration_ms(optarg, 1000); /* a bare number is seconds, as for timeout(1) and --sleep-after */
      if (timeout <= 0) {
        fprintf(stderr, "sbx exec: --timeout takes a duration: 30s, 2m, 500ms, or seconds (got '%s')\n", optarg);
        return 2;
      }
      break;
    case 'e':
      if (!env_arg(env, optarg)) {
        fprintf(stderr, "sbx exec: -e takes KEY=VALUE\n");
        return 2;
      }
      break;
    default: return usage_of("exec");
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "sbx exec: no command\n");
    return 2;
  }
  if (detach && (with_stdin || timeout > 0)) {
    fprintf(stderr, "sbx exec: -d runs in the background: no -i, no --timeout\n");
    return 2;
  }
  /* in MOUNT/<id>/dir of a view: that sandbox, in that directory */
  char view_id[64], view_cwd[4096];
  if (!sandbox && view_place(view_id, view_cwd) && view_id[0]) {
    sandbox = view_id;
    if (!cwd) cwd = view_cwd;
  }
  sbx_client c;
  if (open_client(&c, sandbox) < 0) return 1;
  char *cmd = join_command(argc - optind, argv + optind);
  json_t *args = json_pack("{s:s}", "command", cmd);
  free(cmd);
  if (session) json_object_set_new(args, "sessionId", json_string(session));
  if (cwd) json_object_set_new(args, "cwd", json_string(cwd));
  if (timeout > 0) json_object_set_new(args, "timeout", json_integer(timeout));
  if (json_object_size(env)) json_object_set(args, "env", env);
  json_decref(env);
  if (detach) {
    json_t *r = call(&c, "startProcess", args, NULL, NULL);
    sbx_client_close(&c);
    if (!r) return 1;
    printf("%s\n", json_string_value(json_object_get(sc(r), "id")));
    json_decref(r);
    return 0;
  }
  pid_t feeder = -1;
  if (with_stdin) { /* -i: our stdin streams to the command's, as docker exec -i */
    char err[600];
    json_t *r = sbx_client_request(&c, "sbx/stdin/open", NULL, err, sizeof err);
    json_decref(r);
    int fd = c.passed_fd;
    c.passed_fd = -1;
    if (!r || fd < 0) {
      fprintf(stderr, "sbx exec: no stdin stream: %s\n", r ? "the daemon sent none" : err);
      json_decref(args);
      sbx_client_close(&c);
      return 1;
    }
    if ((feeder = fork()) == 0) {
      signal(SIGINT, SIG_IGN);
      char buf[65536];
      ssize_t n;
      while ((n = read(0, buf, sizeof buf)) > 0)
        if (sbx_write_all(fd, buf, n) < 0) break;
      _exit(0); /* closing the socket is the command's EOF */
    }
    close(fd);
    c.stdin_stream = true;
  }
  struct sigaction sa = {.sa_handler = on_sigint};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, NULL);
  json_t *r = call(&c, "exec", args, exec_progress, NULL);
  sbx_client_close(&c);
  if (feeder > 0) { /* the command is done with its stdin */
    kill(feeder, SIGKILL);
    waitpid(feeder, NULL, 0);
  }
  if (!r) return interrupted ? 130 : !strcmp(last_code, "COMMAND_TIMEOUT") ? 124 : 1; /* 124: as timeout(1) */
  json_t *s = sc(r);
  if (json_is_true(json_object_get(s, "oomKilled"))) fprintf(stderr, "sbx: command killed: out of memory\n");
  int code = (int)json_integer_value(json_object_get(s, "exitCode"));
  json_decref(r);
  return code;
}

/* ID PORT: the words of expose and unexpose; the port, or -1 (said). */
static long port_args(const char *cmd, int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sbx %s ID PORT\n", cmd);
    return -1;
  }
  char *end;
  long port = strtol(argv[2], &end, 10);
  if (!*argv[2] || *end || port < 1 || port > 65535) {
    fprintf(stderr, "sbx %s: PORT must be 1-65535\n", cmd);
    return -1;
  }
  return port;
}

static int cmd_unexpose(int argc, char **argv) {
  long port = port_args("unexpose", argc, argv);
  if (port < 0) return 2;
  sbx_client c;
  if (open_client(&c, argv[1]) < 0) return 1;
  json_t *r = call(&c, "unexposePort", json_pack("{s:s, s:i}", "sandboxId", argv[1], "port", (int)port), NULL, NULL);
  sbx_client_close(&c);
  json_decref(r);
  return r ? 0 : 1;
}

static int cmd_expose(int argc, char **argv) {
  long port = port_args("expose", argc, argv);
  if (port < 0) return 2;
  sbx_client c;
  if (open_client(&c, argv[1]) < 0) return 1;
  /* a port exposed already: its URL again, as the first time; a sandbox
   * that is not there is not made (a typo's), as sbx cp */
  json_t *r = call(&c, "getExposedPorts", json_pack("{s:s}", "sandboxId", argv[1]), NULL, NULL);
  if (!r) {
    sbx_client_close(&c);
    return 1;
  }
  size_t i;
  json_t *e;
  json_array_foreach(json_object_get(sc(r), "ports"), i, e) {
    if (json_integer_value(json_object_get(e, "port")) == port) {
      const char *warning = json_string_value(json_object_get(sc(r), "warning"));
      if (warning) fprintf(stderr, "sbx expose: %s\n", warning); /* a URL that answers nothing is not printed */
      else printf("%s\n", json_string_value(json_object_get(e, "url")));
      json_decref(r);
      sbx_client_close(&c);
      return warning ? 1 : 0;
    }
  }
  json_decref(r);
  r = call(&c, "exposePort", json_pack("{s:s, s:i}", "sandboxId", argv[1], "port", (int)port), NULL, NULL);
  sbx_client_close(&c);
  if (!r) return 1;
  printf("%s\n", json_string_value(json_object_get(sc(r), "url")));
  json_decref(r);
  return 0;
}

/* [-s ID] [--signal SIG] [NAME]: the words of ps, logs and kill. */
static int proc_args(int argc, char **argv, const char **sandbox, const char **name, const char **signame) {
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "-s") || !strcmp(argv[i], "--sandbox")) && i + 1 < argc) *sandbox = argv[++i];
    else if (signame && !strcmp(argv[i], "--signal") && i + 1 < argc) *signame = argv[++i];
    else if (argv[i][0] != '-' && name && !*name) *name = argv[i];
    else return -1;
  }
  return name && !*name ? -1 : 0;
}

static int cmd_ps(int argc, char **argv) {
  const char *sandbox = NULL;
  if (proc_args(argc, argv, &sandbox, NULL, NULL) < 0) {
    return usage_of("ps");
  }
  sbx_client c;
  if (open_client(&c, sandbox) < 0) return 1;
  json_t *r = call(&c, "listProcesses", json_object(), NULL, NULL);
  sbx_client_close(&c);
  if (!r) return 1;
  printf("%-24s %-8s %-10s %-5s %s\n", "PROCESS", "PID", "STATUS", "EXIT", "COMMAND");
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(sc(r), "processes"), i, p) {
    json_t *code = json_object_get(p, "exitCode");
    json_int_t pid = json_integer_value(json_object_get(p, "pid"));
    char exit[16] = "-", pids[24] = "-";
    if (json_is_integer(code)) snprintf(exit, sizeof exit, "%d", (int)json_integer_value(code));
    if (pid > 0) snprintf(pids, sizeof pids, "%lld", (long long)pid);
    printf("%-24s %-8s %-10s %-5s %s\n", json_string_value(json_object_get(p, "id")), pids,
           json_string_value(json_object_get(p, "status")), exit, json_string_value(json_object_get(p, "command")));
  }
  json_decref(r);
  return 0;
}

static int cmd_logs(int argc, char **argv) {
  const char *sandbox = NULL, *name = NULL;
  bool follow = false;
  for (int i = 1; i < argc; i++) /* -f, wherever it is */
    if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
      follow = true;
      memmove(argv + i, argv + i + 1, (argc - i - 1) * sizeof *argv);
      argc--, i--;
    }
  if (proc_args(argc, argv, &sandbox, &name, NULL) < 0) {
    return usage_of("logs");
  }
  sbx_client c;
  if (open_client(&c, sandbox) < 0) return 1;
  if (follow) { /* what it wrote so far, then live until it ends (or ^C) */
    json_t *r = call(&c, "streamProcessLogs", json_pack("{s:s}", "processId", name), exec_progress, NULL);
    sbx_client_close(&c);
    if (!r) return interrupted ? 130 : 1;
    json_decref(r);
    return 0;
  }
  json_t *r = call(&c, "getProcessLogs", json_pack("{s:s}", "processId", name), NULL, NULL);
  sbx_client_close(&c);
  if (!r) return 1;
  json_t *out = json_object_get(sc(r), "stdout"), *err = json_object_get(sc(r), "stderr");
  fwrite(json_string_value(out), 1, json_string_length(out), stdout);
  fflush(stdout);
  fwrite(json_string_value(err), 1, json_string_length(err), stderr);
  const char *path = json_string_value(json_object_get(sc(r), "outputPath"));
  if (path) /* it wrote more than the logs keep: their middle was left out above */
    fprintf(stderr, "sbx logs: the middle of its output was left out above; `sbx logs -f` prints all of it, "
                    "and it is whole at %s in the sandbox\n", path);
  json_decref(r);
  return 0;
}

/* TERM, term, SIGTERM, 15: the names kill(1) takes, as killProcess names
 * them; NULL for one it does not send. */
static const char *signal_name(const char *s) {
  static const char *const names[] = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"};
  static const int numbers[] = {SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  char *end;
  long n = strtol(s, &end, 10);
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++)
    if ((*s && !*end && n == numbers[i]) || !strcasecmp(s, names[i]) || !strcasecmp(s, names[i] + 3)) return names[i];
  return NULL;
}

static int cmd_kill(int argc, char **argv) {
  const char *sandbox = NULL, *name = NULL, *signame = NULL;
  if (proc_args(argc, argv, &sandbox, &name, &signame) < 0) {
    return usage_of("kill");
  }
  if (signame && !(signame = signal_name(signame))) {
    fprintf(stderr, "sbx kill: --signal takes TERM, KILL, INT, HUP, QUIT, USR1 or USR2 (or their numbers)\n");
    return 2;
  }
  sbx_client c;
  if (open_client(&c, sandbox) < 0) return 1;
  json_t *args = json_pack("{s:s}", "processId", name);
  if (signame) json_object_set_new(args, "signal", json_string(signame));
  json_t *r = call(&c, "killProcess", args, NULL, NULL);
  sbx_client_close(&c);
  if (!r) return 1;
  json_decref(r);
  return 0;
}

static int cmd_ls(void) {
  sbx_client c;
  if (open_daemon(&c, NULL) < 0) return 1;
  json_t *r = call(&c, "listSandboxes", json_object(), NULL, NULL);
  sbx_client_close(&c);
  if (!r) return 1;
  printf("%-40s %-8s %-24s %s\n", "SANDBOX", "STATUS", "CREATED", "LAST ACTIVITY");
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(sc(r), "sandboxes"), i, s) {
    printf("%-40s %-8s %-24s %s\n", json_string_value(json_object_get(s, "sandboxId")),
           json_string_value(json_object_get(s, "status")), json_string_value(json_object_get(s, "createdAt")),
           json_string_value(json_object_get(s, "lastActivity")));
  }
  json_decref(r);
  return 0;
}

static int cmd_create(int argc, char **argv) {
  static const struct option opts[] = {{"network", required_argument, 0, 'n'}, {"allow", required_argument, 0, 'a'},
                                       {"memory", required_argument, 0, 'm'},  {"cpus", required_argument, 0, 'c'},
                                       {"pids", required_argument, 0, 'p'},    {"disk", required_argument, 0, 'D'},
                                       {"sleep-after", required_argument, 0, 'z'}, {"keep-alive", no_argument, 0, 'k'},
                                       {"image", required_argument, 0, 'I'},   {"env", required_argument, 0, 'e'},
                                       {0, 0, 0, 0}};
  json_t *args = json_object(), *limits = json_object(), *env = json_object(), *allow = json_array();
  int o, rc = 2;
  optind = 1;
  while ((o = getopt_long(argc, argv, "e:", opts, NULL)) != -1) {
    char *end = NULL;
    switch (o) {
    case 'n': json_object_set_new(args, "network", json_string(optarg)); break;
    case 'a': json_array_append_new(allow, json_string(optarg)); break;
    case 'z': json_object_set_new(args, "sleepAfter", json_string(optarg)); break;
    case 'k': json_object_set_new(args, "keepAlive", json_true()); break;
    case 'I': json_object_set_new(args, "image", json_string(optarg)); break;
    case 'c': {
      double v = strtod(optarg, &end);
      if (!*optarg || *end || !(v > 0)) {
        fprintf(stderr, "sbx create: --cpus wants a number above 0 (1.5: one and a half CPUs), not '%s'\n", optarg);
        goto bad;
      }
      json_object_set_new(limits, "cpus", json_real(v));
      break;
    }
    case 'm': case 'p': case 'D': {
      long long v = strtoll(optarg, &end, 10);
      if (!*optarg || *end || v <= 0) {
        fprintf(stderr, "sbx create: --%s wants a whole number above 0%s, not '%s'\n",
                o == 'm' ? "memory" : o == 'p' ? "pids" : "disk", o == 'p' ? "" : " (MB)", optarg);
        goto bad;
      }
      json_object_set_new(limits, o == 'm' ? "memoryMB" : o == 'p' ? "pids" : "diskMB", json_integer(v));
      break;
    }
    case 'e':
      if (!env_arg(env, optarg)) goto bad;
      break;
    default: goto bad;
    }
  }
  if (optind != argc - 1 || !sbx_valid_id(argv[optind])) goto bad;
  json_object_set_new(args, "sandboxId", json_string(argv[optind]));
  if (json_object_size(limits)) json_object_set(args, "limits", limits);
  if (json_object_size(env)) json_object_set(args, "env", env);
  if (json_array_size(allow)) json_object_set(args, "allowedHosts", allow);
  sbx_client c;
  rc = 1;
  if (open_daemon(&c, NULL) < 0) goto out;
  json_t *r = call(&c, "createSandbox", json_incref(args), NULL, NULL);
  sbx_client_close(&c);
  if (!r) goto out;
  json_t *text = json_object_get(json_array_get(json_object_get(r, "content"), 0), "text");
  printf("%s\n", json_string_value(text) ?: "");
  /* options it could not change (they need a new sandbox) fail the command */
  rc = json_array_size(json_object_get(sc(r), "notApplied")) ? 1 : 0;
  json_decref(r);
  goto out;
bad:
  usage_of("create");
out:
  json_decref(args), json_decref(limits), json_decref(env), json_decref(allow);
  return rc;
}

static int cmd_destroy(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "sbx destroy: which sandbox?\n");
    return 2;
  }
  for (int i = 1; i < argc; i++)
    if (!sbx_valid_id(argv[i])) {
      fprintf(stderr, "sbx destroy: invalid sandbox id '%.100s': ids are 1-63 of [a-z0-9-]\n", argv[i]);
      return 2;
    }
  sbx_client c;
  if (open_daemon(&c, NULL) < 0) return 1;
  int rc = 0;
  for (int i = 1; i < argc; i++) {
    json_t *r = call(&c, "destroySandbox", json_pack("{s:s}", "sandboxId", argv[i]), NULL, NULL);
    if (!r) rc = 1;
    else printf("destroyed %s\n", argv[i]);
    json_decref(r);
  }
  sbx_client_close(&c);
  return rc;
}


static int cmd_session(int argc, char **argv) {
  const char *sandbox = NULL, *cwd = NULL, *verb = NULL, *name = NULL;
  json_t *env = json_object();
  int rc = 2;
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "-s") || !strcmp(argv[i], "--sandbox")) && i + 1 < argc) sandbox = argv[++i];
    else if (!strcmp(argv[i], "--cwd") && i + 1 < argc) cwd = argv[++i];
    else if ((!strcmp(argv[i], "-e") || !strcmp(argv[i], "--env")) && i + 1 < argc) {
      if (!env_arg(env, argv[++i])) {
        fprintf(stderr, "sbx session: -e takes KEY=VALUE\n");
        goto out;
      }
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "sbx session: unknown option %s\n", argv[i]);
      goto out;
    } else if (!verb) verb = argv[i];
    else if (!name) name = argv[i];
    else goto usage;
  }
  if (!verb || (strcmp(verb, "ls") && !name) || (!strcmp(verb, "ls") && name)) goto usage;
  if (name && !sbx_valid_id(name)) {
    fprintf(stderr, "sbx session: invalid session id '%.100s': ids are 1-63 of [a-z0-9-]\n", name);
    goto out;
  }
  sbx_client c;
  if (open_client(&c, sandbox) < 0) {
    rc = 1;
    goto out;
  }
  json_t *r = NULL;
  if (!strcmp(verb, "ls")) {
    if ((r = call(&c, "listSessions", json_object(), NULL, NULL))) {
      size_t i;
      json_t *s;
      printf("%-24s %s\n", "SESSION", "CWD");
      json_array_foreach(json_object_get(sc(r), "sessions"), i, s)
        printf("%-24s %s\n", json_string_value(json_object_get(s, "id")), json_string_value(json_object_get(s, "cwd")));
    }
  } else if (!strcmp(verb, "create")) {
    json_t *args = json_pack("{s:s}", "id", name);
    if (cwd) json_object_set_new(args, "cwd", json_string(cwd));
    if (json_object_size(env)) json_object_set(args, "env", env);
    if ((r = call(&c, "createSession", args, NULL, NULL)))
      printf("created session %s (cwd %s)\n", name, json_string_value(json_object_get(sc(r), "cwd")));
  } else if (!strcmp(verb, "rm") || !strcmp(verb, "delete")) {
    if ((r = call(&c, "deleteSession", json_pack("{s:s}", "id", name), NULL, NULL))) printf("deleted session %s\n", name);
  } else {
    sbx_client_close(&c);
    goto usage;
  }
  sbx_client_close(&c);
  rc = r ? 0 : 1;
  json_decref(r);
  goto out;
usage:
  usage_of("session");
out:
  json_decref(env);
  return rc;
}

/* Stops the daemon and says what became of the sandboxes: their records
 * and disks stay, and each starts again on its next call. */
static int cmd_daemon_stop(void) {
  sbx_paths p;
  char err[600];
  if (sbx_paths_init(&p, err, sizeof err) < 0) {
    fprintf(stderr, "sbx daemon stop: %s\n", err);
    return 1;
  }
  int kept = -1, running = 0;
  int fd = sbx_connect(&p, false, err, sizeof err);
  if (fd >= 0) {
    close(fd);
    sbx_client c;
    if (sbx_client_open(&c, NULL, err, sizeof err) == 0) {
      json_t *r = sbx_client_call(&c, "listSandboxes", json_object(), NULL, NULL, NULL, err, sizeof err);
      size_t i;
      json_t *s;
      if (r) kept = 0;
      json_array_foreach(json_object_get(sc(r), "sandboxes"), i, s) {
        const char *st = json_string_value(json_object_get(s, "status"));
        if (st && !strcmp(st, "starting")) continue; /* a create not answered yet leaves nothing */
        kept++;
        running += st && !strcmp(st, "running");
      }
      json_decref(r);
      sbx_client_close(&c);
    }
  }
  int pid = sbx_daemon_stop(&p, err, sizeof err);
  if (pid < 0) {
    fprintf(stderr, "sbx daemon stop: %s\n", err);
    return 1;
  }
  if (pid == 0) {
    printf("no sbx daemon was running (%s)\n", p.sock);
    return 0;
  }
  printf("stopped the sbx daemon (pid %d)", pid);
  if (kept >= 0)
    printf("; sandboxes kept with their files in %s/sandboxes: %d (%d of them running: each starts again on its next call)",
           p.state, kept, running);
  printf("\n");
  return 0;
}

/* `sbx daemon --http ADDR` with a daemon running: it serves HTTP from now
 * on, no restart. */
static int daemon_http_live(const char *addr, bool remote) {
  sbx_client c;
  char err[600], conf[1024];
  if (open_daemon(&c, NULL) < 0) return 1;
  json_t *r = sbx_client_request(&c, "sbx/daemon/http", json_pack("{s:s, s:b}", "address", addr, "allowRemote", remote),
                                 err, sizeof err);
  sbx_client_close(&c);
  sbx_config_path(conf, sizeof conf);
  if (!r) {
    fprintf(stderr, "sbx daemon: the running daemon does not serve HTTP at %s: %s\n", addr, err);
    return 1;
  }
  printf("the running sbx daemon now serves MCP over HTTP at %s (bearer token in %s).\n"
         "It stops with this daemon; to have every daemon serve it, put \"http\": \"%s\" in %s.\n",
         json_string_value(json_object_get(r, "url")), json_string_value(json_object_get(r, "tokenFile")), addr, conf);
  json_decref(r);
  return 0;
}

/* The kernel's and the configuration's checks, then the daemon that runs:
 * one whose binary was replaced since it started (an upgrade) still runs
 * the old code until it is restarted. */
static int cmd_doctor(void) {
  int problems = sbx_doctor(stdout);
  sbx_paths p;
  char err[600];
  if (sbx_paths_init(&p, err, sizeof err) < 0) return 1;
  FILE *f = fopen(p.pidfile, "re");
  int pid = 0;
  if (f) {
    if (fscanf(f, "%d", &pid) != 1) pid = 0;
    fclose(f);
  }
  char exe[128], path[4096] = "";
  snprintf(exe, sizeof exe, "/proc/%d/exe", pid);
  ssize_t n = pid > 1 && sbx_daemon_listening(&p) ? readlink(exe, path, sizeof path - 1) : -1;
  if (n <= 0) {
    printf("%-4s %-22s %s\n", "ok", "daemon", "not running (the first command starts one)");
  } else {
    path[n] = 0;
    bool replaced = n > 10 && !strcmp(path + n - 10, " (deleted)");
    printf("%-4s %-22s pid %d, %s\n", replaced ? "--" : "ok", "daemon", pid,
           replaced ? "runs a binary replaced since it started: `sbx daemon stop` (sandboxes keep their files; "
                      "the next command starts the new one)"
                    : path);
    problems += replaced;
    sbx_client c; /* what the daemon cannot do now */
    json_t *r = NULL;
    if (sbx_client_open(&c, NULL, err, sizeof err) == 0) {
      r = sbx_client_request(&c, "sbx/daemon/status", json_object(), err, sizeof err);
      sbx_client_close(&c);
    }
    const char *preview = json_string_value(json_object_get(r, "previewProblem"));
    if (preview) printf("%-4s %-22s %s\n", "--", "preview URLs", preview);
    problems += preview != NULL;
    json_decref(r);
  }
  printf("%d problem%s\n", problems, problems == 1 ? "" : "s");
  return problems ? 1 : 0;
}

/* -o's comma-separated options; -1 on one it does not know. */
static int mount_opts(const char *list, sbx_view_opts *o) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (!strcmp(t, "allow_other")) o->allow_other = true;
    else if (!strcmp(t, "nopassthrough")) o->no_passthrough = true;
    else if (!strcmp(t, "nouring")) o->no_uring = true;
    else return -1;
  }
  return 0;
}

static int cmd_mount(int argc, char **argv) {
  sbx_view_opts o = {.ready_fd = -1};
  const char *mnt = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--foreground")) o.foreground = true;
    else if (!strcmp(argv[i], "-d") || !strcmp(argv[i], "--debug")) o.debug = o.foreground = true;
    else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      if (mount_opts(argv[++i], &o) == 0) continue;
      fprintf(stderr, "sbx mount: -o takes allow_other, nopassthrough and nouring (got '%s')\n", argv[i]);
      return 2;
    } else if (argv[i][0] == '-' || mnt) {
      fprintf(stderr, "usage: %s\n", MOUNT_USAGE);
      return 2;
    } else mnt = argv[i];
  }
  if (!mnt) {
    fprintf(stderr, "usage: %s\n", MOUNT_USAGE);
    return 2;
  }
  /* as mkdir -p would: sbx mount /mnt/sbx works on a fresh machine */
  struct stat st;
  if (stat(mnt, &st) < 0 && errno == ENOENT) {
    int r = sbx_mkdir_p(mnt, 0755);
    if (r < 0) {
      fprintf(stderr, "sbx mount: making %s: %s\n", mnt, strerror(-r));
      return 1;
    }
  }
  return sbx_view_main(mnt, &o);
}

static int cmd_umount(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: sbx umount MOUNTPOINT\n");
    return 2;
  }
  char err[600], real[PATH_MAX];
  bool resolved = realpath(argv[1], real) != NULL;
  if (!resolved && !sbx_fuse_dead(errno)) { /* a killed view's mount point answers so (sbx_fuse_dead) */
    fprintf(stderr, "sbx umount: %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  if (resolved && !sbx_fuse_is_ours(real)) {
    fprintf(stderr, "sbx umount: %s is not an sbx mount\n", argv[1]);
    return 1;
  }
  if (sbx_fuse_unmount(argv[1], false, err, sizeof err) < 0 && sbx_fuse_unmount(argv[1], true, err, sizeof err) < 0) {
    fprintf(stderr, "sbx umount: %s\n", err);
    return 1;
  }
  printf("unmounted %s\n", argv[1]);
  return 0;
}

static int run(int argc, char **argv);

int main(int argc, char **argv) {
  int rc = run(argc, argv);
  return bad_usage && rc == 1 ? 2 : rc;
}

static int run(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help")) {
    if (argc > 2 && strcmp(argv[2], "-h") && strcmp(argv[2], "--help")) return help(argv[2]);
    return argc > 2 ? help("help") : (usage(stdout), 0);
  }
  if (asks_help(cmd, argc, argv)) return help(cmd);
  if (!strcmp(cmd, "daemon")) {
    if (argc > 2 && !strcmp(argv[2], "stop")) return cmd_daemon_stop();
    const char *http = NULL, *mount_dir = NULL;
    bool remote = false;
    for (int i = 2; i < argc; i++) {
      if (!strcmp(argv[i], "--http") && i + 1 < argc) http = argv[++i];
      else if (!strncmp(argv[i], "--http=", 7)) http = argv[i] + 7;
      else if (!strcmp(argv[i], "--http-allow-remote")) remote = true;
      else if (!strcmp(argv[i], "--mount") && i + 1 < argc) mount_dir = argv[++i];
      else {
        fprintf(stderr, "sbx daemon: unknown option %s\n", argv[i]);
        return 2;
      }
    }
    sbx_paths p;
    char err[600];
    int fd = sbx_paths_init(&p, err, sizeof err) == 0 ? sbx_connect(&p, false, err, sizeof err) : -1;
    if (fd >= 0) { /* one runs already */
      close(fd);
      if (http && !mount_dir) return daemon_http_live(http, remote);
      fprintf(stderr, "sbx daemon: a daemon runs already (socket %s)%s\n", p.sock,
              mount_dir ? "; `sbx mount DIR` adds a view to it" : "; `sbx daemon stop` stops it");
      return 3;
    }
    return sbx_daemon_main(http, remote, mount_dir);
  }
  if (!strcmp(cmd, "mcp")) {
    const char *sandbox = NULL, *tools = NULL;
    bool read_only = false;
    for (int i = 2; i < argc; i++) {
      if (!strcmp(argv[i], "--sandbox") && i + 1 < argc) sandbox = argv[++i];
      else if (!strncmp(argv[i], "--sandbox=", 10)) sandbox = argv[i] + 10;
      else if (!strcmp(argv[i], "--tools") && i + 1 < argc) tools = argv[++i];
      else if (!strncmp(argv[i], "--tools=", 8)) tools = argv[i] + 8;
      else if (!strcmp(argv[i], "--read-only")) read_only = true;
      else {
        fprintf(stderr, "sbx mcp: unknown option %s\n", argv[i]);
        return 2;
      }
    }
    if (sandbox && !sbx_valid_id(sandbox)) {
      fprintf(stderr, "sbx mcp: --sandbox must be 1-63 of [a-z0-9-]\n");
      return 2;
    }
    return sbx_relay_main(sandbox, tools, read_only);
  }
  /* the commands that take no arguments say so rather than ignore them */
  static const char *const bare[] = {"ls", "doctor", "--version", "-V", "version"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(bare); i++)
    if (!strcmp(cmd, bare[i]) && argc > 2) {
      fprintf(stderr, "sbx %s: takes no arguments (got '%s')\n", cmd, argv[2]);
      return 2;
    }
  if (!strcmp(cmd, "exec")) return cmd_exec(argc - 1, argv + 1);
  if (!strcmp(cmd, "ls")) return cmd_ls();
  if (!strcmp(cmd, "session")) return cmd_session(argc - 1, argv + 1);
  if (!strcmp(cmd, "expose")) return cmd_expose(argc - 1, argv + 1);
  if (!strcmp(cmd, "unexpose")) return cmd_unexpose(argc - 1, argv + 1);
  if (!strcmp(cmd, "ps")) return cmd_ps(argc - 1, argv + 1);
  if (!strcmp(cmd, "logs")) return cmd_logs(argc - 1, argv + 1);
  if (!strcmp(cmd, "kill")) return cmd_kill(argc - 1, argv + 1);
  if (!strcmp(cmd, "destroy")) return cmd_destroy(argc - 1, argv + 1);
  if (!strcmp(cmd, "create")) return cmd_create(argc - 1, argv + 1);
  if (!strcmp(cmd, "cp")) return sbx_cp_main(argc - 1, argv + 1, open_client);
  if (!strcmp(cmd, "doctor")) return cmd_doctor();
  if (!strcmp(cmd, "mount")) return cmd_mount(argc - 1, argv + 1);
  if (!strcmp(cmd, "umount")) return cmd_umount(argc - 1, argv + 1);
  if (!strcmp(cmd, "bucketfs")) return sbx_bucketfs_main(argc - 1, argv + 1); /* internal: run by the daemon */
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
    printf("sbx %s\n", MCP_SERVER_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "sbx: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
