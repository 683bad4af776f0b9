/*
 * checkpoint.c — safetensors reading and writing for checkpoints (the
 * directory protocol itself is in trainer.c; durable writes in
 * common/durable.c).
 */
#include "ckpt/checkpoint.h"

#include "common/durable.h"
#include "common/err.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int fwrite_all_(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static size_t numel_(const st_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}


#define BF16_CHUNK 4096 /* elements narrowed at a time */

/* Elements [i0, i0 + n) of bf16 tensor t as BF16 into out (n <=
 * BF16_CHUNK): each float's upper 16 bits. -1 (err names the element)
 * when one is not a bf16 value. */
static int bf16_chunk_(const st_tensor *t, size_t i0, size_t n,
                       uint16_t *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &t->data[i0 + i], 4);
        if (u & 0xffffu) {
            snprintf(err, errlen, "tensor %s: element %zu is not a bf16 "
                     "value", t->name, i0 + i);
            return -1;
        }
        out[i] = (uint16_t)(u >> 16);
    }
    return 0;
}

/* Feed the file bytes of tensor t to fn (a CRC or a write): F32 as they
 * are, BF16 narrowed chunk by chunk. 0, or -1 (err set). */
static int tensor_bytes_(const st_tensor *t, int bf16,
                         int (*fn)(void *ctx, const void *p, size_t n),
                         void *ctx, char *err, size_t errlen)
{
    size_t n = numel_(t);
    if (!bf16) {
        if (fn(ctx, t->data, n * sizeof(float)) != 0) {
            snprintf(err, errlen, "write failed: %s", strerror(errno));
            return -1;
        }
        return 0;
    }
    uint16_t buf[BF16_CHUNK];
    for (size_t i = 0; i < n; i += BF16_CHUNK) {
        size_t k = n - i < BF16_CHUNK ? n - i : BF16_CHUNK;
        if (bf16_chunk_(t, i, k, buf, err, errlen) != 0)
            return -1;
        if (fn(ctx, buf, k * 2) != 0) {
            snprintf(err, errlen, "write failed: %s", strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int crc_fn_(void *ctx, const void *p, size_t n)
{
    uLong *crc = ctx;
    *crc = crc32_z(*crc, (const Bytef *)p, n);
    return 0;
}

static int write_fn_(void *ctx, const void *p, size_t n)
{
    return fwrite_all_(ctx, p, n);
}

/* CRC-32 (zlib's) of every tensor's bytes in file order: the data region.
 * -1 (err set) when a bf16 tensor holds a value that is not bf16. */
static int data_crc_(const st_tensor *ts, const unsigned char *bf16, int n,
                     unsigned long *out, char *err, size_t errlen)
{
    uLong crc = crc32_z(0L, Z_NULL, 0);
    for (int i = 0; i < n; i++)
        if (tensor_bytes_(&ts[i], bf16 && bf16[i], crc_fn_, &crc, err,
                          errlen) != 0)
            return -1;
    *out = crc;
    return 0;
}

long safetensors_write(FILE *f, const st_tensor *ts, int n, char *err,
                       size_t errlen)
{
    return safetensors_write_dtypes(f, ts, NULL, n, err, errlen);
}

long safetensors_write_dtypes(FILE *f, const st_tensor *ts,
                              const unsigned char *bf16, int n, char *err,
                              size_t errlen)
{
    char crc[16];
    unsigned long crc_v;
    if (data_crc_(ts, bf16, n, &crc_v, err, errlen) != 0)
        return -1;
    snprintf(crc, sizeof crc, "%08lx", crc_v);
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < ts[i].ndim; d++)
            json_array_append_new(shape, json_integer(ts[i].shape[d]));
        int b16 = bf16 && bf16[i];
        size_t bytes = numel_(&ts[i]) * (b16 ? 2 : sizeof(float));
        json_object_set_new(h, ts[i].name,
            json_pack("{s:s, s:o, s:[I,I]}", "dtype",
                      b16 ? "BF16" : "F32", "shape", shape,
                      "data_offsets", (json_int_t)off,
                      (json_int_t)(off + bytes)));
        off += bytes;
    }
    json_object_set_new(h, "__metadata__",
                        json_pack("{s:s, s:s}", "format", "pt",
                                  ST_CRC_KEY, crc));
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hs) {
        snprintf(err, errlen, "out of memory building safetensors header");
        return -1;
    }
    size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
    uint64_t n64 = padded; /* little-endian hosts only (x86-64, aarch64) */
    int bad = fwrite_all_(f, &n64, 8) || fwrite_all_(f, hs, hl);
    for (size_t i = hl; i < padded && !bad; i++)
        bad = fputc(' ', f) == EOF;
    free(hs);
    for (int i = 0; i < n && !bad; i++)
        if (tensor_bytes_(&ts[i], bf16 && bf16[i], write_fn_, f, err,
                          errlen) != 0)
            return -1; /* err says which */
    if (bad || fflush(f) != 0) {
        snprintf(err, errlen, "write failed: %s", strerror(errno));
        return -1;
    }
    return (long)(8 + padded + off);
}

int safetensors_open(st_file *sf, const char *path, char *err, size_t errlen)
{
    memset(sf, 0, sizeof *sf);
    struct stat st;
    int fd = open_regular(path, 0, &st, err, errlen);  /* no FIFO hang */
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (st.st_size < 8) {
        snprintf(err, errlen, "%s: truncated (no header)", path);
        fclose(f);
        return -1;
    }
    sf->len = (size_t)st.st_size;
    sf->buf = malloc(sf->len);
    if (!sf->buf || fread(sf->buf, 1, sf->len, f) != sf->len) {
        snprintf(err, errlen, "%s: read failed", path);
        fclose(f);
        safetensors_close(sf);
        return -1;
    }
    fclose(f);
    uint64_t hl;
    memcpy(&hl, sf->buf, 8);
    if (hl > sf->len - 8) {
        snprintf(err, errlen, "%s: header length %llu exceeds file size %zu",
                 path, (unsigned long long)hl, sf->len);
        safetensors_close(sf);
        return -1;
    }
    json_error_t je;
    sf->header = json_loadb((const char *)sf->buf + 8, hl, 0, &je);
    if (!sf->header || !json_is_object((json_t *)sf->header)) {
        snprintf(err, errlen, "%s: bad header JSON: %s", path, je.text);
        safetensors_close(sf);
        return -1;
    }
    sf->data_start = 8 + hl;
    /* a file cut short: said so before the checksum (which would call it
     * damaged) from the largest end the header's data_offsets name */
    uint64_t need = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)sf->header, k, v) {
        json_t *e = json_array_get(json_object_get(v, "data_offsets"), 1);
        if (strcmp(k, "__metadata__") != 0 && json_is_integer(e) &&
            json_integer_value(e) > 0 &&
            (uint64_t)json_integer_value(e) > need)
            need = (uint64_t)json_integer_value(e);
    }
    if (need > sf->len - sf->data_start) {
        snprintf(err, errlen, "%s: truncated: its tensors need %llu bytes of "
                 "data, the file holds %zu", path, (unsigned long long)need,
                 sf->len - sf->data_start);
        safetensors_close(sf);
        return -1;
    }
    /* the data's checksum, where the writer left one (m6 does; files from
     * elsewhere may not): a flipped bit in a tensor fails here, not as
     * NaN losses after a resume */
    json_t *meta = json_object_get((json_t *)sf->header, "__metadata__");
    json_t *want = meta ? json_object_get(meta, ST_CRC_KEY) : NULL;
    if (want) {
        const char *ws = json_string_value(want);
        char *end = NULL;
        unsigned long w = ws ? strtoul(ws, &end, 16) : 0;
        if (!ws || !*ws || *end) {
            snprintf(err, errlen, "%s: __metadata__.%s is not a hex CRC-32",
                     path, ST_CRC_KEY);
            safetensors_close(sf);
            return -1;
        }
        unsigned long got = crc32_z(crc32_z(0L, Z_NULL, 0),
                                    sf->buf + sf->data_start,
                                    sf->len - sf->data_start);
        if (got != w) {
            snprintf(err, errlen, "%s: tensor data damaged: CRC-32 %08lx, "
                     "the header says %08lx", path, got, w);
            safetensors_close(sf);
            return -1;
        }
    }
    return 0;
}

void safetensors_close(st_file *sf)
{
    if (sf->header)
        json_decref((json_t *)sf->header);
    free(sf->buf);
    memset(sf, 0, sizeof *sf);
}

int safetensors_get(const st_file *sf, const char *name, float *dst,
                    size_t numel, char *err, size_t errlen)
{
    json_t *t = json_object_get((json_t *)sf->header, name);
    json_int_t a, b;
    const char *dtype;
    if (!t) {
        snprintf(err, errlen, "missing tensor %s", name);
        return -1;
    }
    if (json_unpack(t, "{s:s, s:[II]}", "dtype", &dtype, "data_offsets", &a,
                    &b) != 0 ||
        (strcmp(dtype, "F32") != 0 && strcmp(dtype, "BF16") != 0)) {
        snprintf(err, errlen, "tensor %s: not an F32 or BF16 tensor entry",
                 name);
        return -1;
    }
    size_t es = strcmp(dtype, "BF16") == 0 ? 2 : sizeof(float);
    if (a < 0 || b < a || (size_t)b > sf->len - sf->data_start) {
        snprintf(err, errlen, "tensor %s: data offsets out of range", name);
        return -1;
    }
    if ((size_t)(b - a) != numel * es) {
        snprintf(err, errlen, "tensor %s has %zu elements, want %zu", name,
                 (size_t)(b - a) / es, numel);
        return -1;
    }
    const unsigned char *src = sf->buf + sf->data_start + a;
    if (es == sizeof(float)) {
        memcpy(dst, src, (size_t)(b - a));
        return 0;
    }
    for (size_t i = 0; i < numel; i++) { /* BF16: widened, exact */
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(&dst[i], &u, 4);
    }
    return 0;
}

int safetensors_info(const st_file *sf, const char *name, char dtype[16],
                     int *ndim, long shape[4], char *err, size_t errlen)
{
    json_t *t = json_object_get((json_t *)sf->header, name);
    if (!t)
        return 1;
    json_t *dt = json_object_get(t, "dtype"), *sh = json_object_get(t, "shape");
    if (!json_is_string(dt) || !json_is_array(sh) || json_array_size(sh) > 4) {
        snprintf(err, errlen, "tensor %s: entry without dtype or shape "
                 "(of at most 4 dims)", name);
        return -1;
    }
    snprintf(dtype, 16, "%s", json_string_value(dt));
    *ndim = (int)json_array_size(sh);
    for (int d = 0; d < *ndim; d++) {
        json_t *v = json_array_get(sh, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(err, errlen, "tensor %s: shape[%d] is not a size", name, d);
            return -1;
        }
        shape[d] = (long)json_integer_value(v);
    }
    return 0;
}
