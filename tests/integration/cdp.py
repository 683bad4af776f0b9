#!/usr/bin/env python3
"""cdp.py URL WAIT_JS RESULT_JS [--timeout S] [--screenshot FILE.png]
[--size WxH] — loads URL in headless Chromium, driven over the DevTools
protocol on a pipe (--remote-debugging-pipe: fds 3 and 4, NUL-separated
JSON; the standard library only), evaluates WAIT_JS every 100 ms until it
is true, then prints RESULT_JS's value as JSON (and saves a PNG screenshot
of the page). Exits 1 when WAIT_JS is not true within S seconds (default
30; RESULT_JS is printed anyway, for the failure message), 77 when there is
no chromium. CHROMIUM names the binary (default: chromium)."""
import argparse
import json
import os
import base64
import fcntl
import shutil
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("wait_js")
ap.add_argument("result_js")
ap.add_argument("--timeout", type=float, default=30)
ap.add_argument("--screenshot")
ap.add_argument("--size", default="1300x1000")
a = ap.parse_args()

exe = shutil.which(os.environ.get("CHROMIUM", "chromium"))
if not exe:
    print("SKIP: no chromium")
    sys.exit(77)

prof = tempfile.mkdtemp(prefix="m6-cdp-")
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()
# chromium's ends above 9, so that moving them to 3 and 4 cannot clash
for name in ("to_chrome_r", "from_chrome_w"):
    fd = globals()[name]
    globals()[name] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 20)
    os.close(fd)


W, H = (int(v) for v in a.size.split("x"))
# the pipe's ends become chromium's fds 3 (it reads) and 4 (it writes)
proc = subprocess.Popen(
    ["bash", "-c", 'exec "$0" "$@" 3<&%d 4>&%d %d<&- %d>&-'
     % (to_chrome_r, from_chrome_w, to_chrome_r, from_chrome_w), exe,
     "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
     "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe",
     "--user-data-dir=" + prof, "--window-size=%d,%d" % (W, H), "about:blank"],
    pass_fds=(to_chrome_r, from_chrome_w),
    stdout=subprocess.DEVNULL, stderr=open(os.path.join(prof, "stderr"), "w"))
os.close(to_chrome_r)
os.close(from_chrome_w)
out = os.fdopen(to_chrome_w, "wb", buffering=0)
inp = os.fdopen(from_chrome_r, "rb", buffering=0)
buf = b""
next_id = 0


def call(method, params=None, session=None):
    """Send one command and return its result (events are skipped)."""
    global buf, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    out.write(json.dumps(msg).encode() + b"\0")
    while True:
        while b"\0" not in buf:
            chunk = inp.read(65536)
            if not chunk:
                raise SystemExit("chromium closed the pipe (%s)" % method)
            buf += chunk
        raw, buf = buf.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise SystemExit("%s: %s" % (method, reply["error"]))
            return reply["result"]


def evaluate(js, session):
    r = call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session)
    if "exceptionDetails" in r:
        return {"exception": r["exceptionDetails"].get("text", "?") + " " +
                str(r["exceptionDetails"].get("exception", {}).get("description", ""))}
    return r["result"].get("value")


rc = 0
try:
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    sess = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Emulation.setDeviceMetricsOverride",
         {"width": W, "height": H, "deviceScaleFactor": 1, "mobile": False}, sess)
    call("Page.enable", {}, sess)
    call("Page.navigate", {"url": a.url}, sess)
    end = time.monotonic() + a.timeout
    while True:
        ok = evaluate("(() => { try { return !!(%s); } catch (e) { return false; } })()" % a.wait_js, sess)
        if ok is True:
            break
        if time.monotonic() > end:
            rc = 1
            break
        time.sleep(0.1)
    print(json.dumps(evaluate(a.result_js, sess)))
    if a.screenshot:
        png = call("Page.captureScreenshot", {"format": "png"}, sess)["data"]
        open(a.screenshot, "wb").write(base64.b64decode(png))
finally:
    try:
        call("Browser.close")
    except SystemExit:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(prof, ignore_errors=True)
sys.exit(rc)
