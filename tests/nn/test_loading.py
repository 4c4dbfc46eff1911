"""Building a model for a checkpoint: ``init.skipped()`` (nothing drawn, nothing filled) and
``load_state_dict(assign=True)`` (the arrays become the parameters, not copies of them)."""
import numpy as np
import pytest

import minitx
import minitx.nn as nn
from minitx.nn import init

from support import to_host


def test_inside_skipped_no_initialiser_fills_or_draws():
    minitx.manual_seed(3)
    with init.skipped():
        layer = nn.Linear(6, 4)
        w = minitx.tensor(np.full((3, 3), 7.0))
        init.normal_(w), init.xavier_uniform_(w), init.trunc_normal_(w), init.constant_(w, 1)
    assert not to_host(layer.weight.data).any() and (to_host(w.data) == 7.0).all()
    after = minitx.tensor(np.zeros((2, 2)))
    init.normal_(after)                       # the generator was not advanced by the block
    minitx.manual_seed(3)
    again = minitx.tensor(np.zeros((2, 2)))
    init.normal_(again)
    np.testing.assert_array_equal(to_host(after.data), to_host(again.data))


def test_skipped_ends_even_when_the_block_raises():
    with pytest.raises(RuntimeError), init.skipped():
        raise RuntimeError
    w = minitx.tensor(np.zeros((4, 4)))
    init.normal_(w)
    assert to_host(w.data).any()


def test_assign_makes_the_arrays_the_parameters():
    layer = nn.Linear(3, 2)
    state = {"weight": np.arange(6, dtype=np.float32).reshape(2, 3),
             "bias": np.ones(2, dtype=np.float64)}                  # another dtype: copied
    layer.load_state_dict(state, assign=True)
    if minitx.backend.get_array_module(layer.weight.data) is np:
        assert layer.weight.data is state["weight"]
    assert layer.bias.dtype == np.float32
    np.testing.assert_array_equal(to_host(layer.bias.data), [1.0, 1.0])
    frozen = np.zeros((2, 3), np.float32)
    frozen.flags.writeable = False                                  # read-only: copied
    layer.load_state_dict({"weight": frozen, "bias": np.zeros(2, np.float32)}, assign=True)
    assert layer.weight.data is not frozen
    layer.weight.data[0, 0] = 5.0                                   # and writable
    assert frozen[0, 0] == 0.0


def test_assign_checks_everything_first_and_changes_nothing_on_error():
    layer = nn.Linear(3, 2)
    before = to_host(layer.weight.data).copy()
    with pytest.raises(RuntimeError, match="nothing was changed"):
        layer.load_state_dict({"weight": np.zeros((2, 3), np.float32),
                               "bias": np.zeros(5, np.float32)}, assign=True)
    np.testing.assert_array_equal(to_host(layer.weight.data), before)
