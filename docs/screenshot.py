"""Take docs/site.png, the screenshot of the documentation site that about.md links to.

Run by hand after a change to the site's look: ``make docs``, then
``.venv/bin/python docs/screenshot.py`` (options: ``--page``, ``--out``, ``--html``).
It opens the built pages from disk (no server) in the system's headless chromium through
playwright, as tests/test_dashboard.py does: no browser is downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

DOCS = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("EVENTLANES_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=DOCS / "_build" / "html",
                        help="the built site (make docs's DOCS_OUT)")  # fmt: skip
    parser.add_argument("--page", default="getting-started.html", help="the page, in --html")
    parser.add_argument("--out", type=Path, default=DOCS / "site.png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    page_file = args.html / args.page
    if not page_file.is_file():
        print(f"error: no {page_file}: run `make docs` first", file=sys.stderr)
        return 2
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(
                viewport={"width": args.width, "height": args.height}, color_scheme="light"
            )
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            page.evaluate("document.fonts.ready")  # the system fonts, laid out
            page.screenshot(path=str(args.out))  # the first screen: what a reader sees first
        finally:
            browser.close()
    print(f"wrote {args.out} ({args.width}x{args.height}, {args.page})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
