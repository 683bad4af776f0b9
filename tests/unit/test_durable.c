/*
 * test_durable.c — common/durable.c on a shared host and a failing disk:
 * write_file_durable closes its file whatever fsync says (counted in
 * /proc/self/fd, with fsync made to fail), and open_regular refuses a
 * FIFO, a character device, a socket and a directory at once, naming the
 * path and its kind, while a regular file opens in blocking mode.
 *
 * durable.c is compiled into this test with fsync() routed to a stub that
 * fails on demand: a full disk or a dying device cannot be asked for.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <dirent.h>

#include "../common/test_main.h"

/* fsync_stub_: fails with fsync_errno_ when that is not 0 */
static int fsync_errno_;
static int fsync_calls_;
static int fsync_stub_(int fd)
{
    fsync_calls_++;
    if (fsync_errno_) {
        errno = fsync_errno_;
        return -1;
    }
    return fsync(fd);
}
#define fsync fsync_stub_
#include "../../daemon/common/durable.c"
#undef fsync

/* open_fds_: descriptors this process holds, from /proc (the oracle) */
static int open_fds_(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the DIR's own */
}

static char dir_[256];

static int setup_(void **st)
{
    (void)st;
    snprintf(dir_, sizeof dir_, "%s/m6-durable-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir_) ? 0 : -1;
}

static int teardown_(void **st)
{
    (void)st;
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    return system(cmd) == 0 ? 0 : -1;
}

/* a failed fsync: -1, the error names the path and fsync, no fd left
 * open after 64 tries; a good one writes the bytes */
static void test_fsync_failure_closes(void **st)
{
    (void)st;
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/f", dir_);
    int before = open_fds_();
    fsync_errno_ = EIO;
    fsync_calls_ = 0;
    for (int i = 0; i < 64; i++) {
        err[0] = '\0';
        assert_int_equal(write_file_durable(path, "abc", 3, err, sizeof err), -1);
        assert_int_equal(errno, EIO);
    }
    assert_int_equal(fsync_calls_, 64);
    char want[400];
    snprintf(want, sizeof want, "%s: fsync: %s", path, strerror(EIO));
    assert_string_equal(err, want);
    assert_int_equal(open_fds_(), before);

    fsync_errno_ = ENOSPC;
    assert_int_equal(write_file_durable(path, "abc", 3, err, sizeof err), -1);
    assert_non_null(strstr(err, "(ENOSPC: disk full)"));
    assert_int_equal(open_fds_(), before);

    fsync_errno_ = 0;
    assert_int_equal(write_file_durable(path, "hello", 5, err, sizeof err), 5);
    assert_int_equal(open_fds_(), before);
    char buf[16] = {0};
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, sizeof buf, f), 5);
    fclose(f);
    assert_string_equal(buf, "hello");
}

static void on_alarm_(int sig)
{
    (void)sig;
    static const char m[] = "open_regular blocked for 5 s\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(1);
}

/* one refusal: -1, EINVAL, "PATH is KIND, not a regular file", no fd */
static void refused_(const char *path, const char *kind)
{
    char err[512], want[512];
    int before = open_fds_();
    errno = 0;
    assert_int_equal(open_regular(path, 0, NULL, err, sizeof err), -1);
    assert_int_equal(errno, EINVAL);
    snprintf(want, sizeof want, "%s is %s, not a regular file", path, kind);
    assert_string_equal(err, want);
    assert_int_equal(open_fds_(), before);
}

static void test_open_regular_kinds(void **st)
{
    (void)st;
    char fifo[300], sock[300], file[300], err[512];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir_);
    snprintf(sock, sizeof sock, "%s/sock", dir_);
    snprintf(file, sizeof file, "%s/file", dir_);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    /* a bound Unix socket: open(2) of it fails with ENXIO, named too */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(sock) < sizeof a.sun_path);
    memcpy(a.sun_path, sock, strlen(sock) + 1);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);

    /* a FIFO without a writer blocks a plain open: the alarm says so */
    signal(SIGALRM, on_alarm_);
    alarm(5);
    refused_(fifo, "a FIFO");
    refused_("/dev/null", "a character device");
    refused_(dir_, "a directory");
    alarm(0);
    char want[400];
    snprintf(want, sizeof want, "%s: %s", sock, strerror(ENXIO));
    assert_int_equal(open_regular(sock, 0, NULL, err, sizeof err), -1);
    assert_string_equal(err, want);
    close(s);

    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
    struct stat sb;
    int fd = open_regular(file, 0, &sb, err, sizeof err);
    assert_true(fd >= 0);
    assert_int_equal(sb.st_size, 1);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
}

TEST_MAIN(cmocka_unit_test_setup_teardown(test_fsync_failure_closes,
                                          setup_, teardown_),
          cmocka_unit_test_setup_teardown(test_open_regular_kinds,
                                          setup_, teardown_))
