#define _GNU_SOURCE
#include "passthrough.h"

#include <errno.h>
#include <linux/fuse.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

/* From the kernel's protocol 7.40, which Debian 12's headers predate. */
#define SBX_FUSE_PASSTHROUGH_FLAG2 (1u << (37 - 32))
#define SBX_FOPEN_PASSTHROUGH (1u << 7)
struct sbx_fuse_backing_map {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
#define SBX_FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct sbx_fuse_backing_map)
#define SBX_FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
/* fuse_init_out's first unused word became max_stack_depth; a backing file
 * (the sandbox's ext4) stacks one level under the view */
#define MAX_STACK_DEPTH 1

static struct {
  int fd;
  atomic_bool offered; /* the kernel's INIT said it can */
  atomic_bool killpriv_v2;
  atomic_bool on;
  _Atomic uint64_t init_unique;
} pt = {.fd = -1};

/* The backing id for the open or create reply this thread is sending. */
static __thread int reply_backing;

static ssize_t pt_read(int fd, void *buf, size_t len, void *ud) {
  (void)ud;
  ssize_t n = read(fd, buf, len);
  if (n >= (ssize_t)(sizeof(struct fuse_in_header) + sizeof(struct fuse_init_in)) &&
      atomic_load(&pt.init_unique) == 0) {
    const struct fuse_in_header *h = buf;
    const struct fuse_init_in *in = (const void *)(h + 1);
    if (h->opcode == FUSE_INIT) {
      atomic_store(&pt.offered, (in->flags & FUSE_INIT_EXT) && (in->flags2 & SBX_FUSE_PASSTHROUGH_FLAG2));
      atomic_store(&pt.killpriv_v2, in->flags & FUSE_HANDLE_KILLPRIV_V2);
      atomic_store(&pt.init_unique, h->unique);
    }
  }
  return n;
}

static ssize_t pt_writev(int fd, struct iovec *iov, int count, void *ud) {
  (void)ud;
  const struct fuse_out_header *h = iov[0].iov_base;
  if (count == 2 && h->error == 0) {
    if (reply_backing > 0 &&
        (iov[1].iov_len == sizeof(struct fuse_open_out) ||
         iov[1].iov_len == sizeof(struct fuse_entry_out) + sizeof(struct fuse_open_out))) {
      struct fuse_open_out *o =
          (void *)((char *)iov[1].iov_base + iov[1].iov_len - sizeof(struct fuse_open_out));
      o->open_flags |= SBX_FOPEN_PASSTHROUGH;
      o->padding = (uint32_t)reply_backing; /* backing_id */
    } else if (h->unique && h->unique == atomic_load(&pt.init_unique) && atomic_load(&pt.offered) &&
               iov[1].iov_len >= sizeof(struct fuse_init_out)) {
      struct fuse_init_out *o = iov[1].iov_base;
      /* the kernel refuses passthrough beside the writeback cache */
      if ((o->flags & FUSE_INIT_EXT) && !(o->flags & FUSE_WRITEBACK_CACHE)) {
        o->flags2 |= SBX_FUSE_PASSTHROUGH_FLAG2;
        o->unused[0] = MAX_STACK_DEPTH;
        /* A passthrough write first asks whether the file has set-id bits
         * or file capabilities to drop: a getxattr round trip per write,
         * unless the kernel may remember the answer (SB_NOSEC), which it
         * does once the server says it drops them itself. The view's
         * server does: it writes, truncates and chowns as the sandbox's
         * root without CAP_FSETID, so the sandbox's filesystem drops them,
         * as it does for the kernel's passthrough writes. */
        if (atomic_load(&pt.killpriv_v2)) o->flags |= FUSE_HANDLE_KILLPRIV_V2;
        atomic_store(&pt.on, true);
      }
    }
  }
  return writev(fd, iov, count);
}

int sbx_passthrough_attach(struct fuse_session *se) {
  static const struct fuse_custom_io io = {.read = pt_read, .writev = pt_writev};
  int fd = fuse_session_fd(se);
  if (fd < 0) return -EBADF;
  int r = fuse_session_custom_io(se, &io, fd);
  if (r < 0) return r;
  pt.fd = fd;
  return 0;
}

bool sbx_passthrough_on(void) { return atomic_load(&pt.on); }

int sbx_passthrough_open(int fd) {
  if (!sbx_passthrough_on()) return -EOPNOTSUPP;
  struct sbx_fuse_backing_map map = {.fd = fd};
  int id = ioctl(pt.fd, SBX_FUSE_DEV_IOC_BACKING_OPEN, &map);
  return id > 0 ? id : id == 0 ? -EIO : -errno;
}

void sbx_passthrough_close(int backing_id) {
  uint32_t id = (uint32_t)backing_id;
  if (backing_id > 0) ioctl(pt.fd, SBX_FUSE_DEV_IOC_BACKING_CLOSE, &id);
}

int sbx_passthrough_reply_open(fuse_req_t req, const struct fuse_file_info *fi, int backing_id) {
  reply_backing = backing_id;
  int r = fuse_reply_open(req, fi);
  reply_backing = 0;
  return r;
}

int sbx_passthrough_reply_create(fuse_req_t req, const struct fuse_entry_param *e, const struct fuse_file_info *fi,
                                 int backing_id) {
  reply_backing = backing_id;
  int r = fuse_reply_create(req, e, fi);
  reply_backing = 0;
  return r;
}
