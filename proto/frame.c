/*
 * frame.c — length-prefixed protobuf frames (see frame.h).
 */
#include "proto/frame.h"

#include <stdlib.h>
#include <string.h>

void frame_reader_init(frame_reader *r) { memset(r, 0, sizeof *r); }

void frame_reader_free(frame_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

void frame_put_len(uint8_t hdr[4], uint32_t n)
{
    hdr[0] = (uint8_t)(n >> 24);
    hdr[1] = (uint8_t)(n >> 16);
    hdr[2] = (uint8_t)(n >> 8);
    hdr[3] = (uint8_t)n;
}

uint32_t frame_get_len(const uint8_t hdr[4])
{
    return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
           (uint32_t)hdr[2] << 8 | (uint32_t)hdr[3];
}

size_t frame_reader_pending(const frame_reader *r) { return r->len - r->pos; }

int frame_reader_feed(frame_reader *r, const void *data, size_t n)
{
    if (r->pos > 0) {  /* drop consumed frames */
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n) cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb) return -1;
        r->buf = nb;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return 0;
}

frame_result frame_reader_next(frame_reader *r, const uint8_t **payload,
                               size_t *len)
{
    size_t avail = r->len - r->pos;
    if (avail < M6_FRAME_HDR) return FRAME_NEED_MORE;
    uint32_t n = frame_get_len(r->buf + r->pos);
    if (n > M6_FRAME_MAX) {
        *len = n;
        return FRAME_TOO_LARGE;
    }
    if (avail - M6_FRAME_HDR < n) return FRAME_NEED_MORE;
    *payload = r->buf + r->pos + M6_FRAME_HDR;
    *len = n;
    r->pos += M6_FRAME_HDR + n;
    return FRAME_OK;
}

uint8_t *frame_pack(const ProtobufCMessage *msg, size_t *len)
{
    *len = 0;
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > M6_FRAME_MAX) return NULL;
    uint8_t *buf = malloc(M6_FRAME_HDR + n);
    if (!buf) return NULL;
    frame_put_len(buf, (uint32_t)n);
    protobuf_c_message_pack(msg, buf + M6_FRAME_HDR);
    *len = M6_FRAME_HDR + n;
    return buf;
}
