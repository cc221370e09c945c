/*
 * treescan_py.c - the CPython binding of treescan.c's listing walk: scan_listing.
 *
 * (scan_tree, the comparison walk, is bound in _native.c.) Added to module
 * sprite_env._native by treescan_add_functions() (called from _native.c's exec slot).
 * Typed stub: sprite_env/_native.pyi.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "treescan.h"
#include "treescan_py.h"

/* An os.stat_result of st, filled field by field (its 19 fields on Linux, in the order of
 * its constructor: the 10 of the tuple, the float times, the ns times, blksize, blocks,
 * rdev): no tuple built first and no constructor call, for each of the 127k children of
 * the medium layer. */
static PyObject *stat_result(PyTypeObject *type, const struct stat *st)
{
    PyObject *r = PyStructSequence_New(type);
    if (r == NULL) {
        return NULL;
    }
    long long a = (long long)st->st_atim.tv_sec, m = (long long)st->st_mtim.tv_sec,
              c = (long long)st->st_ctim.tv_sec;
    long long an = a * 1000000000LL + st->st_atim.tv_nsec;
    long long mn = m * 1000000000LL + st->st_mtim.tv_nsec;
    long long cn = c * 1000000000LL + st->st_ctim.tv_nsec;
    PyObject *v[19] = {
        PyLong_FromUnsignedLong((unsigned long)st->st_mode),
        PyLong_FromUnsignedLongLong((unsigned long long)st->st_ino),
        PyLong_FromUnsignedLongLong((unsigned long long)st->st_dev),
        PyLong_FromUnsignedLongLong((unsigned long long)st->st_nlink),
        PyLong_FromUnsignedLong((unsigned long)st->st_uid),
        PyLong_FromUnsignedLong((unsigned long)st->st_gid),
        PyLong_FromLongLong((long long)st->st_size),
        PyLong_FromLongLong(a),
        PyLong_FromLongLong(m),
        PyLong_FromLongLong(c),
        PyFloat_FromDouble((double)a + (double)st->st_atim.tv_nsec * 1e-9),
        PyFloat_FromDouble((double)m + (double)st->st_mtim.tv_nsec * 1e-9),
        PyFloat_FromDouble((double)c + (double)st->st_ctim.tv_nsec * 1e-9),
        PyLong_FromLongLong(an),
        PyLong_FromLongLong(mn),
        PyLong_FromLongLong(cn),
        PyLong_FromLong((long)st->st_blksize),
        PyLong_FromLongLong((long long)st->st_blocks),
        PyLong_FromUnsignedLongLong((unsigned long long)st->st_rdev),
    };
    int ok = 1;
    for (Py_ssize_t i = 0; i < 19; i++) {
        if (v[i] == NULL) {
            ok = 0;
            v[i] = Py_NewRef(Py_None); /* every slot filled: the result is freed whole */
        }
        PyStructSequence_SetItem(r, i, v[i]); /* steals */
    }
    if (!ok) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *listing_result(const struct treescan_result *r, PyTypeObject *type)
{
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < r->count; i++) {
        const struct treescan_dir *d = r->dirs[i];
        if (!d->listed) {
            continue; /* the caller lists it itself */
        }
        PyObject *kids = PyList_New((Py_ssize_t)d->n_kids);
        if (kids == NULL) {
            goto fail;
        }
        for (size_t j = 0; j < d->n_kids; j++) {
            const struct treescan_kid *k = &d->kids[j];
            PyObject *name = PyBytes_FromStringAndSize(d->kid_names + k->name_off,
                                                       (Py_ssize_t)k->name_len);
            PyObject *st = name != NULL ? stat_result(type, &k->st) : NULL;
            PyObject *pair = st != NULL ? PyTuple_Pack(2, name, st) : NULL;
            Py_XDECREF(name);
            Py_XDECREF(st);
            if (pair == NULL) {
                Py_DECREF(kids);
                goto fail;
            }
            PyList_SET_ITEM(kids, (Py_ssize_t)j, pair);
        }
        PyObject *path = PyBytes_FromStringAndSize(d->path, (Py_ssize_t)d->path_len);
        int rc = path == NULL ? -1 : PyDict_SetItem(out, path, kids);
        Py_XDECREF(path);
        Py_DECREF(kids);
        if (rc != 0) {
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* Both walks' exclusions (scan_tree's in _native.c, scan_listing's here): the (st_dev,
 * st_ino) pairs and the fnmatch patterns, as treescan_params takes them. The sequences
 * (PySequence_Fast) keep the pattern bytes alive until treescan_excludes_free. */
int treescan_excludes_parse(PyObject *inodes_arg, PyObject *patterns_arg,
                            struct treescan_excludes *x)
{
    memset(x, 0, sizeof *x);
    x->inodes = PySequence_Fast(inodes_arg, "exclude_inodes must be a sequence");
    x->patterns = PySequence_Fast(patterns_arg, "patterns must be a sequence");
    if (x->inodes == NULL || x->patterns == NULL) {
        return -1;
    }
    Py_ssize_t n_inos = PySequence_Fast_GET_SIZE(x->inodes);
    Py_ssize_t n_pats = PySequence_Fast_GET_SIZE(x->patterns);
    x->inos = PyMem_Malloc(sizeof(uint64_t) * (size_t)(2 * n_inos + 1));
    x->pats = PyMem_Malloc(sizeof(char *) * (size_t)(n_pats + 1));
    x->pat_lens = PyMem_Malloc(sizeof(size_t) * (size_t)(n_pats + 1));
    if (x->inos == NULL || x->pats == NULL || x->pat_lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_inos; i++) {
        unsigned long long dev, ino;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(x->inodes, i), "KK:exclude_inodes", &dev,
                              &ino)) {
            return -1;
        }
        x->inos[2 * i] = (uint64_t)dev;
        x->inos[2 * i + 1] = (uint64_t)ino;
    }
    x->n_inos = (size_t)n_inos;
    for (Py_ssize_t i = 0; i < n_pats; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(x->patterns, i);
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "patterns must be bytes");
            return -1;
        }
        x->pats[i] = PyBytes_AS_STRING(p);
        x->pat_lens[i] = (size_t)PyBytes_GET_SIZE(p);
    }
    x->n_pats = (size_t)n_pats;
    return 0;
}

void treescan_excludes_free(struct treescan_excludes *x)
{
    PyMem_Free(x->inos);
    PyMem_Free(x->pats);
    PyMem_Free(x->pat_lens);
    Py_XDECREF(x->inodes);
    Py_XDECREF(x->patterns);
    memset(x, 0, sizeof *x);
}

PyDoc_STRVAR(scan_listing_doc,
"scan_listing(fd, root_dev, exclude_inodes, patterns, threads, /) -> dict\n--\n\n"
"Walk the tree below the directory open at fd as scan_tree() does (same threads, same\n"
"subtrees left out: mount points, excluded inodes, '*'/'?' patterns), with the GIL\n"
"released, and return every directory's listing by path (b'' the root): its children as\n"
"(name, os.stat_result of lstat), sorted by name, excluded children, sockets and mount\n"
"points included. A directory that could not be listed, or with a child that could not\n"
"be stat'ed for a reason other than vanishing, is absent. Raises OSError if the root\n"
"cannot be read.");

static PyObject *native_scan_listing(PyObject *self, PyObject *args)
{
    (void)self;
    int fd, threads;
    unsigned long long root_dev;
    PyObject *inodes_arg, *patterns_arg;
    if (!PyArg_ParseTuple(args, "iKOOi:scan_listing", &fd, &root_dev, &inodes_arg,
                          &patterns_arg, &threads)) {
        return NULL;
    }
    PyObject *os = PyImport_ImportModule("os");
    PyObject *type = os != NULL ? PyObject_GetAttrString(os, "stat_result") : NULL;
    Py_XDECREF(os);
    if (type == NULL) {
        return NULL;
    }
    PyObject *n_fields = PyObject_GetAttrString(type, "n_fields");
    long nf = n_fields != NULL ? PyLong_AsLong(n_fields) : -1;
    Py_XDECREF(n_fields);
    if (!PyType_Check(type) || nf != 19) {
        Py_DECREF(type);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "os.stat_result has not the 19 fields of Linux");
        }
        return NULL;
    }
    struct treescan_excludes x;
    struct treescan_cache *cache = NULL;
    struct treescan_result r = {NULL, 0};
    PyObject *result = NULL;
    if (treescan_excludes_parse(inodes_arg, patterns_arg, &x) != 0) {
        goto out;
    }
    cache = treescan_cache_new(0);
    if (cache == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    struct treescan_params params = {
        .root_dev = (uint64_t)root_dev,
        .exclude_inodes = x.inos,
        .n_exclude_inodes = x.n_inos,
        .patterns = x.pats,
        .pattern_lens = x.pat_lens,
        .n_patterns = x.n_pats,
        .cache = cache,
        .threads = threads,
        .keep_listing = 1,
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
    result = listing_result(&r, (PyTypeObject *)type);
out:
    treescan_free(&r);
    treescan_cache_free(cache);
    treescan_excludes_free(&x);
    Py_DECREF(type);
    return result;
}

static PyMethodDef treescan_methods[] = {
    {"scan_listing", native_scan_listing, METH_VARARGS, scan_listing_doc},
    {NULL, NULL, 0, NULL},
};

int treescan_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, treescan_methods);
}
