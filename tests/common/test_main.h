/*
 * test_main.h — the main() of a cmocka unit test that needs no group setup
 * or teardown: TEST_MAIN(entry, ...) runs the entries (cmocka_unit_test(f),
 * cmocka_unit_test_setup_teardown(f, s, t), ...) as one group named
 * "tests" and exits with cmocka's status (the number of tests that
 * failed).
 */
#ifndef M6_TESTS_TEST_MAIN_H
#define M6_TESTS_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define TEST_MAIN(...)                                                       \
    int main(void)                                                           \
    {                                                                        \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                     \
        return cmocka_run_group_tests(tests, NULL, NULL);                    \
    }

#endif /* M6_TESTS_TEST_MAIN_H */
