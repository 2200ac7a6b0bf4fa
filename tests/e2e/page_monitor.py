"""Browser-side watchers for the dashboard tests: what the page painted, frame by frame, and how to pick a job.

The monitor runs on every animation frame (what a user could see) and records any frame in which the
content is visible but names another job than the job box shows, plus each distinct loading text seen.
"""

from __future__ import annotations

MONITOR_JS = """
window.__rs = {stale: [], loading: [], frames: 0};
const txt = (sel) => { const e = document.querySelector(sel); return e ? e.textContent : null; };
const shown = (id) => { const e = document.getElementById(id); return !!e && getComputedStyle(e).display !== 'none'; };
function rsCheck() {
    const r = window.__rs;
    r.frames += 1;
    const sel = txt('#job-value');
    if (shown('content')) {
        const band = txt('#summary-band .band-job');
        const status = txt('#status') || '';
        const strat = txt('#fig-strategy .gtitle') || '';
        const want = (window.__rsStrategy || {})[sel];
        if (band !== 'job ' + sel || status.indexOf('job ' + sel + ' ') < 0 || (want && strat.indexOf(want) < 0)) {
            if (r.stale.length < 20) r.stale.push({selected: sel, band: band, status: status, strategy: strat});
        }
    }
    if (shown('loading')) {
        const t = txt('#loading-text');
        if (t && r.loading.indexOf(t) < 0) r.loading.push(t);
    }
    requestAnimationFrame(rsCheck);
}
requestAnimationFrame(rsCheck);
"""


def install_monitor(driver, strategy_titles: dict[str, str] | None = None) -> None:
    """Start the per-frame watcher; ``strategy_titles`` maps a job to text its strategy figure title holds."""
    driver.execute_script("window.__rsStrategy = arguments[0];", strategy_titles or {})
    driver.execute_script(MONITOR_JS)


def monitor(driver) -> dict:
    return driver.execute_script("return window.__rs;")


def showing(driver, job: str) -> bool:
    """The content is visible and names ``job`` (summary band and status), with its strategy figure drawn."""
    return bool(driver.execute_script("""
        const c = document.getElementById('content');
        if (!c || getComputedStyle(c).display === 'none') return false;
        const band = document.querySelector('#summary-band .band-job');
        return !!band && band.textContent === 'job ' + arguments[0]
            && document.querySelectorAll('#fig-strategy .heatmaplayer image').length > 0;""", job))


def choose(driver, box_id: str, value: str, timeout_s: float = 60) -> None:
    """Open a dcc.Dropdown and click the option ``value`` (as a user would)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def option(d):
        box = d.find_element(By.ID, box_id)
        if box.get_attribute("aria-expanded") != "true":
            box.click()  # (again, if a click landed while the last choice's popup was still closing)
            return None
        return next((o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]")
                     if o.text.strip() == value and o.is_displayed()), None)

    WebDriverWait(driver, timeout_s, poll_frequency=0.25).until(option).click()
    WebDriverWait(driver, timeout_s, poll_frequency=0.05).until(
        lambda d: d.find_element(By.ID, f"{box_id}-value").text.strip() == value)
