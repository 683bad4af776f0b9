/*
 * m6store.c — the worker side of the rendezvous store (cluster/
 * store_client.h) as a command, for tests/integration/nodes.sh: each
 * invocation is one store client, as a rank's collectives would open it.
 *
 *   m6store ADDR TOKEN_FILE STATE_DIR RANK RUN GEN IO_TIMEOUT_MS set KEY VALUE
 *   m6store ADDR TOKEN_FILE STATE_DIR RANK RUN GEN IO_TIMEOUT_MS get KEY TIMEOUT_MS
 *   m6store ADDR TOKEN_FILE STATE_DIR RANK RUN GEN IO_TIMEOUT_MS wait TIMEOUT_MS KEY...
 *
 * STATE_DIR: an m6d's state dir, whose node-id and node-secret say who
 * opens the store, as rank RANK (store_client.h).
 * get prints the value on stdout. Exit 0 ok, 3 a timeout (M6_ECANCELLED),
 * 1 any other error (the store's message on stderr), 2 bad usage.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/store_client.h"

static int fail_(m6_err *e)
{
    fprintf(stderr, "m6store: %s\n", m6_err_msg(e));
    int rc = e->code == M6_ECANCELLED ? 3 : 1;
    m6_err_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 10) {
        fprintf(stderr, "usage: m6store ADDR TOKEN_FILE STATE_DIR RANK RUN GEN "
                "IO_TIMEOUT_MS set KEY VALUE | get KEY TIMEOUT_MS | wait "
                "TIMEOUT_MS KEY...\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);  /* as in m6d: TLS writes on a closed socket */
    cluster_token tok;
    char msg[512];
    if (cluster_token_load(argv[2], &tok, msg, sizeof msg) < 0) {
        fprintf(stderr, "m6store: %s\n", msg);
        return 1;
    }
    m6_store_who who;
    if (m6_store_who_load(argv[3], atoi(argv[4]), &who, msg, sizeof msg) < 0) {
        fprintf(stderr, "m6store: %s\n", msg);
        return 1;
    }
    /* from here the arguments as before STATE_DIR RANK: ADDR moves over
     * them (TOKEN_FILE is read) */
    argv[3] = argv[1];
    argv += 2;
    argc -= 2;
    m6_store st;
    m6_err e = M6_ERR_NONE;
    if (m6_store_tcp_open(argv[1], &tok, &who, atoll(argv[3]), atoll(argv[4]),
                          atoi(argv[5]), &st, &e) < 0)
        return fail_(&e);
    const char *op = argv[6];
    int rc = 0;
    if (strcmp(op, "set") == 0 && argc == 9) {
        if (st.set(st.ctx, argv[7], argv[8], strlen(argv[8]), &e) < 0)
            rc = fail_(&e);
    } else if (strcmp(op, "get") == 0 && argc == 9) {
        void *val;
        size_t len;
        if (st.get(st.ctx, argv[7], &val, &len, atoi(argv[8]), &e) < 0) {
            rc = fail_(&e);
        } else {
            fwrite(val, 1, len, stdout);
            printf("\n");
            free(val);
        }
    } else if (strcmp(op, "wait") == 0 && argc >= 9) {
        if (st.wait(st.ctx, (const char *const *)argv + 8, (size_t)(argc - 8),
                    atoi(argv[7]), &e) < 0)
            rc = fail_(&e);
    } else {
        fprintf(stderr, "m6store: bad operation \"%s\" or argument count\n", op);
        rc = 2;
    }
    m6_store_tcp_close(&st);
    return rc;
}
