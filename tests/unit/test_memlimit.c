/*
 * test_memlimit.c — host_mem_at (daemon/common/memlimit.h) on hand-made
 * /proc/meminfo, /proc/self/cgroup files and cgroup trees: the room under
 * the memory limit of the cgroup or of an ancestor (limit - usage) caps
 * MemAvailable, in cgroup v2 (memory.max) and v1 (memory.limit_in_bytes);
 * "max", v1's "no limit", absent and malformed files set no cap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/memlimit.h"
#include "../common/fake_tree.h"
#include "../common/test_main.h"

#define GIB_ (1024ull * 1024 * 1024)
#define MIB_ (1024ull * 1024)

static char root_[256], proc_[300], meminfo_[300], v2_[300], v1_[300];

static host_mem at_(void)
{
    host_mem m;
    host_mem_at(meminfo_, proc_, v2_, v1_, &m);
    return m;
}

static int setup_(void **state)
{
    tree_make(root_, sizeof root_, "memlimit");
    *state = root_;
    snprintf(proc_, sizeof proc_, "%s/cgroup", root_);
    snprintf(meminfo_, sizeof meminfo_, "%s/meminfo", root_);
    snprintf(v2_, sizeof v2_, "%s/cg2", root_);
    snprintf(v1_, sizeof v1_, "%s/cg1mem", root_);
    /* 8 GiB available on the machine */
    tree_put(meminfo_, "MemTotal:       16777216 kB\n"
                       "MemFree:         1000000 kB\n"
                       "MemAvailable:    8388608 kB\n");
    return 0;
}

static void test_no_cgroup(void **state)
{
    (void)state;
    unlink(proc_);
    host_mem m = at_();
    assert_int_equal(m.avail, 8 * GIB_);
    assert_int_equal(m.meminfo, 8 * GIB_);
    assert_int_equal(m.cgroup_binds, 0);
    char b[256];
    assert_string_equal(host_mem_describe(&m, b, sizeof b),
                        "only 8.00 GiB available (MemAvailable)");
}

static void test_v2_limit(void **state)
{
    (void)state;
    tree_put(proc_, "0::/system.slice/m6d.service\n");
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", "3221225472\n");
    tree_file(v2_, "/system.slice/m6d.service", "memory.current", "104857600\n");
    host_mem m = at_();
    /* 3 GiB - 100 MiB, below 8 GiB MemAvailable */
    assert_int_equal(m.avail, 3 * GIB_ - 100 * MIB_);
    assert_int_equal(m.cgroup_binds, 1);
    assert_int_equal(m.limit, 3 * GIB_);
    assert_int_equal(m.usage, 100 * MIB_);
    char want[700], b[1024];
    snprintf(want, sizeof want, "%s/system.slice/m6d.service/memory.max", v2_);
    assert_string_equal(m.file, want);
    snprintf(want, sizeof want, "m6d's cgroup allows 2.90 GiB (memory.max "
             "3.00 GiB, 0.10 GiB in use: %s/system.slice/m6d.service/"
             "memory.max)", v2_);
    assert_string_equal(host_mem_describe(&m, b, sizeof b), want);

    /* "max": no cap here; a parent's 2 GiB with 1.5 GiB in use binds */
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", "max\n");
    tree_file(v2_, "/system.slice", "memory.max", "2147483648\n");
    tree_file(v2_, "/system.slice", "memory.current", "1610612736\n");
    m = at_();
    assert_int_equal(m.avail, 512 * MIB_);
    snprintf(want, sizeof want, "%s/system.slice/memory.max", v2_);
    assert_string_equal(m.file, want);

    /* a limit above MemAvailable: MemAvailable binds */
    tree_file(v2_, "/system.slice", "memory.max", "max\n");
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", "17179869184\n");
    m = at_();
    assert_int_equal(m.avail, 8 * GIB_);
    assert_int_equal(m.cgroup_binds, 0);

    /* usage over the limit: no room; malformed: no cap */
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", "1073741824\n");
    tree_file(v2_, "/system.slice/m6d.service", "memory.current", "2147483648\n");
    assert_int_equal(at_().avail, 0);
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", "lots\n");
    assert_int_equal(at_().avail, 8 * GIB_);
    tree_file(v2_, "/system.slice/m6d.service", "memory.max", NULL);
    assert_int_equal(at_().avail, 8 * GIB_);
}

static void test_v1_limit(void **state)
{
    (void)state;
    /* hybrid: the v1 memory controller's line wins over 0:: */
    tree_put(proc_, "9:name=systemd:/\n"
                "4:memory:/docker/abc\n"
                "3:cpu,cpuacct:/docker/abc\n"
                "0::/\n");
    tree_file(v1_, "/docker/abc", "memory.limit_in_bytes", "3221225472\n");
    tree_file(v1_, "/docker/abc", "memory.usage_in_bytes", "0\n");
    host_mem m = at_();
    assert_int_equal(m.avail, 3 * GIB_);
    assert_int_equal(m.cgroup_binds, 1);
    char want[700];
    snprintf(want, sizeof want, "%s/docker/abc/memory.limit_in_bytes", v1_);
    assert_string_equal(m.file, want);

    /* v1's "no limit" (LONG_MAX rounded to a page) is none */
    tree_file(v1_, "/docker/abc", "memory.limit_in_bytes",
          "9223372036854771712\n");
    m = at_();
    assert_int_equal(m.avail, 8 * GIB_);
    assert_int_equal(m.cgroup_binds, 0);

    /* a container sees its own cgroup as the mount's root: the path in
     * /proc/self/cgroup is absent there, the root's limit applies */
    tree_file(v1_, "", "memory.limit_in_bytes", "1073741824\n");
    tree_file(v1_, "", "memory.usage_in_bytes", "268435456\n");
    assert_int_equal(at_().avail, 768 * MIB_);

    /* memory among other controllers on one line */
    tree_put(proc_, "5:blkio,memory:/\n");
    assert_int_equal(at_().avail, 768 * MIB_);
}

TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_no_cgroup, setup_,
    tree_teardown),
    cmocka_unit_test_setup_teardown(test_v2_limit, setup_,
    tree_teardown),
    cmocka_unit_test_setup_teardown(test_v1_limit, setup_,
    tree_teardown))
