"""Shared pieces of the real-browser tests: headless Debian Chromium and a ``rankscope dashboard`` process."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2400")


def screenshot_dir(tmp_path: Path) -> Path:
    """Screenshots go to RANKSCOPE_SCREENSHOTS when set (to look at them), else the test's tmp dir."""
    d = Path(os.environ.get("RANKSCOPE_SCREENSHOTS", tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def browser(tmp_path):
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("Debian chromium / chromium-driver not installed")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_dashboard(store: Path, refresh_s: float = 5.0, start_timeout_s: float = 60.0):
    """``rankscope dashboard`` over ``store`` in a subprocess; yields its URL once it answers."""
    port = _free_port()
    exe = shutil.which("rankscope", path=str(Path(sys.executable).parent)) or "rankscope"
    proc = subprocess.Popen([exe, "dashboard", "--store", str(store), "--port", str(port), "--refresh",
                             str(refresh_s)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"rankscope dashboard exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() - t0 > start_timeout_s:
                    pytest.fail(f"rankscope dashboard did not answer within {start_timeout_s:.0f} s")
                time.sleep(0.2)  # polling a port that is not open yet: nothing to wait on but time
        print(f"dashboard answered {time.monotonic() - t0:.1f} s after start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


