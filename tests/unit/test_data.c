/*
 * test_data.c — token shards (write, read back, every rejection) and
 * data_prepare on a hand-made tree and on the fortunes corpus.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../common/open_fds.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "client/corpus/corpus.h"
#include "train/data.h"
#include "control/advice.h"

#define FORTUNES "/usr/share/games/fortunes"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

static int rm_one_(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb; (void)flag; (void)f;
    return remove(p);
}

static int setup_tmp(void **state)
{
    const char *base = getenv("TMPDIR");
    char *dir = malloc(4096);
    if (!dir) return -1;
    snprintf(dir, 4096, "%s/m6-test-data-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) { free(dir); return -1; }
    *state = dir;
    return 0;
}

static int teardown_tmp(void **state)
{
    char *dir = *state;
    nftw(dir, rm_one_, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
    return 0;
}

static char *join(const char *a, const char *b)
{
    size_t len = strlen(a) + strlen(b) + 2;
    char *p = malloc(len);
    assert_non_null(p);
    snprintf(p, len, "%s/%s", a, b);
    return p;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* Deterministic text: printable ASCII and newlines, seeded per file. */
static unsigned char *make_text(size_t n, unsigned seed)
{
    unsigned char *t = malloc(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        unsigned r = (x >> 24) % 96;
        t[i] = r == 95 ? '\n' : (unsigned char)(' ' + r);
    }
    return t;
}

static void assert_contains(const char *hay, const char *needle)
{
    if (!strstr(hay, needle))
        fail_msg("error \"%s\" lacks \"%s\"", hay, needle);
}

/* ------------------------------------------------------------------------ */
/* Shards                                                                    */
/* ------------------------------------------------------------------------ */

static void test_shard_roundtrip(void **state)
{
    const char *dir = *state;
    char err[512];
    size_t na = 1000, nb = 37;
    uint16_t *a = malloc(na * 2), *b = malloc(nb * 2);
    for (size_t i = 0; i < na; i++) a[i] = (uint16_t)((i * 7919u) % 65536u);
    for (size_t i = 0; i < nb; i++) b[i] = (uint16_t)(65535 - i);
    char *pa = join(dir, "s_000000.bin"), *pb = join(dir, "s_000001.bin");
    /* written out of order: the set is sorted by name, not by creation */
    assert_int_equal(shard_write(pb, b, nb, err, sizeof err), 0);
    assert_int_equal(shard_write(pa, a, na, err, sizeof err), 0);

    /* the file is exactly the llm.c layout, and no .tmp is left over */
    size_t len;
    unsigned char *raw = read_file(pa, &len);
    assert_int_equal(len, 1024 + 2 * na);
    int32_t hdr[256];
    memcpy(hdr, raw, sizeof hdr);
    assert_int_equal(hdr[0], 20240520);
    assert_int_equal(hdr[1], 1);
    assert_int_equal(hdr[2], (int32_t)na);
    for (int i = 3; i < 256; i++) assert_int_equal(hdr[i], 0);
    assert_memory_equal(raw + 1024, a, 2 * na);
    free(raw);
    char *tmp = join(dir, "s_000000.bin.tmp");
    assert_int_not_equal(access(tmp, F_OK), 0);

    char *pat = join(dir, "s_*.bin");
    token_set ts;
    assert_int_equal(token_set_open_buf(&ts, pat, 65536, err, sizeof err), 0);
    assert_int_equal(ts.n_shards, 2);
    assert_int_equal(ts.total, na + nb);
    assert_int_equal(ts.n_tokens[0], na);
    assert_int_equal(ts.n_tokens[1], nb);
    for (size_t i = 0; i < na; i++) assert_int_equal(token_set_at(&ts, i), a[i]);
    for (size_t i = 0; i < nb; i++)
        assert_int_equal(token_set_at(&ts, na + i), b[i]);

    /* a window across the shard boundary */
    uint16_t win[21];
    assert_int_equal(token_set_read_buf(&ts, na - 10, win, 21, err, sizeof err), 0);
    for (int k = 0; k < 10; k++) assert_int_equal(win[k], a[na - 10 + k]);
    for (int k = 10; k < 21; k++) assert_int_equal(win[k], b[k - 10]);
    /* past the end the set wraps around */
    assert_int_equal(token_set_read_buf(&ts, na + nb - 2, win, 4, err, sizeof err), 0);
    assert_int_equal(win[0], b[nb - 2]);
    assert_int_equal(win[1], b[nb - 1]);
    assert_int_equal(win[2], a[0]);
    assert_int_equal(win[3], a[1]);
    token_set_close(&ts);

    /* the same tokens are too big for vocab 50257: the error names the file */
    assert_int_equal(token_set_open_buf(&ts, pat, 50257, err, sizeof err), -1);
    assert_contains(err, pa);
    assert_contains(err, ">= vocab_size 50257");

    free(a); free(b); free(pa); free(pb); free(tmp); free(pat);
}

/* A shard written by hand, as another tool would, opens as it is. */
static void test_foreign_shard(void **state)
{
    const char *dir = *state;
    char err[512];
    unsigned char buf[1024 + 2 * 5];
    memset(buf, 0, sizeof buf);
    int32_t h[3] = { 20240520, 1, 5 };
    memcpy(buf, h, sizeof h);
    uint16_t t[5] = { 50256, 0, 1, 255, 40000 };
    memcpy(buf + 1024, t, sizeof t);
    char *p = join(dir, "x.bin");
    write_file(p, buf, sizeof buf);
    token_set ts;
    assert_int_equal(token_set_open_buf(&ts, p, 50257, err, sizeof err), 0);
    assert_int_equal(ts.total, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(token_set_at(&ts, i), t[i]);
    token_set_close(&ts);
    free(p);
}

/* Write a good 100-token shard at dir/name, return its path. */
static char *good_shard(const char *dir, const char *name)
{
    char err[512];
    uint16_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (uint16_t)i;
    char *p = join(dir, name);
    assert_int_equal(shard_write(p, t, 100, err, sizeof err), 0);
    return p;
}

static void expect_open_error(const char *pattern, int vocab, const char *names,
                              const char *problem)
{
    char err[512] = "";
    token_set ts;
    assert_int_equal(token_set_open_buf(&ts, pattern, vocab, err, sizeof err), -1);
    assert_contains(err, names);
    assert_contains(err, problem);
    assert_int_equal(ts.n_shards, 0);  /* closed on failure */
}

static void test_truncated(void **state)
{
    char *p = good_shard(*state, "t.bin");
    assert_int_equal(truncate(p, 1024 + 2 * 99), 0);
    expect_open_error(p, 256, p, "truncated: header says 100 tokens, file holds 99");
    /* one byte too many: not a whole token, so the counts alone agree */
    assert_int_equal(truncate(p, 1024 + 2 * 100 + 1), 0);
    expect_open_error(p, 256, p, "size mismatch: header says 100 tokens (200 "
                      "bytes after the header), the file has 201 bytes after it");
    assert_int_equal(truncate(p, 1000), 0);
    expect_open_error(p, 256, p, "too short");
    free(p);
}

/* A shard under a long directory (the spec allows 1023-byte globs): the
 * message keeps the shard's name and the problem within status's 512
 * bytes, the middle of the path shortened. */
static void test_long_path_error(void **state)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/", (const char *)*state);
    for (int k = 0; k < 4; k++) {  /* four 200-byte components */
        size_t n = strlen(dir);
        memset(dir + n, 'd', 200);
        dir[n + 200] = 0;
        assert_int_equal(mkdir(dir, 0755), 0);
        strcat(dir, "/");
    }
    dir[strlen(dir) - 1] = 0;
    char *p = good_shard(dir, "train_000042.bin");
    assert_true(strlen(p) > 800);
    assert_int_equal(truncate(p, 1024 + 2 * 99), 0);
    char err[512] = "";
    token_set ts;
    assert_int_equal(token_set_open_buf(&ts, p, 256, err, sizeof err), -1);
    assert_contains(err, "...");
    assert_contains(err, "dddd/train_000042.bin: truncated: header says 100 "
                         "tokens, file holds 99");
    assert_true(strlen(err) < 400);
    free(p);
}

/* A shard on a path of over 3000 bytes (twelve nested 250-byte
 * directories): token_set_open's and token_set_read's messages are whole,
 * the full path and the problem after it, however long. */
static void test_long_path_whole(void **state)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", (const char *)*state);
    for (int k = 0; k < 12; k++) {
        size_t n = strlen(dir);
        dir[n] = '/';
        memset(dir + n + 1, 'a' + k, 250);
        dir[n + 251] = 0;
        assert_int_equal(mkdir(dir, 0755), 0);
    }
    char *p = good_shard(dir, "train_000042.bin");
    assert_true(strlen(p) > 3000);
    char want[4200];
    /* at open */
    assert_int_equal(truncate(p, 1024 + 2 * 99), 0);
    token_set ts;
    m6_err e = M6_ERR_NONE;
    assert_int_equal(token_set_open(&ts, p, 256, &e), -1);
    assert_int_equal(e.code, M6_EDATA);
    snprintf(want, sizeof want,
             "%s: truncated: header says 100 tokens, file holds 99", p);
    assert_string_equal(e.msg, want);
    m6_err_free(&e);
    /* while in use */
    free(good_shard(dir, "train_000042.bin"));
    assert_int_equal(token_set_open(&ts, p, 256, &e), 0);
    assert_int_equal(truncate(p, 1024 + 2 * 50), 0);
    uint16_t win[10];
    assert_int_equal(token_set_read(&ts, 60, win, 10, &e), -1);
    snprintf(want, sizeof want,
             "%s: truncated while in use: now 50 tokens, was 100", p);
    assert_string_equal(e.msg, want);
    m6_err_free(&e);
    token_set_close(&ts);
    free(p);
}

static void test_bad_magic(void **state)
{
    char *p = good_shard(*state, "m.bin");
    FILE *f = fopen(p, "r+b");
    int32_t bad = 20240521;
    fwrite(&bad, 4, 1, f);
    fclose(f);
    expect_open_error(p, 256, p, "bad magic 20240521 (want 20240520)");
    free(p);
}

static void test_bad_version(void **state)
{
    char *p = good_shard(*state, "v.bin");
    FILE *f = fopen(p, "r+b");
    int32_t bad = 7;
    fseek(f, 4, SEEK_SET);
    fwrite(&bad, 4, 1, f);
    fclose(f);
    expect_open_error(p, 256, p, "bad version 7");
    free(p);
}

static void test_token_out_of_vocab(void **state)
{
    char err[512];
    uint16_t t[40];
    for (int i = 0; i < 40; i++) t[i] = (uint16_t)(i + 1);
    t[17] = 300;
    char *p = join(*state, "o.bin");
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    expect_open_error(p, 256, p, "token 300 at index 17 >= vocab_size 256");
    /* the boundary: vocab_size itself is out, vocab_size - 1 is in */
    t[17] = 256;
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    expect_open_error(p, 256, p, "token 256 at index 17 >= vocab_size 256");
    token_set ts;
    assert_int_equal(token_set_open_buf(&ts, p, 257, err, sizeof err), 0);
    token_set_close(&ts);
    /* past the first read chunk (512 Ki tokens): the index is still right */
    size_t nb = 1500000;
    uint16_t *big = calloc(nb, sizeof *big);
    assert_non_null(big);
    big[1234567] = 999;
    assert_int_equal(shard_write(p, big, nb, err, sizeof err), 0);
    expect_open_error(p, 256, p, "token 999 at index 1234567 >= vocab_size 256");
    free(big);
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    /* a shard checked once (and remembered as such) then changed in place
     * -- same inode and size, new mtime -- is read again */
    for (int i = 0; i < 40; i++) t[i] = (uint16_t)(i + 1);
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    assert_int_equal(token_set_open_buf(&ts, p, 256, err, sizeof err), 0);
    token_set_close(&ts);
    struct stat before, after;
    assert_int_equal(stat(p, &before), 0);
    struct timespec pause_ = {0, 20 * 1000 * 1000};
    nanosleep(&pause_, NULL);  /* a visibly newer mtime */
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    uint16_t bad = 4000;
    assert_int_equal(pwrite(fd, &bad, 2, 1024 + 2 * 5), 2);
    close(fd);
    assert_int_equal(stat(p, &after), 0);
    assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
    expect_open_error(p, 256, p, "token 4000 at index 5 >= vocab_size 256");
    /* the same with the mtime put back afterwards (touch -r): the ctime
     * still tells the change */
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    assert_int_equal(token_set_open_buf(&ts, p, 256, err, sizeof err), 0);
    token_set_close(&ts);
    assert_int_equal(stat(p, &before), 0);
    nanosleep(&pause_, NULL);
    fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    bad = 4001;
    assert_int_equal(pwrite(fd, &bad, 2, 1024 + 2 * 6), 2);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    assert_int_equal(futimens(fd, times), 0);
    close(fd);
    assert_int_equal(stat(p, &after), 0);
    assert_true(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
                after.st_mtim.tv_nsec == before.st_mtim.tv_nsec &&
                after.st_size == before.st_size);
    expect_open_error(p, 256, p, "token 4001 at index 6 >= vocab_size 256");
    t[17] = 256;
    assert_int_equal(shard_write(p, t, 40, err, sizeof err), 0);
    /* a later shard's error names that shard, not the first one */
    char *g = good_shard(*state, "a.bin");
    char *pat = join(*state, "*.bin");
    expect_open_error(pat, 256, p, "index 17");
    free(p); free(g); free(pat);
}

static void test_empty_glob(void **state)
{
    char *pat = join(*state, "nothing_*.bin");
    char want[4200];
    snprintf(want, sizeof want, "no files match '%s'", pat);
    expect_open_error(pat, 256, pat, want);
    free(pat);
    /* under a directory that does not exist: still "no files match" */
    pat = join(*state, "missing_dir/*.bin");
    snprintf(want, sizeof want, "no files match '%s'", pat);
    expect_open_error(pat, 256, pat, want);
    free(pat);
}

/* More shards than the process may open (a low soft RLIMIT_NOFILE): the
 * set is refused with TOKEN_SET_ENOFILE, the limit, the shard that could
 * not be opened and the set's size, and every descriptor it took is given
 * back; under the old limit the same set opens. */
static void test_too_many_open_files(void **state)
{
    const char *dir = *state;
    enum { N = 40 };
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "f_%06d.bin", i);
        free(good_shard(dir, name));
    }
    char *pat = join(dir, "f_*.bin");
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int before = open_fds();
    low = old;
    low.rlim_cur = (rlim_t)before + 10;  /* room for 10 shards */
    if (low.rlim_cur > old.rlim_cur) skip();
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    char err[1024] = "", want[64];
    token_set ts;
    m6_err e = M6_ERR_NONE;
    int rc = token_set_open(&ts, pat, 256, &e);
    int after = open_fds();
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, TOKEN_SET_ENOFILE);
    /* the core says what happened (code M6_ENOFILE); the edge adds what
     * to do (control/advice.h): err is the message as m6d shows it */
    assert_int_equal(e.code, M6_ENOFILE);
    m6_advice adv = m6_advice_for(e.code);
    assert_non_null(adv.text);
    snprintf(err, sizeof err, "%s%s%s", m6_err_msg(&e), adv.sep, adv.text);
    m6_err_free(&e);
    snprintf(want, sizeof want, "too many open files (limit %d): ",
             before + 10);
    assert_true(strncmp(err, want, strlen(want)) == 0);
    /* shard 11 where descriptors 0..before-1 are all taken */
    assert_contains(err, ".bin: open: shard ");
    assert_contains(err, " of 40; a run keeps every shard open: raise m6d's "
                         "open-file limit");
    assert_int_equal(ts.n_shards, 0);
    assert_int_equal(after, before);
    assert_int_equal(token_set_open_buf(&ts, pat, 256, err, sizeof err), 0);
    assert_int_equal(ts.n_shards, N);
    token_set_close(&ts);
    assert_int_equal(open_fds(), before);
    free(pat);
}

/* A dangling symlink met in a directory walk is skipped and counted; one
 * named on the command line is an error. */
static void test_prepare_dangling_link(void **state)
{
    const char *dir = *state;
    char err[512];
    prepare_stats st;
    char *in = join(dir, "in"), *txt = join(dir, "in/a.txt"),
         *link = join(dir, "in/gone.txt"), *out = join(dir, "out");
    assert_int_equal(mkdir(in, 0755), 0);
    size_t n = 20000;
    unsigned char *t = make_text(n, 3);
    write_file(txt, t, n);
    assert_int_equal(symlink("/nonexistent/m6-target", link), 0);
    const char *inputs[1] = { in };
    assert_int_equal(data_prepare(out, inputs, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), 0);
    assert_int_equal(st.files, 1);
    assert_int_equal(st.skipped, 1);
    assert_int_equal(st.special, 1);
    assert_int_equal(st.binary, 0);
    char *out2 = join(dir, "out2");
    const char *direct[1] = { link };
    assert_int_equal(data_prepare(out2, direct, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, link);
    free(in); free(txt); free(link); free(out); free(out2); free(t);
}

static void test_shard_write_error(void **state)
{
    char err[512] = "";
    uint16_t t[3] = { 1, 2, 3 };
    char *p = join(*state, "no/such/dir/s.bin");
    assert_int_equal(shard_write(p, t, 3, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "No such file or directory");
    free(p);
}

/* ------------------------------------------------------------------------ */
/* data_prepare                                                              */
/* ------------------------------------------------------------------------ */

static void count_progress(const char *file, size_t bytes, void *ud)
{
    (void)file; (void)bytes;
    (*(int *)ud)++;
}

/* All tokens of the shards matching dir/prefix_*.bin, as bytes. */
static unsigned char *read_tokens(const char *dir, const char *prefix,
                                  size_t cap, size_t *n, int *n_shards)
{
    char pat[4200], err[512];
    snprintf(pat, sizeof pat, "%s/%s_*.bin", dir, prefix);
    token_set ts;
    if (token_set_open_buf(&ts, pat, 256, err, sizeof err) != 0)
        fail_msg("%s", err);
    unsigned char *b = malloc(ts.total);
    for (size_t i = 0; i < ts.total; i++) b[i] = (unsigned char)token_set_at(&ts, i);
    for (int s = 0; s < ts.n_shards; s++) assert_true(ts.n_tokens[s] <= cap);
    *n = ts.total;
    *n_shards = ts.n_shards;
    token_set_close(&ts);
    return b;
}

static void test_prepare_tree(void **state)
{
    const char *dir = *state;
    char err[512];
    char *in = join(dir, "in"), *sub = join(in, "sub"), *out = join(dir, "out/a/b");
    assert_int_equal(mkdir(in, 0755), 0);
    assert_int_equal(mkdir(sub, 0755), 0);

    /* walk order (bytewise names): a.txt b.txt.gz c.bin link.txt sub/d.dz
     * (.dz: dictd's dictzip, gzip to zlib) */
    size_t na = 1001, nb = 20000, nd = 333;
    unsigned char *ta = make_text(na, 1), *tb = make_text(nb, 2),
                  *td = make_text(nd, 3);
    char *pa = join(in, "a.txt"), *pb = join(in, "b.txt.gz"),
         *pc = join(in, "c.bin"), *pl = join(in, "link.txt"),
         *pd = join(sub, "d.dz");
    write_file(pa, ta, na);
    gzFile gz = gzopen(pb, "wb9");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, tb, (unsigned)nb), (int)nb);
    assert_int_equal(gzclose(gz), Z_OK);
    unsigned char binary[300];
    memcpy(binary, "text before a NUL", 17);
    memset(binary + 17, 0, sizeof binary - 17);
    write_file(pc, binary, sizeof binary);
    assert_int_equal(symlink("a.txt", pl), 0);
    gz = gzopen(pd, "wb9");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, td, (unsigned)nd), (int)nd);
    assert_int_equal(gzclose(gz), Z_OK);

    /* val is the last quarter (rounded down) of each text file */
    const unsigned char *texts[3] = { ta, tb, td };
    size_t sizes[3] = { na, nb, nd };
    size_t want_train_n = 0, want_val_n = 0;
    unsigned char *want_train = malloc(na + nb + nd), *want_val = malloc(na + nb + nd);
    for (int f = 0; f < 3; f++) {
        size_t v = sizes[f] / 4, t = sizes[f] - v;
        memcpy(want_train + want_train_n, texts[f], t);
        memcpy(want_val + want_val_n, texts[f] + t, v);
        want_train_n += t;
        want_val_n += v;
    }

    const char *inputs[1] = { in };
    prepare_stats st;
    int calls = 0;
    size_t cap = 700;
    if (data_prepare(out, inputs, 1, 0.25, cap, &st, count_progress, &calls,
                     err, sizeof err) != 0)
        fail_msg("data_prepare: %s", err);
    assert_int_equal(st.files, 3);
    assert_int_equal(st.skipped, 1);
    assert_int_equal(calls, 3);
    assert_int_equal(st.train_tokens, want_train_n);
    assert_int_equal(st.val_tokens, want_val_n);
    assert_int_equal(st.train_shards, (want_train_n + cap - 1) / cap);
    assert_int_equal(st.val_shards, (want_val_n + cap - 1) / cap);

    size_t n;
    int shards;
    unsigned char *got = read_tokens(out, "train", cap, &n, &shards);
    assert_int_equal(n, want_train_n);
    assert_int_equal(shards, (int)st.train_shards);
    assert_memory_equal(got, want_train, n);
    free(got);
    got = read_tokens(out, "val", cap, &n, &shards);
    assert_int_equal(n, want_val_n);
    assert_int_equal(shards, (int)st.val_shards);
    assert_memory_equal(got, want_val, n);
    free(got);

    /* a second run into the same directory would mix shards: refused */
    assert_int_equal(data_prepare(out, inputs, 1, 0.25, cap, &st, NULL, NULL,
                                  err, sizeof err), -1);
    assert_contains(err, out);
    assert_contains(err, "already holds shards");

    /* naming the file and its symlink directly still reads it once */
    char *out2 = join(dir, "out2");
    const char *twice[2] = { pl, pa };
    assert_int_equal(data_prepare(out2, twice, 2, 0.0, 0, &st, NULL, NULL,
                                  err, sizeof err), 0);
    assert_int_equal(st.files, 1);
    assert_int_equal(st.train_tokens, na);
    assert_int_equal(st.val_tokens, 0);
    assert_int_equal(st.val_shards, 0);

    free(ta); free(tb); free(td); free(want_train); free(want_val);
    free(pa); free(pb); free(pc); free(pl); free(pd);
    free(in); free(sub); free(out); free(out2);
}

static void interrupt_after_first(const char *file, size_t bytes, void *ud)
{
    (void)file; (void)bytes; (void)ud;
    data_prepare_interrupt();
}

static void test_prepare_errors(void **state)
{
    const char *dir = *state;
    char err[512];
    prepare_stats st;

    /* missing input */
    char *missing = join(dir, "missing.txt"), *out = join(dir, "out");
    const char *in1[1] = { missing };
    assert_int_equal(data_prepare(out, in1, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, missing);
    assert_contains(err, "No such file");

    /* a corrupt .gz: the error names it, and no shard survives */
    size_t n = 50000;
    unsigned char *t = make_text(n, 9);
    char *good = join(dir, "a.txt"), *gzp = join(dir, "b.gz");
    write_file(good, t, n);
    gzFile gz = gzopen(gzp, "wb");
    gzwrite(gz, t, (unsigned)n);
    gzclose(gz);
    size_t len;
    unsigned char *raw = read_file(gzp, &len);
    write_file(gzp, raw, len / 2);
    const char *in2[2] = { good, gzp };
    assert_int_equal(data_prepare(out, in2, 2, 0.1, 1000, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, gzp);
    assert_contains(err, "gzip");
    /* out was made by this call: it goes too */
    struct stat sb;
    assert_int_equal(stat(out, &sb), -1);
    /* an existing out dir stays, emptied of this call's shards */
    assert_int_equal(mkdir(out, 0755), 0);
    assert_int_equal(data_prepare(out, in2, 2, 0.1, 1000, &st, NULL, NULL, err,
                                  sizeof err), -1);
    DIR *d = opendir(out);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') fail_msg("left behind: %s", de->d_name);
    closedir(d);

    /* only binary input */
    char *bin = join(dir, "z.bin");
    unsigned char zeros[64] = { 0 };
    write_file(bin, zeros, sizeof zeros);
    const char *in3[1] = { bin };
    assert_int_equal(data_prepare(out, in3, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, "no text");
    assert_int_equal(st.skipped, 1);
    /* every directory made on the way to out goes too, none that was there */
    char *top = join(dir, "made"), *deep = join(dir, "made/a/b/");
    assert_int_equal(data_prepare(deep, in3, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_int_equal(stat(top, &sb), -1);
    assert_int_equal(stat(dir, &sb), 0);
    free(top); free(deep);
    /* and when mkdir itself fails on the way (a name over NAME_MAX) */
    char longname[300 + 8] = "made/";
    memset(longname + 5, 'x', 300);
    longname[305] = '\0';
    top = join(dir, "made");
    deep = join(dir, longname);
    assert_int_equal(data_prepare(deep, in3, 1, 0.1, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, "mkdir");
    assert_int_equal(stat(top, &sb), -1);
    free(top); free(deep);

    /* interrupted (as by m6ctl's SIGINT handler) after the first file: the
     * shards written so far go, and the out dir this call made */
    char *good2 = join(dir, "c.txt"), *out3 = join(dir, "out3");
    write_file(good2, t, n);
    const char *in5[2] = { good, good2 };
    assert_int_equal(data_prepare(out3, in5, 2, 0.1, 1000, &st, interrupt_after_first,
                                  NULL, err, sizeof err), -1);
    assert_contains(err, "interrupted");
    assert_int_equal(stat(out3, &sb), -1);
    /* the next call starts afresh */
    assert_int_equal(data_prepare(out3, in5, 2, 0.1, 1000, &st, NULL, NULL, err,
                                  sizeof err), 0);
    free(good2); free(out3);

    /* bad fraction */
    const char *in4[1] = { good };
    assert_int_equal(data_prepare(out, in4, 1, 1.0, 0, &st, NULL, NULL, err,
                                  sizeof err), -1);
    assert_contains(err, "val_fraction");

    free(missing); free(out); free(t); free(good); free(gzp); free(raw);
    free(bin);
}

/* The real corpus: text files, binary .dat indexes, .u8 symlinks. */
static void test_prepare_fortunes(void **state)
{
    struct stat sb;
    if (stat(FORTUNES, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        print_message("skipped: %s not present\n", FORTUNES);
        skip();
    }
    /* Independently: the bytes of every regular (non-symlink) text file. */
    size_t want = 0, want_val = 0, texts = 0, bins = 0, links = 0;
    DIR *d = opendir(FORTUNES);
    struct dirent *de;
    while ((de = readdir(d))) {
        char *p = join(FORTUNES, de->d_name);
        struct stat ls;
        if (lstat(p, &ls) == 0 && S_ISREG(ls.st_mode)) {
            size_t n;
            unsigned char *b = read_file(p, &n);
            if (!memchr(b, 0, n < 8192 ? n : 8192)) {
                want += n;
                want_val += n / 10;  /* val_fraction 0.1, rounded down */
                texts++;
            } else {
                bins++;
            }
            free(b);
        } else if (S_ISLNK(ls.st_mode) && stat(p, &ls) == 0 && S_ISREG(ls.st_mode)) {
            links++;  /* the .u8 names: each points at a file read anyway */
        }
        free(p);
    }
    closedir(d);
    assert_true(want > 0);

    char err[512];
    char *out = join(*state, "fortunes");
    const char *in[1] = { FORTUNES };
    prepare_stats st;
    if (data_prepare(out, in, 1, 0.1, 0, &st, NULL, NULL, err, sizeof err) != 0)
        fail_msg("data_prepare: %s", err);
    assert_int_equal(st.files, texts);
    assert_true(st.skipped > 0);  /* the .dat files */
    assert_int_equal(st.binary, bins);
    assert_int_equal(st.skipped, bins);
    assert_int_equal(st.special, 0);
    assert_int_equal(st.duplicates, links);
    assert_true(st.binary_example[0] != '\0' && !strchr(st.binary_example, '/'));
    assert_int_equal(st.train_tokens + st.val_tokens, want);
    assert_int_equal(st.val_tokens, want_val);
    assert_int_equal(st.train_shards, 1);
    assert_int_equal(st.val_shards, 1);

    char *pat = join(out, "*.bin");
    token_set ts;
    if (token_set_open_buf(&ts, pat, 256, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(ts.total, want);
    uint16_t *all = malloc(ts.total * sizeof *all);
    assert_non_null(all);
    /* every token < 256: token_set_read checks them all */
    if (token_set_read_buf(&ts, 0, all, ts.total, err, sizeof err) != 0)
        fail_msg("%s", err);
    free(all);
    token_set_close(&ts);
    free(out);
    free(pat);
}

/* ------------------------------------------------------------------------ */
/* Reading batches from shards that change while in use                      */
/* ------------------------------------------------------------------------ */

/* Two shards of 100 tokens (0..99 and 100..199), opened for vocab 256. */
static void open_two_(const char *dir, token_set *ts, char **pa, char **pb)
{
    char err[512];
    uint16_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (uint16_t)i;
    *pa = join(dir, "r_000000.bin");
    assert_int_equal(shard_write(*pa, t, 100, err, sizeof err), 0);
    for (int i = 0; i < 100; i++) t[i] = (uint16_t)(100 + i);
    *pb = join(dir, "r_000001.bin");
    assert_int_equal(shard_write(*pb, t, 100, err, sizeof err), 0);
    char *pat = join(dir, "r_*.bin");
    if (token_set_open_buf(ts, pat, 256, err, sizeof err) != 0) fail_msg("%s", err);
    free(pat);
}

/* A shard truncated in place under an open set: reads past its new end are
 * an error naming the file and both sizes (not SIGBUS), reads before it and
 * in the other shard still work, and restoring the file makes the same
 * read succeed again. */
static void test_read_truncated_in_use(void **state)
{
    const char *dir = *state;
    token_set ts;
    char *pa, *pb, err[512] = "";
    open_two_(dir, &ts, &pa, &pb);
    size_t n;
    unsigned char *orig = read_file(pb, &n);
    assert_int_equal(truncate(pb, 1024 + 2 * 40), 0);  /* 40 of 100 left */

    uint16_t win[30];
    assert_int_equal(token_set_read_buf(&ts, 130, win, 30, err, sizeof err), -1);
    assert_contains(err, "r_000001.bin");
    assert_contains(err, "truncated while in use: now 40 tokens, was 100");
    assert_int_equal(token_set_at(&ts, 150), -1);
    /* the part still there, and the other shard, read as before */
    assert_int_equal(token_set_read_buf(&ts, 90, win, 30, err, sizeof err), 0);
    for (int k = 0; k < 30; k++) assert_int_equal(win[k], 90 + k);
    assert_int_equal(token_set_at(&ts, 0), 0);
    /* shorter than a header: 0 tokens */
    assert_int_equal(truncate(pb, 100), 0);
    assert_int_equal(token_set_read_buf(&ts, 100, win, 1, err, sizeof err), -1);
    assert_contains(err, "now 0 tokens, was 100");

    /* restored in place (the same inode): the read works again */
    FILE *f = fopen(pb, "r+b");
    assert_non_null(f);
    assert_int_equal(fwrite(orig, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(token_set_read_buf(&ts, 130, win, 30, err, sizeof err), 0);
    for (int k = 0; k < 30; k++) assert_int_equal(win[k], 130 + k);
    token_set_close(&ts);
    free(orig); free(pa); free(pb);
}

/* A token id >= vocab_size written in place after the set was checked: the
 * read that meets it fails, naming the file, the token and its index in
 * the shard; windows that do not cover it read as before. */
static void test_read_bad_token_in_use(void **state)
{
    const char *dir = *state;
    token_set ts;
    char *pa, *pb, err[512] = "";
    open_two_(dir, &ts, &pa, &pb);
    int fd = open(pb, O_WRONLY);
    assert_true(fd >= 0);
    uint16_t bad = 999;
    assert_int_equal(pwrite(fd, &bad, 2, 1024 + 2 * 17), 2);
    assert_int_equal(close(fd), 0);

    uint16_t win[30];
    assert_int_equal(token_set_read_buf(&ts, 110, win, 10, err, sizeof err), -1);
    assert_contains(err, "r_000001.bin");
    assert_contains(err, "token 999 at index 17 >= vocab_size 256");
    assert_int_equal(token_set_at(&ts, 117), -1);
    assert_int_equal(token_set_read_buf(&ts, 90, win, 27, err, sizeof err), 0);
    assert_int_equal(win[26], 116);
    assert_int_equal(token_set_read_buf(&ts, 118, win, 30, err, sizeof err), 0);
    assert_int_equal(win[0], 118);
    /* across the wrap-around: up to the bad token, then onto it */
    uint16_t big[128];
    assert_int_equal(token_set_read_buf(&ts, 190, big, 127, err, sizeof err), 0);
    assert_int_equal(big[126], 116);
    err[0] = 0;
    assert_int_equal(token_set_read_buf(&ts, 190, big, 128, err, sizeof err), -1);
    assert_contains(err, "token 999 at index 17");
    token_set_close(&ts);
    free(pa); free(pb);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_tmp, teardown_tmp)
    const struct CMUnitTest tests[] = {
        T(test_shard_roundtrip),
        T(test_foreign_shard),
        T(test_read_truncated_in_use),
        T(test_read_bad_token_in_use),
        T(test_truncated),
        T(test_long_path_error),
        T(test_long_path_whole),
        T(test_bad_magic),
        T(test_bad_version),
        T(test_token_out_of_vocab),
        T(test_empty_glob),
        T(test_too_many_open_files),
        T(test_shard_write_error),
        T(test_prepare_tree),
        T(test_prepare_errors),
        T(test_prepare_dangling_link),
        T(test_prepare_fortunes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
