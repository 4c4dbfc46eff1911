"""Every registered attention variant documents itself: what it is, formula, shapes, options,
cost, exactness and source — and carries a short ``complexity`` string for the tour.

The class docstring's template, section by section: ``Formula:`` points to the formula in
the module docstring (stated once, there, as LaTeX) and adds what the class fixes (which
option is which symbol); ``Shapes:``, ``Options:``, ``Complexity: {complexity}``,
``Exactness:``, ``Reference:`` (authors, year, title) carry the API facts."""
import re

import pytest

from minitx.attention import REGISTRY

NAMES = sorted(REGISTRY)
YEAR = re.compile(r"\b(199\d|20[0-2]\d|2030)\b")
SECTIONS = ("Formula", "Shapes", "Options", "Complexity", "Exactness", "Reference")


@pytest.mark.parametrize("name", NAMES)
def test_class_docstring_is_complete(name):
    doc = REGISTRY[name].__doc__ or ""          # a class's own docstring (not inherited)
    assert "Formula" in doc and "Shapes" in doc, name
    assert "module docstring" in doc[doc.find("Formula:"):doc.find("Shapes:")], name
    assert "Complexity" in doc or "Time" in doc, name
    assert any(w in doc for w in ("Exact", "exact", "approximate", "score function",
                                  "learned")), name
    assert any(YEAR.search(line) for line in doc.splitlines() if "Reference" in line), name
    where = [doc.find(s + ":") for s in SECTIONS]
    assert -1 not in where and where == sorted(where), (name, dict(zip(SECTIONS, where)))


@pytest.mark.parametrize("name", NAMES)
def test_complexity_attribute(name):
    c = vars(REGISTRY[name]).get("complexity")  # set on the class itself, not inherited
    assert isinstance(c, str) and c.startswith(("time O(", "O(")), (name, c)


@pytest.mark.parametrize("name", NAMES)
def test_the_docstring_shows_the_complexity_attribute_once(name):
    """One source: the class writes ``Complexity: {complexity}`` and ``register`` shows the
    attribute there, so the two can never disagree."""
    cls = REGISTRY[name]
    assert cls.__doc__.count(cls.complexity) == 1 and "{complexity}" not in cls.__doc__, name
