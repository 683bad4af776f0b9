/*
 * fake_tree.h — a throw-away directory of small text files for the cmocka
 * tests that read files the kernel would give (/proc/self/cgroup,
 * /proc/meminfo, a cgroup tree). Every helper fails the test when the
 * file system refuses. Include after cmocka.h.
 */
#ifndef M6_TESTS_FAKE_TREE_H
#define M6_TESTS_FAKE_TREE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/paths.h"

/* Make root (len bytes) a fresh directory $TMPDIR/m6-NAME.XXXXXX (/tmp
 * without TMPDIR); a setup passes root on as *state for tree_teardown. */
static inline void tree_make(char *root, size_t len, const char *name)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, len, "%s/m6-%s.XXXXXX", tmp ? tmp : "/tmp", name);
    assert_non_null(mkdtemp(root));
}

/* Remove root and everything in it. 0 or -1 (a cmocka teardown's value). */
static inline int tree_remove(const char *root)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* cmocka teardown for a group whose setup set *state to its tree's root:
 * removes the tree. */
static inline int tree_teardown(void **state)
{
    return tree_remove(*state);
}

/* The file at path holds exactly text. */
static inline void tree_put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* under<rel>/name holds text (the directories made as needed); NULL
 * text: the file is removed. */
static inline void tree_file(const char *under, const char *rel,
                             const char *name, const char *text)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s%s", under, rel);
    assert_int_equal(paths_mkdir_p(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (text)
        tree_put(path, text);
    else
        unlink(path);
}

#endif /* M6_TESTS_FAKE_TREE_H */
