"""The report (``cdcflow.commands.report``) drawn by a real headless Chromium, driven by Selenium:
the page loads from a file with no network, plotly.js draws every plot with the points
the warehouse holds, the browser logs no error, and a screenshot is taken.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them); without
them the test fails, saying so.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tests.report_warehouse import SourcePlan, build_warehouse, default_sources

from cdcflow.commands.report import PLOT_IDS, write_report

pytestmark = [pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
VIEWPORT = (1280, 1600)

#: a source name a pipeline's configuration could hold: plotly must show it as typed
ODD_SOURCE = "shop.<b>eu</b>&co"

#: its dead letters: codes enough that their legend wraps onto lines (it once grew up
#: over the plot's title)
ODD_DEAD_LETTERS = {
    1: {"TYPE_CONFLICT": 1, "SHARD_KEY_COLLISION": 2, "UNDECLARED_COLUMN": 1},
    2: {"EXPRESSION_FAILED": 1, "UNKNOWN_OP": 2, "TOO_MANY_COLUMNS": 1},
}

#: per plot: the number of points of each trace, and the SVG points drawn
_DRAWN = """
return arguments[0].map(function (id) {
  var gd = document.getElementById(id);
  if (!gd || !gd._fullLayout || !gd.querySelector('.main-svg')) { return null; }
  return {
    points: gd.data.map(function (t) { return [t.name, t.x.length, t.y.length]; }),
    drawn: gd.querySelectorAll('.scatterlayer .point, .barlayer .point').length,
    legend: Array.from(gd.querySelectorAll('.legendtext')).map(function (e) {
      return e.textContent; }),
    title_bottom: gd.querySelector('.gtitle').getBoundingClientRect().bottom,
    legend_top: gd.querySelector('.legend').getBoundingClientRect().top,
  };
});
"""


def _driver(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


def viewport(driver, width: int = VIEWPORT[0], height: int = VIEWPORT[1]) -> None:
    """Make the page's viewport exactly ``width`` x ``height`` CSS pixels (the window
    size includes the browser's own parts)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def test_report_renders_in_chromium(tmp_path):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: the browser test needs Debian's Chromium and "
            "ChromeDriver (apt-get install chromium chromium-driver)"
        )
    from selenium.webdriver.support.ui import WebDriverWait

    odd = SourcePlan(
        ODD_SOURCE,
        "eu.cdc",
        [50, 70, 90, 40],
        dead_letters=ODD_DEAD_LETTERS,
        start_ms=default_sources()[0].start_ms,
    )
    built = build_warehouse(tmp_path / "wh", [*default_sources(), odd])
    summary = write_report(str(built.root), tmp_path / "report.html")

    driver = _driver(tmp_path / "chromium-profile")
    try:
        viewport(driver)
        driver.get(summary.path.resolve().as_uri())
        WebDriverWait(driver, 60).until(
            lambda d: all(p is not None for p in d.execute_script(_DRAWN, list(PLOT_IDS)))
        )
        plots = dict(zip(PLOT_IDS, driver.execute_script(_DRAWN, list(PLOT_IDS)), strict=True))
        log = driver.get_log("browser")
        title = driver.title
        header = driver.find_element("css selector", "header").text
        shot = tmp_path / "report.png"
        assert driver.get_screenshot_as_file(str(shot))
    finally:
        driver.quit()

    assert title == f"cdcflow report: {built.root}"
    assert str(built.root) in header
    severe = [e for e in log if e.get("level") == "SEVERE"]
    assert severe == [], f"the browser logged errors: {severe}"

    events, lag, behind, dead = (plots[i] for i in PLOT_IDS)
    expected_rates = {s.name: built.rate_points(s) for s in built.sources}
    expected_lag = {s.name: built.progress_points(s) for s in built.sources}
    expected_behind = {s.name: built.behind_points(s) for s in built.sources}
    for plot, expected in (
        (events, expected_rates),
        (lag, expected_lag),
        (behind, expected_behind),
    ):
        # names come back as plotly holds them (escaped); the legend shows them as typed
        got = {name: (nx, ny) for name, nx, ny in plot["points"]}
        assert sorted(got.values()) == sorted((n, n) for n in expected.values())
        assert sorted(plot["legend"]) == sorted(expected)
        assert plot["drawn"] == sum(expected.values()), "a point was not drawn"
        assert all(n > 0 for n, _ in got.values())
    assert ODD_SOURCE in lag["legend"]

    codes = {name: nx for name, nx, _ in dead["points"]}
    odd_codes = {code: 1 for letters in ODD_DEAD_LETTERS.values() for code in letters}
    assert codes == {"BAD_JSON": 2, "MISSING_FIELD": 1, **odd_codes}
    assert dead["drawn"] == 3 + len(odd_codes)  # the bars
    for plot_id, plot in plots.items():
        # the legend, however many lines it wraps onto, stays under the plot's title
        assert plot["legend_top"] >= plot["title_bottom"], plot_id

    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    assert struct.unpack(">II", png[16:24]) == VIEWPORT  # the IHDR's width and height
