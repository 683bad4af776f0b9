/*
 * test_cpus.c — cpus_available_at (daemon/common/cpus.h) on hand-made
 * /proc/self/cgroup files and cgroup2 trees: the quota of the cgroup or of
 * an ancestor caps the affinity count, rounded up; "max", absent files,
 * malformed lines and cgroup v1 set no cap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cpus.h"
#include "../common/fake_tree.h"
#include "../common/test_main.h"

static char root_[256], proc_[300];

/* root_/cg<rel>/cpu.max = text (NULL: none) */
static void quota_(const char *rel, const char *text)
{
    char cg[300];
    snprintf(cg, sizeof cg, "%s/cg", root_);
    tree_file(cg, rel, "cpu.max", text);
}

static int at_(int affinity)
{
    char cg[300];
    snprintf(cg, sizeof cg, "%s/cg", root_);
    return cpus_available_at(proc_, cg, affinity);
}

static int setup_(void **state)
{
    tree_make(root_, sizeof root_, "cpus");
    *state = root_;
    snprintf(proc_, sizeof proc_, "%s/cgroup", root_);
    return 0;
}

static void test_quota_caps(void **state)
{
    (void)state;
    tree_put(proc_, "0::/a/b\n");
    quota_("/a/b", "150000 100000\n");  /* CPUQuota=150%: 2 CPUs */
    assert_int_equal(at_(16), 2);
    assert_int_equal(at_(1), 1);          /* the mask is smaller */
    quota_("/a/b", "100000 100000\n");
    assert_int_equal(at_(16), 1);
    quota_("/a/b", "max 100000\n");
    assert_int_equal(at_(16), 16);
}

static void test_ancestor_caps(void **state)
{
    (void)state;
    tree_put(proc_, "0::/a/b/c\n");
    quota_("/a/b/c", "max 100000\n");
    quota_("/a/b", NULL);
    quota_("/a", "350000 100000\n");      /* 3.5 CPUs: 4 */
    assert_int_equal(at_(16), 4);
    quota_("/a/b", "20000 10000\n");      /* 2, tighter than /a */
    assert_int_equal(at_(16), 2);
}

static void test_no_cap(void **state)
{
    (void)state;
    /* cgroup v1 only: no 0:: line */
    tree_put(proc_, "4:memory:/x\n1:cpu:/\n");
    assert_int_equal(at_(8), 8);
    /* v2 at the root: the root has no cpu.max */
    tree_put(proc_, "0::/\n");
    assert_int_equal(at_(8), 8);
    /* malformed cpu.max lines */
    tree_put(proc_, "0::/m\n");
    const char *bad[] = {"", "abc\n", "100000\n", "-5 100000\n", "100 0\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        quota_("/m", bad[i]);
        assert_int_equal(at_(8), 8);
    }
    /* no /proc file; an affinity count below 1 */
    char gone[400];
    snprintf(gone, sizeof gone, "%s/none", root_);
    assert_int_equal(cpus_available_at(gone, root_, 3), 3);
    assert_int_equal(cpus_available_at(gone, root_, 0), 1);
}

/* The real call: between 1 and the machine's online CPUs. */
static void test_this_process(void **state)
{
    (void)state;
    int n = cpus_available();
    assert_true(n >= 1);
    assert_true(n <= sysconf(_SC_NPROCESSORS_ONLN));
}

TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_quota_caps, setup_,
    tree_teardown),
    cmocka_unit_test_setup_teardown(test_ancestor_caps, setup_,
    tree_teardown),
    cmocka_unit_test_setup_teardown(test_no_cap, setup_,
    tree_teardown),
    cmocka_unit_test(test_this_process))
