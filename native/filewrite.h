/*
 * filewrite.h - new files written whole in one call: a restore into an empty directory.
 *
 * Plain C11 and POSIX, no Python. A full restore (an export) of the medium layer creates
 * ~110k files, 98% of them one piece; in Python each was ~10 calls (open, write, truncate,
 * chown, listxattr, chmod, utime, close, rename), each taking and dropping the GIL, and
 * its writer threads spent more time waiting for the GIL than in the kernel.
 * fw_write() does one file's system calls with no interpreter in between; the binding
 * (filewrite_py.c) runs a batch of them with the GIL released.
 *
 * A file is created with O_CREAT | O_EXCL | O_NOFOLLOW in a directory descriptor (never
 * through a path, never over an existing name or a symlink), preallocated when it is big
 * and has no hole, its data pieces written at their offsets (holes are never written:
 * the file stays sparse), its size set, then owner, mode and times in the order that
 * keeps each (chown clears setuid/setgid, so the mode comes after it; the times last).
 * Extended attributes are the caller's: fw_write() only reports whether the new file has
 * any (an inherited default ACL, say), so that the caller can make them exact.
 *
 * Steps the caller knows to be no-ops are skipped (a file of the medium bench layer took
 * 7 system calls; 4 when the export's owner and mode need no change): no fchown when the
 * new file already has its owner (it is created by uid:gid, in no setgid directory), no
 * fchmod when it was created with its mode (plain permission bits the umask keeps; the
 * directories above are 0700 until the restore ends, so the mode in between shows no
 * one), no flistxattr when no directory it is made in can hand down any.
 */
#ifndef SPRITE_ENV_FILEWRITE_H
#define SPRITE_ENV_FILEWRITE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Files at least this big, with no hole, are preallocated (one extent, no growth). */
#define FW_FALLOC_MIN (1u << 20)

/* The step at which fw_write() failed (for the caller's message). */
enum fw_step {
    FW_OK = 0,
    FW_OPEN,
    FW_WRITE,
    FW_TRUNCATE,
    FW_CHOWN,
    FW_LISTXATTR,
    FW_CHMOD,
    FW_UTIME,
    FW_CLOSE,
};

struct fw_piece {
    const uint8_t *data; /* NULL: a hole */
    uint64_t len;
};

struct fw_file {
    int dirfd;                     /* in: the directory the file is created in */
    const char *name;              /* in: one name (no slash), NUL-terminated */
    uint32_t mode;                 /* in: permission bits (st_mode & 07777) */
    uint32_t uid, gid;             /* in */
    int64_t mtime_ns;              /* in: also the atime */
    uint32_t create_mode;          /* in: the mode it is created with (0600, or `mode`) */
    int chmod;                     /* in: set `mode` after the owner */
    int chown;                     /* in: set uid:gid (else it has them on creation) */
    int check_xattrs;              /* in: look for inherited extended attributes */
    const struct fw_piece *pieces; /* in: in file order, contiguous from offset 0 */
    size_t npieces;                /* in */
    int has_xattrs;                /* out: the new file has extended attributes */
    enum fw_step step;             /* out: where it failed (FW_OK: it did not) */
};

/*
 * Creates and writes one file; see the header comment. Returns 0, or the errno of the
 * first step that failed (f->step says which); a file that failed after its creation is
 * unlinked again. Retries EINTR and short writes.
 */
int fw_write(struct fw_file *f);

#ifdef __cplusplus
}
#endif

#endif
