"""The HTML report in a real browser: headless Chromium renders the seed demo's report.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it, and says so). Where it is
missing, the test installs it with apt-get when it runs as root — saying so on the terminal
before it starts, also under ``pytest -q`` — unless ``NANGUARD_NO_APT=1``; it skips, saying why,
where that is impossible (not root, no apt-get, or the install fails).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _spawn import Spawn

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # the page must need no network
]


def _find() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _say(request: pytest.FixtureRequest, text: str) -> None:
    """A line on the terminal even while pytest captures output."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print(f"\n{text}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def chromium(request: pytest.FixtureRequest, spawn: Spawn) -> str:
    path = _find()
    if path:
        return path
    if os.environ.get("NANGUARD_NO_APT") == "1":
        pytest.skip("chromium is not installed and NANGUARD_NO_APT=1: apt-get install -y chromium")
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be installed here (needs root and "
                    "apt-get): apt-get install -y chromium")
    _say(request, "test_browser: installing the system package 'chromium' with apt-get (as root) "
                  "for the browser test; NANGUARD_NO_APT=1 skips the test instead")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends",
                                         "chromium"]):
        proc = spawn.run(cmd, env=env, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"chromium could not be installed ({' '.join(cmd)} failed): "
                        f"{proc.stderr.strip()[-300:]}")
    path = _find()
    if not path:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return path


def _browser(spawn: Spawn, chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return spawn.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args], timeout=600)


@pytest.fixture(scope="module")
def seed_report(tmp_path_factory: pytest.TempPathFactory, spawn: Spawn) -> Path:
    """``nanguard run --report`` on the seed demo (stopped at its first non-finite value)."""
    d = tmp_path_factory.mktemp("browser")
    script = d / "seed.py"
    script.write_text("from nanguard.demos.seed_torch import train\n\ntrain(4.0)\n")
    report = d / "report.html"
    proc = spawn.nanguard("run", "--report", str(report), str(script), timeout=600, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr
    return report


def test_the_browser_renders_the_finding_and_the_plots(chromium: str, seed_report: Path,
                                                      spawn: Spawn) -> None:
    proc = _browser(spawn, chromium, "--virtual-time-budget=5000", "--dump-dom", seed_report.as_uri())
    dom = proc.stdout
    assert proc.returncode == 0 and dom, proc.stderr[-2000:]
    # the finding, at the top
    assert dom.index("id=\"finding\"") < dom.index("id=\"plots\"")
    for text in ("aten.addmm.default", "fc2 (Linear)", "seed_torch.py:58", "learning-rate-too-high",
                 "the first non-finite value was made in the forward pass at step 4",
                 "optimizer = torch.optim.SGD(model.parameters(), lr=0.04)"):
        assert text in dom, text
    # the plots: inline SVG, each with the first non-finite step marked
    for pid in ("plot-loss", "plot-grad-norm", "plot-layer-grad-norms", "plot-lr", "plot-ratio"):
        assert f'id="{pid}"' in dom, pid
    assert dom.count("<svg") >= 5
    assert dom.count("first non-finite (step 4)") >= 4


def test_screenshot_shows_the_report(chromium: str, seed_report: Path, tmp_path: Path,
                                     spawn: Spawn) -> None:
    png = tmp_path / "shot.png"
    proc = _browser(spawn, chromium, "--window-size=1280,2000", f"--screenshot={png}",
                    seed_report.as_uri())
    assert png.exists(), proc.stderr[-2000:]
    from PIL import Image

    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 2000)
    colors = img.getcolors(maxcolors=1 << 20) or []
    # the red of the first-non-finite marks and the blue of the curves were drawn
    red = sum(n for n, (r, g, b) in colors if r > 180 and g < 80 and b < 80)
    blue = sum(n for n, (r, g, b) in colors if r < 80 and 90 < g < 150 and b > 150)
    assert red > 500 and blue > 500, (red, blue)
