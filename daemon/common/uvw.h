/*
 * uvw.h — one libuv write of an owned buffer: the request, the buffer
 * freed in the write callback whatever the status, and the owner told.
 * The control socket, the coordinator's peers and the worker's join
 * connection all queue their frames through it. Header-only so that
 * daemon/common does not link libuv; only libuv users include it.
 */
#ifndef M6_UVW_H
#define M6_UVW_H

#include <stdint.h>
#include <stdlib.h>
#include <uv.h>

/* Told once a queued write ends: status (0 or a libuv error) and the
 * close_after given to uvw_send. */
typedef void (*uvw_done_fn)(void *owner, int status, int close_after);

typedef struct {
    uv_write_t req; /* first: req <-> uvw_req_ */
    uint8_t *buf;
    void *owner;
    int close_after;
    uvw_done_fn done;
} uvw_req_;

static inline void uvw_written_(uv_write_t *req, int status)
{
    uvw_req_ *w = (uvw_req_ *)req;
    void *owner = w->owner;
    int close_after = w->close_after;
    uvw_done_fn done = w->done;
    free(w->buf);
    free(w);
    done(owner, status, close_after);
}

/* Queue buf (len bytes, malloc'd; taken in every case) on stream s;
 * done(owner, status, close_after) runs when the write ends. 0, or a libuv
 * error (UV_ENOMEM for no request) and done will not run. */
static inline int uvw_send(uv_stream_t *s, uint8_t *buf, size_t len,
                          void *owner, int close_after, uvw_done_fn done)
{
    uvw_req_ *w = calloc(1, sizeof *w);
    if (!w) {
        free(buf);
        return UV_ENOMEM;
    }
    w->buf = buf;
    w->owner = owner;
    w->close_after = close_after;
    w->done = done;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int rc = uv_write(&w->req, s, &b, 1, uvw_written_);
    if (rc < 0) {
        free(buf);
        free(w);
    }
    return rc;
}

#endif /* M6_UVW_H */
