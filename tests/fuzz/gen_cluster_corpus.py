#!/usr/bin/env python3
"""gen_cluster_corpus.py [DIR] — writes the seed corpus of fuzz_cluster
(default tests/fuzz/corpus/cluster/): the plaintext byte streams an
authenticated peer sends on the coordinator's port once TLS is up — a
StoreOpen as the fuzz state's coordinator node (rank 0, its node id and
secret as fuzz_cluster.c fixes them) then sets, gets and waits, one of
them of another rank's key; a NodeJoin of a new node then heartbeats and
a NodeLeave; a NodeJoin of the coordinator's node id; a StoreOpen with a
wrong secret and one as a rank nobody holds; garbage after a StoreOpen.
Hand-encoded protobuf (tests/integration/m6wire.py); field numbers as in
proto/m6.proto. Run it again after the port's messages change."""
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus", "cluster")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "integration"))
from m6wire import field_bytes as fb, field_varint as fv, frame  # noqa: E402

SELF_UUID = b"f00d0000000000000000000000000001"  # fuzz_cluster.c
SELF_SECRET = b"\x42" * 32


def rq(num, body):
    return frame(fb(num, body))


def store_open(run=1, gen=1, uuid=SELF_UUID, secret=SELF_SECRET, rank=0):
    return rq(20, fv(1, 1) + fv(3, run) + fv(4, gen) + fb(5, uuid) + fb(6, secret)
              + (fv(7, rank) if rank else b""))


def store_set(key, val):
    return rq(21, fb(1, key) + fb(2, val))


def store_get(key, tmo=0):
    return rq(22, fb(1, key) + (fv(2, tmo) if tmo else b""))


def store_wait(keys, tmo=0):
    return rq(23, b"".join(fb(1, k) for k in keys) + (fv(2, tmo) if tmo else b""))


def node_join(host, uuid, secret=b""):
    body = (fv(1, 1) + fb(3, host) + fb(4, uuid) + fb(5, b"cpu") + fv(6, 1)
            + fv(7, 1 << 30) + fv(8, 1 << 29) + fb(9, b"m6d seed") + fb(10, b"onednn avx2"))
    return rq(12, body + (fb(11, secret) if secret else b""))


seeds = {
    "store_rank0": store_open() + store_set(b"verdict", b"ok") + store_get(b"verdict")
    + store_wait([b"verdict", b"engine"], 10) + store_set(b"run1/g1/1", b"x")
    + store_get(b"missing", 5),
    "store_newer_gen": store_open(gen=1) + store_set(b"a", b"1") + store_open(gen=2),
    "node_join": node_join(b"fz1", b"0123456789abcdef0123456789abcdef")
    + rq(13, fv(1, 12345)) + rq(13, b"") + rq(24, b""),
    "node_join_self": node_join(b"fz2", SELF_UUID),
    "node_join_bad": node_join(b"bad name!", b"xyz"),
    "store_wrong_secret": store_open(secret=b"\x00" * 32) + store_set(b"k", b"v"),
    "store_rank_nobody": store_open(rank=3) + store_set(b"hash/3", b"h"),
    "store_garbage": store_open() + frame(b"\xff" * 8),
    "heartbeat_first": rq(13, b""),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print("%d seeds in %s" % (len(seeds), OUT))
