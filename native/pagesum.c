/*
 * pagesum.c - keyed digests of a file's pages (see pagesum.h).
 *
 * A whole page is four BLAKE3 chunks of 1 KiB, so its keyed hash is the root of a
 * two-level tree: four chunk chaining values (counters 0-3), two parents, one root parent.
 * pagesum_buf() builds those trees for up to BATCH pages at once with blake3_hash_many(),
 * which runs as many inputs side by side as the CPU's SIMD width allows (16 with AVX-512):
 * the same bytes the public API computes one page at a time (tests check it).
 */
#define _GNU_SOURCE
#include "pagesum.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's inline helpers */
#include "blake3/blake3.h"
#include "blake3/blake3_impl.h"
#pragma GCC diagnostic pop

#define CHUNKS_PER_PAGE (PAGESUM_PAGE / BLAKE3_CHUNK_LEN) /* 4 */
/* Pages hashed per batch: a multiple of every SIMD degree (16 at most). */
#define BATCH 32u
/* Bytes read per pread: 256 KiB stays in L2 between the read and the hash. */
#define READ_BLOCK (256u * 1024u)
/* Below this many bytes one thread does it all (a thread costs ~50 us to start). */
#define THREAD_MIN_BYTES (8u << 20)
#define MAX_THREADS 8u

_Static_assert(PAGESUM_PAGE == 4u * BLAKE3_CHUNK_LEN, "a page is four chunks");
_Static_assert(PAGESUM_LEN <= BLAKE3_OUT_LEN, "a digest is a prefix of BLAKE3's");

uint64_t pagesum_windows(uint64_t start, uint64_t len)
{
    if (len == 0) {
        return 0;
    }
    return (start + len - 1) / PAGESUM_PAGE - start / PAGESUM_PAGE + 1;
}

void pagesum_ref(const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *buf, size_t len,
                 uint8_t out[PAGESUM_LEN])
{
    blake3_hasher h;
    blake3_hasher_init_keyed(&h, key);
    blake3_hasher_update(&h, buf, len);
    blake3_hasher_finalize(&h, out, PAGESUM_LEN);
}

/* The digests of `n` (<= BATCH) whole pages, page k at pages[k], its digest to outs[k]. */
static void hash_pages(const uint32_t kw[8], const uint8_t *const *pages, size_t n,
                       uint8_t *const *outs)
{
    const uint8_t *inputs[BATCH * 2];
    uint8_t cvs[CHUNKS_PER_PAGE][BATCH][BLAKE3_OUT_LEN];
    uint8_t blocks[BATCH * 2][BLAKE3_BLOCK_LEN];
    uint8_t parents[BATCH * 2][BLAKE3_OUT_LEN];
    uint8_t roots[BATCH][BLAKE3_OUT_LEN];
    /* chunk j of every page at once: its counter is j (each page is a hash of its own) */
    for (unsigned j = 0; j < CHUNKS_PER_PAGE; j++) {
        for (size_t k = 0; k < n; k++) {
            inputs[k] = pages[k] + j * BLAKE3_CHUNK_LEN;
        }
        blake3_hash_many(inputs, n, BLAKE3_CHUNK_LEN / BLAKE3_BLOCK_LEN, kw, j, false,
                         KEYED_HASH, CHUNK_START, CHUNK_END, &cvs[j][0][0]);
    }
    for (size_t k = 0; k < n; k++) {
        for (unsigned h = 0; h < 2; h++) {
            memcpy(blocks[2 * k + h], cvs[2 * h][k], BLAKE3_OUT_LEN);
            memcpy(blocks[2 * k + h] + BLAKE3_OUT_LEN, cvs[2 * h + 1][k], BLAKE3_OUT_LEN);
            inputs[2 * k + h] = blocks[2 * k + h];
        }
    }
    blake3_hash_many(inputs, 2 * n, 1, kw, 0, false, KEYED_HASH | PARENT, 0, 0,
                     &parents[0][0]);
    for (size_t k = 0; k < n; k++) {
        memcpy(blocks[k], parents[2 * k], BLAKE3_OUT_LEN);
        memcpy(blocks[k] + BLAKE3_OUT_LEN, parents[2 * k + 1], BLAKE3_OUT_LEN);
        inputs[k] = blocks[k];
    }
    blake3_hash_many(inputs, n, 1, kw, 0, false, KEYED_HASH | PARENT | ROOT, 0, 0, &roots[0][0]);
    for (size_t k = 0; k < n; k++) {
        memcpy(outs[k], roots[k], PAGESUM_LEN);
    }
}

void pagesum_buf(const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *buf, size_t len,
                 uint64_t start, uint8_t *out)
{
    uint32_t kw[8];
    load_key_words(key, kw);
    const uint8_t *pages[BATCH];
    uint8_t *outs[BATCH];
    size_t pos = 0;
    while (pos < len) {
        uint64_t at = start + pos;
        size_t left = len - pos;
        if (at % PAGESUM_PAGE == 0 && left >= PAGESUM_PAGE) {
            size_t n = left / PAGESUM_PAGE;
            n = n < BATCH ? n : BATCH;
            for (size_t k = 0; k < n; k++) {
                pages[k] = buf + pos + k * PAGESUM_PAGE;
                outs[k] = out + k * PAGESUM_LEN;
            }
            hash_pages(kw, pages, n, outs);
            out += n * PAGESUM_LEN;
            pos += n * PAGESUM_PAGE;
            continue;
        }
        /* a window that starts or ends inside a page */
        size_t w = (size_t)(PAGESUM_PAGE - at % PAGESUM_PAGE);
        w = w < left ? w : left;
        pagesum_ref(key, buf + pos, w, out);
        out += PAGESUM_LEN;
        pos += w;
    }
}

/* One thread's share: windows [first, end) of the concatenated ranges. */
struct job {
    int fd;
    const struct pagesum_range *ranges;
    const uint64_t *first_window; /* per range, its first window's index */
    size_t count;
    const uint8_t *key;
    const uint8_t *expected; /* NULL: no comparison */
    uint64_t first, end;
    uint8_t *out;
    struct pagesum_diff diff; /* this share's changed windows */
    size_t cap_changes, cap_bytes;
    int err;
};

/* The file offset where window `j` of range `r` starts. */
static uint64_t window_start(const struct pagesum_range *r, uint64_t j)
{
    return j == 0 ? r->start : (r->start / PAGESUM_PAGE + j) * PAGESUM_PAGE;
}

static int read_full(int fd, uint8_t *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, buf + got, len - got, (off_t)(off + got));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            return ENODATA;
        }
        got += (size_t)n;
    }
    return 0;
}

/* Records a changed window and copies its bytes; ENOMEM or 0. */
static int note_change(struct job *jb, uint64_t window, uint64_t range, uint64_t start,
                       const uint8_t *bytes, size_t len)
{
    struct pagesum_diff *d = &jb->diff;
    if (d->count == jb->cap_changes) {
        size_t cap = jb->cap_changes ? jb->cap_changes * 2 : 256;
        void *p = realloc(d->changes, cap * sizeof *d->changes);
        if (p == NULL) {
            return ENOMEM;
        }
        d->changes = p;
        jb->cap_changes = cap;
    }
    if (d->bytes_len + len > jb->cap_bytes) {
        size_t cap = jb->cap_bytes ? jb->cap_bytes * 2 : 1u << 20;
        while (cap < d->bytes_len + len) {
            cap *= 2;
        }
        void *p = realloc(d->bytes, cap);
        if (p == NULL) {
            return ENOMEM;
        }
        d->bytes = p;
        jb->cap_bytes = cap;
    }
    d->changes[d->count++] = (struct pagesum_change){window, range, start, len, d->bytes_len};
    memcpy(d->bytes + d->bytes_len, bytes, len);
    d->bytes_len += len;
    return 0;
}

/* Whole pages waiting to be hashed together (a piece of a database's chunk list is a few
 * pages: batching across pieces keeps all SIMD lanes busy, 2.5x faster than per piece). */
struct batch {
    size_t n;
    const uint8_t *pages[BATCH];
    uint64_t window[BATCH], range[BATCH], start[BATCH];
};

/* Compares window w's new digest with the expected one; a changed window is noted with a
 * copy of its bytes. ENOMEM or 0. */
static int check_window(struct job *jb, uint64_t w, uint64_t r, uint64_t ws,
                        const uint8_t *bytes, size_t len)
{
    if (jb->expected == NULL ||
        memcmp(jb->out + w * PAGESUM_LEN, jb->expected + w * PAGESUM_LEN, PAGESUM_LEN) == 0) {
        return 0;
    }
    return note_change(jb, w, r, ws, bytes, len);
}

static int flush(struct job *jb, const uint32_t kw[8], struct batch *b)
{
    uint8_t *outs[BATCH];
    for (size_t k = 0; k < b->n; k++) {
        outs[k] = jb->out + b->window[k] * PAGESUM_LEN;
    }
    hash_pages(kw, b->pages, b->n, outs);
    int rc = 0;
    for (size_t k = 0; k < b->n && rc == 0; k++) {
        rc = check_window(jb, b->window[k], b->range[k], b->start[k], b->pages[k],
                          PAGESUM_PAGE);
    }
    b->n = 0;
    return rc;
}

/* Where the bytes after range r stop being contiguous, reading at most `limit` bytes
 * from `from` and never past byte `stop`. */
static uint64_t read_end(const struct job *jb, size_t r, uint64_t from, uint64_t stop)
{
    uint64_t limit = from + READ_BLOCK;
    uint64_t end = jb->ranges[r].start + jb->ranges[r].len;
    while (end < limit && r + 1 < jb->count && jb->ranges[r + 1].start == end) {
        r++;
        end += jb->ranges[r].len;
    }
    end = end < stop ? end : stop;
    if (end > limit) { /* cut on a page boundary: no window straddles two reads */
        end = limit / PAGESUM_PAGE * PAGESUM_PAGE;
    }
    return end;
}

static void *run_job(void *arg)
{
    struct job *jb = arg;
    uint8_t *buf = malloc(READ_BLOCK);
    struct batch *b = malloc(sizeof *b);
    uint32_t kw[8];
    load_key_words(jb->key, kw);
    if (buf == NULL || b == NULL) {
        jb->err = ENOMEM;
        goto out;
    }
    b->n = 0;
    /* the range holding window `first`: the last whose first window is <= it */
    size_t lo = 0, hi = jb->count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (jb->first_window[mid] <= jb->first) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    /* the byte where this share ends: the end of its last window */
    uint64_t stop = 0;
    if (jb->end > jb->first) {
        size_t r = lo;
        while (r + 1 < jb->count && jb->first_window[r + 1] < jb->end) {
            r++;
        }
        const struct pagesum_range *rg = &jb->ranges[r];
        uint64_t j = jb->end - jb->first_window[r];
        uint64_t nw = pagesum_windows(rg->start, rg->len);
        stop = j >= nw ? rg->start + rg->len : window_start(rg, j);
    }
    uint64_t bstart = 0, bend = 0; /* the file bytes in buf */
    uint64_t w = jb->first;
    for (size_t r = lo; r < jb->count && w < jb->end && jb->err == 0; r++) {
        const struct pagesum_range *rg = &jb->ranges[r];
        uint64_t nw = pagesum_windows(rg->start, rg->len);
        uint64_t end = rg->start + rg->len;
        for (uint64_t j = w - jb->first_window[r]; j < nw && w < jb->end; j++, w++) {
            uint64_t ws = window_start(rg, j);
            uint64_t we = (ws / PAGESUM_PAGE + 1) * PAGESUM_PAGE;
            we = we < end ? we : end;
            int rc = 0;
            if (ws < bstart || we > bend) {
                if (b->n > 0) {
                    rc = flush(jb, kw, b); /* its pages point into buf */
                }
                bstart = ws;
                bend = read_end(jb, r, ws, stop);
                if (rc == 0) {
                    rc = read_full(jb->fd, buf, (size_t)(bend - bstart), bstart);
                }
            }
            const uint8_t *p = buf + (ws - bstart);
            size_t len = (size_t)(we - ws);
            if (rc == 0 && len == PAGESUM_PAGE) {
                b->pages[b->n] = p;
                b->window[b->n] = w;
                b->range[b->n] = r;
                b->start[b->n] = ws;
                if (++b->n == BATCH) {
                    rc = flush(jb, kw, b);
                }
            } else if (rc == 0) { /* a window that starts or ends inside a page */
                pagesum_ref(jb->key, p, len, jb->out + w * PAGESUM_LEN);
                rc = check_window(jb, w, r, ws, p, len);
            }
            if (rc != 0) {
                jb->err = rc;
                break;
            }
        }
    }
    if (jb->err == 0 && b->n > 0) {
        jb->err = flush(jb, kw, b);
    }
out:
    free(buf);
    free(b);
    return NULL;
}

static int by_window(const void *pa, const void *pb)
{
    const struct pagesum_change *a = pa, *b = pb;
    return (a->window > b->window) - (a->window < b->window);
}

void pagesum_diff_free(struct pagesum_diff *diff)
{
    free(diff->changes);
    free(diff->bytes);
    *diff = (struct pagesum_diff){NULL, 0, NULL, 0};
}

/* Appends `part` to `into` (both in window order), emptying it; ENOMEM or 0. */
static int join_diff(struct pagesum_diff *into, struct pagesum_diff *part)
{
    if (part->count == 0) {
        return 0;
    }
    if (into->count == 0) { /* the first part with changes: taken, not copied */
        pagesum_diff_free(into);
        *into = *part;
        *part = (struct pagesum_diff){NULL, 0, NULL, 0};
        return 0;
    }
    void *c = realloc(into->changes, (into->count + part->count) * sizeof *into->changes);
    if (c == NULL) {
        return ENOMEM;
    }
    into->changes = c;
    void *b = realloc(into->bytes, into->bytes_len + part->bytes_len + 1);
    if (b == NULL) {
        return ENOMEM;
    }
    into->bytes = b;
    memcpy(into->changes + into->count, part->changes, part->count * sizeof *part->changes);
    for (size_t i = 0; i < part->count; i++) {
        into->changes[into->count + i].offset += into->bytes_len;
    }
    memcpy(into->bytes + into->bytes_len, part->bytes, part->bytes_len);
    into->count += part->count;
    into->bytes_len += part->bytes_len;
    return 0;
}

int pagesum_fd_diff(int fd, const struct pagesum_range *ranges, size_t count,
                    const uint8_t key[PAGESUM_KEY_LEN], const uint8_t *expected,
                    unsigned threads, uint8_t *out, struct pagesum_diff *diff)
{
    *diff = (struct pagesum_diff){NULL, 0, NULL, 0};
    uint64_t *first = malloc((count + 1) * sizeof *first);
    if (first == NULL) {
        return ENOMEM;
    }
    uint64_t total = 0, bytes = 0;
    for (size_t i = 0; i < count; i++) {
        first[i] = total;
        total += pagesum_windows(ranges[i].start, ranges[i].len);
        bytes += ranges[i].len;
    }
    first[count] = total;
    if (threads > MAX_THREADS) {
        threads = MAX_THREADS;
    }
    if (threads < 1 || bytes < THREAD_MIN_BYTES) {
        threads = 1;
    }
    struct job jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (unsigned t = 0; t < threads; t++) {
        jobs[t] = (struct job){.fd = fd,
                               .ranges = ranges,
                               .first_window = first,
                               .count = count,
                               .key = key,
                               .expected = expected,
                               .first = total * t / threads,
                               .end = total * (t + 1) / threads,
                               .out = out};
    }
    /* this thread does the first share; the others run beside it */
    for (unsigned t = 1; t < threads; t++) {
        started[t] = pthread_create(&tids[t], NULL, run_job, &jobs[t]) == 0;
        if (!started[t]) {
            run_job(&jobs[t]); /* no thread to be had: do it here */
        }
    }
    run_job(&jobs[0]);
    int err = jobs[0].err;
    for (unsigned t = 1; t < threads; t++) {
        if (started[t]) {
            pthread_join(tids[t], NULL);
        }
        if (err == 0) {
            err = jobs[t].err;
        }
    }
    for (unsigned t = 0; t < threads; t++) {
        if (err == 0) {
            err = join_diff(diff, &jobs[t].diff);
        }
        pagesum_diff_free(&jobs[t].diff);
    }
    free(first);
    if (err != 0) {
        pagesum_diff_free(diff);
    } else if (diff->count > 1) {
        /* a share notes a partial window before the whole pages batched ahead of it */
        qsort(diff->changes, diff->count, sizeof *diff->changes, by_window);
    }
    return err;
}

int pagesum_fd(int fd, const struct pagesum_range *ranges, size_t count,
               const uint8_t key[PAGESUM_KEY_LEN], unsigned threads, uint8_t *out)
{
    struct pagesum_diff none;
    int rc = pagesum_fd_diff(fd, ranges, count, key, NULL, threads, out, &none);
    pagesum_diff_free(&none);
    return rc;
}
