"""The rules the site's proof boxes follow: a verdict rests on a count, never on a clock.

Growth is judged on counted floating-point operations and traced bytes against the limits the
*stated* complexity sets; a timing is drawn, fenced as measured, and judged by nothing; the
counter counts what it says; a variant's own identities are judged like every other number;
plots are log–log with readable units.
"""
import re

import numpy as np
import pytest

from support import need

need("markdown_it")

from minitx.attention import REGISTRY  # noqa: E402
from minitx.site import build as site_build  # noqa: E402
from minitx.site import proofs  # noqa: E402
from minitx.site.render import svg_plot  # noqa: E402


@pytest.mark.parametrize("text,power", [
    ("time O(B·H·N²·D), memory O(B·H·N²)", 2),
    ("time O(B·H·N·m·D), memory O(B·H·N·m); causal memory O(B·H·N·m·D)", 1),
    ("time O(B·H·N·(l + N/l)·D), memory O(B·H·N·(l + N/l)·D)", 2),     # a stride: N²/l
    ("time O(B·H·N·(l + N·c/l)·D), memory O(B·H·N·(l + N·c/l))", 2),
    ("time O(B·H·N²·D), memory O(B·H·(N·D + b_q·b_k))", 1),            # flash: time N², memory N
    ("time O(B·N·E·(log N + log E)), memory O(B·N·E)", 1),
])
def test_the_memory_power_is_read_from_the_stated_complexity(text, power):
    assert proofs.stated_memory_power(text) == power


@pytest.mark.parametrize("text,power", [
    ("time O(B·H·N²·D), memory O(B·H·N²)", 2),
    ("time O(B·H·N·m·D), memory O(B·H·N·m); causal memory O(B·H·N·m·D)", 1),
    ("time O(B·H·N·(l + N/l)·D), memory O(B·H·N·(l + N/l)·D)", 2),     # a stride: N²/l
    ("time O(B·H·N²·D), memory O(B·H·(N·D + b_q·b_k))", 2),            # flash: time N², memory N
    ("time O(B·H·N·(L + N)·D), memory O(B·H·N·L) (dense, mixture)", 2),
    ("time O(B·H·r·(N·c·D + N log N)), memory O(B·H·r·N·c)", 1),
    ("time O(B·H·(N·m·D + T·m³)), memory O(B·H·(N·m + m²))", 1),
    ("time O(B·N·E·(d_c + d'_c) + B·H·N²·(D + d_R)), memory O(B·H·N²)", 2),
])
def test_the_time_power_is_read_from_the_stated_complexity(text, power):
    assert proofs.stated_time_power(text) == power


def test_every_variant_states_a_memory_term_the_rule_can_read():
    for name, cls in REGISTRY.items():
        assert "memory" in cls.complexity or "O(" in cls.complexity, name
        assert proofs.MEMORY_LIMIT[proofs.stated_memory_power(cls.complexity)] in (1.4, 2.4)


def test_the_dense_variants_state_quadratic_time_and_the_sparse_ones_linear():
    # read from each docstring's stated complexity, not from the code's counts
    assert {n for n, c in REGISTRY.items() if proofs.stated_time_power(c.complexity) == 1} >= {
        "performer", "linformer", "linear", "local", "longformer", "bigbird", "nystrom",
        "reformer", "routing"}
    assert {n for n, c in REGISTRY.items() if proofs.stated_time_power(c.complexity) == 2} >= {
        "mha", "gqa", "mqa", "flash", "mla", "sigmoid", "strided", "fixed"}


def test_the_limits_separate_the_powers():
    # a linear claim admits at most 1.4, a quadratic one at most 2.4: neither admits the next
    assert proofs.MEMORY_LIMIT[1] < 2 and proofs.MEMORY_LIMIT[2] < 3


def test_every_number_in_a_box_shows_its_limit_or_the_word_illustrative():
    p = proofs.Proof("x", "X")
    p.report("float64 gradcheck", "pass")
    p.check("gradient error", 1e-9, 1e-6)
    p.report("time exponent", "1.93", measured=True)
    p.check("memory exponent", 1.02, 1.4, fmt="{:.2f}", measured=True)
    html = site_build._proof_html(p)
    for row in re.findall(r"<li>(.*?)</li>", html):
        value = re.search(r'<span class="value"><b>(.*?)</b>', row).group(1)
        if re.search(r"\d", value):
            assert re.search(r'class="limit[^"]*">(≤|≥|illustrative)', row), row
    assert 'illustrative</span>' in html and "1.93" in html


def test_a_slow_machine_cannot_fail_a_build_nor_print_a_time_exponent(monkeypatch):
    # a timing that grows like N⁴ (a loaded machine) is drawn, never judged nor fitted
    p = proofs.Proof("local", "LocalAttention")

    def fake_measure(run, sizes, repeats=3):
        return ([(n, (n / 64) ** 4) for n in sizes], [(n, 1000.0 * n) for n in sizes],
                [(n, 5000 * n) for n in sizes])
    monkeypatch.setattr(proofs, "_measure", fake_measure)
    proofs._growth(p, None, (64, 128, 256), power=1, time_power=1)
    assert not any(line[0].startswith("time") for line in p.lines)
    work = next(line for line in p.lines if line[0].startswith("work exponent"))
    assert work[1:4] == ("1.00", "≤ 1.40", True) and not work[4]     # a count: not fenced
    html = site_build._proof_html(p)
    fenced = "".join(re.findall(r"<!--measured-->(.*?)<!--/measured-->", html, re.S))
    assert 'aria-label="seconds against N"' in fenced
    assert 'aria-label="floating-point operations against N"' not in fenced
    assert "cannot show how the cost grows" in html


def _fake(memory_power, flops_power):
    return lambda run, sizes, repeats=3: ([(n, 1.0) for n in sizes],
                                          [(n, float(n) ** memory_power) for n in sizes],
                                          [(n, float(n) ** flops_power) for n in sizes])


def test_memory_that_grows_faster_than_stated_fails_the_build(monkeypatch):
    p = proofs.Proof("local", "LocalAttention")
    monkeypatch.setattr(proofs, "_measure", _fake(2, 1))
    with pytest.raises(proofs.ProofFailure, match="memory exponent"):
        proofs._growth(p, None, (64, 128, 256), power=1, time_power=1)


def test_work_that_grows_faster_than_stated_fails_the_build(monkeypatch):
    p = proofs.Proof("local", "LocalAttention")
    monkeypatch.setattr(proofs, "_measure", _fake(1, 2))
    with pytest.raises(proofs.ProofFailure, match="work exponent p .*stated time O\\(N\\)"):
        proofs._growth(p, None, (64, 128, 256), power=1, time_power=1)
    proofs._growth(proofs.Proof("mha", "X"), None, (64, 128, 256), power=1, time_power=2)


def test_counts_print_as_counts_and_errors_in_scientific_notation():
    p = proofs.Proof("mla", "X")
    p.check("cache numbers per token", 20.0, 64.0)
    p.check("error", 3e-16, 1e-12)
    p.check("error at a whole limit", 0.25, 2.0)
    assert p.lines[0][1:3] == ("20", "≤ 64")
    assert p.lines[1][1:3] == ("3.0e-16", "≤ 1.0e-12")
    assert p.lines[2][1:3] == ("2.5e-01", "≤ 2.0e+00")


def test_a_variants_identities_are_judged(monkeypatch):
    cls = REGISTRY["local"]
    monkeypatch.setattr(cls, "identities", classmethod(
        lambda c, seed=0: [("recurrent − parallel, max |Δ|", 1e-3, 1e-10)]), raising=False)
    monkeypatch.setattr(proofs, "_measure", _fake(1, 1))
    with pytest.raises(proofs.ProofFailure, match="recurrent − parallel"):
        proofs.variant_proof("local", proofs.Sizes.make(True), seed=0)


def test_plots_are_log_log_with_bytes_in_binary_units():
    svg = svg_plot({"peak traced memory": [(128, 3 * 2 ** 20), (1024, 24 * 2 ** 20)]}, "N",
                   "bytes", unit="B")
    assert "3 MiB" in svg and "24 MiB" in svg and "N (log–log)" in svg
    assert ">1024<" in svg                       # the last tick is written whole
    assert "3145728" not in svg                  # no raw byte counts
    assert "1.5 ms" in svg_plot({"t": [(64, 1.5e-3), (128, 3e-3)]}, "N", "s", unit="s")


def test_a_failed_gradcheck_fails_the_build_and_other_errors_rise_as_themselves(monkeypatch):
    import minitx
    from minitx.autograd.gradcheck import GradcheckError

    def wrong(*args, **kwargs):
        raise GradcheckError("input 0, element 3: analytic 1.0, numerical 2.0")
    monkeypatch.setattr(minitx, "gradcheck", wrong)
    with pytest.raises(proofs.ProofFailure, match="gradcheck failed: input 0"):
        proofs._gradient(proofs.Proof("x", "X"), lambda t: t * 2, [np.ones(3)])

    def broken(*args, **kwargs):
        raise KeyError("a bug, not a wrong gradient")
    monkeypatch.setattr(minitx, "gradcheck", broken)
    with pytest.raises(KeyError):
        proofs._gradient(proofs.Proof("x", "X"), lambda t: t * 2, [np.ones(3)])
