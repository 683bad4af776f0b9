/*
 * log.c — event lines on stderr, "2024-05-20T12:00:00.123Z info run.start id=3".
 */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile log_level g_level = LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level lv) { g_level = lv; }

int log_parse_level(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0) return i;
    return -1;
}

void log_event(log_level lv, const char *event, const char *fmt, ...)
{
    if (lv < g_level) return;
    char small[2048], *line = small;  /* most lines; a longer one: malloc */
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof small,
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     level_names[lv], event);
    if (n < 0 || (size_t)n >= sizeof small) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof small - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    size_t cap = sizeof small;
    if ((size_t)n + (size_t)m + 2 > sizeof small) {
        /* a long message (a path of thousands of bytes): whole, not cut */
        char *big = malloc((size_t)n + (size_t)m + 2);
        if (big) {
            memcpy(big, small, (size_t)n);
            va_start(ap, fmt);
            vsnprintf(big + n, (size_t)m + 1, fmt, ap);
            va_end(ap);
            line = big;
            cap = (size_t)n + (size_t)m + 2;
        }
    }
    size_t len = (size_t)n + (size_t)m;
    if (len > cap - 2) len = cap - 2;  /* out of memory: cut */
    while (len > 0 && line[len - 1] == ' ') len--;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
    if (line != small) free(line);
}
