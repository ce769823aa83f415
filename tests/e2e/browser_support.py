"""Headless Debian Chromium driven by Selenium, for the console's browser test.

Selenium, because Debian ships the matching ``chromedriver`` beside ``chromium``: the
``Service`` is pointed at it, so nothing is downloaded (Playwright would fetch its own browser
build unless pointed at the system one, and its driver is a Node program of its own). Every
wait is bounded. A screenshot is checked with the standard library: the PNG is decoded (zlib,
the five row filters) until it shows more than a couple of colours.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 15  # seconds any one page or element may take


def need_browser() -> None:
    """Skip, saying why, where the browser or the driver or Selenium is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.skip(
            f"no headless browser: {', '.join(missing)} missing "
            "(apt-get install chromium chromium-driver)"
        )
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[dev]')")


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--no-proxy-server",
        "--no-first-run",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(WAIT)
        driver.set_script_timeout(WAIT)
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, what: str, check: Any, timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        check, message=f"waited {timeout}s for {what}; page: {driver.current_url}"
    )


def png_colours(data: bytes, enough: int = 3) -> int:
    """How many distinct pixel colours a PNG shows (counting stops at ``enough``)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    assert header is not None, "PNG without IHDR"
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        start = y * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), prev, bpp)
        colours.update(bytes(line[x : x + bpp]) for x in range(0, stride, bpp))
        if len(colours) >= enough:
            break
        prev = line
    return len(colours)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    if kind == 0:
        return line
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prev[i]
        if kind == 1:
            add = left
        elif kind == 2:
            add = up
        elif kind == 3:
            add = (left + up) // 2
        else:  # 4: Paeth
            corner = prev[i - bpp] if i >= bpp else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            add = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
        line[i] = (line[i] + add) & 0xFF
    return line


def screenshot(driver: Any, into: Path, name: str, selector: str) -> Path:
    """Save the page as ``into/name.png``; check it is not blank and ``selector`` is in the DOM."""
    from selenium.webdriver.common.by import By

    assert driver.find_elements(By.CSS_SELECTOR, selector), f"{name}: no {selector} on the page"
    path = into / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"{name}: no screenshot"
    assert png_colours(path.read_bytes()) >= 3, f"{name}: the screenshot is blank"
    return path


@dataclass
class Console:
    """``ctrlrun console`` in a subprocess."""

    proc: subprocess.Popen[str]
    url: str

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)


def start_console(policy: Path, store_url: str, env: dict[str, str], log: Path) -> Console:
    args = [sys.executable, "-m", "ctrlrun.cli", "console", "--listen", "127.0.0.1:0"]
    args += ["--policy", str(policy), "--store-url", store_url]
    with log.open("w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the start-up line, or nothing when it exits
    if "listening on http://" not in line:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"the console did not start: {line}{log.read_text()[-2000:]}")
    url = line.split("listening on ", 1)[1].split()[0]
    return Console(proc, url)


@contextmanager
def foreign_site(console_url: str, fields: dict[str, str]) -> Iterator[str]:
    """Another origin (another port on 127.0.0.1) serving a form that posts to the console."""
    from html import escape

    inputs = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
    )
    page = (
        f'<html><body><form method="post" action="{escape(console_url)}/approvals/answer">'
        f'{inputs}<button id="win" type="submit">Win a prize</button></form></body></html>'
    ).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def sleep_past_freeze_cache() -> None:
    """A freeze reaches every process within a second (each keeps what it read for 0.5 s)."""
    time.sleep(1.0)
