"""The reading site as a reader sees it: every page loaded in headless Chromium, network off.

Checks: no request leaves the site, zero maths errors (MathML ``<merror>``), no console
errors; at 1280 px notes and code sit side by side, at 390 px (a phone) they stack and the page
does not scroll sideways (long code lines scroll inside their own box); at both widths nothing
in the notes overflows without a scroll affordance (a scrolling box with a visible scrollbar).
The course, as the index shows it: its first page is about attention, and no chapter before
the appendices is over its line budget. Every number in a proof box has a limit or is labelled
illustrative. With ``MINITX_SITE_SCREENSHOT=path`` it saves a screenshot of the Performer page
there.

Needs Playwright's Python package and a Chromium (Debian's ``chromium``); without them the
test skips, naming what is missing.
"""
import glob
import os
import shutil

import pytest

from support import need

STRICT_CUPY = os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy"

pytestmark = [pytest.mark.skipif(STRICT_CUPY, reason="the site is built on NumPy; the NumPy "
                                                     "pass builds it"),
              # one pytest-xdist worker runs the site and notebook tests, so the session's quick
              # site is built once and each notebook executes once (tests/conftest.py)
              pytest.mark.xdist_group("site")]

CHROMIUM = os.environ.get("MINITX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

for _module in ("markdown_it", "mdit_py_plugins", "pygments", "latex2mathml"):
    need(_module)
sync_api = need("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"chromium missing (looked for {CHROMIUM}): apt-get install -y chromium",
                allow_module_level=True)

from site_support import quick_site  # noqa: E402
from support import REPO  # noqa: E402

# Elements of the notes (a source page's left column, a doc page, a notebook's Markdown) that
# are wider than their box must scroll, with a visible scrollbar; nothing may stick out of the
# column unless a scrolling box around it holds it.
OVERFLOW = """() => {
  const bad = [];
  const scrolls = (cs) => cs.overflowX === 'auto' || cs.overflowX === 'scroll';
  for (const col of document.querySelectorAll('.prose, article.doc, .nb-md')) {
    const edge = col.getBoundingClientRect().right;
    for (const el of col.querySelectorAll('*')) {
      const cs = getComputedStyle(el);
      const what = el.tagName.toLowerCase() + (el.className && el.className.baseVal === undefined
                   ? '.' + el.className : '');
      if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
        if (!scrolls(cs) && cs.overflowX !== 'visible') bad.push(what + ': clipped');
        else if (scrolls(cs) && cs.scrollbarWidth === 'none') bad.push(what + ': no scrollbar');
      }
      if (el.getBoundingClientRect().right > edge + 1 && cs.position !== 'absolute') {
        let a = el.parentElement, held = false;
        while (a && a !== col && !held) { held = scrolls(getComputedStyle(a)); a = a.parentElement; }
        if (!held) bad.push(what + ': sticks out of the notes by ' +
                            Math.round(el.getBoundingClientRect().right - edge) + ' px');
      }
    }
  }
  return bad.slice(0, 5);
}"""

# the side-by-side check is made on the first section with both notes and code
PAIR = """() => {
  for (const sec of document.querySelectorAll('section.sec')) {
    const p = sec.querySelector('.prose'), c = sec.querySelector('.code pre');
    if (p && c && p.innerText.trim() && c.innerText.trim()) {
      const a = p.getBoundingClientRect(), b = c.getBoundingClientRect();
      return [a.left, a.right, a.top, a.bottom, b.left, b.right, b.top, b.bottom];
    }
  }
  return null;
}"""


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _context(browser, width, outside, height=900):
    ctx = browser.new_context(viewport={"width": width, "height": height})

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()
    ctx.route("**/*", route)
    return ctx


def test_every_page_reads_well_at_1280_and_390_px_offline(browser, tmp_path_factory,
                                                          notebook_cache):
    site = quick_site(tmp_path_factory, notebook_cache)
    pages = sorted(glob.glob(os.path.join(site, "*.html")))
    assert len(pages) > 60
    outside, problems = [], []
    for width in (1280, 390):
        ctx = _context(browser, width, outside)
        tab = ctx.new_page()
        errors = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        for path in pages:
            name = os.path.basename(path)
            errors.clear()
            tab.goto("file://" + path, wait_until="load")
            merror = tab.evaluate("document.querySelectorAll('merror').length")
            if merror:
                problems.append(f"{name}: {merror} maths errors")
            if errors:
                problems.append(f"{name} @ {width}px: console errors {errors[:3]}")
            pair = tab.evaluate(PAIR)
            if width == 1280 and pair:
                pl, pr, pt, _, cl, _, ct, _ = pair
                if not (pr <= cl + 1 and abs(pt - ct) < 40):
                    problems.append(f"{name}: notes and code not side by side at 1280 px {pair}")
            spill = tab.evaluate(OVERFLOW)
            if spill:
                problems.append(f"{name} @ {width}px: {spill}")
            if width == 390:
                if pair:
                    _, _, _, pb, _, _, ct, _ = pair
                    if not pb <= ct + 1:
                        problems.append(f"{name}: notes and code not stacked at 390 px {pair}")
                scroll = tab.evaluate("document.documentElement.scrollWidth")
                if scroll > 390:
                    problems.append(f"{name}: scrollWidth {scroll} > 390 at 390 px")
        ctx.close()
    assert not outside, f"requests outside the site: {sorted(set(outside))[:10]}"
    assert not problems, "\n".join(problems[:30])


def test_the_math_is_drawn_as_mathml(browser, tmp_path_factory, notebook_cache):
    """Chromium lays MathML out: a rendered fraction is taller than one line of text."""
    site = quick_site(tmp_path_factory, notebook_cache)
    path = tmp_path_factory.mktemp("mathml") / "probe.html"
    from minitx.site.render import Renderer
    path.write_text("<!DOCTYPE html><meta charset='utf-8'><link rel='stylesheet' href='"
                    + os.path.join(site, "style.css") + "'>"
                    + Renderer("probe")(r"$$\frac{e^{x_i}}{\sum_j e^{x_j}}$$"), encoding="utf-8")
    ctx = _context(browser, 800, [])
    tab = ctx.new_page()
    tab.goto("file://" + str(path))
    height = tab.evaluate("document.querySelector('mfrac').getBoundingClientRect().height")
    line = tab.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
    ctx.close()
    assert height > 1.5 * line


def test_screenshot_of_a_variant_page(browser, tmp_path_factory, notebook_cache):
    target = os.environ.get("MINITX_SITE_SCREENSHOT")
    if not target:
        pytest.skip("set MINITX_SITE_SCREENSHOT=path to save a screenshot of the Performer page")
    site = quick_site(tmp_path_factory, notebook_cache)
    outside = []
    ctx = _context(browser, 1280, outside, height=1100)
    tab = ctx.new_page()
    tab.goto("file://" + os.path.join(site, "minitx.attention.performer.html#PerformerAttention"))
    tab.screenshot(path=target)
    ctx.close()
    assert not outside and os.path.getsize(target) > 10_000


def _lines(path):
    with open(os.path.join(str(REPO), path), encoding="utf-8") as fh:
        return sum(1 for _ in fh)


def test_the_course_as_the_index_shows_it(browser, tmp_path_factory, notebook_cache):
    """The first page is about attention; no chapter before the appendices is over its line
    budget (the whole files it lists, notes included: 800 for the engine, 1,500 for the
    rest)."""
    from minitx.site.build import CHAPTER_BUDGET, ENGINE_BUDGET
    site = quick_site(tmp_path_factory, notebook_cache)
    ctx = _context(browser, 1280, [])
    tab = ctx.new_page()
    tab.goto("file://" + os.path.join(site, "index.html"))
    chapters = tab.evaluate("""() => [...document.querySelectorAll('ol.course > li.chapter')]
        .map(li => [li.querySelector('h2').innerText,
                    [...li.querySelectorAll('ol > li > a')].map(a => a.innerText)])""")
    appendices = tab.evaluate("[...document.querySelectorAll('section.appendix h2')]"
                              ".map(h => h.innerText)")
    tab.click("ol.course a")                                 # the course's first page
    first_heading = tab.evaluate("document.querySelector('main h1, main h2').innerText")
    first_url = tab.url
    ctx.close()
    assert chapters and appendices and all(a.startswith("Appendix: ") for a in appendices)
    title, files = chapters[0]
    assert "attention" in title.lower() and "attention" in first_heading.lower(), (
        title, first_heading)
    assert first_url.endswith("notebooks.01_attention_by_hand.html")
    over = []
    for title, files in chapters:
        budget = ENGINE_BUDGET if "engine" in title.lower() else CHAPTER_BUDGET
        lines = sum(_lines(f) for f in files)
        if lines > budget:
            over.append(f"{title}: {lines} lines > {budget}")
    assert not over, "\n".join(over)


def test_every_proof_number_has_a_limit_or_says_it_is_illustrative(browser, tmp_path_factory,
                                                                   notebook_cache):
    site = quick_site(tmp_path_factory, notebook_cache)
    ctx = _context(browser, 1280, [])
    tab = ctx.new_page()
    bare = []
    for path in sorted(glob.glob(os.path.join(site, "*.html"))):
        if 'class="claims"' not in open(path, encoding="utf-8").read():
            continue
        tab.goto("file://" + path)
        bare += tab.evaluate("""(page) => [...document.querySelectorAll('.claims li')]
            .filter(li => !li.querySelector('.limit') && !/illustrative/i.test(li.innerText))
            .map(li => page + ': ' + li.innerText.replace(/\\s+/g, ' '))""",
                             os.path.basename(path))
    ctx.close()
    assert not bare, f"{len(bare)} proof numbers with no limit and no label:\n" + "\n".join(
        bare[:20])
