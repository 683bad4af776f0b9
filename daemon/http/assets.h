/*
 * assets.h — the dashboard's files (daemon/http/assets/), compiled into
 * m6d by embed.py: each with the path it is served at and its media type.
 */
#ifndef M6_HTTP_ASSETS_H
#define M6_HTTP_ASSETS_H

#include <stddef.h>

typedef struct {
    const char *path;  /* "/", "/dashboard.js", ... */
    const char *type;  /* Content-Type */
    const unsigned char *data;
    size_t len;
} http_asset;

extern const http_asset http_assets[];
extern const int http_n_assets;

#endif /* M6_HTTP_ASSETS_H */
