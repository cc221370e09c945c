/*
 * filewrite_py.c - the CPython binding of filewrite.c: write_files.
 *
 * Added to module sprite_env._native by filewrite_add_functions() (called from
 * _native.c's exec slot). Typed stub: sprite_env/_native.pyi.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "filewrite.h"
#include "nstime.h"

/* A chunk list entry: id:32 offset:u32 length:u32, little-endian (snapshot/tree.py). */
#define CHUNK_LEN 40
#define ID_LEN 32

static const char *step_name(enum fw_step s)
{
    switch (s) {
    case FW_OPEN: return "create";
    case FW_WRITE: return "write";
    case FW_TRUNCATE: return "truncate";
    case FW_CHOWN: return "chown";
    case FW_LISTXATTR: return "listxattr";
    case FW_CHMOD: return "chmod";
    case FW_UTIME: return "utime";
    case FW_CLOSE: return "close";
    default: return "write";
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_hole(const uint8_t *id)
{
    for (int i = 0; i < ID_LEN; i++) {
        if (id[i]) {
            return 0;
        }
    }
    return 1;
}

PyDoc_STRVAR(write_files_doc,
"write_files(files, objects, /) -> list[int]\n--\n\n"
"Creates and writes each file of files, a list of (dirfd, name, mode, uid, gid, mtime_ns,\n"
"chunks): chunks is a chunk list as tree objects encode it, its pieces' bytes taken from\n"
"objects (id -> bytes; an all-zero id is a hole, never written). Owner, mode and times\n"
"are set; the GIL is released while the files are written, in order. Returns the indices\n"
"of the files created with extended attributes (inherited ones: the caller sets them).\n"
"Raises OSError (with the name) for the first file that failed, which is removed and\n"
"after which nothing is written; ValueError for a malformed chunk list, an object not\n"
"given or shorter than a piece of it, or a name with a slash.\n\n"
"Steps known to be no-ops are skipped: owner (uid, gid) is the owner a new file gets\n"
"here (no fchown for a file of that owner; None: always); umask the process's (>= 0: a\n"
"file whose mode is plain permission bits the umask keeps is created with it, no\n"
"fchmod; -1: always); xattrs false: no directory here hands down extended attributes\n"
"(no flistxattr; the result is then empty).");

static PyObject *native_write_files(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"", "", "owner", "umask", "xattrs", NULL};
    PyObject *files_in, *objects, *owner = Py_None;
    int umask_ = -1, xattrs = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|$Oip:write_files", kwlist, &files_in,
                                     &PyDict_Type, &objects, &owner, &umask_, &xattrs)) {
        return NULL;
    }
    int have_owner = owner != Py_None;
    unsigned int own_uid = 0, own_gid = 0;
    if (have_owner && !PyArg_ParseTuple(owner, "II:owner", &own_uid, &own_gid)) {
        return NULL;
    }
    if (umask_ > 0777) {
        PyErr_SetString(PyExc_ValueError, "umask must be -1 or permission bits");
        return NULL;
    }
    /* our own references: the list and the dict may change once the GIL is released */
    PyObject *files = PySequence_Tuple(files_in);
    if (files == NULL) {
        return NULL;
    }
    PyObject *keep = PyList_New(0);
    PyObject *result = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(files);
    struct fw_file *fw = calloc((size_t)n + 1u, sizeof *fw);
    size_t total = 0;
    struct fw_piece *pieces = NULL;
    if (keep == NULL || fw == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(files, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7 ||
            !PyBytes_Check(PyTuple_GET_ITEM(t, 6))) {
            PyErr_SetString(PyExc_TypeError,
                            "a file is (dirfd, name, mode, uid, gid, mtime_ns, chunks: bytes)");
            goto out;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 6));
        if (plen % CHUNK_LEN) {
            PyErr_SetString(PyExc_ValueError, "malformed chunk list (length)");
            goto out;
        }
        total += (size_t)(plen / CHUNK_LEN);
    }
    pieces = calloc(total + 1u, sizeof *pieces);
    if (pieces == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    size_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(files, i);
        struct fw_file *f = &fw[i];
        const char *chunks;
        Py_ssize_t clen;
        unsigned int mode, uid, gid;
        long long mtime;
        if (!PyArg_ParseTuple(t, "iyIIILy#", &f->dirfd, &f->name, &mode, &uid, &gid, &mtime,
                              &chunks, &clen)) {
            goto out;
        }
        if (strchr(f->name, '/') != NULL || f->name[0] == '\0') {
            PyErr_SetString(PyExc_ValueError, "a file name must be one component");
            goto out;
        }
        f->mode = mode & 07777u;
        f->uid = uid;
        f->gid = gid;
        f->mtime_ns = mtime;
        f->chown = !have_owner || uid != own_uid || gid != own_gid;
        /* plain permission bits only: chown clears setuid/setgid, and a create may drop
         * setgid for a group the process is not in */
        int as_is = umask_ >= 0 && (f->mode & 07000u) == 0 && (f->mode & (unsigned)umask_) == 0;
        f->create_mode = as_is ? f->mode : 0600u;
        f->chmod = !as_is;
        f->check_xattrs = xattrs;
        f->pieces = &pieces[k];
        f->npieces = (size_t)(clen / CHUNK_LEN);
        for (Py_ssize_t at = 0; at < clen; at += CHUNK_LEN, k++) {
            const uint8_t *c = (const uint8_t *)chunks + at;
            uint32_t off = le32(c + ID_LEN), len = le32(c + ID_LEN + 4);
            pieces[k].len = len;
            if (is_hole(c)) {
                pieces[k].data = NULL;
                continue;
            }
            PyObject *key = PyBytes_FromStringAndSize((const char *)c, ID_LEN);
            if (key == NULL) {
                goto out;
            }
            PyObject *v = PyDict_GetItemWithError(objects, key); /* borrowed */
            Py_DECREF(key);
            if (v == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "an object of a chunk list is not given");
                }
                goto out;
            }
            if (!PyBytes_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "objects must be bytes");
                goto out;
            }
            if ((uint64_t)off + len > (uint64_t)PyBytes_GET_SIZE(v)) {
                PyErr_SetString(PyExc_ValueError, "an object is shorter than its piece");
                goto out;
            }
            if (PyList_Append(keep, v) != 0) {
                goto out;
            }
            pieces[k].data = (const uint8_t *)PyBytes_AS_STRING(v) + off;
        }
    }
    Py_ssize_t failed = -1;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        err = fw_write(&fw[i]);
        if (err) {
            failed = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed >= 0) {
        /* OSError(errno, "strerror (step)", filename): the errno picks the subclass */
        PyObject *name = PyBytes_FromString(fw[failed].name);
        PyObject *msg = PyUnicode_FromFormat("%s (%s)", strerror(err), step_name(fw[failed].step));
        if (name != NULL && msg != NULL) {
            PyObject *e = PyObject_CallFunction(PyExc_OSError, "iOO", err, msg, name);
            if (e != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(e), e);
                Py_DECREF(e);
            }
        }
        Py_XDECREF(msg);
        Py_XDECREF(name);
        goto out;
    }
    result = PyList_New(0);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        if (fw[i].has_xattrs) {
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL || PyList_Append(result, ix) != 0) {
                Py_CLEAR(result);
            }
            Py_XDECREF(ix);
        }
    }
out:
    free(pieces);
    free(fw);
    Py_XDECREF(keep);
    Py_DECREF(files);
    return result;
}

/* An item of touch_captured(): what the capture saw, and the mtime to set. */
struct touch {
    const char *name;
    unsigned int mode;
    unsigned int uid, gid;
    unsigned long long nlink;
    long long mtime_ns, size, new_ns;
    int done;
};

static void touch_one(int dirfd, struct touch *t)
{
    /* The very inode the capture saw, reached through a descriptor (never by name: a link
     * to a file outside the layer planted meanwhile would get the checkpoint's times). */
    int fd = openat(dirfd, t->name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (unsigned int)st.st_mode == t->mode &&
        st.st_uid == t->uid && st.st_gid == t->gid && (unsigned long long)st.st_nlink == t->nlink &&
        nstime_of(st.st_mtim) == t->mtime_ns &&
        (long long)st.st_size == t->size) {
        struct timespec times[2] = {nstime_split(t->new_ns), nstime_split(t->new_ns)};
        t->done = futimens(fd, times) == 0;
    }
    close(fd);
}

PyDoc_STRVAR(touch_captured_doc,
"touch_captured(dirfd, items, /) -> list[int]\n--\n\n"
"Sets back the mtime of files whose only change is their mtime. Each of items is (name,\n"
"mode, uid, gid, nlink, mtime_ns, size, new_mtime_ns): the regular file name in the\n"
"directory open at dirfd is opened (O_RDONLY | O_NONBLOCK | O_NOFOLLOW) and, if its fstat\n"
"shows exactly that st_mode (type and permission bits), owner, group, link count, mtime and\n"
"size, its atime and mtime are set to new_mtime_ns through that descriptor. The GIL is\n"
"released for the whole batch. Returns the indices of the items left as they were (another\n"
"inode, or an error): the caller decides each of those on its own. Raises ValueError for a\n"
"name that is not bytes without NUL or a slash.");

static PyObject *native_touch_captured(PyObject *self, PyObject *args)
{
    (void)self;
    int dirfd;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "iO!:touch_captured", &dirfd, &PyList_Type, &items)) {
        return NULL;
    }
    /* a copy: the names' bytes stay alive, and unchanged, while the GIL is out */
    PyObject *own = PyList_GetSlice(items, 0, PyList_GET_SIZE(items));
    if (own == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(own);
    PyObject *result = NULL;
    struct touch *ts = calloc(n > 0 ? (size_t)n : 1u, sizeof *ts);
    if (ts == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        struct touch *t = &ts[i];
        Py_ssize_t nlen = 0;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(own, i), "y#IIIKLLL:touch_captured", &t->name,
                              &nlen, &t->mode, &t->uid, &t->gid, &t->nlink, &t->mtime_ns,
                              &t->size, &t->new_ns)) {
            goto out;
        }
        if (nlen == 0 || strlen(t->name) != (size_t)nlen || memchr(t->name, '/', (size_t)nlen)) {
            PyErr_SetString(PyExc_ValueError, "a name must be bytes without NUL or slash");
            goto out;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        touch_one(dirfd, &ts[i]);
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(0);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        if (ts[i].done) {
            continue;
        }
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL || PyList_Append(result, v) != 0) {
            Py_XDECREF(v);
            Py_CLEAR(result);
            break;
        }
        Py_DECREF(v);
    }
out:
    free(ts);
    Py_DECREF(own);
    return result;
}

static PyMethodDef filewrite_methods[] = {
    {"touch_captured", native_touch_captured, METH_VARARGS, touch_captured_doc},
    {"write_files", (PyCFunction)(void (*)(void))native_write_files, METH_VARARGS | METH_KEYWORDS,
     write_files_doc},
    {NULL, NULL, 0, NULL},
};

int filewrite_add_functions(PyObject *module);

int filewrite_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, filewrite_methods);
}
