"""A 2,048-rank store in a real browser: the loading banner while it is analysed, then the verdict, an
aggregated grid and heatmap, and a first paint under 5 s once the analysis is cached (the issue's bar)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import screenshot_dir, serve_dashboard
from tests.e2e.page_monitor import install_monitor, monitor, showing

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

FIRST_PAINT_LIMIT_S = 5.0
"""the issue's bar on an idle machine; scaled by the run-queue excess when other work shares the CPUs."""


def _load_factor() -> float:
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("big") / "store"
    exe = str(Path(sys.executable).parent / "rankscope")
    subprocess.run([exe, "simulate", "--out", str(out), "--job", "big", "--dp", "256", "--pp", "8", "--steps", "3",
                    "--microbatches", "4", "--no-flows", "--fault", "slow-worker:rank=1000,factor=1.5"],
                   check=True, capture_output=True, timeout=600)
    return out


def _drawn(driver) -> bool:
    return showing(driver, "big") and driver.execute_script(
        "return document.querySelectorAll('#fig-heatmap .heatmaplayer image').length") > 0


def test_2048_ranks_load_then_paint_fast_from_the_cache(browser, big_store, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serve_dashboard(big_store, refresh_s=30) as url:
        browser.get(url)
        install_monitor(browser, {"big": "DP=256 PP=8"})
        # while the first analysis runs, the page says so and names the job; no content is shown
        WebDriverWait(browser, 120, poll_frequency=0.05).until(
            lambda b: "job big" in b.find_element(By.ID, "loading-text").text)
        assert not browser.find_element(By.ID, "content").is_displayed()
        t0 = time.monotonic()
        WebDriverWait(browser, 900, poll_frequency=0.2).until(_drawn)
        cold_s = time.monotonic() - t0
        m = monitor(browser)
        assert not m["stale"] and any("job big" in t for t in m["loading"])
        band = browser.find_element(By.ID, "summary-band").text
        assert "rank 1000" in band and "GPU-hours/day" in band, band
        grid = browser.execute_script("""
            const gd = document.querySelector('#fig-strategy .js-plotly-plot');
            const z = gd.calcdata[0][0].z;  // decoded as drawn (the JSON carries a typed array)
            return [z.length, z[0].length];""")
        assert grid == [64, 8], grid  # 256 DP replicas binned by 4 into 64 rows, 8 stages
        rows = browser.execute_script(
            "return document.querySelector('#fig-heatmap .js-plotly-plot').data[0].y.length")
        assert rows <= 256
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "big_store.png"))

        # a new page over the same store version: the analysis comes from the cache
        t0 = time.monotonic()
        browser.get(url)
        WebDriverWait(browser, 120, poll_frequency=0.05).until(_drawn)
        first_paint_s = time.monotonic() - t0
        calls = browser.execute_script("""
            return performance.getEntriesByType('resource').filter(e => e.name.indexOf('_dash-update') >= 0)
                .map(e => Math.round(e.duration));""")
        load = _load_factor()
        print(f"2048 ranks: first view (analysis) {cold_s:.1f} s; first paint from the cache {first_paint_s:.2f} s "
              f"(callbacks {calls} ms; load average / CPUs {load:.1f})")
        assert first_paint_s < FIRST_PAINT_LIMIT_S * load
