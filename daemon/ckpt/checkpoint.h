/*
 * checkpoint.h — files of a checkpoint: safetensors I/O (durable writes:
 * common/durable.h).
 *
 * safetensors (huggingface/safetensors format): u64 little-endian header
 * length n, then n bytes of JSON {"name": {"dtype", "shape", "data_offsets"}},
 * "__metadata__": {str: str}}, padded with spaces to 8 bytes, then the data.
 * m6 writes F32 tensors, and BF16 ones for bf16 master weights (values
 * that are bf16 already, stored exactly). Files are read fully and every
 * offset checked.
 * m6 also writes __metadata__.m6_data_crc32: zlib's CRC-32 of the data
 * region (every byte after the header), 8 hex digits; a file that has it
 * must match it to open.
 */
#ifndef M6_CHECKPOINT_H
#define M6_CHECKPOINT_H

#include <stddef.h>
#include <stdio.h>

#define ST_CRC_KEY "m6_data_crc32"

typedef struct {
    const char *name;
    const float *data;
    int ndim;
    long shape[2];
} st_tensor;

/* Write n tensors to the open stream f (already positioned at 0), as F32.
 * Returns bytes written or -1 with err (ENOSPC etc. named). */
long safetensors_write(FILE *f, const st_tensor *ts, int n, char *err,
                       size_t errlen);

/* The same with tensor i stored as BF16 where bf16[i] (bf16 NULL: none):
 * the upper 16 bits of each float; a value that is not a bf16 one is
 * refused, never rounded (-1, "tensor X: element i is not a bf16
 * value"). */
long safetensors_write_dtypes(FILE *f, const st_tensor *ts,
                              const unsigned char *bf16, int n, char *err,
                              size_t errlen);

typedef struct {
    unsigned char *buf;   /* the whole file */
    size_t len;
    size_t data_start;
    void *header;         /* json_t* */
} st_file;

/* Read and validate a safetensors file, its data against the header's
 * CRC-32 where there is one. 0 or -1 with err naming the file ("tensor
 * data damaged: ..." for a checksum mismatch). */
int safetensors_open(st_file *sf, const char *path, char *err, size_t errlen);
void safetensors_close(st_file *sf);

/* Copy tensor `name` (F32, or BF16 widened exactly; numel elements) into
 * dst. 0 or -1 with err ("missing tensor X", "tensor X has N elements,
 * want M", "tensor X: not an F32 or BF16 tensor entry"). */
int safetensors_get(const st_file *sf, const char *name, float *dst,
                    size_t numel, char *err, size_t errlen);

/* The entry of tensor `name`: dtype ("F32", "BF16", ...; at most 15
 * chars, into dtype[16]), ndim (at most 4) and shape. 0; 1 when there is
 * no such tensor; -1 when its entry is malformed (err says how). */
int safetensors_info(const st_file *sf, const char *name, char dtype[16],
                     int *ndim, long shape[4], char *err, size_t errlen);

#endif /* M6_CHECKPOINT_H */
