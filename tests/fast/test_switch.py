"""The one switch between the reference and the fast layer (``minitx/configuration.py``).

``minitx.config.fast``, ``minitx.using_config(fast=...)`` and ``MINITX_FAST`` (read at import)
choose; ``configuration.twin(name)`` is what every dispatch point asks, at call time. Checked
here: the values each accepts and refuses (with messages naming the setting, expected and
given), that a ``with`` block restores the setting even when it raises and leaves nothing
half-changed when refused, that the environment variable is honoured by a fresh interpreter
(and that the fast layer's host set-up is skipped with it off), and the twin table's rules.
"""
import os
import re
import subprocess
import sys

import pytest

import minitx
from minitx import configuration
from support import REPO


def test_the_object_is_minitx_config():
    assert minitx.config is configuration.config
    assert repr(minitx.config) == f"minitx.config(fast={minitx.config.fast})"


def test_using_config_restores_the_setting_after_the_block_and_after_an_error():
    before = minitx.config.fast
    with minitx.using_config(fast=not before) as cfg:
        assert cfg.fast is (not before)
    assert minitx.config.fast is before
    with pytest.raises(ZeroDivisionError):
        with minitx.using_config(fast=not before):
            1 / 0
    assert minitx.config.fast is before


@pytest.mark.parametrize("value", [0, 1, "yes", None, 1.0])
def test_a_value_that_is_not_a_bool_is_refused_naming_the_setting(value):
    before = minitx.config.fast
    with pytest.raises(ValueError, match=r"fast must be True or False, got"):
        with minitx.using_config(fast=value):
            pass                                              # pragma: no cover
    with pytest.raises(ValueError, match=r"minitx.config: fast must be True or False"):
        minitx.config.fast = value
    assert minitx.config.fast is before


def test_an_unknown_setting_is_refused_and_nothing_is_changed():
    before = minitx.config.fast
    with pytest.raises(AttributeError, match=r"no setting 'fastest' \(settings: fast\)"):
        with minitx.using_config(fast=not before, fastest=True):
            pass                                              # pragma: no cover
    assert minitx.config.fast is before
    with pytest.raises(AttributeError, match="no setting 'speed'"):
        minitx.config.speed = True


@pytest.mark.parametrize("text,expected", [("0", False), ("1", True), ("", True), (" 0 ", False)])
def test_the_environment_variable_values(text, expected):
    assert configuration.fast_from_env(text) is expected


@pytest.mark.parametrize("text", ["2", "false", "off", "no"])
def test_an_unknown_environment_value_is_refused_naming_the_variable(text):
    with pytest.raises(ValueError, match=rf"MINITX_FAST must be 0 .* or 1 .*, got '{text}'"):
        configuration.fast_from_env(text)


def _fresh(code, **env):
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND", "OPENBLAS_THREAD_TIMEOUT",
                           "MINITX_FAST")}, **env}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return done


def test_minitx_fast_0_at_import_turns_the_layer_off_and_skips_its_host_set_up():
    code = ("import os, minitx, minitx.functional as F; "
            "print(minitx.config.fast, os.environ.get('OPENBLAS_THREAD_TIMEOUT'), "
            "minitx.configuration.why_not_fast('sdpa') is not None)")
    assert _fresh(code, MINITX_FAST="0").stdout.split() == ["False", "None", "True"]
    assert _fresh(code).stdout.split() == ["True", "20", "False"]
    bad = _fresh(code, MINITX_FAST="fast")
    assert bad.returncode != 0 and "MINITX_FAST must be 0" in bad.stderr


def test_twin_reads_the_switch_at_every_call():
    fn = configuration.twins()["sdpa"]
    assert configuration.twin("sdpa") is (fn if minitx.config.fast else None)
    with minitx.using_config(fast=False):
        assert configuration.twin("sdpa") is None
    with minitx.using_config(fast=True):
        assert configuration.twin("sdpa") is fn
        assert configuration.twin("no such op") is None
        assert configuration.why_not_fast("no such op") == "'no such op' has no fast twin"


def test_without_twins_takes_one_out_and_puts_it_back():
    fn = configuration.twins()["row_max"]
    with minitx.using_config(fast=True):
        with configuration.without_twins("row_max"):
            assert configuration.twin("row_max") is None
            assert configuration.twin("sdpa") is not None
        assert configuration.twin("row_max") is fn
    with pytest.raises(KeyError, match="no fast twin named 'nope'"):
        with configuration.without_twins("row_max", "nope"):
            pass                                              # pragma: no cover
    assert configuration.twins()["row_max"] is fn


def test_a_second_twin_for_one_name_is_refused():
    with pytest.raises(ValueError, match="'sdpa' already has a fast twin"):
        configuration.register_twin("sdpa", lambda *a: None)
    fn = configuration.twins()["sdpa"]
    assert configuration.register_twin("sdpa", fn) is fn          # the same one again: fine


def test_every_twin_lives_in_the_fast_layer_and_names_its_reference():
    """Each registered twin is defined under minitx/fast/ and its docstring (or its module's)
    says which reference it stands in for."""
    for name, fn in configuration.twins().items():
        assert fn.__module__.startswith("minitx.fast."), (name, fn.__module__)
        doc = (fn.__doc__ or "") + (sys.modules[fn.__module__].__doc__ or "")
        assert "reference" in doc.lower() or "twin" in doc.lower(), name


def test_the_docs_twin_table_lists_exactly_the_registered_twins():
    """The table of twins in ``docs/architecture.md`` names every registered twin once in its
    first column, and nothing else: it is kept current as twins come and go."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("\n| twin |")
    rows = text[start:text.index("\n\n", start)].strip().splitlines()[2:]
    listed = [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]
    assert sorted(listed) == sorted(configuration.twins()), listed
    assert all(re.search(r"\d\.\d\d×", row.split("|")[-2]) for row in rows), rows
