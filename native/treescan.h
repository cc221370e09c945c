/*
 * treescan.h - a whole tree's directories compared with the files cache, on several threads.
 *
 * Plain C, no Python. See treescan.c (the walk) and sprite_env/snapshot/dircache.py (the
 * signature blob each directory is compared with).
 */
#ifndef SPRITE_TREESCAN_H
#define SPRITE_TREESCAN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* The files cache's signature blobs by directory path, as borrowed pointers: the caller keeps
 * the bytes alive and unchanged until treescan_cache_free(). */
struct treescan_cache;

struct treescan_cache *treescan_cache_new(size_t rows);
/* Adds one row (path relative to the root, "" the root). Returns 0, or -ENOMEM. */
int treescan_cache_put(struct treescan_cache *c, const char *path, size_t path_len,
                       const uint8_t *blob, size_t blob_len);
void treescan_cache_free(struct treescan_cache *c);

struct treescan_params {
    int64_t now_ns, racy_ns; /* as dirscan(): a child changed since now - racy is racy */
    uint64_t root_dev;       /* subdirectories on another device are mount points */
    const uint64_t *exclude_inodes; /* (st_dev, st_ino) pairs, n_exclude_inodes of them */
    size_t n_exclude_inodes;
    const char *const *patterns; /* fnmatch patterns over the relative path; see treescan.c */
    const size_t *pattern_lens;
    size_t n_patterns;
    const struct treescan_cache *cache;
    int threads;      /* walkers; at least 1 */
    int keep_listing; /* keep every directory's children with their stat (kids below) */
};

/* A child of a listed directory: its name (kid_names + name_off, name_len bytes, NUL after)
 * and its lstat. */
struct treescan_kid {
    size_t name_off, name_len;
    struct stat st;
};

struct treescan_dir {
    char *path; /* relative to the root, NUL-terminated; "" the root */
    size_t path_len;
    struct treescan_dir *parent;
    /* The subtree's counts, this directory included (as capture.Totals). */
    uint64_t files, dirs, symlinks, specials, bytes;
    int dirty; /* this directory's listing differs from its row, or cannot be vouched for */
    int clean; /* neither it nor anything below is dirty (set by treescan()) */
    /* With keep_listing: every child that was there to stat, sorted by name (excluded
     * ones, sockets, mount points and hard links too: the caller applies its own rules).
     * listed is 0 when the directory could not be listed or a child could not be stat'ed
     * for a reason other than vanishing: the caller lists it itself and meets the error. */
    int listed;
    struct treescan_kid *kids;
    size_t n_kids;
    char *kid_names;
    /* internal */
    const char *name; /* within path */
    int fd;
    size_t pending; /* children not yet opened; the fd is closed at 0 */
};

struct treescan_result {
    struct treescan_dir **dirs; /* every directory reached, each after its parent */
    size_t count;
};

/* Walks the tree below the directory open at root_fd (not followed out of: no symlinks, no
 * other file systems, nothing excluded) and fills *out. Returns 0, or -errno when the root
 * cannot be read or memory runs out; every other problem only makes a directory dirty. The
 * caller frees *out with treescan_free() (also after an error). */
int treescan(int root_fd, const struct treescan_params *p, struct treescan_result *out);
void treescan_free(struct treescan_result *r);

#endif
