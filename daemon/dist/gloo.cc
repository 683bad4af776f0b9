/*
 * gloo.cc — the "gloo" engine of collectives.h: Gloo's TCP transport
 * between CPU workers, with Gloo's rendezvous Store implemented over
 * m6_store (Debian's Gloo has no TCP store; m6's coordinator serves one
 * over its own protocol, tests use a file store).
 *
 * C++ stays inside this file: collectives.c sees only the coll_ops table
 * (coll_backend.h), and every Gloo exception is caught here and turned
 * into a coll_msg. Each collective gets its own tag (a counter, the same
 * sequence on every rank) and the caller's timeout.
 */
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <signal.h>

#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "dist/coll_backend.h"

namespace {

/* m6_code values (common/err.h is C only) */
constexpr int kCancelled = 5;  /* M6_ECANCELLED */
constexpr int kInternal = 4;   /* M6_EINTERNAL */

/* A store failure thrown through Gloo's rendezvous, keeping its code. */
struct StoreFailure : std::runtime_error {
    int code;
    StoreFailure(const coll_msg &e) : std::runtime_error(e.msg), code(e.code) {}
};

/* Gloo's Store over m6_store: keys under prefix/, gets and waits bounded
 * by the group's timeout (Gloo's own get has none). */
class M6Store : public gloo::rendezvous::Store {
  public:
    M6Store(m6_store *st, const std::string &prefix, int timeout_ms)
        : st_(st), prefix_(prefix.empty() ? "" : prefix + "/"),
          timeout_ms_(timeout_ms) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        coll_msg e = {0, ""};
        if (coll_store_set(st_, (prefix_ + key).c_str(), data.data(),
                           data.size(), &e) != 0)
            throw StoreFailure(e);
    }

    std::vector<char> get(const std::string &key) override
    {
        coll_msg e = {0, ""};
        void *val = nullptr;
        size_t len = 0;
        if (coll_store_get(st_, (prefix_ + key).c_str(), &val, &len,
                           timeout_ms_, &e) != 0)
            throw StoreFailure(e);
        std::vector<char> out((char *)val, (char *)val + len);
        free(val);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, std::chrono::milliseconds(timeout_ms_));
    }

    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override
    {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys)
            full.push_back(prefix_ + k);
        for (const auto &k : full)
            ptrs.push_back(k.c_str());
        long ms = (long)timeout.count();
        if (ms <= 0 || ms > timeout_ms_)
            ms = timeout_ms_;
        coll_msg e = {0, ""};
        if (coll_store_wait(st_, ptrs.data(), ptrs.size(), (int)ms, &e) != 0)
            throw StoreFailure(e);
    }

  private:
    m6_store *st_;
    std::string prefix_;
    int timeout_ms_;
};

struct Group {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    uint32_t tag = 0;
};

/* Gloo's words into e; a timeout is M6_ECANCELLED. */
void from_exception_(const std::exception &x, coll_msg *e)
{
    const char *w = x.what();
    e->code = (strstr(w, "imed out") || strstr(w, "imeout")) ? kCancelled
                                                            : kInternal;
    snprintf(e->msg, sizeof e->msg, "%s", w);
}

/* Gloo writes to its sockets with writev: a peer that died would kill
 * this process with SIGPIPE instead of failing the collective. Ignore it
 * unless the process chose a handler of its own (m6d ignores it already). */
void ignore_sigpipe_()
{
    struct sigaction old;
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

void *gloo_init_(const coll_setup *s, coll_msg *e)
{
    ignore_sigpipe_();
    auto g = std::make_unique<Group>();
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = s->hostname;
        g->dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(s->rank,
                                                             s->world_size);
        g->ctx->setTimeout(std::chrono::milliseconds(s->timeout_ms));
        M6Store store(s->store, s->prefix, s->timeout_ms);
        g->ctx->connectFullMesh(store, g->dev);
    } catch (const StoreFailure &x) {
        e->code = x.code;
        snprintf(e->msg, sizeof e->msg, "rendezvous: %s", x.what());
        return nullptr;
    } catch (const std::exception &x) {
        from_exception_(x, e);
        return nullptr;
    }
    return g.release();
}

// One collective on g: fill sets its buffers on a fresh Opts, then the
// group's next tag and the timeout; run starts it and waits. 0, or -1 with
// e from the exception it threw.
template <typename Opts, typename Fill, typename Run>
int collective_(Group *g, int timeout_ms, coll_msg *e, Fill fill, Run run)
{
    try {
        Opts opts(g->ctx);
        fill(opts);
        opts.setTag(g->tag++);
        opts.setTimeout(std::chrono::milliseconds(timeout_ms));
        run(opts);
    } catch (const std::exception &x) {
        from_exception_(x, e);
        return -1;
    }
    return 0;
}

int gloo_allreduce_sum_(void *ctx, float *buf, size_t n, int timeout_ms,
                        coll_msg *e)
{
    using Opts = gloo::AllreduceOptions;
    return collective_<Opts>(
        (Group *)ctx, timeout_ms, e,
        [&](Opts &opts) {
            opts.setOutput(buf, n);
            void (*fn)(void *, const void *, const void *, size_t) =
                &gloo::sum<float>;
            opts.setReduceFunction(fn);
        },
        [](Opts &opts) { gloo::allreduce(opts); });
}

int gloo_broadcast_(void *ctx, void *buf, size_t bytes, int root,
                    int timeout_ms, coll_msg *e)
{
    using Opts = gloo::BroadcastOptions;
    return collective_<Opts>(
        (Group *)ctx, timeout_ms, e,
        [&](Opts &opts) {
            opts.setOutput((uint8_t *)buf, bytes);
            opts.setRoot(root);
        },
        [](Opts &opts) { gloo::broadcast(opts); });
}

int gloo_barrier_(void *ctx, int timeout_ms, coll_msg *e)
{
    using Opts = gloo::BarrierOptions;
    return collective_<Opts>((Group *)ctx, timeout_ms, e, [](Opts &) {},
                             [](Opts &opts) { gloo::barrier(opts); });
}

// In place (no input set: Gloo's allgatherv then takes each rank's part
// from the output buffer itself).
int gloo_allgather_(void *ctx, float *buf, const size_t *counts,
                    int timeout_ms, coll_msg *e)
{
    using Opts = gloo::AllgathervOptions;
    Group *g = (Group *)ctx;
    std::vector<size_t> n(counts, counts + g->ctx->size);
    return collective_<Opts>(
        g, timeout_ms, e, [&](Opts &opts) { opts.setOutput(buf, n); },
        [](Opts &opts) { gloo::allgatherv(opts); });
}

// Gloo's alltoallv in bytes. Every rank calls it whatever its sizes (the
// tag numbers the group's collectives); Gloo only reads the input.
int gloo_alltoallv_(void *ctx, const void *send, const size_t *send_bytes,
                    void *recv, const size_t *recv_bytes, int timeout_ms,
                    coll_msg *e)
{
    using Opts = gloo::AlltoallvOptions;
    Group *g = (Group *)ctx;
    int W = g->ctx->size;
    std::vector<int64_t> sn(send_bytes, send_bytes + W);
    std::vector<int64_t> rn(recv_bytes, recv_bytes + W);
    // a zero-length buffer still needs an address to register
    static uint8_t none_;
    size_t st = 0, rt = 0;
    for (int i = 0; i < W; i++) {
        st += send_bytes[i];
        rt += recv_bytes[i];
    }
    uint8_t *in = st ? (uint8_t *)const_cast<void *>(send) : &none_;
    uint8_t *out = rt ? (uint8_t *)recv : &none_;
    return collective_<Opts>(
        g, timeout_ms, e,
        [&](Opts &opts) {
            opts.setInput(in, sn);
            opts.setOutput(out, rn);
        },
        [](Opts &opts) { gloo::alltoallv(opts); });
}

void gloo_destroy_(void *ctx, int broken)
{
    (void)broken;  /* closing the pairs' sockets never waits for peers */
    delete (Group *)ctx;
}

}  // namespace

extern "C" const coll_ops coll_gloo_ops = {
    "gloo", 0, gloo_init_, gloo_allreduce_sum_, gloo_broadcast_,
    gloo_barrier_, gloo_destroy_, gloo_allgather_, gloo_alltoallv_,
};
