/*
 * treescan_py.h - what both CPython bindings of treescan.c (scan_tree in _native.c,
 * scan_listing in treescan_py.c) share: the parsing of their exclusions.
 */
#ifndef SPRITE_TREESCAN_PY_H
#define SPRITE_TREESCAN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

struct treescan_excludes {
    PyObject *inodes, *patterns; /* the PySequence_Fast of each: they own the bytes below */
    uint64_t *inos;              /* (st_dev, st_ino) pairs, n_inos of them */
    size_t n_inos;
    const char **pats;
    size_t *pat_lens;
    size_t n_pats;
};

/* Fills x from a sequence of (dev, ino) pairs and a sequence of bytes patterns; 0, or -1
 * with a Python exception set. Call treescan_excludes_free(x) either way. */
int treescan_excludes_parse(PyObject *inodes_arg, PyObject *patterns_arg,
                            struct treescan_excludes *x);
void treescan_excludes_free(struct treescan_excludes *x);

#endif
