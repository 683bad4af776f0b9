#!/usr/bin/env python3
"""prom.py — the Prometheus side of prometheus.sh, on the standard library.

prom.py scrape URL N INTERVAL_S OUT_DIR TOKENS_PER_STEP
    N scrapes of URL (one every INTERVAL_S), each saved as OUT_DIR/NNN.txt.
    Across them every sample of a *_total family (and every histogram
    _bucket/_sum/_count) never decreases; in each one, every run's
    m6_tokens_total equals its m6_steps_total * TOKENS_PER_STEP (the test's
    own arithmetic from the spec); and the last scrape saw steps. Exits 1
    naming the first failure.
prom.py fetch URL
    Writes the body of GET URL to stdout; exits 1 unless it is 200.
prom.py get FILE NAME [LABEL=VALUE...]
    Prints the sum of NAME's samples in FILE whose labels match (nothing
    when there is none).
prom.py http URL METHOD [HEADER_BYTES]
    Prints the status code of one request (HEADER_BYTES: an X-Pad header of
    that many bytes).
prom.py slow HOST PORT SECONDS
    Holds a connection open sending half a request line, one byte a second,
    for SECONDS (a client that never finishes its request)."""
import re
import socket
import sys
import time
import urllib.error
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """[(name, {label: value}, float)] of the exposition text."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise SystemExit("unparsable line: %r" % line)
        labels = dict(LABEL.findall(m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def key(name, labels):
    return name + "{" + ",".join("%s=%s" % kv for kv in sorted(labels.items())) + "}"


def monotone(name):
    return (name.endswith("_total") or name.endswith("_bucket")
            or name.endswith("_count") or name.endswith("_sum"))


def scrape(url, n, interval, out_dir, tokens_per_step):
    last = {}
    steps_seen = 0
    for i in range(n):
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        open("%s/%03d.txt" % (out_dir, i), "w").write(text)
        samples = parse(text)
        steps, tokens = {}, {}
        for name, labels, v in samples:
            k = key(name, labels)
            if monotone(name):
                if k in last and v < last[k]:
                    raise SystemExit("scrape %d: %s went from %g to %g" % (i, k, last[k], v))
                last[k] = v
            run = (labels.get("run"), labels.get("phase"))
            if name == "m6_steps_total":
                steps[run] = v
            if name == "m6_tokens_total":
                tokens[run] = v
        if set(steps) != set(tokens):
            raise SystemExit("scrape %d: steps for %s, tokens for %s" % (i, sorted(steps), sorted(tokens)))
        for run, s in steps.items():
            if tokens[run] != s * tokens_per_step:
                raise SystemExit("scrape %d: run %s phase %s: %g tokens after %g steps, want %g"
                                 % (i, run[0], run[1], tokens[run], s, s * tokens_per_step))
        steps_seen = sum(steps.values())
        time.sleep(interval)
    if steps_seen == 0:
        raise SystemExit("no steps in the last scrape")
    print("%d scrapes, %d series monotone, %d steps at the end" % (n, len(last), steps_seen))


def get(path, name, want):
    want = dict(w.split("=", 1) for w in want)
    vals = [v for n, l, v in parse(open(path).read())
            if n == name and all(l.get(k) == x for k, x in want.items())]
    if vals:
        print(repr(sum(vals)))


def http(url, method, pad):
    req = urllib.request.Request(url, method=method, data=b"x=1" if method == "POST" else None)
    if pad:
        req.add_header("X-Pad", "a" * pad)
    try:
        print(urllib.request.urlopen(req, timeout=10).status)
    except urllib.error.HTTPError as e:
        print(e.code)
    except (ConnectionError, urllib.error.URLError) as e:
        print("error %s" % e)


def slow(host, port, seconds):
    s = socket.create_connection((host, port))
    s.sendall(b"GET /metr")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1)
        try:
            s.sendall(b"i")
        except OSError:
            break
    s.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "scrape":
        scrape(a[1], int(a[2]), float(a[3]), a[4], int(a[5]))
    elif a[0] == "fetch":
        sys.stdout.write(urllib.request.urlopen(a[1], timeout=10).read().decode())
    elif a[0] == "get":
        get(a[1], a[2], a[3:])
    elif a[0] == "http":
        http(a[1], a[2], int(a[3]) if len(a) > 3 else 0)
    elif a[0] == "slow":
        slow(a[1], int(a[2]), float(a[3]))
    else:
        raise SystemExit(__doc__)
