"""The quick site, built once per test session and shared by ``test_site.py`` and
``test_site_browser.py`` (through the command line, as a user builds it)."""
from minitx.cli import main

_BUILT = {}


def quick_site(tmp_path_factory, notebook_cache, seed=0) -> str:
    """The folder of the quick site built with ``seed`` (built on first use)."""
    if seed not in _BUILT:
        out = tmp_path_factory.mktemp(f"site-seed{seed}")
        assert main(["site", "--out", str(out), "--quick", "--seed", str(seed), "--cache",
                     str(notebook_cache)]) == 0
        _BUILT[seed] = str(out)
    return _BUILT[seed]
