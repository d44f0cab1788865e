"""`npumem view` in a real browser: Debian's chromium, driven headless through chromedriver by
selenium. Each test starts the command on a small real recording, loads the page and checks
what it draws and writes: the timeline's pixels, the peaks against `npumem report`, a moment,
an allocation, a what-if replay to its end, the OOM banner, two sources on one axis, and 403
for a wrong token. Skipped, saying why, where selenium, chromium or chromedriver is missing
(.ci/run installs them)."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="no chromium and chromedriver here (apt-get install chromium chromium-driver)")

DATA = os.path.join(os.path.dirname(__file__), "data")
SNAPSHOT = os.path.join(DATA, "cuda_snapshots", "mlp.pickle.gz")
OTHER = os.path.join(DATA, "cuda_snapshots", "lstm.pickle.gz")
OOM = os.path.join(DATA, "cuda_oom_h200", "snapshots", "mlp", "116MiB_default.pickle.gz")
WAIT = 20                                   # seconds: generous for a loaded 2-core machine


class Viewer:
    """`npumem view --no-browser --port 0 PATHS` running; `url` is the address it printed."""

    def __init__(self, *paths: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "npumem", "view", "--no-browser", "--port", "0", *paths],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(60)
        first = line[0] if line else ""
        match = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", first)
        if not match:
            self.close()
            raise AssertionError(f"npumem view printed {first!r} first; stderr: "
                                 f"{self.process.stderr.read()[-2000:]}")
        self.base, self.token = match.groups()
        self.url = f"{self.base}?token={self.token}"

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def viewer(request):
    started = Viewer(*request.param)
    yield started
    started.close()


def wait_for(driver, script: str, what: str, timeout: float = WAIT):
    """Poll a JavaScript expression until it is truthy; on timeout say what the page shows."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = driver.execute_script("return " + script)
        if value:
            return value
        time.sleep(0.05)
    errors = driver.execute_script("return document.getElementById('errors').innerText")
    raise AssertionError(f"waited {timeout} s for {what}; the page's errors: {errors!r}")


def open_page(driver, viewer):
    driver.get(viewer.url)
    wait_for(driver, "document.documentElement.getAttribute('data-npumem-ready') === '1'",
             "the first drawn timeline")
    assert driver.execute_script("return document.getElementById('errors').innerText") == ""


INK_FRACTION = """
const u = NV.timeline.state.lanes[arguments[0]].plot, c = u.ctx.canvas, b = u.bbox;
if (!c.closest('.lanes .lane')) return -1;
const d = u.ctx.getImageData(Math.round(b.left), Math.round(b.top), Math.round(b.width), Math.round(b.height)).data;
let inked = 0;                  // coloured or dark ink: not the light grey gridlines
for (let i = 0; i < d.length; i += 4) {
  const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
  if (d[i + 3] > 0 && (hi - lo > 40 || hi < 120)) inked++;
}
return inked / (d.length / 4);
"""


def report_peaks(path: str) -> tuple[str, str]:
    run = subprocess.run([sys.executable, "-m", "npumem", "report", path],
                         capture_output=True, text=True, timeout=120)
    match = re.search(r"peak allocated ([\d.]+ \w+), peak reserved ([\d.]+ \w+)", run.stdout)
    assert match, run.stdout[-1000:] + run.stderr[-1000:]
    return match.groups()


def assert_peaks_are_the_reports(driver, path: str, index: int = 0):
    """The peaks the page writes for a source are those `npumem report` prints for its file."""
    allocated, reserved = report_peaks(path)
    line = driver.find_elements(By.CSS_SELECTOR, "#sources .source")[index].text
    assert f"peak allocated {allocated}" in line and f"peak reserved {reserved}" in line, line


def assert_a_moment_is_the_servers(driver, lane_index: int = 0, source: int = 0):
    """Click a lane's middle: the moment panel's live bytes are /api/moment's for that time."""
    lane = driver.find_elements(By.CSS_SELECTOR, ".lanes .lane")[lane_index]
    driver.execute_script("document.getElementById('panel-moment').removeAttribute('data-moment-t')")
    ActionChains(driver).move_to_element(lane).click().perform()
    live = wait_for(driver, "document.querySelector('#panel-moment[data-moment-t] .live-bytes')"
                            " && document.querySelector('#panel-moment .live-bytes').textContent",
                    "the moment panel")
    t = driver.execute_script("return document.getElementById('panel-moment')"
                              ".getAttribute('data-moment-t')")
    answer = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "NV.api.get('/api/moment', {source: arguments[1], t: arguments[0]})"
        ".then(done, e => done({error: String(e)}));", t, source)
    assert "error" not in answer, answer
    assert live == driver.execute_script("return NV.fmt.bytes(arguments[0])", answer["live_bytes"])
    return lane


def draws(driver) -> int:
    return int(driver.execute_script(
        "return document.documentElement.getAttribute('data-npumem-draws')"))


def span(driver) -> float:
    return driver.execute_script("const v = NV.timeline.state.view; return v.v1 - v.v0")


@pytest.mark.parametrize("viewer", [(SNAPSHOT,)], indirect=True)
def test_a_snapshot_draws_and_every_view_answers(browser, viewer):
    open_page(browser, viewer)
    # The plot is drawn: categories, allocated and reserved ink a good part of it.
    assert browser.execute_script(INK_FRACTION, 0) > 0.05
    # The peaks written on the page are the report's own.
    assert_peaks_are_the_reports(browser, SNAPSHOT)
    # Everything the page loaded, its charting library included, came from the viewer itself.
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert any("/static/uPlot.iife.min.js" in url for url in loaded), loaded
    assert all(url.startswith(viewer.base) for url in loaded if not url.startswith("data:")), loaded

    # A moment: click the middle of the timeline.
    lane = assert_a_moment_is_the_servers(browser)
    assert browser.find_elements(By.CSS_SELECTOR, "#panel-moment canvas.blockmap")
    assert browser.find_elements(By.CSS_SELECTOR, "#panel-moment canvas.icicle")
    assert browser.find_elements(By.CSS_SELECTOR, "#panel-moment table.bars tbody tr")

    # An allocation: the largest block live there.
    browser.find_element(By.CSS_SELECTOR, "#panel-moment .largest button").click()
    wait_for(browser, "/^Allocation /.test(document.querySelector('#panel-allocation h3')"
                      "?.textContent || '')", "the allocation panel")
    text = browser.find_element(By.ID, "panel-allocation").text
    assert re.search(r"size\s+[\d.]+ (B|KiB|MiB|GiB)", text) and "lifetime" in text

    # A what-if: tune's first candidate, replayed to the end and drawn over the recording.
    browser.find_element(By.ID, "tab-whatif").click()
    pick = browser.find_element(By.ID, "whatif-pick")
    pick.find_elements(By.TAG_NAME, "option")[2].click()
    browser.find_element(By.CSS_SELECTOR, "#whatif-form button[type=submit]").click()
    state = wait_for(browser, "document.querySelector('.whatif-run[data-done]')"
                              " && document.querySelector('.whatif-run').getAttribute('data-done')",
                     "the what-if replay", timeout=30)
    run_text = browser.find_element(By.CSS_SELECTOR, ".whatif-run").text
    assert state == "1", run_text
    assert re.search(r"peak reserved [\d.]+ (B|KiB|MiB|GiB)", run_text)
    assert browser.execute_script("return NV.timeline.state.whatifs.length") == 1
    # A setting PyTorch would refuse: the page says why, in the run's line and at the top.
    typed = browser.find_element(By.ID, "whatif-text")
    typed.clear()
    typed.send_keys("expandable_segments:Maybe")
    browser.find_element(By.CSS_SELECTOR, "#whatif-form button[type=submit]").click()
    wait_for(browser, "document.querySelectorAll('.whatif-run[data-done=error]').length",
             "the refused setting's error")
    refused = browser.find_elements(By.CSS_SELECTOR, ".whatif-run")[-1].text
    assert "expandable_segments" in refused and "400" in refused, refused
    assert "Maybe" in browser.find_element(By.ID, "errors").text
    browser.execute_script("document.getElementById('errors').innerHTML = '';"
                           "document.getElementById('errors').hidden = true")

    # Leaks and steps, and pinned host memory, answer without an error.
    for tab in ("tab-leaks", "tab-host"):
        browser.find_element(By.ID, tab).click()
    panel = "document.getElementById('panel-host').textContent"
    wait_for(browser, f"{panel}.length > 0 && !/Loading/.test({panel})", "the host panel")
    assert browser.execute_script("return document.getElementById('errors').innerText") == ""

    # Zoom with the wheel, with a drag across the lane and with a key; pan with an arrow: each
    # time the server answers the new range and the page draws it.
    def redrawn(action, what):
        before, width = draws(browser), span(browser)
        action()
        wait_for(browser, f"+document.documentElement.getAttribute('data-npumem-draws') > {before}",
                 what)
        return width, span(browser)

    before, after = redrawn(lambda: ActionChains(browser).scroll_from_origin(
        webdriver.common.actions.wheel_input.ScrollOrigin.from_element(lane), 0, -400).perform(),
        "the timeline zoomed by the wheel")
    assert after < before
    before, after = redrawn(lambda: ActionChains(browser).move_to_element_with_offset(lane, -200, 0)
                            .click_and_hold().move_by_offset(150, 0).release().perform(),
                            "the timeline zoomed to a dragged range")
    assert after < before
    before, after = redrawn(lambda: lane.send_keys("-"), "the timeline zoomed out by a key")
    assert after > before
    v0 = browser.execute_script("return NV.timeline.state.view.v0")
    redrawn(lambda: lane.send_keys(Keys.ARROW_LEFT), "the timeline panned by a key")
    assert browser.execute_script("return NV.timeline.state.view.v0") < v0


@pytest.mark.parametrize("viewer", [(OOM,)], indirect=True)
def test_an_oom_snapshot_shows_the_oom_and_its_explanation(browser, viewer):
    open_page(browser, viewer)
    banner = browser.find_element(By.ID, "oom")
    assert banner.is_displayed() and "Out of memory" in banner.text
    assert "out of memory" in banner.find_element(By.CLASS_NAME, "oom-message").text.lower()
    wait_for(browser, "document.querySelector('#oom .oom-explanation').textContent"
                      " && !/Working out why/.test(document.querySelector('#oom .oom-explanation')"
                      ".textContent)", "the OOM's explanation", timeout=30)
    assert browser.execute_script(INK_FRACTION, 0) > 0.02
    assert_peaks_are_the_reports(browser, OOM)
    browser.find_element(By.CSS_SELECTOR, "#oom button").click()
    wait_for(browser, "document.querySelector('#panel-moment .live-bytes')", "the moment at the OOM")
    assert browser.find_elements(By.CSS_SELECTOR, "#panel-moment canvas.blockmap")


PROGRAM = """
import npumem as npu
npu.init()
npu.set_device(0)
kept = []
for step in range(6):
    scratch = npu.malloc(1 << 20)
    kept.append(npu.malloc(256 << 10))
    npu.free(scratch)
"""


@pytest.fixture
def profile_folder(tmp_path):
    """The folder `npumem profile` writes for a program on npumem's runtime."""
    (tmp_path / "program.py").write_text(PROGRAM)
    run = subprocess.run([sys.executable, "-m", "npumem", "profile", "--stacks", "--out",
                          str(tmp_path / "prof"), "--", "program.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert (tmp_path / "prof" / "snapshot.pickle").exists(), run.stdout + run.stderr
    return str(tmp_path / "prof")


def test_a_profile_folder_opens(browser, profile_folder):
    viewer = Viewer(profile_folder)
    try:
        open_page(browser, viewer)
        assert browser.execute_script(INK_FRACTION, 0) > 0.05
        assert "profile" in browser.find_element(By.ID, "sources").text
        assert_peaks_are_the_reports(browser, profile_folder)
        assert_a_moment_is_the_servers(browser)
    finally:
        viewer.close()


@pytest.fixture
def pinned_snapshot(tmp_path):
    """The H100 snapshot with pinned host memory added as PyTorch 2.14 writes it beside the
    device's (host_segments, host_traces), in the shape the server reads."""
    with gzip.open(SNAPSHOT, "rb") as f:
        data = pickle.load(f)
    start = data["device_traces"][0][0]["time_us"]
    data["host_segments"] = [{"address": 0x7f0000000000, "total_size": 4 << 20,
                              "allocated_size": 3 << 20,
                              "blocks": [{"address": 0x7f0000000000, "size": 3 << 20,
                                          "state": "active_allocated"},
                                         {"address": 0x7f0000300000, "size": 1 << 20,
                                          "state": "inactive"}]}]
    data["host_traces"] = [{"action": "alloc", "addr": 0x7f0000000000 + i * (1 << 20),
                            "size": 1 << 20, "time_us": start + 1000 * i} for i in range(3)]
    path = tmp_path / "pinned.pickle"
    path.write_bytes(pickle.dumps(data))
    return str(path)


def test_pinned_host_memory_is_shown(browser, pinned_snapshot):
    viewer = Viewer(pinned_snapshot)
    try:
        open_page(browser, viewer)
        browser.find_element(By.ID, "tab-host").click()
        text = wait_for(browser, "document.querySelector('#panel-host table')"
                                 " && document.getElementById('panel-host').innerText",
                        "the pinned host memory panel")
        assert "1 pinned segment, 4.00 MiB held; 3 trace entries" in text, text
        assert browser.find_elements(By.CSS_SELECTOR, "#panel-host .host-chart canvas")
        assert browser.execute_script("return document.getElementById('errors').innerText") == ""
    finally:
        viewer.close()


@pytest.mark.parametrize("viewer", [(SNAPSHOT, OTHER)], indirect=True)
def test_two_sources_share_one_axis(browser, viewer):
    open_page(browser, viewer)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".lanes .lane canvas")) == 2
    assert browser.execute_script(INK_FRACTION, 0) > 0.02
    assert browser.execute_script(INK_FRACTION, 1) > 0.02
    header = browser.find_element(By.ID, "sources").text
    assert "A: " in header and "B: " in header
    assert_peaks_are_the_reports(browser, SNAPSHOT, 0)
    assert_peaks_are_the_reports(browser, OTHER, 1)
    assert_a_moment_is_the_servers(browser, lane_index=1, source=1)
    # B stretched over A's length: the lanes are drawn again from the server's answers.
    before = draws(browser)
    browser.find_element(By.ID, "stretch").click()
    wait_for(browser, f"+document.documentElement.getAttribute('data-npumem-draws') > {before}",
             "the stretched lanes")
    assert browser.execute_script(INK_FRACTION, 1) > 0.02


@pytest.mark.parametrize("viewer", [(SNAPSHOT,)], indirect=True)
def test_a_wrong_token_gets_403_and_any_other_path_404(browser, viewer):
    for url in (viewer.base + "?token=wrong", viewer.base + "api/info",
                viewer.base + "static/app.js?token=wrong"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 403, url
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(viewer.base + "etc/passwd?token=" + viewer.token, timeout=10)
    assert missing.value.code == 404
