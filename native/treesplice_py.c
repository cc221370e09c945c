/*
 * treesplice_py.c - the CPython binding of treesplice.c: sig_diff, sig_splice, tree_splice,
 * tree_find, tree_find_many, tree_counts.
 *
 * Added to module sprite_env._native by treesplice_add_functions() (called from
 * _native.c's exec slot). Typed stubs: sprite_env/_native.pyi.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "treesplice.h"

struct lists {
    PyObject *changed, *removed;
};

static int append_name(PyObject *list, const uint8_t *name, size_t len)
{
    PyObject *b = PyBytes_FromStringAndSize((const char *)name, (Py_ssize_t)len);
    if (b == NULL) {
        return -1;
    }
    int rc = PyList_Append(list, b);
    Py_DECREF(b);
    return rc;
}

static int on_changed(const uint8_t *name, size_t len, void *ctx)
{
    return append_name(((struct lists *)ctx)->changed, name, len);
}

static int on_removed(const uint8_t *name, size_t len, void *ctx)
{
    return append_name(((struct lists *)ctx)->removed, name, len);
}

PyDoc_STRVAR(sig_diff_doc,
"sig_diff(new_blob, old_blob, /) -> (changed, removed)\n--\n\n"
"Compares two directories' signature blobs (dircache.encode_sigs()'s format, sorted by\n"
"name): changed lists the names of new_blob whose row differs from old_blob's, is\n"
"poisoned (racy) or is new; removed the names only in old_blob; both sorted.\n"
"Raises ValueError for a malformed blob.");

static PyObject *native_sig_diff(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "y*y*:sig_diff", &a, &b)) {
        return NULL;
    }
    struct lists l = {PyList_New(0), PyList_New(0)};
    PyObject *result = NULL;
    if (l.changed != NULL && l.removed != NULL) {
        int rc = sig_diff(a.buf, (size_t)a.len, b.buf, (size_t)b.len, on_changed, on_removed,
                          &l);
        if (rc == -1) {
            PyErr_SetString(PyExc_ValueError, "malformed signature blob");
        } else if (rc == 0) {
            result = PyTuple_Pack(2, l.changed, l.removed);
        }
    }
    Py_XDECREF(l.changed);
    Py_XDECREF(l.removed);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

/* The bytes of a list of bytes objects as spans (malloc'ed, the caller frees), valid while
 * the list is alive and the GIL held; NULL with an exception set (what: for the message). */
static struct span *spans_of(PyObject *list, const char *what)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    struct span *spans = calloc((size_t)n + 1u, sizeof *spans);
    if (spans == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(e)) {
            PyErr_Format(PyExc_TypeError, "%s must be bytes", what);
            free(spans);
            return NULL;
        }
        spans[i].data = (const uint8_t *)PyBytes_AS_STRING(e);
        spans[i].len = (size_t)PyBytes_GET_SIZE(e);
    }
    return spans;
}

PyDoc_STRVAR(sig_splice_doc,
"sig_splice(old_blob, patch, gone, /) -> bytes\n--\n\n"
"The signature blob (dircache.encode_sigs()'s format) of old_blob's rows with each row of\n"
"patch (same format, sorted) in place of old_blob's row of that name or added, and the\n"
"rows named in gone (a sorted list of bytes) left out. Raises ValueError for a malformed\n"
"blob, or patch or gone out of order or naming one child in both.");

static PyObject *native_sig_splice(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer old, patch;
    PyObject *gone;
    if (!PyArg_ParseTuple(args, "y*y*O!:sig_splice", &old, &patch, &PyList_Type, &gone)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(gone);
    struct span *spans = spans_of(gone, "gone names");
    if (spans == NULL) {
        goto out;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    /* the GIL is held throughout (the list and its bytes cannot change): a few KiB */
    int rc = sig_splice(old.buf, (size_t)old.len, patch.buf, (size_t)patch.len, spans, (size_t)n,
                        &buf, &len);
    if (rc == -5) {
        PyErr_NoMemory();
    } else if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, rc == -4 ? "patch or gone out of order"
                                                   : "malformed signature blob");
    } else {
        result = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    }
    free(buf);
out:
    free(spans);
    PyBuffer_Release(&old);
    PyBuffer_Release(&patch);
    return result;
}

PyDoc_STRVAR(tree_splice_doc,
"tree_splice(old_tree, blob, added, /) -> bytes\n--\n\n"
"The tree object holding, for each name of the signature blob in its order, the entry of\n"
"added (a list of encoded entries sorted by name) of that name, else old_tree's entry of\n"
"that name, copied byte for byte. Raises ValueError if old_tree is malformed, lacks a name\n"
"the blob has that added does not supply, or added names what the blob does not.");

static PyObject *native_tree_splice(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer old, blob;
    PyObject *added;
    if (!PyArg_ParseTuple(args, "y*y*O!:tree_splice", &old, &blob, &PyList_Type, &added)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(added);
    struct span *spans = spans_of(added, "added entries");
    if (spans == NULL) {
        goto out;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;
    /* the list (and so its bytes) stays alive and unchanged: we hold the GIL throughout,
     * the splice of a directory being a memcpy of at most a few hundred KiB */
    rc = tree_splice(old.buf, (size_t)old.len, blob.buf, (size_t)blob.len, spans, (size_t)n,
                     &buf, &len);
    if (rc == -5) {
        PyErr_NoMemory();
    } else if (rc != 0) {
        PyErr_Format(PyExc_ValueError, "cannot splice the tree (%s)",
                     rc == -3   ? "the old tree lacks an unchanged child"
                     : rc == -4 ? "an added entry is not in the listing"
                                : "malformed tree or blob");
    } else {
        result = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    }
    free(buf);
out:
    free(spans);
    PyBuffer_Release(&old);
    PyBuffer_Release(&blob);
    return result;
}

static int on_dir(const uint8_t *name, size_t len, void *ctx)
{
    return append_name((PyObject *)ctx, name, len);
}

PyDoc_STRVAR(tree_counts_doc,
"tree_counts(tree, /) -> (files, bytes, symlinks, specials, dirs)\n--\n\n"
"What the tree object holds directly: its regular files, their bytes, its symlinks, its\n"
"other non-directories, and the names of its subdirectories (in order). Raises ValueError\n"
"for a malformed tree.");

static PyObject *native_tree_counts(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer tree;
    if (PyObject_GetBuffer(arg, &tree, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    PyObject *dirs = PyList_New(0);
    PyObject *result = NULL;
    uint64_t c[4];
    if (dirs != NULL) {
        int rc = tree_counts(tree.buf, (size_t)tree.len, c, on_dir, dirs);
        if (rc == -1) {
            PyErr_SetString(PyExc_ValueError, "malformed tree");
        } else if (rc == 0) {
            result = Py_BuildValue("(KKKKO)", (unsigned long long)c[0], (unsigned long long)c[1],
                                   (unsigned long long)c[2], (unsigned long long)c[3], dirs);
        }
    }
    Py_XDECREF(dirs);
    PyBuffer_Release(&tree);
    return result;
}

PyDoc_STRVAR(tree_find_doc,
"tree_find(tree, name, /) -> bytes | None\n--\n\n"
"The encoded entry called name in the tree object, or None. Raises ValueError for a\n"
"malformed tree.");

static PyObject *native_tree_find(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer tree, name;
    if (!PyArg_ParseTuple(args, "y*y*:tree_find", &tree, &name)) {
        return NULL;
    }
    size_t at = 0, len = 0;
    int rc = tree_find(tree.buf, (size_t)tree.len, name.buf, (size_t)name.len, &at, &len);
    PyObject *result = NULL;
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed tree");
    } else if (rc == 1) {
        result = Py_NewRef(Py_None);
    } else {
        result = PyBytes_FromStringAndSize((const char *)tree.buf + at, (Py_ssize_t)len);
    }
    PyBuffer_Release(&tree);
    PyBuffer_Release(&name);
    return result;
}

PyDoc_STRVAR(tree_find_many_doc,
"tree_find_many(tree, names, /) -> list[bytes | None]\n--\n\n"
"tree_find of each of names (a list of bytes, any order), in one pass over the tree.\n"
"Raises ValueError for a malformed tree, TypeError for a name that is not bytes.");

static PyObject *native_tree_find_many(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer tree;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "y*O!:tree_find_many", &tree, &PyList_Type, &names)) {
        return NULL;
    }
    PyObject *result = NULL;
    /* a copy of the list: the names' buffers must outlive the search */
    PyObject *held = PyList_GetSlice(names, 0, PyList_GET_SIZE(names));
    Py_ssize_t k = held != NULL ? PyList_GET_SIZE(held) : 0;
    struct tree_name *want = held != NULL ? calloc(k > 0 ? (size_t)k : 1, sizeof *want) : NULL;
    if (held == NULL || want == NULL) {
        if (held != NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *b = PyList_GET_ITEM(held, i);
        if (!PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            goto done;
        }
        want[i].name = (const uint8_t *)PyBytes_AS_STRING(b);
        want[i].len = (size_t)PyBytes_GET_SIZE(b);
    }
    int rc = tree_find_many(tree.buf, (size_t)tree.len, want, (size_t)k);
    if (rc == -1) {
        PyErr_SetString(PyExc_ValueError, "malformed tree");
        goto done;
    }
    if (rc != 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(k);
    for (Py_ssize_t i = 0; result != NULL && i < k; i++) {
        PyObject *item = want[i].entry_len == 0
                             ? Py_NewRef(Py_None)
                             : PyBytes_FromStringAndSize((const char *)tree.buf + want[i].at,
                                                         (Py_ssize_t)want[i].entry_len);
        if (item == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    free(want);
    Py_XDECREF(held);
    PyBuffer_Release(&tree);
    return result;
}

PyDoc_STRVAR(tree_spans_doc,
"tree_spans(tree, /) -> dict[bytes, bytes]\n--\n\n"
"The tree object's entries by name, each left encoded (snapshot/tree.py entry_spans).\n"
"Raises ValueError for a malformed tree (bad magic, truncated, trailing bytes).");

static PyObject *native_tree_spans(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer tree;
    if (PyObject_GetBuffer(arg, &tree, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    const uint8_t *buf = tree.buf;
    size_t len = (size_t)tree.len;
    uint32_t count = 0;
    PyObject *out = NULL;
    if (tree_check_head(buf, len, &count) != 0) {
        PyErr_SetString(PyExc_ValueError, "malformed tree: bad magic");
        goto done;
    }
    out = PyDict_New();
    if (out == NULL) {
        goto done;
    }
    size_t off = TREE_HEAD;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *name;
        size_t nlen, elen;
        if (tree_entry_at(buf, len, off, &name, &nlen, &elen) != 0) {
            PyErr_SetString(PyExc_ValueError, "malformed tree: truncated");
            goto fail;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)name, (Py_ssize_t)nlen);
        PyObject *v = k ? PyBytes_FromStringAndSize((const char *)buf + off, (Py_ssize_t)elen) : NULL;
        int rc = v ? PyDict_SetItem(out, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc != 0) {
            goto fail;
        }
        off += elen;
    }
    if (off != len) {
        PyErr_SetString(PyExc_ValueError, "malformed tree: trailing bytes");
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&tree);
    return out;
}

static PyMethodDef treesplice_methods[] = {
    {"sig_diff", native_sig_diff, METH_VARARGS, sig_diff_doc},
    {"sig_splice", native_sig_splice, METH_VARARGS, sig_splice_doc},
    {"tree_splice", native_tree_splice, METH_VARARGS, tree_splice_doc},
    {"tree_find", native_tree_find, METH_VARARGS, tree_find_doc},
    {"tree_find_many", native_tree_find_many, METH_VARARGS, tree_find_many_doc},
    {"tree_counts", native_tree_counts, METH_O, tree_counts_doc},
    {"tree_spans", native_tree_spans, METH_O, tree_spans_doc},
    {NULL, NULL, 0, NULL},
};

int treesplice_add_functions(PyObject *module);

int treesplice_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, treesplice_methods);
}
