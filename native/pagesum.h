/*
 * pagesum.h - keyed digests of a file's pages, to find what changed in place.
 *
 * Plain C11 with POSIX threads and pread, no Python. A range of a file is cut into
 * windows at every multiple of PAGESUM_PAGE (file offsets): a window is a whole page, or
 * the part of one that the range covers where it starts or ends inside a page. The
 * digest of a window is BLAKE3 in keyed mode (the key is 32 random bytes kept with the
 * digests) of the window's bytes, truncated to PAGESUM_LEN bytes; sprite_env/snapshot/
 * pagesums.py says why that is safe and what the digests are for.
 *
 * Whole pages are hashed sixteen or more at a time with BLAKE3's own many-input kernel
 * (blake3_hash_many, SIMD across pages: 5 GB/s on one AVX-512 core, where one call of the
 * public API per page makes 1.7 GB/s); pagesum_ref() is the scalar reference, one window
 * through the public API, and the test suite checks both against the Python blake3.
 */
#ifndef SPRITE_ENV_PAGESUM_H
#define SPRITE_ENV_PAGESUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PAGESUM_PAGE 4096u
#define PAGESUM_LEN 16u
#define PAGESUM_KEY_LEN 32u

/* A range of a file to digest: bytes [start, start + len). */
struct pagesum_range {
    uint64_t start;
    uint64_t len;
};

/* The number of windows of [start, start + len) (0 if len is 0). */
uint64_t pagesum_windows(uint64_t start, uint64_t len);

/* One window's digest through BLAKE3's public API (the reference). */
void pagesum_ref(const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *buf, size_t len,
                 uint8_t out[PAGESUM_LEN]);

/* The digests of the windows of buf, which holds the file's bytes [start, start + len),
 * written to out (PAGESUM_LEN bytes per window, pagesum_windows(start, len) of them). */
void pagesum_buf(const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *buf, size_t len,
                 uint64_t start, uint8_t *out);

/* Reads the ranges from fd with pread and writes their windows' digests to out, range
 * after range, on up to `threads` threads (one below 8 MiB). Returns 0; ENODATA if the
 * file ended before a range did (it shrank); ENOMEM; or the errno of a failed read. */
int pagesum_fd(int fd, const struct pagesum_range *ranges, size_t count,
               const uint8_t key[PAGESUM_KEY_LEN], unsigned threads, uint8_t *out);

/* A window whose digest differs from the expected one (pagesum_fd_diff). */
struct pagesum_change {
    uint64_t window; /* its index among the windows of all ranges */
    uint64_t range;  /* the range it is in */
    uint64_t start;  /* its file offset */
    uint64_t len;
    uint64_t offset; /* where its bytes are in pagesum_diff.bytes */
};

/* The changed windows, in window order, and their bytes (as read and hashed). */
struct pagesum_diff {
    struct pagesum_change *changes;
    size_t count;
    uint8_t *bytes;
    size_t bytes_len;
};

/* pagesum_fd(), and for every window whose digest differs from `expected`'s (as many
 * digests as out gets), a record in `diff` with a copy of the bytes it was hashed from:
 * the caller stores those very bytes, so what it keeps and what the digests describe
 * cannot differ even if the file changes meanwhile. Free `diff` with
 * pagesum_diff_free() whatever the result. */
int pagesum_fd_diff(int fd, const struct pagesum_range *ranges, size_t count,
                    const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *expected,
                    unsigned threads, uint8_t *out, struct pagesum_diff *diff);

void pagesum_diff_free(struct pagesum_diff *diff);

#ifdef __cplusplus
}
#endif

#endif
