/*
 * test_frame.c — framing of the control protocol: partial reads, frames
 * split at every byte, several frames per read, the 16 MiB limit, packing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/frame.h"
#include "../common/hello_request.h"
#include "../common/test_main.h"

static size_t mkframe_(uint8_t *out, const char *payload)
{
    size_t n = strlen(payload);
    frame_put_len(out, (uint32_t)n);
    memcpy(out + 4, payload, n);
    return n + 4;
}

static void test_len_roundtrip(void **st)
{
    (void)st;
    uint8_t h[4];
    frame_put_len(h, 0x01020304u);
    assert_int_equal(h[0], 1);
    assert_int_equal(h[3], 4);
    assert_int_equal(frame_get_len(h), 0x01020304u);
}

static void test_split_every_byte(void **st)
{
    (void)st;
    uint8_t buf[64];
    size_t n = mkframe_(buf, "hello frame");
    frame_reader r;
    frame_reader_init(&r);
    const uint8_t *p;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_NEED_MORE);
        assert_int_equal(frame_reader_feed(&r, buf + i, 1), 0);
    }
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_OK);
    assert_int_equal(len, 11);
    assert_memory_equal(p, "hello frame", 11);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_NEED_MORE);
    assert_int_equal(frame_reader_pending(&r), 0);
    frame_reader_free(&r);
}

static void test_coalesced_and_partial(void **st)
{
    (void)st;
    uint8_t buf[128];
    size_t n = mkframe_(buf, "one");
    n += mkframe_(buf + n, "");
    n += mkframe_(buf + n, "three");
    frame_reader r;
    frame_reader_init(&r);
    /* everything but the last 2 bytes */
    frame_reader_feed(&r, buf, n - 2);
    const uint8_t *p;
    size_t len;
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_OK);
    assert_memory_equal(p, "one", 3);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_OK);
    assert_int_equal(len, 0);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_NEED_MORE);
    frame_reader_feed(&r, buf + n - 2, 2);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_OK);
    assert_memory_equal(p, "three", 5);
    frame_reader_free(&r);
}

static void test_oversize(void **st)
{
    (void)st;
    frame_reader r;
    frame_reader_init(&r);
    uint8_t h[4];
    const uint8_t *p;
    size_t len;
    frame_put_len(h, M6_FRAME_MAX + 1);
    frame_reader_feed(&r, h, 4);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_TOO_LARGE);
    assert_int_equal(len, M6_FRAME_MAX + 1);
    /* nothing of the declared size was allocated */
    assert_true(r.cap < 1u << 20);
    frame_reader_free(&r);

    /* exactly the limit is allowed (header says so; payload pending) */
    frame_reader_init(&r);
    frame_put_len(h, M6_FRAME_MAX);
    frame_reader_feed(&r, h, 4);
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_NEED_MORE);
    frame_reader_free(&r);
}

static void test_pack_unpack(void **st)
{
    (void)st;
    M6__Hello hello;
    M6__Request rq;
    hello_request(&rq, &hello, "test");
    size_t n;
    uint8_t *f = frame_pack(&rq.base, &n);
    assert_non_null(f);
    frame_reader r;
    frame_reader_init(&r);
    frame_reader_feed(&r, f, n);
    const uint8_t *p;
    size_t len;
    assert_int_equal(frame_reader_next(&r, &p, &len), FRAME_OK);
    M6__Request *back = m6__request__unpack(NULL, len, p);
    assert_non_null(back);
    assert_int_equal(back->body_case, M6__REQUEST__BODY_HELLO);
    assert_int_equal(back->hello->protocol_version, M6_PROTOCOL_VERSION);
    assert_string_equal(back->hello->client, "test");
    m6__request__free_unpacked(back, NULL);
    frame_reader_free(&r);
    free(f);
}

TEST_MAIN(
    cmocka_unit_test(test_len_roundtrip),
    cmocka_unit_test(test_split_every_byte),
    cmocka_unit_test(test_coalesced_and_partial),
    cmocka_unit_test(test_oversize),
    cmocka_unit_test(test_pack_unpack))
