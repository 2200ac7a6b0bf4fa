"""Selecting another job never shows the old one: the page shows the new job or a loading banner naming it.

Switches between two jobs of one store at least ten times, some without waiting for the answer, while a
per-frame watcher in the page records any painted frame whose content names another job than the job box.
Every wait is on a condition in the page; nothing sleeps to synchronise.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import screenshot_dir, serve_dashboard
from tests.e2e.page_monitor import choose, install_monitor, monitor, showing

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::UserWarning")]

STRATEGY = {"alpha": "DP=4 PP=2", "beta": "DP=3 PP=2"}


@pytest.fixture
def two_job_url(tmp_path):
    from rankscope.datasets.sim.job_config import Fault, SimConfig
    from rankscope.datasets.simulator import simulate, write_store

    store = tmp_path / "two"
    write_store(simulate(SimConfig(job="alpha", dp=4, pp=2, steps=3, microbatches=4, layers=4, flows=False,
                                   seed=3, faults=(Fault("slow-worker", {"rank": 5, "factor": 1.6}),))), store)
    write_store(simulate(SimConfig(job="beta", dp=3, pp=2, steps=3, microbatches=4, layers=4, flows=False,
                                   seed=4, faults=(Fault("slow-worker", {"rank": 2, "factor": 1.5}),))), store)
    with serve_dashboard(store, refresh_s=2) as url:  # short refresh: ticks race the selections too
        yield url


def test_selecting_a_job_never_shows_the_old_one(browser, two_job_url, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(two_job_url)
    wait = WebDriverWait(browser, 300, poll_frequency=0.05)
    install_monitor(browser, STRATEGY)
    wait.until(lambda b: showing(b, "alpha"))
    # first view of beta: its analysis is not cached yet, so the loading banner must name it meanwhile
    choose(browser, "job", "beta")
    wait.until(lambda b: showing(b, "beta"))
    assert any("job beta" in t for t in monitor(browser)["loading"]), monitor(browser)
    switches = 2
    for i in range(12):
        job = ("alpha", "beta")[i % 2]
        choose(browser, "job", job)
        switches += 1
        if i % 3 == 2:
            # change again before the answer comes: the late answer for the other job must not show
            other = "beta" if job == "alpha" else "alpha"
            choose(browser, "job", other)
            switches += 1
            job = other
        wait.until(lambda b, j=job: showing(b, j))
        m = monitor(browser)
        assert not m["stale"], f"switch {switches}: a frame showed another job: {m['stale'][:3]}"
    m = monitor(browser)
    print(f"{switches} switches, {m['frames']} frames watched, loading texts {m['loading']}")
    assert switches >= 10 and m["frames"] > switches
    browser.save_screenshot(str(screenshot_dir(tmp_path) / "selection.png"))


def test_missing_store_says_so_in_the_page(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    empty = tmp_path / "empty"
    empty.mkdir()
    with serve_dashboard(empty) as url:
        browser.get(url)
        WebDriverWait(browser, 120, poll_frequency=0.1).until(
            lambda b: "no records yet" in b.find_element(By.ID, "summary-band").text)
        assert "rankscope ingest" in browser.find_element(By.ID, "summary-band").text
        assert "step_series" not in browser.find_element(By.ID, "content").text


def test_live_refresh_shows_new_steps_without_a_loading_flash(browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.unit.dashboard.hand_store import write_hand_store

    store = tmp_path / "live"
    write_hand_store(store, steps=2)
    points = ("const gd = document.querySelector('#fig-step_series .js-plotly-plot');"
              "return gd && gd.calcdata ? gd.calcdata[0].length : 0;")
    with serve_dashboard(store, refresh_s=1) as url:
        browser.get(url)
        wait = WebDriverWait(browser, 300, poll_frequency=0.05)
        install_monitor(browser)
        wait.until(lambda b: showing(b, "handjob") and b.execute_script(points) == 2)
        browser.execute_script("window.__rs.loading = [];")
        write_hand_store(store, steps=1, first_step=2)  # a live writer adds a step
        wait.until(lambda b: b.execute_script(points) == 3)
        m = monitor(browser)
        assert not m["stale"] and m["loading"] == [], m  # same job, newer data: no loading banner
