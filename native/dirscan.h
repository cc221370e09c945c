/*
 * dirscan.h - one directory's children and their stat signatures, for the files cache.
 *
 * Plain C, no Python. See dirscan.c and sprite_env/snapshot/dircache.py (the blob format).
 */
#ifndef SPRITE_DIRSCAN_H
#define SPRITE_DIRSCAN_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>

struct dirscan {
    uint8_t *blob;        /* signature rows, sorted by name (dircache.py's format) */
    size_t blob_len;
    uint8_t *subdirs;     /* subdirectory names, each as u16 length + bytes, sorted */
    size_t subdirs_len;
    uint64_t files, bytes, symlinks, specials;
    int irregular;        /* a socket, a mount point, a hard link or a racy child: slow path */
};

/* Lists the directory open at dirfd, stats every child without following symlinks and
 * fills *out. Signatures of children whose mtime or ctime is at or after now_ns - racy_ns
 * are poisoned exactly as dircache.sig_of does. Returns 0, or -errno. The caller frees
 * out->blob and out->subdirs with free() (also after an error). */
int dirscan(int dirfd, int64_t now_ns, int64_t racy_ns, uint64_t root_dev, struct dirscan *out);

/* dirscan() in steps, so that a binding can list a directory before it decides whether
 * the rest is worth releasing the GIL for (see native_scan_dir in _native.c). */
struct dirscan_name {
    char *s;
    size_t len;
};

struct dirscan_list {
    struct dirscan_name *names; /* in listing order until dirscan_stat() sorts them */
    size_t count, cap;
    int eof; /* every name is in */
    DIR *dir;
};

/* Opens the directory at dirfd for listing (a description of its own). Returns 0 or
 * -errno; after 0 the caller frees with dirscan_list_free(). */
int dirscan_open(int dirfd, struct dirscan_list *l);
/* Lists names until the end or until at least `upto` are in. Returns 0 or -errno. */
int dirscan_read(struct dirscan_list *l, size_t upto);
/* Lists the rest, sorts, stats every child and fills *out as dirscan() does. */
int dirscan_stat(int dirfd, struct dirscan_list *l, int64_t now_ns, int64_t racy_ns,
                 uint64_t root_dev, struct dirscan *out);
void dirscan_list_free(struct dirscan_list *l);

#endif
