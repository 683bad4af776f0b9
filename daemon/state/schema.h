/*
 * schema.h — the SQL migrations of schema/, embedded at build time
 * (schema/embed.py generates schema.c). Applied in order by state_open.
 */
#ifndef M6_SCHEMA_H
#define M6_SCHEMA_H

typedef struct {
    const char *name;  /* "0001_init.sql" */
    const char *sql;
} schema_migration;

extern const schema_migration schema_migrations[];
extern const int schema_n_migrations;

#endif /* M6_SCHEMA_H */
