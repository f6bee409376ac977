"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`):
no extra package, no port. For the slow tests that look at pages as a person would: open a
page, run script in it, read console errors, take a screenshot, measure overflow."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--remote-debugging-pipe"]


def chromium() -> str | None:
    """The system's Chromium (None when not installed: the tests skip)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _pipe_fds(commands: int, replies: int) -> None:
    """In the child: the command pipe on fd 3, the reply pipe on fd 4 (copied high first, so
    neither overwrites the other)."""
    high = os.dup(commands), os.dup(replies)
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


class Browser:
    """One Chromium process with one page; `with Browser() as b: b.open(url)`."""

    def __init__(self, width: int = 1280, height: int = 800):
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="dllm-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the protocol's pipe is the child's fds 3 (commands) and 4 (replies)
        self.process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: _pipe_fds(to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next = 0
        self.errors: list[str] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:                      # already gone: kill below
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            data = os.read(self._from_child, 1 << 20)
            if not data:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += data
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(params["entry"].get("text", ""))

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply (events seen meanwhile are recorded)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=await_promise)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait until the document has loaded."""
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete'", timeout)

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{expression!r} stayed false for {timeout:g} s")

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> None:
        """A PNG of the page (the whole page when `full_page`)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": max(height, 1), "scale": 1})
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))

    def overflow(self) -> int:
        """How many CSS pixels the page is wider than the window (0: no horizontal scroll)."""
        return int(self.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth"))
