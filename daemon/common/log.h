/*
 * log.h — one line per event on stderr: "time level event key=value ...".
 * Thread-safe (one write(2) per line). Used by every m6d module.
 */
#ifndef M6_LOG_H
#define M6_LOG_H

typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } log_level;

void log_set_level(log_level lv);
/* "debug"|"info"|"warn"|"error" -> level; -1 if unknown. */
int log_parse_level(const char *s);

/* event: a short dotted name ("run.start"); fmt: "key=value key=value". */
void log_event(log_level lv, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_debug(ev, ...) log_event(LOG_DEBUG, ev, __VA_ARGS__)
#define log_info(ev, ...)  log_event(LOG_INFO, ev, __VA_ARGS__)
#define log_warn(ev, ...)  log_event(LOG_WARN, ev, __VA_ARGS__)
#define log_error(ev, ...) log_event(LOG_ERROR, ev, __VA_ARGS__)

#endif /* M6_LOG_H */
