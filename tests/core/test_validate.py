"""``minitx.validate``: the one set of option checks (every layer's errors go through it)."""
import math

import numpy as np
import pytest

from minitx import validate
from minitx.validate import OptionError


def test_an_option_error_is_both_a_value_error_and_a_type_error():
    assert issubclass(OptionError, ValueError) and issubclass(OptionError, TypeError)
    with pytest.raises(OptionError, match=r"^local: window must be a positive int, got 0$"):
        validate.positive_int(0, "window", owner="local")


@pytest.mark.parametrize("value", [True, False, 1.0, "3", None, [3]])
def test_integers_refuse_bool_float_and_text(value):
    with pytest.raises(OptionError, match="must be"):
        validate.integer(value, "n")


def test_integers_keep_numpy_ints_as_python_ints_and_check_both_bounds():
    v = validate.integer(np.int64(5), "n", minimum=1, maximum=5)
    assert v == 5 and type(v) is int
    with pytest.raises(OptionError, match=r"n must be an int >= 1 and <= 5, got 6"):
        validate.integer(6, "n", minimum=1, maximum=5)
    assert validate.nonnegative_int(0, "w") == 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1.0", None])
def test_positive_reals_refuse_nan_inf_bool_and_text(value):
    with pytest.raises(OptionError, match="scale must be a positive finite number"):
        validate.positive_real(value, "scale")


def test_real_bounds_open_and_closed():
    assert validate.real(0.0, "x", minimum=0.0) == 0.0
    with pytest.raises(OptionError, match=r"x must be a finite number > 0.0"):
        validate.real(0.0, "x", minimum=0.0, min_open=True)
    assert validate.real(math.inf, "x", finite=False) == math.inf
    assert validate.nonnegative_real(np.float32(0.5), "eps") == 0.5


def test_probabilities():
    assert validate.probability(0.0, "p") == 0.0
    with pytest.raises(OptionError, match=r"p must be a probability in \[0, 1\), got 1"):
        validate.probability(1, "p")
    assert validate.probability(1.0, "p", allow_one=True) == 1.0


def test_choices_booleans_and_int_tuples():
    assert validate.choice("elu", "feature_map", ("elu", "relu")) == "elu"
    with pytest.raises(OptionError, match=r"one of \('elu', 'relu'\), got 'gelu'"):
        validate.choice("gelu", "feature_map", ("elu", "relu"))
    with pytest.raises(OptionError):
        validate.choice(True, "mode", (0, 1))            # True == 1, but it is not an option
    assert validate.boolean(np.bool_(True), "causal") is True
    with pytest.raises(OptionError, match="causal must be True or False, got 'yes'"):
        validate.boolean("yes", "causal")
    assert validate.int_tuple([0, np.int32(-1)], "global_tokens") == (0, -1)
    with pytest.raises(OptionError, match=r"global_tokens\[1\] must be an int"):
        validate.int_tuple((0, "a"), "global_tokens")
    with pytest.raises(OptionError, match="global_tokens must be a tuple of ints"):
        validate.int_tuple("01", "global_tokens")
