/*
 * bulkread.c - many small files read, chunked and hashed in one call (see bulkread.h).
 *
 * The pool: threads made on first use (at most POOL_MAX, never more than asked for),
 * kept for the life of the process, blocked on a condition while there is no work.
 * bulk_start() queues a batch and wakes them; it returns at once, so the caller (the
 * capture's walk) goes on listing directories while the files are read, and collects the
 * batch with bulk_finish() when it needs the entries. Batches are served in the order
 * queued, each by at most `threads` threads. A thread per batch would cost its creation
 * for every directory (17k of them in the medium bench layer, ~6 files each), and a
 * Python thread per batch a hand-over of the GIL each way.
 */
#define _GNU_SOURCE
#include "bulkread.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "fastcdc.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's inline helpers */
#include "blake3/blake3.h"
#pragma GCC diagnostic pop

/* Threads of the pool: more than cores, as a cold read waits on the disk (8 readers of
 * the small bench layer's files: 3.2 s, one: 7.2 s). */
#define POOL_MAX 8u

struct bulk_task {
    struct bulk_task *next_task;
    int dirfd; /* a duplicate, the task's own: closed when the task is freed */
    struct bulk_file *files;
    size_t n, next, done, limit, min_size, avg_size, max_size;
    unsigned helpers, max_helpers; /* pool threads on this task now, and at most */
    bool lazy;                     /* see bulk_start() */
    pthread_cond_t finished;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct bulk_task *queue;
    unsigned threads, idle; /* idle: waiting on `work` */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child has none of the pool's threads (a fork from a thread holding the lock
 * would also leave it held): it starts a pool of its own. */
static void pool_after_fork(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work, NULL);
    pool.queue = NULL;
    pool.threads = 0;
    pool.idle = 0;
}

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork);
}

void bulk_file_free(struct bulk_file *f)
{
    free(f->data);
    free(f->ends);
    free(f->ids);
    f->data = NULL;
    f->ends = NULL;
    f->ids = NULL;
    f->nchunks = 0;
}

static bool same_times(const struct stat *a, const struct stat *b)
{
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
           a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Reads the whole of fd (size bytes) into f->data; false if it could not (an error, or
 * the file ended early: it shrank). */
static bool read_all(int fd, struct bulk_file *f, size_t size)
{
    f->data = malloc(size);
    if (f->data == NULL) {
        return false;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, f->data + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false;
        }
        got += (size_t)r;
    }
    return true;
}

/* Cuts f->data as the streaming chunker does (final) and hashes every chunk. */
static bool chunk_and_hash(const struct bulk_task *t, struct bulk_file *f)
{
    size_t size = f->len, cap = size / (t->min_size + 1) + 2, n = 0, pos = 0;
    f->ends = malloc(cap * sizeof *f->ends);
    if (f->ends == NULL) {
        return false;
    }
    while (pos < size) {
        if (n == cap) {
            cap *= 2;
            size_t *grown = realloc(f->ends, cap * sizeof *f->ends);
            if (grown == NULL) {
                return false;
            }
            f->ends = grown;
        }
        pos += fastcdc_cut(f->data + pos, size - pos, t->min_size, t->avg_size, t->max_size);
        f->ends[n++] = pos;
    }
    f->nchunks = n;
    f->ids = malloc((n ? n : 1) * BULK_ID_LEN);
    if (f->ids == NULL) {
        return false;
    }
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        blake3_hasher h;
        blake3_hasher_init(&h);
        blake3_hasher_update(&h, f->data + start, f->ends[i] - start);
        blake3_hasher_finalize(&h, f->ids + i * BULK_ID_LEN, BULK_ID_LEN);
        start = f->ends[i];
    }
    return true;
}

/* The plain case of bulkread.h, else BULK_FALLBACK with nothing kept. */
static void read_one(const struct bulk_task *t, struct bulk_file *f)
{
    f->status = BULK_FALLBACK;
    f->xattr_fd = -1;
    f->data = NULL;
    f->ends = NULL;
    f->ids = NULL;
    f->nchunks = 0;
    f->len = 0;
    int fd = openat(t->dirfd, f->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return; /* the general path opens it again and decides (gone, denied, an error) */
    }
    struct stat before;
    bool ok = fstat(fd, &before) == 0 && S_ISREG(before.st_mode) && before.st_nlink == 1 &&
              before.st_size >= 0 && (uint64_t)before.st_size <= (uint64_t)t->limit;
    size_t size = ok ? (size_t)before.st_size : 0;
    if (ok && size > 0) {
        /* all data, no hole: what data_regions() would call one region [0, size) */
        ok = lseek(fd, 0, SEEK_DATA) == 0 && lseek(fd, 0, SEEK_HOLE) >= (off_t)size;
        ok = ok && read_all(fd, f, size);
    }
    ok = ok && fstat(fd, &f->st) == 0 && same_times(&before, &f->st);
    if (ok) {
        f->len = size;
        ok = chunk_and_hash(t, f);
    }
    if (!ok) {
        bulk_file_free(f);
        close(fd);
        return;
    }
    ssize_t x = flistxattr(fd, NULL, 0);
    if (x == 0 || (x < 0 && (errno == ENOTSUP || errno == EOPNOTSUPP))) {
        close(fd);
    } else {
        f->xattr_fd = fd; /* the caller reads them as the general path does, and closes */
    }
    f->status = 0;
}

static struct bulk_task *claimable(void)
{
    for (struct bulk_task *t = pool.queue; t != NULL; t = t->next_task) {
        if (t->helpers < t->max_helpers) {
            return t;
        }
    }
    return NULL;
}

static void unqueue(struct bulk_task *t)
{
    for (struct bulk_task **p = &pool.queue; *p != NULL; p = &(*p)->next_task) {
        if (*p == t) {
            *p = t->next_task;
            return;
        }
    }
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        struct bulk_task *t = claimable();
        if (t == NULL) {
            pool.idle++;
            pthread_cond_wait(&pool.work, &pool.lock);
            pool.idle--;
            continue;
        }
        size_t i = t->next++;
        if (t->next == t->n) {
            unqueue(t); /* nothing left to claim in it */
        }
        t->helpers++;
        /* a lazy task's starter woke one thread at most: the ramp-up is ours */
        struct bulk_task *more = pool.idle > 0 ? claimable() : NULL;
        bool wake = more != NULL && more->lazy;
        pthread_mutex_unlock(&pool.lock);
        if (wake) {
            pthread_cond_signal(&pool.work);
        }
        read_one(t, &t->files[i]);
        pthread_mutex_lock(&pool.lock);
        t->helpers--;
        if (++t->done == t->n) {
            pthread_cond_broadcast(&t->finished);
        }
    }
    return NULL;
}

/* Grows the pool to `want` threads (under the lock); fewer if the system refuses. */
static void grow_pool(unsigned want)
{
    if (want > POOL_MAX) {
        want = POOL_MAX;
    }
    if (pool.threads >= want) {
        return;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with the interpreter's threads */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256u * 1024u); /* a hasher and a few frames */
    while (pool.threads < want) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, worker, NULL) != 0) {
            break;
        }
        pool.threads++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A condition whose timed waits (bulk_wait) count on the monotonic clock. */
static int init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc != 0) {
        return rc;
    }
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) {
        rc = pthread_cond_init(c, &attr);
    }
    pthread_condattr_destroy(&attr);
    return rc;
}

struct bulk_task *bulk_start(int dirfd, struct bulk_file *files, size_t n, size_t limit,
                             size_t min_size, size_t avg_size, size_t max_size,
                             unsigned threads, bool lazy)
{
    pthread_once(&atfork_once, register_atfork);
    struct bulk_task *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return NULL;
    }
    *t = (struct bulk_task){.dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0),
                            .files = files,
                            .n = n,
                            .limit = limit,
                            .min_size = min_size,
                            .avg_size = avg_size,
                            .max_size = max_size,
                            .max_helpers = threads > 0 ? threads : 1,
                            .lazy = lazy};
    if (t->dirfd < 0 || init_monotonic(&t->finished) != 0) {
        if (t->dirfd >= 0) {
            close(t->dirfd);
        }
        free(t);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        files[i].status = BULK_FALLBACK; /* until read */
        files[i].xattr_fd = -1;
    }
    size_t wake = 0;
    pthread_mutex_lock(&pool.lock);
    grow_pool(t->max_helpers);
    if (pool.threads == 0) {
        t->done = t->next = n; /* no thread to be had: every file falls back */
    } else if (n > 0) {
        struct bulk_task **tail = &pool.queue;
        while (*tail != NULL) {
            tail = &(*tail)->next_task;
        }
        *tail = t;
        /* as many idle threads as can help (busy ones look at the queue when they finish):
         * waking all 8 for a directory of 2 files costs each of them a turn at the lock
         * (the medium layer's 17k directories, a broadcast each: 2.7 s of its walk) */
        wake = n < t->max_helpers ? n : t->max_helpers;
        if (wake > pool.idle) {
            wake = pool.idle;
        }
        if (lazy && wake > 0) {
            /* one, and only if no thread is awake to find the task in the queue */
            wake = pool.idle == pool.threads ? 1 : 0;
        }
    }
    pthread_mutex_unlock(&pool.lock);
    /* Signalled after the unlock: a thread woken while the caller still held the lock
     * blocked on it at once and the caller lost its core to the hand-over (py-spy of the
     * small layer's first checkpoint under load 11: bulk_start's pthread_cond_signal was
     * 9.6% of the walk's thread). A thread that went idle meanwhile re-checks the queue
     * under the lock before it waits, so no task is missed. */
    for (size_t i = 0; i < wake; i++) {
        pthread_cond_signal(&pool.work);
    }
    return t;
}

void bulk_finish(struct bulk_task *t)
{
    pthread_mutex_lock(&pool.lock);
    while (t->done < t->n) {
        pthread_cond_wait(&t->finished, &pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
    pthread_cond_destroy(&t->finished);
    close(t->dirfd);
    free(t);
}

bool bulk_wait(struct bulk_task *t, long timeout_ns)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ns / 1000000000L;
    until.tv_nsec += timeout_ns % 1000000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&pool.lock);
    while (timeout_ns > 0 && t->done < t->n) {
        if (pthread_cond_timedwait(&t->finished, &pool.lock, &until) == ETIMEDOUT) {
            break;
        }
    }
    bool done = t->done == t->n;
    pthread_mutex_unlock(&pool.lock);
    return done;
}
