"""The host's settings for speed (``minitx/fast/host.py``): OpenBLAS's idle-thread timeout, set
when minitx is imported before NumPy with the fast layer on, and the caching allocator that the
programs ask for. Each case runs in a fresh interpreter: both act once per process."""
import os
import platform
import subprocess
import sys

import pytest

from minitx import backend


def _python(code, **env_changes):
    """stdout of ``code`` in a fresh interpreter on the NumPy backend, with the test process's
    environment less OPENBLAS_THREAD_TIMEOUT (conftest sets it) and the MINITX_* switches,
    plus ``env_changes``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "MINITX_FAST", "MINITX_MALLOC_TUNING",
                        "MINITX_TEST_BACKEND")}
    env["MINITX_BACKEND"] = "numpy"                      # no CuPy stand-in there
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.parametrize("given,first,fast,expected", [
    (None, "minitx", "1", "20"),     # minitx first: OpenBLAS idle threads sleep after ~0.4 ms
    (None, "minitx", None, "20"),    # (the fast layer is on by default)
    ("9", "minitx", "1", "9"),       # a value the user set is kept
    (None, "numpy", "1", None),      # NumPy (so OpenBLAS) already loaded: too late, untouched
    (None, "minitx", "0", None),     # the fast layer off: nothing is set
    ("9", "minitx", "0", "9"),
])
def test_openblas_thread_timeout_is_set_only_by_the_fast_layer_before_numpy_loads(
        given, first, fast, expected):
    env = {}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    if fast is not None:
        env["MINITX_FAST"] = fast
    code = (f"import {first}, minitx, os; "
            "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), minitx.config.fast)")
    value, on = _python(code, **env).split()
    assert value == str(expected) and on == str(fast != "0")


GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("env,switch,expected", [
    ({}, None, GLIBC),                              # applied where glibc's mallopt exists
    ({"MINITX_MALLOC_TUNING": "0"}, None, False),   # turned off by the user
    ({"MINITX_FAST": "0"}, None, False),            # the fast layer off
    ({}, False, False),                             # ... or switched off in the program
])
def test_tune_host_allocator_is_applied_only_with_the_fast_layer_on(env, switch, expected):
    code = "import minitx\n"
    if switch is not None:
        code += f"minitx.config.fast = {switch}\n"
    code += "print(minitx.fast.host.tune_host_allocator())"
    assert _python(code, **env) == str(expected)


def test_the_backend_no_longer_tunes_the_host():
    """The allocator is the fast layer's business: the backend has no copy of it."""
    assert not hasattr(backend, "tune_host_allocator")
    assert "tune_host_allocator" not in backend.__all__
