/*
 * filewrite.c - see filewrite.h.
 */
#define _GNU_SOURCE
#include "filewrite.h"
#include "nstime.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static int write_all(int fd, const uint8_t *data, uint64_t len, uint64_t at)
{
    while (len > 0) {
        /* at most 1 GiB a call: pwrite() may write less than asked anyway */
        size_t want = len > (1u << 30) ? (size_t)1u << 30 : (size_t)len;
        ssize_t n = pwrite(fd, data, want, (off_t)at);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            return EIO;
        }
        data += n;
        len -= (uint64_t)n;
        at += (uint64_t)n;
    }
    return 0;
}

static int fail(struct fw_file *f, int fd, enum fw_step step, int err)
{
    f->step = step;
    if (fd >= 0) {
        close(fd);
        unlinkat(f->dirfd, f->name, 0);
    }
    return err;
}

int fw_write(struct fw_file *f)
{
    f->step = FW_OK;
    f->has_xattrs = 0;
    int fd;
    do {
        fd = openat(f->dirfd, f->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    (mode_t)f->create_mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return fail(f, -1, FW_OPEN, errno);
    }
    uint64_t size = 0;
    int holes = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        size += f->pieces[i].len;
        holes |= f->pieces[i].data == NULL;
    }
    if (size >= FW_FALLOC_MIN && !holes) {
        /* one extent up front; a file system without fallocate simply grows the file */
        (void)fallocate(fd, 0, 0, (off_t)size);
    }
    uint64_t at = 0, end = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        const struct fw_piece *p = &f->pieces[i];
        if (p->data != NULL) { /* a hole is never written: the file stays sparse */
            int err = write_all(fd, p->data, p->len, at);
            if (err) {
                return fail(f, fd, FW_WRITE, err);
            }
            end = at + p->len;
        }
        at += p->len;
    }
    if (end != size && ftruncate(fd, (off_t)size) != 0) {
        return fail(f, fd, FW_TRUNCATE, errno);
    }
    if (f->chown && fchown(fd, (uid_t)f->uid, (gid_t)f->gid) != 0) {
        return fail(f, fd, FW_CHOWN, errno);
    }
    if (f->check_xattrs) {
        ssize_t xl = flistxattr(fd, NULL, 0);
        if (xl < 0 && errno != ENOTSUP) {
            return fail(f, fd, FW_LISTXATTR, errno);
        }
        f->has_xattrs = xl > 0;
    }
    if (f->chmod && fchmod(fd, (mode_t)f->mode) != 0) {
        return fail(f, fd, FW_CHMOD, errno);
    }
    struct timespec ts[2] = {nstime_split(f->mtime_ns), nstime_split(f->mtime_ns)};
    if (futimens(fd, ts) != 0) {
        return fail(f, fd, FW_UTIME, errno);
    }
    if (close(fd) != 0 && errno != EINTR) {
        fd = -1;
        f->step = FW_CLOSE;
        int err = errno;
        unlinkat(f->dirfd, f->name, 0);
        return err;
    }
    return 0;
}
