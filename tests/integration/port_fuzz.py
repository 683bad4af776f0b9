#!/usr/bin/env python3
"""port_fuzz.py PORT TOKEN_FILE STATE_DIR CORPUS_DIR M6D_PID SECONDS [SEED]
— a black-box fuzzer of the coordinator's TCP port (cluster_fuzz.sh), from
outside the process, against the real m6d:

  before TLS: a real ClientHello (captured from m6tls through a relay
    here), the seed frames of tests/fuzz/corpus/cluster sent in clear and
    random bytes, each mutated (bits flipped, bytes set, inserted,
    deleted, lengths changed, cut, repeated), 32 connections at a time;
  inside TLS (m6tls, env M6TLS): the same seed frames, whose node id and
    secret are made those of STATE_DIR (the coordinator's own node, so
    that the StoreOpens get past their first check), mutated alike, 8 at
    a time.

Half of SECONDS each. M6D_PID must stay alive throughout (checked as
connections close): a crash or a sanitizer's abort ends m6d, and the
fuzzer saves the inputs in flight as fuzz-crash-N in STATE_DIR's parent. Prints the inputs sent and the crashes found; exit 1 on a crash,
or when the coordinator holds a connection before TLS past its handshake
deadline (plus slack). SEED (default: from the clock) is printed: the
inputs before TLS repeat with it (those inside TLS come from 8 threads,
in no fixed order)."""
import os
import random
import selectors
import socket
import subprocess
import sys
import threading
import time

PORT, TOKEN, SDIR, CORPUS = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
PID, SECS = int(sys.argv[5]), float(sys.argv[6])
SEED = int(sys.argv[7]) if len(sys.argv) > 7 else int(time.time() * 1000) % 1000003
HOLD_MAX_S = 12  # the handshake deadline (5 s at most) plus slack
M6TLS = os.environ["M6TLS"]
rng = random.Random(SEED)
print("port_fuzz: seed %d" % SEED, flush=True)

# the corpus of fuzz_cluster, with the coordinator's own id and secret
SELF_UUID = b"f00d0000000000000000000000000001"  # gen_cluster_corpus.py
SELF_SECRET = b"\x42" * 32
uuid = open(os.path.join(SDIR, "node-id"), "rb").read().strip()
secret = open(os.path.join(SDIR, "node-secret"), "rb").read()
assert len(uuid) == len(SELF_UUID) and len(secret) == 32, "node-id / node-secret"
seeds = []
for name in sorted(os.listdir(CORPUS)):
    b = open(os.path.join(CORPUS, name), "rb").read()
    seeds.append(b.replace(SELF_UUID, uuid).replace(SELF_SECRET, secret))
if not seeds:
    sys.exit("port_fuzz: no seeds in %s" % CORPUS)


def capture_hello():
    """The first bytes m6tls sends: its ClientHello."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    p = subprocess.Popen([M6TLS, "127.0.0.1:%d" % ls.getsockname()[1], TOKEN],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    ls.settimeout(10)
    c, _ = ls.accept()
    c.settimeout(2)
    got = b""
    try:
        while len(got) < 5 or len(got) < 5 + int.from_bytes(got[3:5], "big"):
            d = c.recv(65536)
            if not d:
                break
            got += d
    except socket.timeout:
        pass
    c.close()
    ls.close()
    p.kill()
    p.wait()
    if len(got) < 5 or got[0] != 22:
        sys.exit("port_fuzz: no ClientHello from m6tls: %r" % got[:16])
    return got


def mutate(b):
    b = bytearray(b)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        op = rng.randrange(8)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip a bit
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # set a byte to an edge value
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7f, 0x80, 0xff))
        elif op == 2:  # insert random bytes
            b[i:i] = os.urandom(rng.randrange(1, 16))
        elif op == 3 and b:  # delete a run
            del b[i:i + rng.randrange(1, 16)]
        elif op == 4 and len(b) >= 4:  # a frame or record length gone odd
            j = rng.randrange(len(b) - 3)
            b[j:j + 4] = rng.choice((b"\xff\xff\xff\xff", b"\x00\x00\x00\x00",
                                     b"\x00\x01\x00\x00", b"\x00\x00\xff\xff"))
        elif op == 5:  # cut
            b = b[:i]
        elif op == 6 and b:  # repeat a chunk
            j = rng.randrange(len(b))
            b[j:j] = b[j:j + rng.randrange(1, 64)]
        elif op == 7:  # splice another seed in
            s = rng.choice(seeds)
            b[i:i] = s[:rng.randrange(len(s) + 1)]
    return bytes(b)


crash_at = [None]


def check_alive(what):
    try:
        os.kill(PID, 0)
    except ProcessLookupError:
        crash_at[0] = what
        return False
    return True


def save_(inputs):
    for k, b in enumerate(inputs):
        path = os.path.join(os.path.dirname(SDIR), "fuzz-crash-%d" % k)
        open(path, "wb").write(b)


def plain_phase(until):
    """Up to 32 connections in flight, each from an address of 127.0.2.0/24
    (the port caps connections per address), a new one as each closes."""
    hello = capture_hello()
    pool = [hello] * 4 + [s for s in seeds] + [os.urandom(64)]
    sel = selectors.DefaultSelector()
    sent = 0

    def start():
        data = mutate(rng.choice(pool))
        s = socket.socket()
        s.setblocking(False)
        s.bind(("127.0.2.%d" % rng.randrange(1, 255), 0))
        try:
            s.connect(("127.0.0.1", PORT))
        except BlockingIOError:
            pass
        sel.register(s, selectors.EVENT_WRITE | selectors.EVENT_READ,
                     [data, 0, time.monotonic()])

    def finish(s):
        sel.unregister(s)
        s.close()

    while time.monotonic() < until or sel.get_map():
        while time.monotonic() < until and len(sel.get_map()) < 32:
            start()
            sent += 1
        for key, mask in sel.select(timeout=0.5):
            s, st = key.fileobj, key.data
            if mask & selectors.EVENT_WRITE and st[1] < len(st[0]):
                try:
                    st[1] += s.send(st[0][st[1]:])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    finish(s)
                    continue
                if st[1] >= len(st[0]):
                    sel.modify(s, selectors.EVENT_READ, st)
            if mask & selectors.EVENT_READ:
                try:
                    if not s.recv(65536):
                        finish(s)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    finish(s)
        now = time.monotonic()
        for key in list(sel.get_map().values()):
            if now - key.data[2] > HOLD_MAX_S:
                save_([key.data[0]])
                sys.exit("port_fuzz: a connection before TLS held open %.0f s "
                         "(input saved as fuzz-crash-0)" % (now - key.data[2]))
        if not check_alive("plain"):
            save_([k.data[0] for k in sel.get_map().values()])
            return sent
    return sent


def tls_phase(until):
    sent = [0]
    lock = threading.Lock()

    def worker():
        while time.monotonic() < until and crash_at[0] is None:
            data = mutate(rng.choice(seeds))
            p = subprocess.Popen([M6TLS, "127.0.0.1:%d" % PORT, TOKEN],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            try:
                p.communicate(data, timeout=3)
            except subprocess.TimeoutExpired:  # a store client may stay
                p.kill()
                p.communicate()
            except BrokenPipeError:
                p.wait()
            with lock:
                sent[0] += 1
            if not check_alive("tls"):
                save_([data])
                return

    th = [threading.Thread(target=worker) for _ in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return sent[0]


t0 = time.monotonic()
n_plain = plain_phase(t0 + SECS / 2)
n_tls = tls_phase(time.monotonic() + SECS / 2) if crash_at[0] is None else 0
crashes = 0 if crash_at[0] is None else 1
print("port_fuzz: %d inputs before TLS, %d inside TLS, %d crashes (seed %d)"
      % (n_plain, n_tls, crashes, SEED), flush=True)
if crashes:
    sys.exit("port_fuzz: m6d (pid %d) died during the %s phase; the inputs in "
             "flight are saved as fuzz-crash-N" % (PID, crash_at[0]))
