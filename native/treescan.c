/*
 * treescan.c - a whole tree's directories compared with the files cache, on several threads.
 *
 * A capture the change journal cannot narrow (a daemon start, an overflow, no journal) must
 * still cost about one `find` of the layer (issue 11.4). Calling dirscan() from Python once
 * per directory left Python 40% of such a walk (0.25 of 0.58 s for 17k directories of the
 * medium layer); here the whole walk runs without the GIL: listing (getdents64), a stat of
 * every child, the signature blob of each directory (dirscan.c's format, byte-identical to
 * dircache.encode_sigs()) and its comparison with the directory's row. What comes back is
 * the directories whose listing differs from their row or cannot be vouched for ("dirty"),
 * and the counts of every subtree; the capture walks the dirty ones and their ancestors
 * exactly like a full walk and keeps every other directory's tree id.
 *
 * A directory is dirty when it has no row, its blob differs from the row, or it holds what
 * the Python walk treats specially: a socket, a mount point, a hard link (non-directory with
 * more than one link), a racy child (mtime or ctime at or after now - racy: a poisoned
 * signature vouches for nothing), an excluded child, or a child it could not open or stat.
 * Excluded children, mount points and unopenable directories are not descended into.
 *
 * Threads share one stack of directories to open (last in, first out, so that the open
 * descriptors stay about two per level of depth, not one per waiting directory): a
 * directory's descriptor stays open until its last subdirectory has been opened through it,
 * so a path is never resolved twice and no symlink is ever followed (O_NOFOLLOW).
 *
 * With keep_listing the walk also keeps every directory's children and their lstat
 * (treescan_dir.kids): a first checkpoint has no rows to compare with, and its walk takes
 * these listings instead of listing and stat'ing every directory a second time from Python
 * (scandir there, one GIL round trip per child: a quarter of the walk's thread, issue 12).
 *
 * Patterns: fnmatch.fnmatchcase() over the whole relative path, where '*' matches any bytes
 * ('/' too) and '?' any one byte. A pattern with '[' is left to the blob comparison: its
 * parent's row lacks the excluded child, so the directory differs from its row anyway; the
 * patterns evaluated here only spare the walk of an excluded subtree.
 */
#define _GNU_SOURCE
#include "treescan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROW_SIZE 34u /* 2 + 8 + 8 + 8 + 8, as dirscan.c */
#define DENTS_BUF 32768u

/* -- the files cache: open addressing over borrowed bytes ------------------------------- */

struct slot {
    const char *path;
    size_t path_len;
    const uint8_t *blob;
    size_t blob_len;
    uint64_t hash;
};

struct treescan_cache {
    struct slot *slots;
    size_t mask; /* capacity - 1, a power of two at least twice the rows */
};

static uint64_t hash_of(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a, 64 bits */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3u;
    }
    return h;
}

struct treescan_cache *treescan_cache_new(size_t rows)
{
    size_t cap = 16;
    while (cap < rows * 2u + 1u) {
        cap *= 2u;
    }
    struct treescan_cache *c = malloc(sizeof *c);
    if (c == NULL) {
        return NULL;
    }
    c->slots = calloc(cap, sizeof *c->slots);
    if (c->slots == NULL) {
        free(c);
        return NULL;
    }
    c->mask = cap - 1u;
    return c;
}

int treescan_cache_put(struct treescan_cache *c, const char *path, size_t path_len,
                       const uint8_t *blob, size_t blob_len)
{
    uint64_t h = hash_of(path, path_len);
    for (size_t i = (size_t)h & c->mask;; i = (i + 1u) & c->mask) {
        struct slot *s = &c->slots[i];
        if (s->path == NULL || (s->hash == h && s->path_len == path_len &&
                                memcmp(s->path, path, path_len) == 0)) {
            s->path = path;
            s->path_len = path_len;
            s->blob = blob;
            s->blob_len = blob_len;
            s->hash = h;
            return 0;
        }
    }
}

static const struct slot *cache_get(const struct treescan_cache *c, const char *path, size_t n)
{
    uint64_t h = hash_of(path, n);
    for (size_t i = (size_t)h & c->mask;; i = (i + 1u) & c->mask) {
        const struct slot *s = &c->slots[i];
        if (s->path == NULL) {
            return NULL;
        }
        if (s->hash == h && s->path_len == n && memcmp(s->path, path, n) == 0) {
            return s;
        }
    }
}

void treescan_cache_free(struct treescan_cache *c)
{
    if (c != NULL) {
        free(c->slots);
        free(c);
    }
}

/* -- patterns ----------------------------------------------------------------------------- */

/* fnmatchcase() for patterns of literals, '*' and '?' (the caller skips those with '['). */
static int wild_match(const char *p, size_t pn, const char *s, size_t sn)
{
    size_t pi = 0, si = 0, star = (size_t)-1, mark = 0;
    while (si < sn) {
        if (pi < pn && (p[pi] == '?' || (p[pi] != '*' && p[pi] == s[si]))) {
            pi++;
            si++;
        } else if (pi < pn && p[pi] == '*') {
            star = pi++;
            mark = si;
        } else if (star != (size_t)-1) {
            pi = star + 1u;
            si = ++mark;
        } else {
            return 0;
        }
    }
    while (pi < pn && p[pi] == '*') {
        pi++;
    }
    return pi == pn;
}

/* -- one walker's scratch space ----------------------------------------------------------- */

struct entry {
    const char *name;
    size_t len;
};

struct scratch {
    char *dents;                 /* getdents64 buffer */
    char *names;                 /* the names of one directory, NUL-terminated, packed */
    size_t names_len, names_cap;
    struct entry *entries;
    size_t n_entries, entries_cap;
    uint8_t *blob;
    size_t blob_cap;
    struct entry *subdirs;
    size_t n_subdirs, subdirs_cap;
    char *path; /* a child's relative path, for the patterns */
    size_t path_cap;
};

static int grow(void **buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) {
        return 0;
    }
    size_t n = *cap ? *cap : 64u;
    while (n < need) {
        n *= 2u;
    }
    void *p = realloc(*buf, n * size);
    if (p == NULL) {
        return -ENOMEM;
    }
    *buf = p;
    *cap = n;
    return 0;
}

static void scratch_free(struct scratch *t)
{
    free(t->dents);
    free(t->names);
    free(t->entries);
    free(t->blob);
    free(t->subdirs);
    free(t->path);
}

/* -- the walk ------------------------------------------------------------------------------ */

struct walk {
    const struct treescan_params *p;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct treescan_dir **stack; /* to open: each dir's parent fd is open */
    size_t depth, stack_cap;
    size_t busy; /* walkers holding a directory */
    size_t idle; /* walkers waiting for one, not yet signalled */
    int error;   /* -ENOMEM: everything stops */
    struct treescan_result *out;
    size_t out_cap;
};

static int cmp_entries(const void *pa, const void *pb)
{
    const struct entry *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->name, b->name, n);
    if (c != 0) {
        return c;
    }
    return (a->len > b->len) - (a->len < b->len);
}

static void put_u16(uint8_t *q, uint16_t v)
{
    q[0] = (uint8_t)(v & 0xffu);
    q[1] = (uint8_t)(v >> 8);
}

static void put_u64(uint8_t *q, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        q[i] = (uint8_t)(v >> (8 * i));
    }
}

static int64_t ns_of(struct timespec ts)
{
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Reads every name of the directory at fd into t (sorted). Returns 0 or -errno. */
static int list_dir(int fd, struct scratch *t)
{
    t->names_len = 0;
    t->n_entries = 0;
    for (;;) {
        ssize_t n = getdents64(fd, t->dents, DENTS_BUF);
        if (n < 0) {
            return -errno;
        }
        if (n == 0) {
            break;
        }
        for (size_t off = 0; off < (size_t)n;) {
            struct dirent64 *de = (struct dirent64 *)(void *)(t->dents + off);
            off += de->d_reclen;
            const char *s = de->d_name;
            if (s[0] == '.' && (s[1] == '\0' || (s[1] == '.' && s[2] == '\0'))) {
                continue;
            }
            size_t len = strlen(s);
            void *names = t->names;
            if (grow(&names, &t->names_cap, t->names_len + len + 1u, 1) != 0) {
                return -ENOMEM;
            }
            t->names = names;
            memcpy(t->names + t->names_len, s, len + 1u);
            void *ents = t->entries;
            if (grow(&ents, &t->entries_cap, t->n_entries + 1u, sizeof(struct entry)) != 0) {
                return -ENOMEM;
            }
            t->entries = ents;
            /* an offset for now: names may move while it grows */
            t->entries[t->n_entries].name = (const char *)(uintptr_t)t->names_len;
            t->entries[t->n_entries].len = len;
            t->n_entries++;
            t->names_len += len + 1u;
        }
    }
    for (size_t i = 0; i < t->n_entries; i++) {
        t->entries[i].name = t->names + (uintptr_t)t->entries[i].name;
    }
    if (t->n_entries > 1) {
        qsort(t->entries, t->n_entries, sizeof *t->entries, cmp_entries);
    }
    return 0;
}

static int excluded(const struct treescan_params *p, struct scratch *t,
                    const struct treescan_dir *d, const struct entry *e, const struct stat *st)
{
    for (size_t i = 0; i < p->n_exclude_inodes; i++) {
        if (p->exclude_inodes[2 * i] == (uint64_t)st->st_dev &&
            p->exclude_inodes[2 * i + 1] == (uint64_t)st->st_ino) {
            return 1;
        }
    }
    if (p->n_patterns == 0) {
        return 0;
    }
    size_t n = d->path_len ? d->path_len + 1u + e->len : e->len;
    void *path = t->path;
    if (grow(&path, &t->path_cap, n, 1) != 0) {
        return 1; /* cannot tell: the directory is dirty, Python decides */
    }
    t->path = path;
    if (d->path_len) {
        memcpy(t->path, d->path, d->path_len);
        t->path[d->path_len] = '/';
        memcpy(t->path + d->path_len + 1u, e->name, e->len);
    } else {
        memcpy(t->path, e->name, e->len);
    }
    for (size_t i = 0; i < p->n_patterns; i++) {
        const char *pat = p->patterns[i];
        size_t pn = p->pattern_lens[i];
        if (memchr(pat, '[', pn) == NULL && wild_match(pat, pn, t->path, n)) {
            return 1;
        }
    }
    return 0;
}

/* Lists and stats the directory d (its fd open), compares it with its row, counts its
 * children and collects its subdirectories in t->subdirs. Returns 0 or -ENOMEM. */
static int scan(const struct treescan_params *p, struct treescan_dir *d, struct scratch *t)
{
    t->n_subdirs = 0;
    int rc = list_dir(d->fd, t);
    if (rc == -ENOMEM) {
        return rc;
    }
    if (rc != 0) {
        d->dirty = 1; /* the Python walk meets the same error and decides */
        return 0;
    }
    size_t blob_len = 0;
    int64_t limit = p->now_ns - p->racy_ns;
    if (p->keep_listing) {
        d->kids = malloc((t->n_entries ? t->n_entries : 1u) * sizeof *d->kids);
        d->kid_names = malloc(t->names_len ? t->names_len : 1u);
        if (d->kids == NULL || d->kid_names == NULL) {
            return -ENOMEM;
        }
        if (t->names_len) {
            memcpy(d->kid_names, t->names, t->names_len);
        }
        d->listed = 1;
    }
    for (size_t i = 0; i < t->n_entries; i++) {
        const struct entry *e = &t->entries[i];
        struct stat st;
        if (fstatat(d->fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) { /* ENOENT: vanished since the listing, not there */
                d->dirty = 1;
                d->listed = 0;
            }
            continue;
        }
        if (p->keep_listing) {
            struct treescan_kid *k = &d->kids[d->n_kids++];
            k->name_off = (size_t)(e->name - t->names);
            k->name_len = e->len;
            k->st = st;
        }
        mode_t m = st.st_mode;
        if (excluded(p, t, d, e, &st) || S_ISSOCK(m) ||
            (S_ISDIR(m) && (uint64_t)st.st_dev != p->root_dev) ||
            (!S_ISDIR(m) && st.st_nlink > 1) || e->len > 0xffffu) {
            d->dirty = 1;
            continue;
        }
        int64_t mtime = ns_of(st.st_mtim), ctime = ns_of(st.st_ctim);
        int racy = mtime >= limit || ctime >= limit;
        if (racy) {
            d->dirty = 1;
        }
        void *blob = t->blob;
        if (grow(&blob, &t->blob_cap, blob_len + ROW_SIZE + e->len, 1) != 0) {
            return -ENOMEM;
        }
        t->blob = blob;
        uint8_t *q = t->blob + blob_len;
        put_u16(q, (uint16_t)e->len);
        put_u64(q + 2, (uint64_t)st.st_ino);
        put_u64(q + 10, racy ? (uint64_t)(int64_t)-1 : (uint64_t)ctime);
        put_u64(q + 18, racy ? 0u : (uint64_t)st.st_size);
        put_u64(q + 26, racy ? (uint64_t)(int64_t)-1 : (uint64_t)mtime);
        memcpy(q + ROW_SIZE, e->name, e->len);
        blob_len += ROW_SIZE + e->len;
        if (S_ISDIR(m)) {
            void *sub = t->subdirs;
            if (grow(&sub, &t->subdirs_cap, t->n_subdirs + 1u, sizeof(struct entry)) != 0) {
                return -ENOMEM;
            }
            t->subdirs = sub;
            t->subdirs[t->n_subdirs++] = *e;
        } else if (S_ISREG(m)) {
            d->files++;
            d->bytes += (uint64_t)st.st_size;
        } else if (S_ISLNK(m)) {
            d->symlinks++;
        } else {
            d->specials++;
        }
    }
    if (!d->dirty) {
        const struct slot *row = cache_get(p->cache, d->path, d->path_len);
        if (row == NULL || row->blob_len != blob_len ||
            (blob_len != 0 && memcmp(row->blob, t->blob, blob_len) != 0)) {
            d->dirty = 1;
        }
    }
    return 0;
}

static struct treescan_dir *new_dir(struct treescan_dir *parent, const struct entry *e)
{
    struct treescan_dir *d = calloc(1, sizeof *d);
    if (d == NULL) {
        return NULL;
    }
    size_t n = parent->path_len ? parent->path_len + 1u + e->len : e->len;
    d->path = malloc(n + 1u);
    if (d->path == NULL) {
        free(d);
        return NULL;
    }
    if (parent->path_len) {
        memcpy(d->path, parent->path, parent->path_len);
        d->path[parent->path_len] = '/';
        memcpy(d->path + parent->path_len + 1u, e->name, e->len);
    } else {
        memcpy(d->path, e->name, e->len);
    }
    d->path[n] = '\0';
    d->path_len = n;
    d->name = d->path + (n - e->len);
    d->parent = parent;
    d->fd = -1;
    return d;
}

/* Appends d to the result (the lock held). */
static int record(struct walk *w, struct treescan_dir *d)
{
    void *dirs = w->out->dirs;
    if (grow(&dirs, &w->out_cap, w->out->count + 1u, sizeof(struct treescan_dir *)) != 0) {
        return -ENOMEM;
    }
    w->out->dirs = dirs;
    w->out->dirs[w->out->count++] = d;
    return 0;
}

/* The parent of a just-opened (or failed) child lets go of one pending open (lock held). */
static void release_parent(struct treescan_dir *parent)
{
    if (parent != NULL && --parent->pending == 0) {
        close(parent->fd);
        parent->fd = -1;
    }
}

/* After d was scanned: its subdirectories go on the stack (lock held). */
static int push_children(struct walk *w, struct treescan_dir *d, struct scratch *t)
{
    size_t pushed = 0;
    int rc = 0;
    void *stack = w->stack;
    if (grow(&stack, &w->stack_cap, w->depth + t->n_subdirs, sizeof *w->stack) != 0) {
        rc = -ENOMEM;
    } else {
        w->stack = stack;
        /* pushed in reverse so that they are opened in name order (reads nearby inodes) */
        for (size_t i = t->n_subdirs; i-- > 0;) {
            struct treescan_dir *c = new_dir(d, &t->subdirs[i]);
            if (c == NULL || record(w, c) != 0) {
                if (c != NULL) {
                    free(c->path);
                    free(c);
                }
                rc = -ENOMEM;
                break;
            }
            w->stack[w->depth++] = c;
            pushed++;
        }
    }
    d->pending = pushed;
    if (pushed == 0 && d->fd >= 0) {
        close(d->fd);
        d->fd = -1;
    }
    return rc;
}

static void *walker(void *arg)
{
    struct walk *w = arg;
    struct scratch t;
    memset(&t, 0, sizeof t);
    t.dents = malloc(DENTS_BUF);
    pthread_mutex_lock(&w->lock);
    if (t.dents == NULL) {
        w->error = -ENOMEM;
        pthread_cond_broadcast(&w->wake);
    }
    for (;;) {
        while (w->depth == 0 && w->busy > 0 && w->error == 0) {
            w->idle++; /* the walker that signals it takes it off (a spurious wakeup only
                        * leaves one too many: one more signal, no harm) */
            pthread_cond_wait(&w->wake, &w->lock);
        }
        if (w->depth == 0 || w->error != 0) {
            break;
        }
        struct treescan_dir *d = w->stack[--w->depth];
        w->busy++;
        pthread_mutex_unlock(&w->lock);
        int fd = openat(d->parent->fd, d->name,
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        int rc = 0;
        if (fd >= 0) {
            pthread_mutex_lock(&w->lock);
            release_parent(d->parent);
            pthread_mutex_unlock(&w->lock);
            d->fd = fd;
            rc = scan(w->p, d, &t);
        }
        pthread_mutex_lock(&w->lock);
        if (fd < 0) {
            /* replaced, vanished or unreadable since the listing: Python looks again */
            d->dirty = 1;
            d->parent->dirty = 1;
            release_parent(d->parent);
        } else if (rc == 0) {
            size_t before = w->depth;
            rc = push_children(w, d, &t);
            /* wake only as many walkers as there is new work: a broadcast per directory
             * cost 25% of a warm walk on 8 threads (2 cores) */
            size_t n = w->depth - before < w->idle ? w->depth - before : w->idle;
            w->idle -= n;
            while (n-- > 0) {
                pthread_cond_signal(&w->wake);
            }
        } else {
            close(d->fd);
            d->fd = -1;
        }
        if (rc != 0) {
            w->error = rc;
        }
        w->busy--;
        if (w->error != 0 || (w->depth == 0 && w->busy == 0)) {
            pthread_cond_broadcast(&w->wake); /* the end: every walker returns */
        }
    }
    pthread_mutex_unlock(&w->lock);
    scratch_free(&t);
    return NULL;
}

int treescan(int root_fd, const struct treescan_params *p, struct treescan_result *out)
{
    memset(out, 0, sizeof *out);
    struct treescan_dir *root = calloc(1, sizeof *root);
    if (root == NULL) {
        return -ENOMEM;
    }
    root->path = calloc(1, 1);
    if (root->path == NULL) {
        free(root);
        return -ENOMEM;
    }
    root->name = root->path;
    /* A fresh open file description: the caller's fd offset is left alone. */
    root->fd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root->fd < 0) {
        int e = errno;
        free(root->path);
        free(root);
        return -e;
    }
    struct walk w;
    memset(&w, 0, sizeof w);
    w.p = p;
    w.out = out;
    size_t cap = 0;
    void *dirs = NULL;
    if (grow(&dirs, &cap, 1, sizeof(struct treescan_dir *)) != 0) {
        close(root->fd);
        free(root->path);
        free(root);
        return -ENOMEM;
    }
    out->dirs = dirs;
    out->dirs[out->count++] = root;
    w.out_cap = cap;
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.wake, NULL);

    /* The root is scanned here; the walkers take its subdirectories. */
    struct scratch t;
    memset(&t, 0, sizeof t);
    t.dents = malloc(DENTS_BUF);
    int rc = t.dents == NULL ? -ENOMEM : scan(p, root, &t);
    if (rc == 0) {
        rc = push_children(&w, root, &t);
    }
    scratch_free(&t);
    if (rc == 0) {
        int n = p->threads > 1 ? p->threads : 1;
        pthread_t tids[16];
        if (n > 16) {
            n = 16;
        }
        int started = 0;
        for (int i = 1; i < n; i++) {
            if (pthread_create(&tids[started], NULL, walker, &w) != 0) {
                break; /* fewer walkers: slower, not wrong */
            }
            started++;
        }
        walker(&w);
        for (int i = 0; i < started; i++) {
            pthread_join(tids[i], NULL);
        }
        rc = w.error;
    }
    /* on error the stack may hold directories whose parents' fds are still open */
    for (size_t i = 0; i < out->count; i++) {
        if (out->dirs[i]->fd >= 0) {
            close(out->dirs[i]->fd);
            out->dirs[i]->fd = -1;
        }
    }
    free(w.stack);
    pthread_cond_destroy(&w.wake);
    pthread_mutex_destroy(&w.lock);
    if (rc != 0) {
        return rc;
    }
    /* Bottom up (every directory comes after its parent): subtree counts and cleanliness. */
    for (size_t i = out->count; i-- > 0;) {
        struct treescan_dir *d = out->dirs[i];
        d->dirs += 1u;
        d->clean = d->clean == 0 && !d->dirty; /* clean was 0, or -1 from a dirty child */
        struct treescan_dir *up = d->parent;
        if (up != NULL) {
            up->files += d->files;
            up->dirs += d->dirs;
            up->symlinks += d->symlinks;
            up->specials += d->specials;
            up->bytes += d->bytes;
            if (!d->clean) {
                up->clean = -1;
            }
        }
    }
    return 0;
}

void treescan_free(struct treescan_result *r)
{
    for (size_t i = 0; i < r->count; i++) {
        free(r->dirs[i]->kids);
        free(r->dirs[i]->kid_names);
        free(r->dirs[i]->path);
        free(r->dirs[i]);
    }
    free(r->dirs);
    r->dirs = NULL;
    r->count = 0;
}
