"""Open a report in headless Chromium and say what a reader's browser would see.

A small client of the Chrome DevTools protocol over `--remote-debugging-pipe` (commands on
the child's fd 3, replies and events on its fd 4, each message JSON ending in a NUL byte):
standard library only, no browser download. It loads the page from disk, collects console
errors and uncaught exceptions, reads every image's natural size, and takes a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from epi.core.errors import UserError
from epi.formats.json_types import JSON, JSONObject, as_json

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", "--hide-scrollbars", "--mute-audio")


class Image(TypedDict):
    """One <img> of the loaded page, as the browser saw it (0 × 0: it did not decode)."""

    alt: str
    complete: bool
    natural_width: int
    natural_height: int


#: A DevTools protocol message as received (JSON); its fields are narrowed where they are read.
Message = JSONObject


def _obj(value: object) -> JSONObject:
    """`value` when it is a JSON object, else {} (a field the browser left out)."""
    return value if isinstance(value, dict) else {}


def _items(value: object) -> list[object]:
    """`value` when it is a JSON list, else []."""
    return value if isinstance(value, list) else []


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _image(value: object) -> Image:
    i = _obj(value)
    return {"alt": str(i.get("alt", "")), "complete": bool(i.get("complete")),
            "natural_width": _int(i.get("natural_width")),
            "natural_height": _int(i.get("natural_height"))}


@dataclass
class PageCheck:
    images: list[Image]
    console_errors: list[str] = field(default_factory=list)
    title: str = ""
    screenshot_png: bytes = b""
    sections: dict[str, str] = field(default_factory=dict)  # <section id> → its visible text


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise UserError("chromium not found: install the Debian package `chromium` "
                    "(make test installs it)")


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int) -> None:
        self.proc, self.wfd, self.rfd = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[Message] = []

    def send(self, method: str, params: dict[str, JSON] | None = None,
             session: str | None = None, timeout_s: float = 30.0) -> Message:
        self.next_id += 1
        msg: dict[str, JSON] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        deadline = time.monotonic() + timeout_s
        while True:
            m = self._recv(deadline)
            if m.get("id") == want:
                if "error" in m:
                    raise UserError(f"chromium: {method} failed: "
                                    f"{_obj(m['error']).get('message')}")
                return _obj(m.get("result"))
            self.events.append(m)

    def wait_event(self, method: str, timeout_s: float = 30.0) -> Message:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout_s
        while True:
            m = self._recv(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def _recv(self, deadline: float) -> Message:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError("chromium: no answer from the DevTools pipe in time")
            ready, _, _ = select.select([self.rfd], [], [], min(left, 1.0))
            if not ready:
                if self.proc.poll() is not None:
                    raise UserError(f"chromium exited with code {self.proc.returncode}")
                continue
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise UserError("chromium closed the DevTools pipe")
            self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        msg = json.loads(raw)
        if not isinstance(msg, dict):
            raise UserError(f"chromium: a DevTools message is not an object: {raw[:40]!r}")
        return msg


def _high_fd(fd: int) -> int:
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    """One headless Chromium on the DevTools pipe, for checking pages one after another
    (starting the browser is most of a check's time: a caller with several pages starts it
    once). Use as a context manager; `check_page` is one page in a browser of its own."""

    def __init__(self, *, width: int = 1200, height: int = 900,
                 timeout_s: float = 60.0) -> None:
        exe = find_chromium()
        self.timeout_s = timeout_s
        to_child_r, to_child_w = (_high_fd(fd) for fd in os.pipe())
        from_child_r, from_child_w = (_high_fd(fd) for fd in os.pipe())

        def child_fds() -> None:
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.profile = tempfile.mkdtemp(prefix="epi-chromium-")
        argv = [exe, *FLAGS, f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=False,
                                     preexec_fn=child_fds)
        os.close(to_child_r)
        os.close(from_child_w)
        self.pipe = _Pipe(self.proc, to_child_w, from_child_r)
        self.closed = False
        try:
            pipe = self.pipe
            targets = _items(pipe.send("Target.getTargets", timeout_s=timeout_s
                                       ).get("targetInfos"))
            page = next((_obj(t) for t in targets if _obj(t).get("type") == "page"), None)
            if page is None:
                page_id = pipe.send("Target.createTarget", {"url": "about:blank"}
                                    ).get("targetId")
            else:
                page_id = page.get("targetId")
            self.sid = str(pipe.send("Target.attachToTarget",
                                     {"targetId": as_json(page_id, "targetId"), "flatten": True}
                                     ).get("sessionId"))
            for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
                pipe.send(domain, session=self.sid)
        except BaseException:
            self.close(ask=False)
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        self.close(ask=exc_type is None)

    def check(self, html_path: Path) -> PageCheck:
        """Load `html_path` from disk in this browser's page; images, console errors (of this
        page only), screenshot."""
        html_path = Path(html_path).resolve()
        if not html_path.is_file():
            raise UserError(f"{html_path}: no such file")
        pipe, sid, timeout_s = self.pipe, self.sid, self.timeout_s
        pipe.events.clear()
        pipe.send("Page.navigate", {"url": html_path.as_uri()}, session=sid)
        pipe.wait_event("Page.loadEventFired", timeout_s=timeout_s)
        res = pipe.send("Runtime.evaluate", {
            "expression": "JSON.stringify({title: document.title, images: Array.from("
                          "document.images).map(i => ({alt: i.alt, complete: i.complete, "
                          "natural_width: i.naturalWidth, natural_height: i.naturalHeight})), "
                          "sections: Object.fromEntries(Array.from(document.querySelectorAll("
                          "'section[id]')).map(s => [s.id, s.innerText]))})",
            "returnByValue": True}, session=sid)
        info = _obj(json.loads(str(_obj(res.get("result")).get("value"))))
        shot = pipe.send("Page.captureScreenshot", {"format": "png",
                                                    "captureBeyondViewport": True},
                         session=sid, timeout_s=timeout_s)
        errors = []
        for ev in pipe.events:
            m, p = ev.get("method"), _obj(ev.get("params"))
            entry = _obj(p.get("entry"))
            if m == "Runtime.exceptionThrown":
                errors.append("exception: " + str(_obj(p.get("exceptionDetails")).get("text")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console.error: " + " ".join(
                    str(_obj(a).get("value", _obj(a).get("description", "")))
                    for a in _items(p.get("args"))))
            elif m == "Log.entryAdded" and entry.get("level") == "error":
                errors.append("log: " + str(entry.get("text")) + " "
                              + str(entry.get("url", "")))
        sections = {str(k): str(v) for k, v in _obj(info.get("sections")).items()}
        return PageCheck([_image(i) for i in _items(info.get("images"))], errors,
                         str(info.get("title", "")), base64.b64decode(str(shot.get("data", ""))),
                         sections)

    def close(self, *, ask: bool = True) -> None:
        """Ask the browser to close (not after an error: it may not answer), then make sure
        it has (killed after 10 s)."""
        if self.closed:
            return
        self.closed = True
        if ask:
            with contextlib.suppress(UserError):
                self.pipe.send("Browser.close", timeout_s=5)
        os.close(self.pipe.wfd)
        os.close(self.pipe.rfd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def check_page(html_path: Path, *, width: int = 1200, height: int = 900,
               timeout_s: float = 60.0) -> PageCheck:
    """Load `html_path` from disk in headless Chromium; images, console errors, screenshot."""
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise UserError(f"{html_path}: no such file")
    with Browser(width=width, height=height, timeout_s=timeout_s) as browser:
        return browser.check(html_path)
