/*
 * err_into.h — for tests and benches: call a function that reports through
 * an m6_err *, and copy the message into a char array the test prints or
 * checks.
 *
 *   char err[512];
 *   if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0) fail_msg("%s", err);
 *
 * The call names the m6_err as err_; ERR_INTO's value is the call's. err
 * is "" when the call set no error; the message is cut to sizeof err (the
 * tests' messages are short; the daemon keeps them whole).
 */
#ifndef M6_TESTS_ERR_INTO_H
#define M6_TESTS_ERR_INTO_H

#include <stdio.h>

#include "common/err.h"

#define ERR_INTO(buf, call)                                               \
    __extension__({                                                       \
        m6_err err_ = M6_ERR_NONE;                                        \
        __typeof__(call) rc_ = (call);                                    \
        snprintf((buf), sizeof(buf), "%s", m6_err_msg(&err_));            \
        m6_err_free(&err_);                                               \
        rc_;                                                              \
    })

#endif /* M6_TESTS_ERR_INTO_H */
