/*
 * tls.c — TLS 1.3 with the token's PSK for the control channel (see
 * tls.h).
 */
#include "cluster/tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>

/* TLS_AES_128_GCM_SHA256 (RFC 8446, B.4): the suite of the PSK's session */
static const unsigned char aes128gcm_id_[2] = {0x13, 0x01};

void cluster_tls_reason(char *out, size_t outlen)
{
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(out, outlen, "%s", "");
    } else {
        const char *r = ERR_reason_error_string(e);
        if (r) snprintf(out, outlen, "%s", r);
        else ERR_error_string_n(e, out, outlen);
    }
    ERR_clear_error();
}

/* The PSK as a resumable session: the form OpenSSL's TLS 1.3 external-PSK
 * callbacks take. NULL on failure. */
static SSL_SESSION *psk_session_(SSL *ssl)
{
    const uint8_t *psk = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    const SSL_CIPHER *c = SSL_CIPHER_find(ssl, aes128gcm_id_);
    SSL_SESSION *s = c ? SSL_SESSION_new() : NULL;
    if (!s) return NULL;
    if (!SSL_SESSION_set1_master_key(s, psk, CLUSTER_PSK_LEN) ||
        !SSL_SESSION_set_cipher(s, c) ||
        !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
        SSL_SESSION_free(s);
        return NULL;
    }
    return s;
}

static int use_session_cb_(SSL *ssl, const EVP_MD *md,
                           const unsigned char **id, size_t *idlen,
                           SSL_SESSION **sess)
{
    const SSL_CIPHER *c = SSL_CIPHER_find(ssl, aes128gcm_id_);
    *sess = NULL;
    *id = NULL;
    *idlen = 0;
    /* after a HelloRetryRequest for another hash: no PSK fits (fails) */
    if (!c || (md && md != SSL_CIPHER_get_handshake_digest(c))) return 1;
    if (!(*sess = psk_session_(ssl))) return 0;
    *id = (const unsigned char *)CLUSTER_TLS_IDENTITY;
    *idlen = strlen(CLUSTER_TLS_IDENTITY);
    return 1;
}

static int find_session_cb_(SSL *ssl, const unsigned char *id, size_t idlen,
                            SSL_SESSION **sess)
{
    *sess = NULL;
    /* another identity: no PSK, and with no certificate the handshake fails */
    if (idlen != strlen(CLUSTER_TLS_IDENTITY) ||
        memcmp(id, CLUSTER_TLS_IDENTITY, idlen) != 0)
        return 1;
    return (*sess = psk_session_(ssl)) != NULL;
}

SSL_CTX *cluster_tls_ctx(const cluster_token *t, int server, char *err,
                         size_t errlen)
{
    char why[256];
    uint8_t *psk = malloc(CLUSTER_PSK_LEN);
    SSL_CTX *ctx = psk ? SSL_CTX_new(server ? TLS_server_method()
                                            : TLS_client_method())
                       : NULL;
    if (!ctx) goto fail;
    memcpy(psk, t->psk, CLUSTER_PSK_LEN);
    SSL_CTX_set_app_data(ctx, psk);
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256"))
        goto fail;
    /* a peer that closes without close_notify has simply closed: every
     * frame carries its length, so a cut one shows anyway */
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    if (server) {
        SSL_CTX_set_num_tickets(ctx, 0);
        SSL_CTX_set_psk_find_session_callback(ctx, find_session_cb_);
    } else {
        SSL_CTX_set_psk_use_session_callback(ctx, use_session_cb_);
    }
    return ctx;
fail:
    cluster_tls_reason(why, sizeof why);
    snprintf(err, errlen, "TLS setup: %s", why[0] ? why : "out of memory");
    if (ctx) cluster_tls_ctx_free(ctx);
    else free(psk);
    return NULL;
}

void cluster_tls_ctx_free(SSL_CTX *ctx)
{
    if (!ctx) return;
    uint8_t *psk = SSL_CTX_get_app_data(ctx);
    if (psk) {
        OPENSSL_cleanse(psk, CLUSTER_PSK_LEN);
        free(psk);
    }
    SSL_CTX_free(ctx);
}

int cluster_tls_init(cluster_tls *t, SSL_CTX *ctx, int server)
{
    memset(t, 0, sizeof *t);
    BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
    t->ssl = rb && wb ? SSL_new(ctx) : NULL;
    if (!t->ssl) {
        BIO_free(rb);
        BIO_free(wb);
        return -1;
    }
    SSL_set_bio(t->ssl, rb, wb);  /* the SSL owns both from here */
    if (server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        int r = SSL_do_handshake(t->ssl);  /* the ClientHello, into wb */
        if (r <= 0 && SSL_get_error(t->ssl, r) != SSL_ERROR_WANT_READ) {
            ERR_clear_error();
            cluster_tls_free(t);
            return -1;
        }
    }
    return 0;
}

void cluster_tls_free(cluster_tls *t)
{
    if (t->ssl) SSL_free(t->ssl);
    t->ssl = NULL;
}

static cluster_tls_result failed_(const char *what, char *why, size_t whylen)
{
    char r[256];
    cluster_tls_reason(r, sizeof r);
    snprintf(why, whylen, "%s: %s", what, r[0] ? r : "protocol error");
    return CLUSTER_TLS_FAILED;
}

cluster_tls_result cluster_tls_feed(cluster_tls *t, const void *p, size_t n,
                                    frame_reader *rd, char *why,
                                    size_t whylen)
{
    if (n > 0 && BIO_write(SSL_get_rbio(t->ssl), p, (int)n) != (int)n) {
        snprintf(why, whylen, "out of memory");
        return CLUSTER_TLS_FAILED;
    }
    if (!t->handshaken) {
        int r = SSL_do_handshake(t->ssl);
        if (r <= 0) {
            int e = SSL_get_error(t->ssl, r);
            if (e == SSL_ERROR_WANT_READ) return CLUSTER_TLS_OK;
            return failed_("TLS handshake failed", why, whylen);
        }
        t->handshaken = 1;
    }
    uint8_t buf[16384];
    for (;;) {
        int r = SSL_read(t->ssl, buf, sizeof buf);
        if (r > 0) {
            if (frame_reader_feed(rd, buf, (size_t)r) < 0) {
                snprintf(why, whylen, "out of memory");
                return CLUSTER_TLS_FAILED;
            }
            continue;
        }
        int e = SSL_get_error(t->ssl, r);
        if (e == SSL_ERROR_WANT_READ) return CLUSTER_TLS_OK;
        if (e == SSL_ERROR_ZERO_RETURN) return CLUSTER_TLS_CLOSED;
        return failed_("TLS record", why, whylen);
    }
}

int cluster_tls_write(cluster_tls *t, const void *p, size_t n)
{
    if (!t->handshaken || n > (size_t)INT32_MAX) return -1;
    /* memory BIOs take everything: no partial write, no WANT_WRITE */
    if (n == 0) return 0;
    if (SSL_write(t->ssl, p, (int)n) != (int)n) {
        ERR_clear_error();
        return -1;
    }
    return 0;
}

int cluster_tls_take_out(cluster_tls *t, uint8_t **out, size_t *len)
{
    BIO *wb = SSL_get_wbio(t->ssl);
    size_t n = BIO_ctrl_pending(wb);
    *out = NULL;
    *len = 0;
    if (n == 0) return 0;
    uint8_t *b = malloc(n);
    if (!b) return -1;
    if (BIO_read(wb, b, (int)n) != (int)n) {
        free(b);
        return -1;
    }
    *out = b;
    *len = n;
    return 0;
}
