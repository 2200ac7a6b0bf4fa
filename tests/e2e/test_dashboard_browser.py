"""A real headless Chromium drives the dashboard and the static report page."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import screenshot_dir, serve_dashboard
from tests.unit.dashboard.hand_store import write_hand_store

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def dashboard_url(tmp_path):
    """``rankscope dashboard`` over a simulated DP=4 x PP=2 job whose rank 5 computes 1.6x slower."""
    from rankscope.datasets.sim.job_config import Fault, SimConfig
    from rankscope.datasets.simulator import simulate, write_store

    store = tmp_path / "store"
    cfg = SimConfig(job="sim", dp=4, pp=2, steps=3, microbatches=4, layers=4, flows=False, seed=3,
                    faults=(Fault("slow-worker", {"rank": 5, "factor": 1.6}),))
    write_store(simulate(cfg), store)
    with serve_dashboard(store) as url:
        yield url


def test_dashboard_shows_strategy_and_figures(browser, dashboard_url, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(dashboard_url)
    wait = WebDriverWait(browser, 180, poll_frequency=0.5)
    wait.until(lambda b: "DP 4 x PP 2" in b.find_element(By.ID, "strategy-summary").text)
    # the strategy grid is drawn (a heatmap image in each panel) and the timeline has its bars
    wait.until(lambda b: b.execute_script(
        "return document.querySelectorAll('#fig-strategy .heatmaplayer image').length") >= 1)
    wait.until(lambda b: b.execute_script(
        "return document.querySelectorAll('#fig-timeline .bars path').length") >= 8)
    assert "job sim" in browser.find_element(By.ID, "status").text
    band = browser.find_element(By.ID, "summary-band").text
    assert "verdict: worker" in band and "rank 5" in band and "GPU-hours/day" in band
    cards = browser.find_element(By.ID, "cards").text
    assert "4 x 2 x 1" in cards
    # the straggler heatmap the browser drew has the injected slow rank as its worst row
    worst = browser.execute_script("""
        const gd = document.querySelector('#fig-heatmap .js-plotly-plot');
        const z = Array.from(gd.calcdata[0][0].z, r => Array.from(r));  // decoded as drawn
        const mean = r => r.reduce((a, b) => a + b, 0) / r.length;
        let best = 0;
        z.forEach((r, i) => { if (mean(r) > mean(z[best])) best = i; });
        return String(gd._fullData[0].y[best]);""")
    assert worst.startswith("rank 5 ")
    # the critical path: the browser drew the first step's path (its line crosses the slow rank's row), a
    # menu offers every listed step, and the share table lists rank 5 first
    drawn = browser.execute_script("""
        const gd = document.querySelector('#fig-critical_path .js-plotly-plot');
        const line = gd._fullData.filter(t => t.type === 'scatter' && t.visible === true);
        return {ranks: line.length ? Array.from(line[0].y, String) : [],
                steps: gd._fullLayout.updatemenus[0].buttons.length,
                first: document.querySelector('#fig-path_shares .js-plotly-plot').data[0].cells.values[1][0]};""")
    assert "5" in drawn["ranks"] and drawn["steps"] >= 1 and str(drawn["first"]) == "5"
    shot = screenshot_dir(tmp_path) / "dashboard.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_static_report_renders_offline(browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    from rankscope.analysis.diagnose import analyze_job
    from rankscope.collectors.job_frames import load_job
    from rankscope.dashboard.report_html import render_report

    store = write_hand_store(tmp_path / "store", steps=3)
    page = tmp_path / "handjob.html"
    page.write_text(render_report(*analyze_job(load_job(store, "handjob"))))
    browser.get(page.as_uri())
    WebDriverWait(browser, 60).until(lambda b: b.execute_script(
        "return document.querySelectorAll('.js-plotly-plot .main-svg').length") > 0)
    n_plots = browser.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    n_divs = browser.execute_script("return document.querySelectorAll('[id^=plot-]').length")
    assert n_plots == n_divs >= 8
    shot = screenshot_dir(tmp_path) / "report.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
