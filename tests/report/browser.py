"""Load a page in headless Chromium over the DevTools protocol (pipe transport, no websockets).

`inspect_page(path)` opens a local HTML file in a fresh headless Chromium, waits for the load
event, and returns what a test needs: the console / log errors, each <img>'s natural width, and a
PNG screenshot. The page itself needs no JavaScript: the checks run through `Runtime.evaluate`.

Transport: with `--remote-debugging-pipe` Chromium reads NUL-terminated JSON commands on fd 3 and
writes replies and events on fd 4.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


def chromium_binary() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def ensure_chromium() -> tuple[str | None, str]:
    """Find Chromium, installing Debian's package if absent. Returns (binary, why-not)."""
    found = chromium_binary()
    if found:
        return found, ""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return None, "chromium is not installed and cannot be installed here (needs apt-get as root)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"installing chromium failed ({' '.join(cmd)}): {tail[0]}"
    found = chromium_binary()
    return found, "" if found else "apt-get installed chromium but no binary was found"


@dataclass
class PageReport:
    """What the browser saw."""

    errors: list[str] = field(default_factory=list)
    """Console errors, uncaught exceptions and failed resource loads."""
    images: list[dict] = field(default_factory=list)
    """One {src, complete, naturalWidth, naturalHeight} per <img> in document order."""
    title: str = ""
    """document.title"""
    text: str = ""
    """document.body.innerText"""
    screenshot: bytes = b""
    """PNG of the viewport."""


class _Pipe:
    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc, self.wfd, self.rfd = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read(timeout)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if ready:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit code {self.proc.poll()})")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)


_PROBE = """JSON.stringify({
  title: document.title,
  text: document.body ? document.body.innerText : "",
  images: Array.from(document.images).map(i => ({src: i.getAttribute("src").slice(0, 120),
      complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight}))
})"""


def inspect_page(path: Path, binary: str, width: int = 1280, height: int = 2000, timeout: float = 60.0) -> PageReport:
    """Open `path` (a local HTML file) in headless Chromium and report what loaded."""
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def wire_fds():  # runs in the child: Chromium expects its pipe ends on fds 3 and 4
        a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
        os.dup2(a, 3)
        os.dup2(b, 4)

    profile = tempfile.mkdtemp(prefix="icrl-chromium-")
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=wire_fds, close_fds=False,
    )
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
    report = PageReport()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            pipe.send(domain, session=session)
        pipe.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        nav = pipe.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session, timeout=timeout)
        if nav.get("errorText"):
            report.errors.append(f"navigation failed: {nav['errorText']}")
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        probe = pipe.send("Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=session)
        data = json.loads(probe["result"]["value"])
        report.title, report.text, report.images = data["title"], data["text"], data["images"]
        shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
        report.screenshot = base64.b64decode(shot["data"])
        for ev in pipe.events:
            p = ev.get("params", {})
            if ev.get("method") == "Runtime.exceptionThrown":
                report.errors.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif ev.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                report.errors.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif ev.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                report.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        try:
            pipe.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        shutil.rmtree(profile, ignore_errors=True)
    return report
