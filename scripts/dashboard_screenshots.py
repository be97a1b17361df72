"""Screenshots of the dashboard over the demo's two runs, for the README and the docs.

Run: python scripts/dashboard_screenshots.py DEMO_DIR OUT_DIR
(after `layerscope demo --out DEMO_DIR`; needs playwright and Debian's /usr/bin/chromium)
"""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
PORT = 8799


def main(demo: str, out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "layerscope", "serve", demo, "--port", str(PORT)],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{PORT}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/")
                break
            except OSError:
                time.sleep(0.1)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "/#/run/broken")
            page.wait_for_function("() => document.getElementById('heatmap').data", timeout=30000)
            page.wait_for_selector(".alert-row")
            dead = page.locator(".alert-row", has_text="dead").first
            dead.click()
            page.wait_for_function(
                "() => document.getElementById('distribution').dataset.step", timeout=30000
            )
            time.sleep(1.0)  # the charts' transitions
            page.screenshot(path=f"{out}/dashboard.png", full_page=True)
            page.goto(url + "/#/run/broken?compare=fixed")
            page.wait_for_function("() => document.getElementById('heatmap').data", timeout=30000)
            time.sleep(2.0)
            page.screenshot(path=f"{out}/dashboard-compare.png", full_page=False)
            browser.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
