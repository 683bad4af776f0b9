/*
 * readbuf.h — the read buffer of m6d's libuv streams (the control socket,
 * the coordinator's peers, a joined node's link to its coordinator).
 * Header only: common/ itself does not link libuv.
 */
#ifndef M6_READBUF_H
#define M6_READBUF_H

#include <stdlib.h>
#include <uv.h>

/* uv_read_start's allocation callback: a malloc'd buffer of at least
 * 64 KiB (libuv's suggestion when larger); len 0 when malloc fails, which
 * libuv reports to the read callback as UV_ENOBUFS. The read callback
 * frees buf->base. */
static inline void readbuf_alloc(uv_handle_t *h, size_t suggested,
                                 uv_buf_t *buf)
{
    (void)h;
    size_t n = suggested < 65536 ? 65536 : suggested;
    buf->base = malloc(n);
    buf->len = buf->base ? n : 0;
}

#endif /* M6_READBUF_H */
