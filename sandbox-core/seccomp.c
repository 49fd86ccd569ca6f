#define _GNU_SOURCE
#include "seccomp.h"
#include "util.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <linux/netlink.h>

enum cond { ANY, ARG0_HAS_FLAG, ARG1_EQ, ARG0_NOT_IN_FAMILIES, ARG0_NETLINK_NOT_ROUTE };

/* The policy, reviewed as a table. Everything not named is allowed: the
 * capability set and namespaces do the rest, as in the container default. */
static const struct rule {
  const char *syscall;
  int err;
  enum cond cond;
  unsigned long long value;
} rules[] = {
    /* no new namespaces: glibc falls back from clone3 to clone, whose
     * namespace flags are refused one by one */
    {"clone3", ENOSYS, ANY, 0},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWUSER},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWNS},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWPID},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWNET},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWUTS},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWIPC},
    {"clone", EPERM, ARG0_HAS_FLAG, CLONE_NEWCGROUP},
    {"unshare", EPERM, ANY, 0},
    {"setns", EPERM, ANY, 0},
    /* the mount family */
    {"mount", EPERM, ANY, 0},
    {"umount2", EPERM, ANY, 0},
    {"pivot_root", EPERM, ANY, 0},
    {"open_tree", EPERM, ANY, 0},
    {"move_mount", EPERM, ANY, 0},
    {"fsopen", EPERM, ANY, 0},
    {"fsconfig", EPERM, ANY, 0},
    {"fsmount", EPERM, ANY, 0},
    {"fspick", EPERM, ANY, 0},
    {"mount_setattr", EPERM, ANY, 0},
    {"chroot", EPERM, ANY, 0},
    /* kernel facilities that are not namespaced */
    {"add_key", EPERM, ANY, 0},
    {"request_key", EPERM, ANY, 0},
    {"keyctl", EPERM, ANY, 0},
    {"bpf", EPERM, ANY, 0},
    {"perf_event_open", EPERM, ANY, 0},
    {"kexec_load", EPERM, ANY, 0},
    {"kexec_file_load", EPERM, ANY, 0},
    {"init_module", EPERM, ANY, 0},
    {"finit_module", EPERM, ANY, 0},
    {"delete_module", EPERM, ANY, 0},
    {"clock_settime", EPERM, ANY, 0},
    {"clock_adjtime", EPERM, ANY, 0},
    {"settimeofday", EPERM, ANY, 0},
    {"adjtimex", EPERM, ANY, 0},
    {"reboot", EPERM, ANY, 0},
    {"swapon", EPERM, ANY, 0},
    {"swapoff", EPERM, ANY, 0},
    {"open_by_handle_at", EPERM, ANY, 0},
    {"name_to_handle_at", EPERM, ANY, 0},
    {"userfaultfd", EPERM, ANY, 0},
    {"io_uring_setup", EPERM, ANY, 0},
    {"io_uring_enter", EPERM, ANY, 0},
    {"io_uring_register", EPERM, ANY, 0},
    {"acct", EPERM, ANY, 0},
    {"quotactl", EPERM, ANY, 0},
    {"syslog", EPERM, ANY, 0},
    {"vhangup", EPERM, ANY, 0},
    {"iopl", EPERM, ANY, 0},
    {"ioperm", EPERM, ANY, 0},
    {"lookup_dcookie", EPERM, ANY, 0},
    {"fanotify_init", EPERM, ANY, 0},
    /* terminal injection */
    {"ioctl", EPERM, ARG1_EQ, TIOCSTI},
    {"ioctl", EPERM, ARG1_EQ, TIOCLINUX},
    /* socket families are an allowlist (socket_families below): vsock, and
     * the other families that ignore network namespaces, are refused */
    {"socket", EAFNOSUPPORT, ARG0_NOT_IN_FAMILIES, 0},
    {"socketpair", EAFNOSUPPORT, ARG0_NOT_IN_FAMILIES, 0},
    /* netlink: only NETLINK_ROUTE (ip, ss, getaddrinfo's interface query) */
    {"socket", EAFNOSUPPORT, ARG0_NETLINK_NOT_ROUTE, 0},
};

/* The socket families a sandbox may create. */
static const int socket_families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};

static struct sock_fprog prog;

size_t sbx_seccomp_rule_count(void) { return SBX_ARRAY_SIZE(rules); }

int sbx_seccomp_compile(void) {
  if (prog.filter) return 0;
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return -ENOMEM;
  int r = 0;
  /* other architectures (i386, x32) are not added: their syscalls hit the
   * bad-arch action, which kills */
  seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  for (size_t i = 0; i < SBX_ARRAY_SIZE(rules) && r == 0; i++) {
    const struct rule *ru = &rules[i];
    int nr = seccomp_syscall_resolve_name(ru->syscall);
    if (nr == __NR_SCMP_ERROR) continue; /* not on this architecture */
    switch (ru->cond) {
    case ANY: r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 0); break;
    case ARG0_HAS_FLAG:
      r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, ru->value, ru->value));
      break;
    case ARG1_EQ:
      r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffULL, ru->value));
      break;
    case ARG0_NOT_IN_FAMILIES: {
      /* every family below AF_MAX but the allowed ones, then all above */
      for (int fam = 0; fam < AF_MAX && r == 0; fam++) {
        bool ok = false;
        for (size_t k = 0; k < SBX_ARRAY_SIZE(socket_families); k++) ok |= socket_families[k] == fam;
        if (!ok)
          r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 1, SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffULL, fam));
      }
      if (r == 0) r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 1, SCMP_A0(SCMP_CMP_GE, AF_MAX));
      break;
    }
    case ARG0_NETLINK_NOT_ROUTE:
      r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ru->err), nr, 2, SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffULL, AF_NETLINK),
                           SCMP_A2(SCMP_CMP_NE, NETLINK_ROUTE));
      break;
    }
  }
  if (r == 0) {
    _cleanup_close_ int fd = memfd_create("sbx-seccomp", MFD_CLOEXEC);
    if (fd < 0) r = -errno;
    else if ((r = seccomp_export_bpf(ctx, fd)) == 0) {
      off_t len = lseek(fd, 0, SEEK_END);
      struct sock_filter *f = malloc(len);
      if (!f || pread(fd, f, len, 0) != len) {
        free(f);
        r = -EIO;
      } else {
        prog.filter = f;
        prog.len = len / sizeof *f;
      }
    }
  }
  seccomp_release(ctx);
  return r;
}

int sbx_seccomp_install(void) {
  if (!prog.filter) return -EINVAL;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -errno;
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) return -errno;
  return 0;
}
