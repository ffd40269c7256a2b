"""A headless Chromium driven over the DevTools protocol, to see the MLflow UI as a person does:
the test that a sweep's view shows its figures (tests/test_remote_tracking.py) and the screenshot in
docs/framework.md (benchmarks/ui_screenshot.py).

The system's browser (Debian's ``chromium``, which ``make install`` installs as root where it
is missing), no driver package: the protocol runs on a pipe (``--remote-debugging-pipe``: the
browser reads commands on its fd 3 and answers on fd 4, each message JSON ended by a NUL byte),
so nothing listens on a port and nothing is downloaded.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self  # Python 3.11's; the annotations are not evaluated (3.10 runs this)

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
          "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
          "--disable-component-update", "--mute-audio")  # fmt: skip
# MLflow's runs table (ag-grid): each header's column id and text, each row's id and cells by column
# id, in the order they are seen (left to right, top to bottom: ag-grid places them by style,
# not in the order of the document)
RUNS_TABLE_JS = """(() => {
  const seen = (els, axis) => [...els].sort((a, b) => a.getBoundingClientRect()[axis] - b.getBoundingClientRect()[axis]);
  return JSON.stringify({
    headers: seen(document.querySelectorAll('.ag-header-cell[col-id]'), 'x').map(e => [e.getAttribute('col-id'), e.innerText]),
    rows: seen(document.querySelectorAll('.ag-center-cols-container [role=row][row-id]'), 'y').map(r =>
      [r.getAttribute('row-id'), Object.fromEntries([...r.querySelectorAll('[role=gridcell][col-id]')]
        .map(c => [c.getAttribute('col-id'), c.innerText]))])});
})()"""


class BrowserError(Exception):
    """No browser, or one that stopped answering; the message says which."""


def executable() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Chromium:
    """One headless browser with one page, ``width`` x ``height`` CSS pixels."""

    def __init__(self, width: int = 1600, height: int = 1000) -> None:
        path = executable()
        if path is None:
            raise BrowserError(f"no browser found ({', '.join(BROWSERS)}): make install installs chromium as root")
        self._profile = tempfile.mkdtemp(prefix="pb-chromium-")
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()
        # the browser's fds 3 and 4 are the pipes' ends (dup2 makes them inheritable; every other
        # fd of this process is close-on-exec), in a session of its own; posix_spawn, not a
        # preexec_fn, which is unsafe in a process with threads (pytest's, the tracking client's)
        null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        self._pid = os.posix_spawn(
            path, [path, *_FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            os.environ, file_actions=[*null, (os.POSIX_SPAWN_DUP2, commands_r, 3), (os.POSIX_SPAWN_DUP2, answers_w, 4)],
            setsid=True)  # fmt: skip
        self._status: int | None = None
        os.close(commands_r)
        os.close(answers_w)
        self._pending = b""
        self._id = 0
        try:
            page = next(t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            self._session = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            self.page("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _message(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._pending:
            ready, _, _ = select.select([self._answers], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise BrowserError(f"the browser did not answer within {timeout:g} s")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise BrowserError("the browser went away")
            self._pending += chunk
        message, _, self._pending = self._pending.partition(b"\0")
        return json.loads(message)

    def _call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self._id += 1
        command: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        while True:  # events and answers to nothing we wait for are passed over
            reply = self._message(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply["result"]

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        """A DevTools command to the page."""
        return self._call(method, session=self._session, **params)

    def goto(self, url: str) -> None:
        self.page("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise awaited)."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """The first truthy value of ``expression``, polled until ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                if not value:
                    raise BrowserError(f"not shown within {timeout:g} s: {expression}")
                return value
            time.sleep(0.1)

    def runs_table(self) -> dict[str, Any]:
        """MLflow's runs table as shown: ``headers`` {column id: text}, ``rows`` {run id: {column id: text}}."""
        table = json.loads(self.evaluate(RUNS_TABLE_JS))
        return {"headers": dict(table["headers"]), "rows": dict(table["rows"])}  # dicts keep that order

    def screenshot(self, path: Path) -> None:
        Path(path).write_bytes(base64.b64decode(self.page("Page.captureScreenshot", format="png")["data"]))

    def _exited(self, wait_s: float = 0.0) -> bool:
        """Whether the browser has exited (reaped), waiting up to ``wait_s`` seconds for it."""
        deadline = time.monotonic() + wait_s
        while self._status is None:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
            if pid:
                self._status = status
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.05)
        return True

    def close(self) -> None:
        """Close the browser (killed with its processes if it does not go within seconds) and its profile."""
        if not self._exited():
            try:
                self._call("Browser.close", timeout=5)
            except (BrowserError, OSError):
                pass
            if not self._exited(5):
                os.killpg(self._pid, signal.SIGKILL)
                self._exited(5)
        for fd in (self._commands, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)
