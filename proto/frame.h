/*
 * frame.h — framing of the control protocol (proto/m6.proto): a 4-byte
 * big-endian length, then one protobuf message. Shared by m6d and m6ctl.
 *
 * frame_reader accumulates bytes as they arrive (any split: one byte at a
 * time, several frames in one read) and hands out complete payloads. A
 * declared length over M6_FRAME_MAX is reported before any of the payload is
 * buffered, so a hostile length never makes us allocate 4 GiB.
 */
#ifndef M6_FRAME_H
#define M6_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "m6.pb-c.h"

#define M6_PROTOCOL_VERSION 1u
#define M6_FRAME_MAX (16u * 1024u * 1024u)
#define M6_FRAME_HDR 4u

/* A Request holding message body under oneof case which (body: &q.base of
 * the message that case holds). Every case of the Request oneof is a
 * message pointer in one slot, so this one setter serves them all. */
static inline M6__Request frame_request(M6__Request__BodyCase which,
                                        ProtobufCMessage *body)
{
    M6__Request rq = M6__REQUEST__INIT;
    rq.body_case = which;
    rq.hello = (M6__Hello *)body; /* the oneof's one pointer slot */
    return rq;
}

typedef struct {
    uint8_t *buf;
    size_t len;   /* bytes held */
    size_t pos;   /* start of the first unconsumed frame */
    size_t cap;
} frame_reader;

typedef enum {
    FRAME_NEED_MORE = 0,
    FRAME_OK = 1,
    FRAME_TOO_LARGE = -1,
} frame_result;

void frame_reader_init(frame_reader *r);
void frame_reader_free(frame_reader *r);

/* Append n bytes. Invalidates payload pointers handed out before.
 * Returns 0, or -1 when out of memory. */
int frame_reader_feed(frame_reader *r, const void *data, size_t n);

/* Next complete frame: FRAME_OK with *payload and *len (valid until the next
 * feed), FRAME_NEED_MORE, or FRAME_TOO_LARGE with *len = declared length. */
frame_result frame_reader_next(frame_reader *r, const uint8_t **payload,
                               size_t *len);

/* Bytes held that are not yet part of a returned frame. */
size_t frame_reader_pending(const frame_reader *r);

void frame_put_len(uint8_t hdr[4], uint32_t n);
uint32_t frame_get_len(const uint8_t hdr[4]);

/* Serialize a message into a fresh malloc'd frame (header + payload).
 * Returns NULL (and *len 0) on OOM or when the message exceeds the limit. */
uint8_t *frame_pack(const ProtobufCMessage *msg, size_t *len);

#endif /* M6_FRAME_H */
