/*
 * hello_request.h — the Hello request a test or benchmark client opens its
 * control connection with (proto/m6.proto Hello): the protocol version
 * this build speaks (proto/frame.h) and the client's name.
 */
#ifndef M6_TESTS_HELLO_REQUEST_H
#define M6_TESTS_HELLO_REQUEST_H

#include "proto/frame.h"
#include "m6.pb-c.h"

/* Fill *rq as a Hello request whose body is *hello, from client (kept by
 * pointer: it must outlive rq). */
static inline void hello_request(M6__Request *rq, M6__Hello *hello,
                                 const char *client)
{
    m6__hello__init(hello);
    hello->protocol_version = M6_PROTOCOL_VERSION;
    hello->client = (char *)client;
    m6__request__init(rq);
    rq->body_case = M6__REQUEST__BODY_HELLO;
    rq->hello = hello;
}

#endif /* M6_TESTS_HELLO_REQUEST_H */
