"""Look at the built documentation site in a real browser: serve ``site/`` on 127.0.0.1, open pages in headless
Chromium (Debian's ``chromium``), screenshot them, and check what a reader would see: every figure of each page
loads, code blocks are highlighted, and the site's search index holds ``DPSCallback``'s API entry.

    make docs && python scripts/site_screenshots.py --out runs/site_screenshots

Exit status 1 when a check fails (each failure printed); the PNGs are written either way. Not run by the suite
(it needs Chromium, which ``pip`` does not install: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: (name, path under the site, what must be on the rendered page)
PAGES = [
    ("home", "", "lit_rlft"),
    ("guide", "guides/study/", "Which strategy pays on my data?"),
    ("results", "results/real-models/", "Real models"),
    ("api", "api/callbacks/", "DPSCallback"),
]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _chromium(browser: str, *args: str, timeout: float = 120) -> str:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
               "--virtual-time-budget=8000", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return proc.stdout


def check(site: Path, out: Path, browser: str) -> list[str]:
    """Screenshots into ``out``; the problems found, in words."""
    out.mkdir(parents=True, exist_ok=True)
    server, base = _serve(site)
    problems = []
    try:
        for name, path, expected in PAGES:
            url = base + path
            png = out / f"{name}.png"
            _chromium(browser, f"--screenshot={png}", "--window-size=1280,1600", url)
            if not png.exists() or png.stat().st_size < 10_000:
                problems.append(f"{name}: no screenshot of {url}")
            dom = _chromium(browser, "--dump-dom", url)
            if expected not in dom:
                problems.append(f"{name}: {expected!r} is not on the rendered {url}")
            for src in re.findall(r'<img[^>]+src="([^"]+)"', dom):
                target = urllib.parse.urljoin(url, src)
                try:
                    with urllib.request.urlopen(target, timeout=10) as r:
                        if r.status != 200 or int(r.headers.get("Content-Length", "1")) == 0:
                            problems.append(f"{name}: figure {src} does not load")
                except OSError as e:
                    problems.append(f"{name}: figure {src} does not load ({e})")
            if "<pre" in dom and 'class="highlight' not in dom:
                problems.append(f"{name}: code blocks are not highlighted")
        # The search: the index the site's search reads holds DPSCallback on its API page (headless Chromium's
        # --dump-dom returns before the search worker has built its index, so the results list is not checked in
        # the browser; the screenshot shows the query typed into the search box).
        with urllib.request.urlopen(base + "search/search_index.json", timeout=10) as r:
            docs = json.loads(r.read())["docs"]
        if not any("DPSCallback" in d.get("title", "") and d["location"].startswith("api/") for d in docs):
            problems.append("search: the index has no API entry titled DPSCallback")
        _chromium(browser, f"--screenshot={out / 'search.png'}", "--window-size=1280,900", base + "?q=DPSCallback")
    finally:
        server.shutdown()
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", type=Path, default=REPO / "site", help="the built site (make docs)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "site_screenshots", help="where the PNGs go")
    p.add_argument("--browser", default=shutil.which("chromium") or "chromium", help="the Chromium executable")
    a = p.parse_args(argv)
    if not (a.site / "index.html").exists():
        p.error(f"{a.site}: no built site (make docs)")
    if not shutil.which(a.browser):
        p.error(f"{a.browser}: not found (apt-get install chromium)")
    problems = check(a.site, a.out, a.browser)
    for line in problems:
        print(line, file=sys.stderr)
    print(f"{len(PAGES) + 1} screenshots in {a.out}; " + ("all checks passed" if not problems
                                                         else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
