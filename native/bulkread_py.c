/*
 * bulkread_py.c - the CPython binding of bulkread.c: read_start, read_finish, read_files;
 * and lstat_names, open_at, close_fd, set_mtime and handle_at: system calls of the walks
 * and the journal made with the GIL kept.
 *
 * Added to module sprite_env._native by bulkread_add_functions() (called from _native.c's
 * exec slot). Typed stub: sprite_env/_native.pyi.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bulkread.h"
#include "fastcdc.h"
#include "nstime.h"

/* True if b is bytes that can be passed to the kernel as a name (no NUL inside it). */
static int is_c_name(PyObject *b)
{
    return PyBytes_Check(b) && (Py_ssize_t)strlen(PyBytes_AS_STRING(b)) == PyBytes_GET_SIZE(b);
}

/* os.stat_result's 19 fields, in its constructor's order. */
static PyObject *stat_tuple(const struct stat *st)
{
    long long a = (long long)st->st_atim.tv_sec, m = (long long)st->st_mtim.tv_sec,
              c = (long long)st->st_ctim.tv_sec;
    long long an = a * 1000000000LL + st->st_atim.tv_nsec;
    long long mn = m * 1000000000LL + st->st_mtim.tv_nsec;
    long long cn = c * 1000000000LL + st->st_ctim.tv_nsec;
    return Py_BuildValue("(IKKKIILLLLdddLLLlLK)", (unsigned)st->st_mode,
                         (unsigned long long)st->st_ino, (unsigned long long)st->st_dev,
                         (unsigned long long)st->st_nlink, (unsigned)st->st_uid,
                         (unsigned)st->st_gid, (long long)st->st_size, a, m, c,
                         (double)an / 1e9, (double)mn / 1e9, (double)cn / 1e9, an, mn, cn,
                         (long)st->st_blksize, (long long)st->st_blocks,
                         (unsigned long long)st->st_rdev);
}

/* (stat, data, ends, ids, xattr_fd) of a file read, or None. */
static PyObject *file_result(struct bulk_file *f)
{
    if (f->status != 0) {
        Py_RETURN_NONE;
    }
    PyObject *ends = PyList_New((Py_ssize_t)f->nchunks);
    if (ends == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < f->nchunks; i++) {
        PyObject *v = PyLong_FromSize_t(f->ends[i]);
        if (v == NULL) {
            Py_DECREF(ends);
            return NULL;
        }
        PyList_SET_ITEM(ends, (Py_ssize_t)i, v);
    }
    /* y# of a NULL pointer would be None: an empty file's bytes are b"" */
    const char *data = f->data != NULL ? (const char *)f->data : "";
    return Py_BuildValue("(Ny#Ny#i)", stat_tuple(&f->st), data,
                         (Py_ssize_t)f->len, ends, (const char *)f->ids,
                         (Py_ssize_t)(f->nchunks * BULK_ID_LEN), f->xattr_fd);
}

/* A batch in flight: what the capsule of read_start() holds. */
struct pending {
    struct bulk_task *task; /* NULL once finished */
    struct bulk_file *files;
    Py_ssize_t n;
    PyObject *names; /* a list: keeps the names' bytes alive while the pool reads */
};

#define CAPSULE_NAME "sprite_env._native.read_start"

/* How long read_finish waits for its batch with the GIL held before it lets go of it (the
 * pool's threads do not need it). Released, the GIL can take up to the switch interval
 * (5 ms) to come back beside a busy Python thread. A/B over 600 directories of the medium
 * layer (5.9k files), scan_dir + read_start + read_finish each as a journal walk does,
 * warm, beside a thread compressing with zstd between bits of Python, 7 rounds
 * alternating, load 11: released at once 1.17 s, held up to 1 ms 0.85 s (alone: 0.83 and
 * 0.76 s). */
#define READ_FINISH_HOLD_NS 1000000L

static void pending_free(struct pending *p)
{
    if (p->task != NULL) {
        Py_BEGIN_ALLOW_THREADS
        bulk_finish(p->task);
        Py_END_ALLOW_THREADS
        p->task = NULL;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        bulk_file_free(&p->files[i]);
        if (p->files[i].status == 0 && p->files[i].xattr_fd >= 0) {
            close(p->files[i].xattr_fd); /* not handed over */
        }
    }
    free(p->files);
    Py_XDECREF(p->names);
    free(p);
}

static void pending_destroy(PyObject *capsule)
{
    struct pending *p = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (p != NULL) {
        pending_free(p); /* never collected: waits for the pool, then drops the results */
    }
}

PyDoc_STRVAR(read_start_doc,
"read_start(dirfd, names, limit, min_size, avg_size, max_size, threads, lazy=False, /)\n"
"-> batch\n--\n\n"
"Starts reading, chunking and hashing the files names (bytes, in the directory open at\n"
"dirfd, which the batch duplicates) on up to threads threads of a pool, without the GIL,\n"
"and returns at once; read_finish(batch) gives the results. Raises ValueError for bad\n"
"chunking parameters or a name that is not bytes without NUL, OSError if the batch could\n"
"not be started. lazy: wake a pool thread only if none is awake, and let the pool wake\n"
"the rest (for many batches started in a row and waited for later).");

static PyObject *native_read_start(PyObject *self, PyObject *args)
{
    (void)self;
    int dirfd;
    PyObject *names;
    Py_ssize_t limit, min_size, avg_size, max_size;
    unsigned threads;
    int lazy = 0;
    if (!PyArg_ParseTuple(args, "iO!nnnnI|p:read_start", &dirfd, &PyList_Type, &names, &limit,
                          &min_size, &avg_size, &max_size, &threads, &lazy)) {
        return NULL;
    }
    if (limit < 0 || min_size < 0 || avg_size < 0 || max_size < 0) {
        PyErr_SetString(PyExc_ValueError, "sizes must not be negative");
        return NULL;
    }
    int rc = fastcdc_validate((size_t)min_size, (size_t)avg_size, (size_t)max_size);
    if (rc != FASTCDC_OK) {
        PyErr_SetString(PyExc_ValueError, fastcdc_strerror(rc));
        return NULL;
    }
    struct pending *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return PyErr_NoMemory();
    }
    /* a copy of the list: another thread could change the caller's meanwhile */
    p->names = PyList_GetSlice(names, 0, PyList_GET_SIZE(names));
    if (p->names == NULL) {
        free(p);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(p->names);
    p->files = calloc(n > 0 ? (size_t)n : 1, sizeof *p->files);
    if (p->files == NULL) {
        pending_free(p);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(p->names, i);
        if (!is_c_name(b)) {
            pending_free(p);
            PyErr_SetString(PyExc_ValueError, "names must be bytes without NUL");
            return NULL;
        }
        p->files[i].name = PyBytes_AS_STRING(b);
        p->files[i].status = BULK_FALLBACK;
        p->files[i].xattr_fd = -1;
    }
    p->n = n;
    /* With the GIL held: the pool's threads never take it, so waiting here for the pool's
     * lock (held by them for a few instructions at a time) cannot deadlock, and releasing
     * the GIL for those microseconds would cost, beside a busy Python thread, up to its
     * switch interval (5 ms) to take it back, for each directory of the walk. */
    p->task = bulk_start(dirfd, p->files, (size_t)n, (size_t)limit, (size_t)min_size,
                         (size_t)avg_size, (size_t)max_size, threads, lazy != 0);
    if (p->task == NULL) {
        int err = errno ? errno : ENOMEM;
        pending_free(p);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *capsule = PyCapsule_New(p, CAPSULE_NAME, pending_destroy);
    if (capsule == NULL) {
        pending_free(p);
    }
    return capsule;
}

PyDoc_STRVAR(read_finish_doc,
"read_finish(batch, /) -> list\n--\n\n"
"Waits (GIL released, unless it is done already) for a batch of read_start() and\n"
"returns one result per name: None when the file is not plain (not a regular file of\n"
"one link and at most limit bytes, holes, changed while read, any error: the caller's\n"
"general path decides) or\n"
"(stat, data, ends, ids, xattr_fd): the 19 fields of os.stat_result after the read, the\n"
"bytes, the chunks' exclusive ends (the streaming chunker's boundaries), their BLAKE3-256\n"
"ids concatenated (32 bytes each), and the file's descriptor if it may have xattrs (the\n"
"caller reads and closes it), else -1. Raises ValueError for a batch already finished.");

static PyObject *native_read_finish(PyObject *self, PyObject *capsule)
{
    (void)self;
    struct pending *p = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (p == NULL) {
        return NULL;
    }
    if (p->task == NULL) {
        PyErr_SetString(PyExc_ValueError, "batch already finished");
        return NULL;
    }
    struct bulk_task *task = p->task;
    if (bulk_wait(task, READ_FINISH_HOLD_NS)) {
        bulk_finish(task); /* nothing more to wait for: the GIL was kept (see read_start) */
    } else {
        Py_BEGIN_ALLOW_THREADS
        bulk_finish(task);
        Py_END_ALLOW_THREADS
    }
    p->task = NULL;
    PyObject *out = PyList_New(p->n);
    for (Py_ssize_t i = 0; out != NULL && i < p->n; i++) {
        PyObject *r = file_result(&p->files[i]);
        if (r == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, r);
        p->files[i].xattr_fd = -1; /* handed over */
        bulk_file_free(&p->files[i]); /* copied: the memory goes back at once */
    }
    return out;
}

PyDoc_STRVAR(read_files_doc,
"read_files(dirfd, names, limit, min_size, avg_size, max_size, threads, /) -> list\n--\n\n"
"read_finish(read_start(...)): the same results, waited for.");

static PyObject *native_read_files(PyObject *self, PyObject *args)
{
    PyObject *batch = native_read_start(self, args);
    if (batch == NULL) {
        return NULL;
    }
    PyObject *out = native_read_finish(self, batch);
    Py_DECREF(batch);
    return out;
}

/* At most this many names are stated with the GIL held by lstat_names (as scan_dir). */
#define LSTAT_KEEP_GIL 256

PyDoc_STRVAR(lstat_names_doc,
"lstat_names(dirfd, names, /) -> list\n--\n\n"
"The os.stat_result fields (19, as read_finish gives them) of each of names (bytes) in the\n"
"directory open at dirfd, symlinks not followed, or None for a name that does not exist.\n"
"The GIL is kept for up to 256 names (each stat is a microsecond or two; a released GIL\n"
"can take up to the switch interval to come back beside a busy Python thread).\n"
"Raises OSError (with the name) for any other error, ValueError for a name with a NUL.");

static PyObject *native_lstat_names(PyObject *self, PyObject *args)
{
    (void)self;
    int dirfd;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "iO!:lstat_names", &dirfd, &PyList_Type, &names)) {
        return NULL;
    }
    /* a copy of the list: another thread could change the caller's while the GIL is out */
    PyObject *own = PyList_GetSlice(names, 0, PyList_GET_SIZE(names));
    if (own == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(own);
    struct stat *sts = calloc(n > 0 ? (size_t)n : 1u, sizeof *sts);
    int *errs = calloc(n > 0 ? (size_t)n : 1u, sizeof *errs);
    PyObject *out = NULL;
    if (sts == NULL || errs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(own, i);
        if (!is_c_name(b)) {
            PyErr_SetString(PyExc_ValueError, "names must be bytes without NUL");
            goto done;
        }
    }
    if (n <= LSTAT_KEEP_GIL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *name = PyBytes_AS_STRING(PyList_GET_ITEM(own, i));
            errs[i] = fstatat(dirfd, name, &sts[i], AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
        }
    } else {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *name = PyBytes_AS_STRING(PyList_GET_ITEM(own, i));
            errs[i] = fstatat(dirfd, name, &sts[i], AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (errs[i] != 0 && errs[i] != ENOENT) {
            errno = errs[i];
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PyList_GET_ITEM(own, i));
            goto done;
        }
    }
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *r;
        if (errs[i] == ENOENT) {
            r = Py_NewRef(Py_None);
        } else {
            r = stat_tuple(&sts[i]);
        }
        if (r == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, r);
    }
done:
    free(sts);
    free(errs);
    Py_DECREF(own);
    return out;
}

PyDoc_STRVAR(open_at_doc,
"open_at(dirfd, name, flags, /) -> int\n--\n\n"
"os.open(name, flags, dir_fd=dirfd) (no O_CREAT: no mode) with the GIL kept: opening a\n"
"directory whose entry is cached takes a few microseconds, and a released GIL can take\n"
"up to the switch interval (5 ms) to come back beside a busy Python thread. Raises\n"
"OSError with the name, as os.open does; ValueError for a name with a NUL.");

static PyObject *native_open_at(PyObject *self, PyObject *args)
{
    (void)self;
    int dirfd, flags;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "iO!i:open_at", &dirfd, &PyBytes_Type, &name, &flags)) {
        return NULL;
    }
    if (!is_c_name(name)) {
        PyErr_SetString(PyExc_ValueError, "name must be bytes without NUL");
        return NULL;
    }
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) { /* O_TMPFILE holds O_DIRECTORY */
        PyErr_SetString(PyExc_ValueError, "open_at opens what exists (no O_CREAT)");
        return NULL;
    }
    int fd = openat(dirfd, PyBytes_AS_STRING(name), flags | O_CLOEXEC);
    if (fd < 0) {
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
    }
    return PyLong_FromLong(fd);
}

PyDoc_STRVAR(handle_at_doc,
"handle_at(path, /) -> bytes\n--\n\n"
"The file handle of what path names (name_to_handle_at(2), not following a last symlink),\n"
"as fanotify reports one: handle_type (int32, native order) then f_handle. The journal asks\n"
"it for each name of a step's data events (3.6k in the medium layer's step): through\n"
"ctypes 4 us more a name than os.lstat. The GIL is kept (see open_at). Raises OSError\n"
"with the path; ValueError for a path with a NUL.");

static PyObject *native_handle_at(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "handle_at: path must be bytes");
        return NULL;
    }
    if (!is_c_name(arg)) {
        PyErr_SetString(PyExc_ValueError, "path must be bytes without NUL");
        return NULL;
    }
    union {
        struct file_handle fh;
        unsigned char raw[sizeof(struct file_handle) + MAX_HANDLE_SZ];
    } buf;
    buf.fh.handle_bytes = MAX_HANDLE_SZ;
    int mount_id;
    if (name_to_handle_at(AT_FDCWD, PyBytes_AS_STRING(arg), &buf.fh, &mount_id, 0) != 0) {
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
    }
    unsigned int n = buf.fh.handle_bytes;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(sizeof(int) + n));
    if (out == NULL) {
        return NULL;
    }
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, &buf.fh.handle_type, sizeof(int));
    memcpy(p + sizeof(int), buf.fh.f_handle, n);
    return out;
}

PyDoc_STRVAR(close_fd_doc,
"close_fd(fd, /) -> None\n--\n\n"
"os.close(fd) with the GIL kept (see open_at): for descriptors whose close cannot wait,\n"
"such as a directory's. Raises OSError as os.close does.");

static PyObject *native_close_fd(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd;
    if (!PyArg_Parse(arg, "i:close_fd", &fd)) {
        return NULL;
    }
    if (close(fd) != 0 && errno != EINTR) { /* after EINTR the descriptor is gone (Linux) */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_mtime_doc,
"set_mtime(fd, ns, /) -> None\n--\n\n"
"os.utime(fd, ns=(ns, ns)) with the GIL kept (see open_at): a restore sets back the mtime\n"
"of every directory it wrote in and of every file whose only change is its mtime. Raises\n"
"OSError as os.utime does.");

static PyObject *native_set_mtime(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    long long ns;
    if (!PyArg_ParseTuple(args, "iL:set_mtime", &fd, &ns)) {
        return NULL;
    }
    struct timespec times[2] = {nstime_split(ns), nstime_split(ns)};
    if (futimens(fd, times) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef bulkread_methods[] = {
    {"set_mtime", native_set_mtime, METH_VARARGS, set_mtime_doc},
    {"open_at", native_open_at, METH_VARARGS, open_at_doc},
    {"close_fd", native_close_fd, METH_O, close_fd_doc},
    {"handle_at", native_handle_at, METH_O, handle_at_doc},
    {"lstat_names", native_lstat_names, METH_VARARGS, lstat_names_doc},
    {"read_start", native_read_start, METH_VARARGS, read_start_doc},
    {"read_finish", native_read_finish, METH_O, read_finish_doc},
    {"read_files", native_read_files, METH_VARARGS, read_files_doc},
    {NULL, NULL, 0, NULL},
};

int bulkread_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, bulkread_methods);
}
