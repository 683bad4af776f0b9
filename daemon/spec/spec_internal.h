/*
 * spec_internal.h — what spec.c and spec_write.c share, private to
 * daemon/spec/: the key table's entry (one per spec key: where it lives in
 * run_spec, its kind and range, its doc sentence) and the table itself,
 * which spec_keys.c owns. spec.h is the interface.
 */
#ifndef M6_SPEC_SPEC_INTERNAL_H
#define M6_SPEC_SPEC_INTERNAL_H

#include <stddef.h>

#include "spec/spec.h"

typedef enum {
    K_STR,     /* char[size] */
    K_INT,     /* int, [ilo, ihi] */
    K_LONG,    /* long, [ilo, ihi] */
    K_U64,     /* uint64_t: JSON integer >= 0, or a decimal string */
    K_FLOAT,   /* float, lo/hi with open ends */
    K_ENUM,    /* int-sized enum, value = index in names */
    K_SIZE,    /* size_t bytes: integer, or string with a unit suffix */
} kind_;

typedef struct {
    const char *section;  /* NULL: top level */
    const char *key;
    kind_ kind;
    size_t off, size;
    long long ilo, ihi;
    double flo, fhi;
    int lo_open, hi_open;
    const char *const *names;  /* K_ENUM, NULL-terminated */
    const char *doc;           /* one sentence for docs/OPERATIONS.md's key table */
    /* the table's default where it is a rule the parser applies to a
     * spec that leaves the key out (p2r_defaults_), not spec_defaults'
     * value; NULL: the value */
    const char *default_rule;
} key_;

/* The offset of run_spec member m (a key_'s off). */
#define OFF(m) offsetof(run_spec, m)

/* The key table (spec_keys.c): spec_n_keys_ entries, in the order the docs
 * and spec_to_json list them. */
extern const key_ spec_keys_[];
extern const size_t spec_n_keys_;
#define N_KEYS spec_n_keys_

/* "section.key" or "key" of k into buf[len]. */
void spec_path_of_(const key_ *k, char *buf, size_t len);
/* Shortest "%.Ng" of f that reads back to exactly f, with a '.' or an
 * exponent (a JSON real). */
void spec_float_text_(float f, char *buf, size_t len);

#endif /* M6_SPEC_SPEC_INTERNAL_H */
