"""Every test here compares a fast twin with its reference, so the fast layer is on for each
module here (whatever ``MINITX_FAST`` said at import); tests that need it off say so with
``minitx.using_config(fast=False)``."""
import pytest

import minitx


@pytest.fixture(scope="module", autouse=True)
def fast_layer_on():
    with minitx.using_config(fast=True):
        yield
