"""`zcoll monitor`'s page in a real headless browser (Debian's chromium, driven by selenium): a
2-rank job (tests/mpi/monitor_job.py) publishes while the page is open; the heatmaps and the
timeline render the job's own numbers and grow while it runs (server push, no reload), a verdict
pushed by the server shows as a verdict and a hotspot within 5 s, and a run whose rank 0 never
publishes is named on the page. The emulated-network version (a slow link injected with tc on
the two-node test bed) is bench/monitor_testbed.py (root), its output in docs/monitor.md."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time

import pytest
from mpi_util import script_job
from zcoll.observe import serve
from zcoll.observe.monitor_state import MonitorState

pytest.importorskip(
    "starlette", reason="pip install 'zcoll[monitor]' (starlette, uvicorn, prometheus_client, plotly)"
)
webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
monitor_server = pytest.importorskip("zcoll.tools.monitor_server")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("no headless browser: apt-get install chromium chromium-driver", allow_module_level=True)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2000"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))


def wait_for(driver, script, timeout=20.0):
    """The first truthy value of a JavaScript expression, polled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return {script}")
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page never had {script} within {timeout} s")


def test_page_renders_the_jobs_numbers_and_a_pushed_verdict(tmp_path):
    state = MonitorState()
    server = serve.serve(monitor_server.make_app(state), "127.0.0.1", 0)
    stop = (
        tmp_path / "stop"
    )  # the job runs until the page has shown it growing (a busy machine draws less often)
    job = script_job("mpi/monitor_job.py", 2, f"--url={server.url}", "--steps=100000", "--period=0.1",
                     f"--stop-file={stop}")  # fmt: skip
    driver = browser()
    try:
        driver.get(server.url + "/")
        wait_for(driver, "document.body.dataset.version")  # the page is up before the job starts
        training = threading.Thread(target=job.launch)
        training.start()
        samples, deadline = [], time.monotonic() + 120  # (steps on the timeline, pushes received)
        while training.is_alive() and time.monotonic() < deadline:
            samples.append(driver.execute_script(
                "return [document.getElementById('timeline').dataset.steps, document.body.dataset.pushes]"))  # fmt: skip
            if len({n for n, _ in samples if n is not None}) >= 3:
                break
            time.sleep(0.05)
        stop.touch()
        training.join(120)
        grown = [int(n) for n, _ in samples if n is not None]
        # the timeline grew while the job ran, one server push at a time (the page never reloads)
        assert len(set(grown)) >= 3 and grown == sorted(grown), samples
        pushes = [int(x) for _, x in samples if x is not None]
        assert pushes and pushes[-1] - pushes[0] >= 3, samples
        job.check("publish", min_checks=20)
        s = state.snapshot()
        last = f"'{s['version']}'"  # the last push arrived, and the charts drawn at most twice a second too
        wait_for(driver, f"document.body.dataset.version === {last} && "
                         f"document.getElementById('timeline').dataset.version === {last}")  # fmt: skip
        shown = json.loads(wait_for(driver, "document.getElementById('heat-bw').dataset.values"))
        want = [[None if v is None else v * 1e-6 for v in row] for row in s["links"]["bandwidth"]]
        assert shown[0][1] == pytest.approx(want[0][1]) and shown[1][0] == pytest.approx(want[1][0])
        assert wait_for(driver, "document.querySelectorAll('#heat-bw .heatmaplayer').length") == 1
        assert wait_for(driver, "document.querySelectorAll('#timeline .barlayer .point').length") >= 1
        summary = driver.find_element("id", "timeline-summary").text
        shown_ms = float(re.search(r": ([0-9.]+) ms;", summary).group(1))
        assert abs(shown_ms - s["steps"]["0"][-1]["step_s"] * 1e3) <= 0.051, summary
        collectives = driver.find_element("id", "collectives").text
        assert "allreduce" in collectives and "<= 1MiB" in collectives, collectives

        doc = {"format": "zcoll-monitor/1", "run": s["run"], "rank": 0, "size": 2, "t": time.time(), "steps": [],
               "calls": [], "buckets": [], "links": s["links"],
               "verdict": {"label": "slow link", "who": "1->0", "text": "slow link 1->0: injected"}}  # fmt: skip
        start = time.monotonic()
        state.publish(doc)
        wait_for(driver, "document.getElementById('verdict').dataset.who === '1->0' && "
                         "document.getElementById('heat-bw').dataset.hotspot === '1->0'", timeout=5.0)  # fmt: skip
        took = time.monotonic() - start
        assert took < 5.0
        assert "slow link 1->0" in driver.find_element("id", "verdict").text
        driver.save_screenshot(str(tmp_path / "monitor.png"))
        assert (tmp_path / "monitor.png").stat().st_size > 10_000

        state.grace = 0.0  # a run whose rank 0 cannot reach the monitor: the page says so
        state.publish(dict(doc, run="lonely", rank=1, verdict=None, links=None))
        wait_for(driver, "document.getElementById('notes').dataset.count === '1'", timeout=5.0)
        assert "rank 0 has not published" in driver.find_element("id", "notes").text
    finally:
        driver.quit()
        server.close()
