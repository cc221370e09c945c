/*
 * treesplice.h - a changed directory in proportion to its changed children.
 *
 * A directory the change journal (or the full walk) names as changed usually differs from
 * its files-cache row in a few children: after the benchmark's agent step on the medium
 * layer, 1,130 such directories held 61k children of which about 2.5k had changed. Python
 * comparing every child's signature and decoding every old tree entry took 1.2 s of a
 * 3.4 s checkpoint; these two merges do that in C, so that Python touches only the changed
 * children and the new tree is the old one with those entries replaced.
 *
 * Plain C, no Python; formats: sprite_env/snapshot/dircache.py (signature rows) and
 * sprite_env/snapshot/tree.py (tree objects).
 */
#ifndef SPRITE_TREESPLICE_H
#define SPRITE_TREESPLICE_H

#include <stddef.h>
#include <stdint.h>

struct span {
    const uint8_t *data;
    size_t len;
};

/* Called with a child's name; nonzero stops the walk. */
typedef int (*sig_name_fn)(const uint8_t *name, size_t len, void *ctx);

/* Merges two sorted signature blobs: on_changed for each name of new_blob whose row is
 * not byte-equal to old_blob's (or is poisoned, or is new), on_removed for each name only
 * in old_blob. Returns 0, -1 for a malformed blob, -2 if a callback stopped it. */
int sig_diff(const uint8_t *new_blob, size_t new_len, const uint8_t *old_blob, size_t old_len,
             sig_name_fn on_changed, sig_name_fn on_removed, void *ctx);

/* The signature blob of a directory of which only some children were looked at: old_blob's
 * rows, each replaced by patch's row of the same name, plus patch's rows of new names,
 * less the rows named in gone (spans, sorted). Both blobs sorted by name, as is the result.
 * *out is malloc'ed (the caller frees it). Returns 0; -1 malformed blob; -4 patch or gone
 * out of order (or a name in both); -5 no memory. */
int sig_splice(const uint8_t *old_blob, size_t old_len, const uint8_t *patch, size_t patch_len,
               const struct span *gone, size_t ngone, uint8_t **out, size_t *out_len);

/* The tree entry starting at off: its name and byte length; -1 if malformed. */
int tree_entry_at(const uint8_t *tree, size_t len, size_t off, const uint8_t **name,
                  size_t *nlen, size_t *entry_len);

/* A tree's header (tree._HEAD "<4sI"): its magic and entry count; the first entry follows. */
#define TREE_HEAD 8u

/* Checks a tree's magic; its entry count in *count. -1 if it is no tree. */
int tree_check_head(const uint8_t *tree, size_t len, uint32_t *count);

/* The tree holding, for each name of the signature blob (in its order), the entry of add
 * (encoded entries, sorted by name) of that name, else the old tree's entry of that name.
 * *out is malloc'ed (the caller frees it). Returns 0; -1 malformed input; -3 an unchanged
 * name the old tree lacks; -4 an added entry the blob does not name, or add out of order;
 * -5 no memory. */
int tree_splice(const uint8_t *old, size_t old_len, const uint8_t *blob, size_t blob_len,
                const struct span *add, size_t nadd, uint8_t **out, size_t *out_len);

/* What a tree holds directly: counts[0..3] = regular files, their bytes, symlinks, other
 * non-directories; on_dir for each subdirectory's name (nonzero stops). Returns 0, -1 if
 * the tree is malformed, -2 if on_dir stopped it. */
int tree_counts(const uint8_t *tree, size_t len, uint64_t counts[4], sig_name_fn on_dir,
                void *ctx);

/* Finds the entry called name in a tree: 0 with its offset and length, 1 if absent,
 * -1 if the tree is malformed. */
int tree_find(const uint8_t *tree, size_t len, const uint8_t *name, size_t nlen,
              size_t *at, size_t *entry_len);

/* A name to look up in a tree (tree_find_many): entry_len is 0 if it is absent, else the
 * entry's length, at its offset. */
struct tree_name {
    const uint8_t *name;
    size_t len;
    size_t at;
    size_t entry_len;
};

/* tree_find of each of names[0..k), in any order, in one pass over the tree: 0, -1 if
 * the tree is malformed (as far as the pass read it), -2 out of memory. */
int tree_find_many(const uint8_t *tree, size_t len, struct tree_name *names, size_t k);

#endif
