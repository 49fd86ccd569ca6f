/* Network "egress": a sandbox reaches the outside through pasta, attached
 * to its network namespace with no port forwarding either way and no
 * mapping of the gateway to the host (so the host's loopback services stay
 * out of reach), behind an nftables filter inside the sandbox's namespace
 * that refuses private and link-local destinations. */
#define _GNU_SOURCE
#include "network.h"
#include "files.h"
#include "netpolicy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Refused destinations: every address that is not the public internet
 * from the host's point of view (the special-purpose registries: its own
 * networks, metadata services, translation prefixes), and the gateway
 * itself but for DNS. */
/* allowedHosts: what is listed is reachable (even a special-purpose
 * address, named explicitly), and nothing else is. */
static int nft_rules(const sbx_strv *allowed, const char *gw, char *out, size_t len) {
  char v4[2048], v6[2048], a4[4096] = "", a6[4096] = "";
  if (sbx_special_nft(AF_INET, v4, sizeof v4) < 0 || sbx_special_nft(AF_INET6, v6, sizeof v6) < 0) return -ENOSPC;
  for (size_t i = 0; i < allowed->n; i++) {
    sbx_cidr c;
    if (sbx_cidr_parse(allowed->v[i], &c) < 0) continue; /* a name: its addresses come with its answers */
    char *set = c.family == AF_INET ? a4 : a6;
    size_t o = strlen(set);
    snprintf(set + o, sizeof a4 - o, "%s%s", o ? ", " : "", allowed->v[i]);
  }
  int n = snprintf(out, len,
                   "table inet sbx {\n"
                   "  set special4 { type ipv4_addr; flags interval; auto-merge; elements = { %s } }\n"
                   "  set special6 { type ipv6_addr; flags interval; auto-merge; elements = { %s } }\n"
                   "  set allowed4 { type ipv4_addr; flags interval; auto-merge; %s%s%s }\n"
                   "  set allowed6 { type ipv6_addr; flags interval; auto-merge; %s%s%s }\n"
                   /* what answers for allowed names open: plain sets, so that
                    * adds from several nft runs at once never conflict */
                   "  set named4 { type ipv4_addr; size 8192; }\n"
                   "  set named6 { type ipv6_addr; size 8192; }\n"
                   "  chain out {\n"
                   "    type filter hook output priority 0; policy accept;\n"
                   "    oifname \"lo\" accept\n"
                   "    ip daddr @allowed4 accept\n"
                   "    ip6 daddr @allowed6 accept\n"
                   "    ip daddr @named4 accept\n"
                   "    ip6 daddr @named6 accept\n"
                   "    %sip daddr %s udp dport 53 accept\n"
                   "    %sip daddr %s tcp dport 53 accept\n"
                   "    ip daddr @special4 reject with icmp type admin-prohibited\n"
                   "    ip6 daddr @special6 reject with icmpv6 type admin-prohibited\n"
                   "    ip daddr %s reject with icmp type admin-prohibited\n"
                   "%s"
                   "  }\n"
                   "}\n",
                   v4, v6, *a4 ? "elements = { " : "", a4, *a4 ? " };" : "", *a6 ? "elements = { " : "", a6,
                   *a6 ? " };" : "", allowed->n ? "# DNS only through the daemon's filter: " : "", gw,
                   allowed->n ? "# " : "", gw, gw,
                   allowed->n ? "    meta nfproto ipv4 reject with icmp type admin-prohibited\n"
                                "    meta nfproto ipv6 reject with icmpv6 type admin-prohibited\n"
                              : "");
  return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

static const char *find_tool(const char *name) {
  static const char *const dirs[] = {"/usr/bin", "/usr/sbin", "/bin", "/sbin"};
  static char path[64];
  for (size_t i = 0; i < SBX_ARRAY_SIZE(dirs); i++) {
    snprintf(path, sizeof path, "%s/%s", dirs[i], name);
    if (access(path, X_OK) == 0) return path;
  }
  return NULL;
}

bool sbx_net_egress_available(const char **why) {
  if (!find_tool("pasta")) {
    if (why) *why = "pasta (Debian package passt) is not installed";
    return false;
  }
  if (!find_tool("nft")) {
    if (why) *why = "nft (Debian package nftables) is not installed";
    return false;
  }
  if (access("/dev/net/tun", R_OK | W_OK) < 0) {
    if (why) *why = "pasta needs read-write /dev/net/tun, which this user lacks (it is mode 0666 on most systems)";
    return false;
  }
  return true;
}

/* The host's IPv4 default gateway, from /proc/net/route. */
static int default_gateway(char out[INET_ADDRSTRLEN]) {
  _cleanup_fclose_ FILE *f = fopen("/proc/net/route", "re");
  if (!f) return -errno;
  char line[256], ifname[64];
  unsigned dest, gw, flags;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%63s %x %x %x", ifname, &dest, &gw, &flags) == 4 && dest == 0 && (flags & 2)) {
      struct in_addr a = {.s_addr = gw};
      inet_ntop(AF_INET, &a, out, INET_ADDRSTRLEN);
      return 0;
    }
  return -ENETUNREACH;
}

/* Starts nft -f - with the sandbox's user and network namespaces joined
 * (as its root, and no other namespace), `input` on its stdin: its pid
 * (and pidfd), or -1 with errno. */
static pid_t nft_spawn(sbx_sandbox *sb, const char *input, int *pidfd) {
  char nft[64];
  snprintf(nft, sizeof nft, "%s", find_tool("nft"));
  char *argv[] = {nft, "-f", "-", NULL};
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -1;
  pid_t pid = sbx_fork_child(0, pidfd);
  if (pid < 0) {
    int e = errno;
    close(p[0]);
    close(p[1]);
    errno = e;
    return -1;
  }
  if (pid == 0) {
    sbx_child_unblock();
    /* as sandbox root: netlink wants an identity mapped in the namespace */
    if (setns(sb->init_pidfd, CLONE_NEWUSER | CLONE_NEWNET) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
      _exit(126);
    dup2(p[0], 0);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 1);
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    execve(argv[0], argv, envp);
    _exit(127);
  }
  close(p[0]);
  /* what is asked of nft is a few KiB: the pipe holds it all */
  int r = sbx_write_all(p[1], input, strlen(input));
  close(p[1]);
  if (r < 0) errno = -r; /* the child sees a short input and fails: its status says so */
  return pid;
}

/* nft -f - in the sandbox's namespace: its exit status, or -errno. */
static int nft_run(sbx_sandbox *sb, const char *input) {
  pid_t pid = nft_spawn(sb, input, NULL);
  if (pid < 0) return -errno;
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -errno;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

pid_t sbx_net_open_named(sbx_sandbox *sb, const sbx_dns_addr *a, int n, int *pidfd) {
  size_t cap = (size_t)n * (INET6_ADDRSTRLEN + 2) + 128, o4 = 0, o6 = 0;
  _cleanup_free_ char *v4 = calloc(1, cap), *v6 = calloc(1, cap), *input = calloc(2, cap);
  if (!v4 || !v6 || !input) {
    errno = ENOMEM;
    return -1;
  }
  for (int i = 0; i < n; i++) {
    char addr[INET6_ADDRSTRLEN];
    inet_ntop(a[i].family, a[i].addr, addr, sizeof addr);
    if (a[i].family == AF_INET) o4 += (size_t)snprintf(v4 + o4, cap - o4, "%s%s", o4 ? ", " : "", addr);
    else o6 += (size_t)snprintf(v6 + o6, cap - o6, "%s%s", o6 ? ", " : "", addr);
  }
  snprintf(input, 2 * cap, "%s%s%s%s%s%s", o4 ? "add element inet sbx named4 { " : "", v4, o4 ? " }\n" : "",
           o6 ? "add element inet sbx named6 { " : "", v6, o6 ? " }\n" : "");
  return nft_spawn(sb, input, pidfd);
}

int sbx_netns_socket(sbx_sandbox *sb, int type, const struct sockaddr *addr, socklen_t alen) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -errno;
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid < 0) {
    int e = errno;
    close(sv[0]);
    close(sv[1]);
    return -e;
  }
  if (pid == 0) {
    sbx_child_unblock();
    int32_t e = 0;
    int s = -1;
    if (setns(sb->init_pidfd, CLONE_NEWUSER | CLONE_NEWNET) < 0) e = errno;
    else if ((s = socket(addr->sa_family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) e = errno;
    else if (bind(s, addr, alen) < 0) e = errno;
    sbx_send_fds(sv[1], &e, sizeof e, &s, e ? 0 : 1, 0);
    _exit(0);
  }
  close(sv[1]);
  int32_t e = EIO;
  int fd = -1;
  ssize_t n = sbx_recv_fds(sv[0], &e, sizeof e, &fd, 1, NULL, 0);
  close(sv[0]);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
  if (n != sizeof e || e || fd < 0) {
    if (fd >= 0) close(fd);
    return -(e ? e : EIO);
  }
  return fd;
}

int sbx_net_egress_start(sbx_sandbox *sb, sbx_error *err) {
  const char *why;
  if (!sbx_net_egress_available(&why)) return sbx_err(err, "VALIDATION_FAILED", "network \"egress\": %s", why);
  char gw[INET_ADDRSTRLEN];
  int r = default_gateway(gw);
  if (r < 0) return sbx_err_errno(err, "INTERNAL", -r, "network \"egress\" needs a default route on the host");

  /* the filter first: nothing leaves before it stands */
  char rules[16384];
  if (nft_rules(&sb->opts.allowed_hosts, gw, rules, sizeof rules) < 0)
    return sbx_err(err, "INTERNAL", "the egress filter does not fit");
  r = nft_run(sb, rules);
  if (r != 0) return sbx_err(err, "INTERNAL", "installing the egress filter of sandbox '%s' failed (%d)", sb->id, r);

  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/net", sb->init_pid);
  _cleanup_close_ int netfd = open(path, O_RDONLY | O_CLOEXEC);
  snprintf(path, sizeof path, "/proc/%d/ns/user", sb->init_pid);
  _cleanup_close_ int userfd = open(path, O_RDONLY | O_CLOEXEC);
  if (netfd < 0 || userfd < 0) return sbx_err_errno(err, "INTERNAL", errno, "opening the namespaces of '%s'", sb->id);
  char pasta[64];
  snprintf(pasta, sizeof pasta, "%s", find_tool("pasta"));
  int pidfd = -1;
  /* every disposition default (pasta insists on finding SIGPIPE so, while
   * the daemon ignores it) */
  pid_t pid = sbx_fork_child(0, &pidfd);
  if (pid < 0) return sbx_err_errno(err, "INTERNAL", errno, "fork");
  if (pid == 0) {
    sbx_child_unblock();
    /* the namespaces by fd: pasta opens them after dropping privileges;
     * its complaints go to the daemon's log */
    int n = fcntl(netfd, F_DUPFD, 10), u = fcntl(userfd, F_DUPFD, 10);
    int null = open("/dev/null", O_RDWR);
    if (n < 0 || u < 0 || null < 0) _exit(126);
    dup2(null, 0), dup2(null, 1);
    dup2(n, 3), dup2(u, 4);
    close_range(5, ~0U, 0);
    char *argv[] = {pasta, "--netns", "/proc/self/fd/3", "--userns", "/proc/self/fd/4",
                    "--config-net", "--foreground", "--quiet",
                    /* no port forwarding either way, no host loopback behind the gateway */
                    "-t", "none", "-u", "none", "-T", "none", "-U", "none", "--no-map-gw",
                    "--dns-forward", gw, "--no-dhcp", "--no-dhcpv6", "--no-ndp", "--no-ra",
                    /* as root it must stay root to join a root-owned user namespace */
                    geteuid() == 0 ? "--runas" : NULL, "0", NULL};
    char *envp[] = {"PATH=/usr/bin:/usr/sbin:/bin:/sbin", NULL};
    execve(pasta, argv, envp);
    _exit(127);
  }
  sb->net_pid = pid;
  sb->net_pidfd = pidfd;
  /* pasta configures the namespace's interface: wait (bounded) until the
   * sandbox has a default route */
  for (int i = 0; i < 500; i++) {
    char route[64];
    snprintf(route, sizeof route, "/proc/%d/net/route", sb->init_pid);
    FILE *f = fopen(route, "re");
    bool up = false;
    if (f) {
      char line[256], ifn[64];
      unsigned dest, g, flags;
      while (fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %x %x %x", ifn, &dest, &g, &flags) == 4 && dest == 0) up = true;
      fclose(f);
    }
    if (up) break;
    siginfo_t si = {0};
    if (waitid(P_PIDFD, pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid) {
      sb->net_pid = 0;
      close(pidfd);
      sb->net_pidfd = -1;
      return sbx_err(err, "INTERNAL", "pasta exited (%d) before the network of '%s' was up", si.si_status, sb->id);
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL); /* pasta has no readiness signal when it stays in the foreground */
  }
  /* names in allowedHosts: the sandbox's resolver is the daemon's filter */
  if (sbx_dns_filter_wanted(sb) && sbx_dns_filter_start(sb, err) < 0) {
    sbx_net_stop(sb);
    return -1;
  }
  char resolv[128];
  snprintf(resolv, sizeof resolv, "nameserver %s\n", sb->dns ? "127.0.0.1" : gw);
  return sbx_fs_write(sb, "/etc/resolv.conf", resolv, strlen(resolv), err);
}

void sbx_net_stop(sbx_sandbox *sb) {
  sbx_dns_filter_stop(sb);
  if (sb->net_pidfd < 0) return;
  sbx_pidfd_send_signal(sb->net_pidfd, SIGKILL);
  siginfo_t si;
  while (waitid(P_PIDFD, sb->net_pidfd, &si, WEXITED) < 0 && errno == EINTR) {
  }
  close(sb->net_pidfd);
  sb->net_pidfd = -1;
  sb->net_pid = 0;
}
