/*
 * _native.c - CPython binding of the FastCDC kernel: module sprite_env._native.
 *
 * cut_points() scans any C-contiguous buffer (bytes, bytearray, memoryview,
 * mmap, ...) with the GIL released. The buffer stays exported for the whole
 * call, so it cannot be resized or closed meanwhile; if another thread writes
 * into it during the scan the cut points are unspecified (but memory-safe).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "blake3/blake3.h"
#include "dirscan.h"
#include "fastcdc.h"
#include "pagesum.h"
#include "treescan.h"
#include "treescan_py.h"

int filewrite_add_functions(PyObject *module);  /* filewrite_py.c */
int treesplice_add_functions(PyObject *module); /* treesplice_py.c */
int bulkread_add_functions(PyObject *module);   /* bulkread_py.c */
int treescan_add_functions(PyObject *module);   /* treescan_py.c */

/* Directories of at most this many entries are scanned with the GIL held (scan_dir). */
#define SCAN_DIR_KEEP_GIL 256u

/* Below this many bytes the scan is too short to be worth a GIL round trip. */
#define RELEASE_GIL_MIN_BYTES 8192

PyDoc_STRVAR(cut_points_doc,
"cut_points(buf, /, min_size, avg_size, max_size, final)\n"
"--\n"
"\n"
"Return the end offsets of the complete chunks found in buf.\n"
"\n"
"Offsets are exclusive and relative to the start of buf; the first chunk\n"
"starts at 0 and each next one where the previous one ended. If final is\n"
"false, scanning stops as soon as fewer than max_size bytes remain, since a\n"
"chunk there might still grow with more data: the caller keeps buf[last:]\n"
"(shorter than max_size) and passes it again, followed by more data. If\n"
"final is true, the remaining bytes form the last chunk (an empty buf gives\n"
"no chunk). The GIL is released during the scan.\n"
"\n"
"Raises ValueError unless 0 <= min_size < avg_size < max_size and avg_size\n"
"is a power of two between 2**3 and 2**62.");

/* Grows *cuts to hold at least one more entry. Called without the GIL. */
static int grow(size_t **cuts, size_t *cap)
{
    size_t new_cap = *cap ? *cap * 2u : 64u;
    if (new_cap > PY_SSIZE_T_MAX / sizeof(size_t)) {
        return -1;
    }
    size_t *p = PyMem_RawRealloc(*cuts, new_cap * sizeof(size_t));
    if (p == NULL) {
        return -1;
    }
    *cuts = p;
    *cap = new_cap;
    return 0;
}

/* The scan itself; touches no Python object, so it may run without the GIL.
 * Returns 0, or -1 when out of memory. */
static int scan(const uint8_t *buf, size_t len, size_t min_size, size_t avg_size,
                size_t max_size, int final, size_t **cuts, size_t *count, size_t *cap)
{
    size_t pos = 0;
    while (pos < len) {
        size_t rem = len - pos;
        if (!final && rem < max_size) {
            break;
        }
        pos += fastcdc_cut(buf + pos, rem, min_size, avg_size, max_size);
        if (*count == *cap && grow(cuts, cap) < 0) {
            return -1;
        }
        (*cuts)[(*count)++] = pos;
    }
    return 0;
}

static PyObject *native_cut_points(PyObject *Py_UNUSED(module), PyObject *args,
                                   PyObject *kwargs)
{
    static char *kwlist[] = {"", "min_size", "avg_size", "max_size", "final", NULL};
    Py_buffer view;
    Py_ssize_t min_arg, avg_arg, max_arg;
    int final;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nnnp:cut_points", kwlist, &view,
                                     &min_arg, &avg_arg, &max_arg, &final)) {
        return NULL;
    }
    if (min_arg < 0 || avg_arg < 0 || max_arg < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "chunk sizes must not be negative");
        return NULL;
    }
    size_t min_size = (size_t)min_arg, avg_size = (size_t)avg_arg, max_size = (size_t)max_arg;
    int status = fastcdc_validate(min_size, avg_size, max_size);
    if (status != FASTCDC_OK) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, fastcdc_strerror(status));
        return NULL;
    }

    const uint8_t *buf = (const uint8_t *)view.buf;
    size_t len = (size_t)view.len;
    size_t *cuts = NULL;
    size_t count = 0, cap = 0;
    int rc;
    if (len >= RELEASE_GIL_MIN_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = scan(buf, len, min_size, avg_size, max_size, final, &cuts, &count, &cap);
        Py_END_ALLOW_THREADS
    } else {
        rc = scan(buf, len, min_size, avg_size, max_size, final, &cuts, &count, &cap);
    }
    PyBuffer_Release(&view);
    if (rc < 0) {
        PyMem_RawFree(cuts);
        return PyErr_NoMemory();
    }

    PyObject *result = PyList_New((Py_ssize_t)count);
    if (result != NULL) {
        for (size_t i = 0; i < count; i++) {
            PyObject *item = PyLong_FromSize_t(cuts[i]);
            if (item == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, (Py_ssize_t)i, item);
        }
    }
    PyMem_RawFree(cuts);
    return result;
}

/* Inputs up to this many bytes are hashed with the GIL kept (16 KiB: about 10 us): an
 * object id of a small object (a tree, a small file's chunk) taken beside a busy Python
 * thread waited longer to take the GIL back than it took to compute. Longer ones release
 * it, so that threads hashing chunks (a restore's verifying writers) run on both cores. */
#define B3_KEEP_GIL (16u << 10)

PyDoc_STRVAR(blake3_256_doc,
"blake3_256(data, /) -> bytes\n--\n\n"
"The BLAKE3-256 digest of data (any contiguous buffer), as blake3.blake3(data).digest().\n"
"The GIL is kept for up to 16 KiB and released for longer inputs.");

static PyObject *native_blake3_256(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    uint8_t out[BLAKE3_OUT_LEN];
    blake3_hasher h;
    blake3_hasher_init(&h);
    if ((size_t)b.len <= B3_KEEP_GIL) {
        blake3_hasher_update(&h, b.buf, (size_t)b.len);
    } else {
        /* the export keeps a bytearray from being resized meanwhile */
        Py_BEGIN_ALLOW_THREADS
        blake3_hasher_update(&h, b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    }
    blake3_hasher_finalize(&h, out, BLAKE3_OUT_LEN);
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, BLAKE3_OUT_LEN);
}

PyDoc_STRVAR(gear_table_doc,
"gear_table()\n"
"--\n"
"\n"
"Return the 256-entry gear table of the kernel as a tuple of ints.");

static PyObject *native_gear_table(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    PyObject *table = PyTuple_New(256);
    if (table == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < 256; i++) {
        PyObject *item = PyLong_FromUnsignedLongLong(fastcdc_gear[i]);
        if (item == NULL) {
            Py_DECREF(table);
            return NULL;
        }
        PyTuple_SET_ITEM(table, i, item);
    }
    return table;
}

PyDoc_STRVAR(scan_dir_doc,
"scan_dir(fd, now_ns, racy_ns, root_dev, /)\n"
"--\n"
"\n"
"List the directory open at fd and stat its children (symlinks not followed).\n"
"\n"
"Returns (blob, subdirs, files, bytes, symlinks, specials, irregular): blob is the\n"
"signature rows in dircache.encode_sigs()'s format, subdirs the subdirectory names\n"
"(sorted), then counts; irregular is true when a socket, a mount point or a hard link\n"
"was seen (the caller must take its slow path). The GIL is released meanwhile, unless\n"
"the directory is small (at most 256 entries: the scan is shorter than taking it back).\n"
"Raises OSError.");

static PyObject *native_scan_dir(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    long long now_ns, racy_ns;
    unsigned long long root_dev;
    if (!PyArg_ParseTuple(args, "iLLK:scan_dir", &fd, &now_ns, &racy_ns, &root_dev)) {
        return NULL;
    }
    /* A small directory is listed and stated with the GIL held. Releasing it costs
     * nothing alone, but with another Python thread runnable (the store's encoders, the
     * capture's readers, the journal's poll) taking it back can wait up to the switch
     * interval (5 ms), where the scan of a small directory is well under a millisecond.
     * 653 directories of 20-80 entries of the medium layer, warm, both builds alternating
     * (7 rounds, load 5): alone 0.35 s either way; beside a thread that compresses 64 KiB
     * with zstd between bits of Python 0.54 s released, 0.40 s held; beside a pure Python
     * loop 0.75 s and 0.57 s. Past SCAN_DIR_KEEP_GIL names (or on an error) the listing
     * goes on, and the stats are done, without it. */
    struct dirscan r;
    struct dirscan_list l;
    int rc = dirscan_open(fd, &l);
    if (rc == 0) {
        rc = dirscan_read(&l, SCAN_DIR_KEEP_GIL + 1u);
    }
    if (rc == 0 && l.eof && l.count <= SCAN_DIR_KEEP_GIL) {
        rc = dirscan_stat(fd, &l, (int64_t)now_ns, (int64_t)racy_ns, (uint64_t)root_dev, &r);
    } else if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = dirscan_stat(fd, &l, (int64_t)now_ns, (int64_t)racy_ns, (uint64_t)root_dev, &r);
        Py_END_ALLOW_THREADS
    } else {
        memset(&r, 0, sizeof r);
    }
    dirscan_list_free(&l);
    PyObject *result = NULL, *blob = NULL, *subdirs = NULL;
    if (rc != 0) {
        errno = -rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto out;
    }
    blob = PyBytes_FromStringAndSize((const char *)r.blob, (Py_ssize_t)r.blob_len);
    subdirs = PyList_New(0);
    if (blob == NULL || subdirs == NULL) {
        goto out;
    }
    for (size_t off = 0; off + 2u <= r.subdirs_len;) {
        size_t len = (size_t)r.subdirs[off] | ((size_t)r.subdirs[off + 1u] << 8);
        PyObject *name = PyBytes_FromStringAndSize((const char *)r.subdirs + off + 2u,
                                                   (Py_ssize_t)len);
        if (name == NULL || PyList_Append(subdirs, name) != 0) {
            Py_XDECREF(name);
            goto out;
        }
        Py_DECREF(name);
        off += 2u + len;
    }
    result = Py_BuildValue("(OOKKKKO)", blob, subdirs, (unsigned long long)r.files,
                           (unsigned long long)r.bytes, (unsigned long long)r.symlinks,
                           (unsigned long long)r.specials, r.irregular ? Py_True : Py_False);
out:
    Py_XDECREF(blob);
    Py_XDECREF(subdirs);
    free(r.blob);
    free(r.subdirs);
    return result;
}

PyDoc_STRVAR(scan_tree_doc,
"scan_tree(fd, now_ns, racy_ns, root_dev, rows, exclude_inodes, patterns, threads, /)\n"
"--\n"
"\n"
"Walk the tree below the directory open at fd on `threads` threads and compare\n"
"every directory's signature blob (scan_dir()'s) with rows[path] (bytes by path,\n"
"b'' the root). exclude_inodes is a sequence of (st_dev, st_ino), patterns a\n"
"sequence of bytes (fnmatchcase over the relative path).\n"
"\n"
"Returns (dirty, totals): the paths of the directories that differ from their row\n"
"or that the walk cannot vouch for, and for every directory with nothing dirty at\n"
"or below it, its subtree's (files, dirs, symlinks, specials, bytes). The GIL is\n"
"released meanwhile. Raises OSError if the root cannot be read.");

/* Holds a new reference to every bytes object the walk borrows. */
struct held {
    PyObject **refs;
    size_t count;
};

static void hold(struct held *h, PyObject *o)
{
    Py_INCREF(o);
    h->refs[h->count++] = o;
}

static void release_held(struct held *h)
{
    for (size_t i = 0; i < h->count; i++) {
        Py_DECREF(h->refs[i]);
    }
    PyMem_Free(h->refs);
}

static PyObject *scan_tree_result(const struct treescan_result *r)
{
    PyObject *dirty = PyList_New(0), *totals = PyDict_New(), *result = NULL;
    if (dirty == NULL || totals == NULL) {
        goto out;
    }
    for (size_t i = 0; i < r->count; i++) {
        const struct treescan_dir *d = r->dirs[i];
        if (!d->dirty && !d->clean) {
            continue; /* an ancestor of a dirty directory: walked, nothing to say */
        }
        PyObject *path = PyBytes_FromStringAndSize(d->path, (Py_ssize_t)d->path_len);
        if (path == NULL) {
            goto out;
        }
        int rc;
        if (d->dirty) {
            rc = PyList_Append(dirty, path);
        } else {
            PyObject *t = Py_BuildValue("(KKKKK)", (unsigned long long)d->files,
                                        (unsigned long long)d->dirs,
                                        (unsigned long long)d->symlinks,
                                        (unsigned long long)d->specials,
                                        (unsigned long long)d->bytes);
            rc = t == NULL ? -1 : PyDict_SetItem(totals, path, t);
            Py_XDECREF(t);
        }
        Py_DECREF(path);
        if (rc != 0) {
            goto out;
        }
    }
    result = PyTuple_Pack(2, dirty, totals);
out:
    Py_XDECREF(dirty);
    Py_XDECREF(totals);
    return result;
}

static PyObject *native_scan_tree(PyObject *self, PyObject *args)
{
    (void)self;
    int fd, threads;
    long long now_ns, racy_ns;
    unsigned long long root_dev;
    PyObject *rows, *inodes_arg, *patterns_arg;
    if (!PyArg_ParseTuple(args, "iLLKO!OOi:scan_tree", &fd, &now_ns, &racy_ns, &root_dev,
                          &PyDict_Type, &rows, &inodes_arg, &patterns_arg, &threads)) {
        return NULL;
    }
    struct treescan_excludes x;
    struct treescan_cache *cache = NULL;
    struct held held = {NULL, 0};
    struct treescan_result r = {NULL, 0};
    PyObject *result = NULL;
    if (treescan_excludes_parse(inodes_arg, patterns_arg, &x) != 0) {
        goto out;
    }
    Py_ssize_t n_rows = PyDict_Size(rows);
    held.refs = PyMem_Malloc(sizeof(PyObject *) * (size_t)(2 * n_rows + 1));
    cache = treescan_cache_new((size_t)n_rows);
    if (held.refs == NULL || cache == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(rows, &pos, &key, &value)) {
        if (!PyBytes_Check(key) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "rows must map bytes to bytes");
            goto out;
        }
        hold(&held, key);
        hold(&held, value);
        if (treescan_cache_put(cache, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                               (const uint8_t *)PyBytes_AS_STRING(value),
                               (size_t)PyBytes_GET_SIZE(value)) != 0) {
            PyErr_NoMemory();
            goto out;
        }
    }
    struct treescan_params params = {
        .now_ns = (int64_t)now_ns,
        .racy_ns = (int64_t)racy_ns,
        .root_dev = (uint64_t)root_dev,
        .exclude_inodes = x.inos,
        .n_exclude_inodes = x.n_inos,
        .patterns = x.pats,
        .pattern_lens = x.pat_lens,
        .n_patterns = x.n_pats,
        .cache = cache,
        .threads = threads,
    };
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = treescan(fd, &params, &r);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        errno = -rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto out;
    }
    result = scan_tree_result(&r);
out:
    treescan_free(&r);
    treescan_cache_free(cache);
    if (held.refs != NULL) {
        release_held(&held);
    }
    treescan_excludes_free(&x);
    return result;
}

PyDoc_STRVAR(page_sums_doc,
"page_sums(buf, start, key, /)\n"
"--\n"
"\n"
"Return the digests of buf's windows, buf holding a file's bytes from offset\n"
"start: buf cut at every multiple of 4096 of the file's offsets, each piece's\n"
"BLAKE3 keyed with key (32 bytes), truncated to 16 bytes, concatenated. The GIL\n"
"is released meanwhile. Raises ValueError for a key that is not 32 bytes.");

static int page_key(const Py_buffer *key)
{
    if (key->len != PAGESUM_KEY_LEN) {
        PyErr_SetString(PyExc_ValueError, "the key must be 32 bytes");
        return -1;
    }
    return 0;
}

/* A bytes object of n digests, or NULL with the exception set. */
static PyObject *digests_of(uint64_t n)
{
    if (n > (uint64_t)PY_SSIZE_T_MAX / PAGESUM_LEN) {
        return PyErr_NoMemory();
    }
    return PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * PAGESUM_LEN));
}

static PyObject *native_page_sums(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view, key;
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "y*Ky*:page_sums", &view, &start, &key)) {
        return NULL;
    }
    PyObject *out = NULL;
    if (page_key(&key) == 0 &&
        (out = digests_of(pagesum_windows(start, (uint64_t)view.len))) != NULL) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        if (view.len >= RELEASE_GIL_MIN_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            pagesum_buf(key.buf, view.buf, (size_t)view.len, start, dst);
            Py_END_ALLOW_THREADS
        } else {
            pagesum_buf(key.buf, view.buf, (size_t)view.len, start, dst);
        }
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&key);
    return out;
}

PyDoc_STRVAR(page_sums_fd_doc,
"page_sums_fd(fd, ranges, key, threads, /)\n"
"--\n"
"\n"
"Read the ranges of the file open at fd with pread and return their windows'\n"
"digests (as page_sums() of each range's bytes), range after range. ranges is a\n"
"buffer of native unsigned 64-bit (start, length) pairs (array('Q')). The GIL is\n"
"released; up to `threads` threads hash side by side. Raises OSError (ENODATA if\n"
"the file ends before a range does) and ValueError.");

static PyObject *native_page_sums_fd(PyObject *Py_UNUSED(module), PyObject *args)
{
    int fd, threads;
    Py_buffer rbuf, key;
    if (!PyArg_ParseTuple(args, "iy*y*i:page_sums_fd", &fd, &rbuf, &key, &threads)) {
        return NULL;
    }
    PyObject *out = NULL;
    struct pagesum_range *ranges = NULL;
    size_t count = (size_t)rbuf.len / sizeof *ranges;
    if (page_key(&key) != 0) {
        goto done;
    }
    if ((size_t)rbuf.len % sizeof *ranges != 0 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "ranges must be (start, length) pairs of u64");
        goto done;
    }
    ranges = PyMem_Malloc(count * sizeof *ranges + 1); /* a copy: aligned, and ours */
    if (ranges == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(ranges, rbuf.buf, count * sizeof *ranges);
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].start > UINT64_MAX / 2 || ranges[i].len > UINT64_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "a range is out of bounds");
            goto done;
        }
        total += pagesum_windows(ranges[i].start, ranges[i].len);
    }
    if ((out = digests_of(total)) == NULL) {
        goto done;
    }
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pagesum_fd(fd, ranges, count, key.buf, (unsigned)threads, dst);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_CLEAR(out);
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
    }
done:
    PyMem_Free(ranges);
    PyBuffer_Release(&rbuf);
    PyBuffer_Release(&key);
    return out;
}

PyDoc_STRVAR(page_sums_compare_doc,
"page_sums_compare(fd, ranges, key, expected, threads, /)\n"
"--\n"
"\n"
"page_sums_fd(), compared with the digests `expected` (as many as it returns).\n"
"Returns (digests, runs): runs are the maximal runs of changed windows within\n"
"one range, each (range index, file offset, bytes), the bytes those windows were\n"
"hashed from. Raises as page_sums_fd(), and ValueError for a wrong `expected`.");

/* The runs of consecutive changed windows of one range, as a list of tuples. */
static PyObject *runs_of(const struct pagesum_diff *d)
{
    PyObject *runs = PyList_New(0);
    size_t i = 0;
    while (runs != NULL && i < d->count) {
        const struct pagesum_change *c = &d->changes[i];
        size_t j = i + 1, len = (size_t)c->len;
        while (j < d->count && d->changes[j].window == d->changes[j - 1].window + 1 &&
               d->changes[j].range == c->range) {
            len += (size_t)d->changes[j].len;
            j++;
        }
        PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
        PyObject *run = NULL;
        if (data != NULL) {
            char *dst = PyBytes_AS_STRING(data);
            for (size_t k = i; k < j; k++) {
                memcpy(dst, d->bytes + d->changes[k].offset, (size_t)d->changes[k].len);
                dst += d->changes[k].len;
            }
            run = Py_BuildValue("(KKN)", (unsigned long long)c->range,
                                (unsigned long long)c->start, data);
        }
        if (run == NULL || PyList_Append(runs, run) != 0) {
            Py_XDECREF(run);
            Py_CLEAR(runs);
            break;
        }
        Py_DECREF(run);
        i = j;
    }
    return runs;
}

static PyObject *native_page_sums_compare(PyObject *Py_UNUSED(module), PyObject *args)
{
    int fd, threads;
    Py_buffer rbuf, key, expected;
    if (!PyArg_ParseTuple(args, "iy*y*y*i:page_sums_compare", &fd, &rbuf, &key, &expected,
                          &threads)) {
        return NULL;
    }
    PyObject *out = NULL, *result = NULL;
    struct pagesum_range *ranges = NULL;
    struct pagesum_diff diff = {NULL, 0, NULL, 0};
    size_t count = (size_t)rbuf.len / sizeof *ranges;
    if (page_key(&key) != 0) {
        goto done;
    }
    if ((size_t)rbuf.len % sizeof *ranges != 0 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "ranges must be (start, length) pairs of u64");
        goto done;
    }
    ranges = PyMem_Malloc(count * sizeof *ranges + 1);
    if (ranges == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(ranges, rbuf.buf, count * sizeof *ranges);
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].start > UINT64_MAX / 2 || ranges[i].len > UINT64_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "a range is out of bounds");
            goto done;
        }
        total += pagesum_windows(ranges[i].start, ranges[i].len);
    }
    if ((uint64_t)expected.len != total * PAGESUM_LEN) {
        PyErr_SetString(PyExc_ValueError, "expected digests of another length");
        goto done;
    }
    if ((out = digests_of(total)) == NULL) {
        goto done;
    }
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pagesum_fd_diff(fd, ranges, count, key.buf, expected.buf, (unsigned)threads, dst,
                         &diff);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    PyObject *runs = runs_of(&diff);
    if (runs != NULL) {
        result = PyTuple_Pack(2, out, runs);
        Py_DECREF(runs);
    }
done:
    Py_XDECREF(out);
    pagesum_diff_free(&diff);
    PyMem_Free(ranges);
    PyBuffer_Release(&rbuf);
    PyBuffer_Release(&key);
    PyBuffer_Release(&expected);
    return result;
}

PyDoc_STRVAR(page_sums_diff_doc,
"page_sums_diff(a, b, /)\n"
"--\n"
"\n"
"Return the indices of the 16-byte digests that differ between a and b, two\n"
"buffers of the same length, a multiple of 16. Raises ValueError otherwise.");

static PyObject *native_page_sums_diff(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "y*y*:page_sums_diff", &a, &b)) {
        return NULL;
    }
    PyObject *out = NULL;
    if (a.len != b.len || (size_t)a.len % PAGESUM_LEN != 0) {
        PyErr_SetString(PyExc_ValueError, "digests of unequal lengths");
    } else if ((out = PyList_New(0)) != NULL) {
        const uint8_t *pa = a.buf, *pb = b.buf;
        size_t n = (size_t)a.len / PAGESUM_LEN;
        for (size_t i = 0; i < n; i++) {
            if (memcmp(pa + i * PAGESUM_LEN, pb + i * PAGESUM_LEN, PAGESUM_LEN) == 0) {
                continue;
            }
            PyObject *item = PyLong_FromSize_t(i);
            if (item == NULL || PyList_Append(out, item) != 0) {
                Py_XDECREF(item);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(item);
        }
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return out;
}

static PyMethodDef native_methods[] = {
    {"scan_dir", native_scan_dir, METH_VARARGS, scan_dir_doc},
    {"scan_tree", native_scan_tree, METH_VARARGS, scan_tree_doc},
    {"cut_points", (PyCFunction)(void (*)(void))native_cut_points,
     METH_VARARGS | METH_KEYWORDS, cut_points_doc},
    {"gear_table", native_gear_table, METH_NOARGS, gear_table_doc},
    {"blake3_256", native_blake3_256, METH_O, blake3_256_doc},
    {"page_sums", native_page_sums, METH_VARARGS, page_sums_doc},
    {"page_sums_fd", native_page_sums_fd, METH_VARARGS, page_sums_fd_doc},
    {"page_sums_diff", native_page_sums_diff, METH_VARARGS, page_sums_diff_doc},
    {"page_sums_compare", native_page_sums_compare, METH_VARARGS, page_sums_compare_doc},
    {NULL, NULL, 0, NULL},
};

static int native_exec(PyObject *module)
{
    PyObject *seed = PyLong_FromUnsignedLongLong(FASTCDC_GEAR_SEED);
    if (seed == NULL) {
        return -1;
    }
    int rc = PyModule_AddObjectRef(module, "GEAR_SEED", seed);
    Py_DECREF(seed);
    if (rc == 0) {
        rc = filewrite_add_functions(module); /* filewrite_py.c */
    }
    if (rc == 0) {
        rc = treesplice_add_functions(module); /* treesplice_py.c */
    }
    if (rc == 0) {
        rc = bulkread_add_functions(module); /* bulkread_py.c */
    }
    if (rc == 0) {
        rc = treescan_add_functions(module); /* treescan_py.c */
    }
    return rc;
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, (void *)native_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(module_doc,
"FastCDC content-defined chunking (normalized chunking level 2), in C.\n"
"\n"
"Use sprite_env.store.chunker instead of this module directly.");

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sprite_env._native",
    .m_doc = module_doc,
    .m_size = 0,
    .m_methods = native_methods,
    .m_slots = native_slots,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
