"""Generation as a user expects it: temperature, top-k, top-p (nucleus) and a seed; stopping at
end-of-text or end-of-turn ids; streaming through a callback that can also stop it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
from minitx.models import Decoder, DecoderConfig
from minitx.models.gpt import sample_next
from minitx.validate import OptionError


def _nucleus(p, top_p):
    """The reference: sort descending, keep the shortest prefix whose mass reaches top_p."""
    order = np.argsort(-p, kind="stable")
    mass, kept = 0.0, set()
    for i in order:
        if mass >= top_p:
            break
        kept.add(int(i))
        mass += p[i]
    return kept


@settings(max_examples=40, deadline=None)
@given(v=st.integers(2, 40), seed=st.integers(0, 2 ** 31 - 1),
       top_p=st.floats(0.05, 1.0), temperature=st.floats(0.3, 3.0))
def test_top_p_samples_only_inside_the_nucleus(v, seed, top_p, temperature):
    g = np.random.default_rng(seed)
    logits = g.standard_normal((1, v)) * 3
    z = logits[0] / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    allowed = _nucleus(p, top_p)
    draws = {int(sample_next(logits, temperature, top_p=top_p,
                             generator=np.random.default_rng(seed + k))[0, 0])
             for k in range(60)}
    assert draws <= allowed, (draws - allowed, sorted(allowed))


def test_top_p_keeps_the_nucleus_probabilities_in_proportion():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    g = np.random.default_rng(0)
    counts = np.bincount([int(sample_next(logits, 1.0, top_p=0.7, generator=g)[0, 0])
                          for _ in range(4000)], minlength=4)
    # the nucleus is {0, 1} (0.5 < 0.7 ≤ 0.8): 5/8 and 3/8 of the draws, within 4 sigma
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / 4000 - 0.625) < 4 * np.sqrt(0.625 * 0.375 / 4000)


def test_bad_sampling_options_are_refused_by_name():
    logits = np.zeros((1, 5))
    for kwargs, word in (({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                         ({"top_k": 0}, "top_k"), ({"temperature": -1.0}, "temperature")):
        with pytest.raises((OptionError, ValueError, TypeError), match=word):
            sample_next(logits, **{"temperature": 1.0, **kwargs})


def _model(seed=0):
    minitx.manual_seed(seed)
    return Decoder(DecoderConfig(vocab_size=23, hidden_size=16, num_layers=2, num_heads=2,
                                 ffn_hidden=32)).eval()


def test_a_seed_gives_the_same_tokens_and_another_seed_others():
    model, prompt = _model(), minitx.tensor([[1, 2, 3]])
    a = model.generate(prompt, 12, temperature=1.0, top_k=10, top_p=0.9, seed=7).numpy()
    minitx.manual_seed(123)                                  # the global generator is not used
    b = model.generate(prompt, 12, temperature=1.0, top_k=10, top_p=0.9, seed=7).numpy()
    c = model.generate(prompt, 12, temperature=1.0, top_k=10, top_p=0.9, seed=8).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_generation_stops_at_an_end_id_and_pads_stopped_rows():
    model, prompt = _model(), minitx.tensor([[1, 2, 3], [4, 5, 6]])
    free = model.generate(prompt, 10).numpy()                # greedy, no stop
    stop = int(free[0, 5])                                   # the 3rd new token of row 0
    out = model.generate(prompt, 10, eos_token_id=[stop]).numpy()
    row0 = out[0, 3:]
    first = int(np.flatnonzero(row0 == stop)[0])
    assert (row0[first:] == stop).all()                      # kept, then padded with it
    np.testing.assert_array_equal(row0[:first], free[0, 3:3 + first])
    ended = [np.flatnonzero(r[3:] == stop) for r in out]
    if all(len(e) for e in ended):                           # every row stopped: no extra step
        assert out.shape[1] == 3 + max(int(e[0]) for e in ended) + 1
    else:
        assert out.shape[1] == 3 + 10


def test_on_token_streams_each_step_and_can_stop_the_generation():
    model, prompt = _model(), minitx.tensor([[1, 2, 3]])
    seen = []

    def on_token(step, ids):
        seen.append(int(ids[0]))
        if step == 3:
            raise StopIteration                              # e.g. a stop string was found
    out = model.generate(prompt, 10, on_token=on_token).numpy()
    assert out.shape == (1, 3 + 4) and seen == out[0, 3:].tolist()


def test_greedy_is_unchanged_by_the_new_options():
    model, prompt = _model(), minitx.tensor([[1, 2, 3]])
    a = model.generate(prompt, 8).numpy()
    b = model.generate(prompt, 8, top_p=0.5, seed=1).numpy()         # temperature 0: argmax
    np.testing.assert_array_equal(a, b)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 9), k=st.integers(1, 9), cached=st.booleans())
def test_logits_to_keep_are_the_last_positions_of_the_full_logits(n, k, cached):
    minitx.manual_seed(1)
    model = Decoder(DecoderConfig(vocab_size=23, hidden_size=16, num_layers=2, num_heads=2,
                                  max_position=32, positions="rope")).eval()
    model.to(dtype="float64")
    ids = minitx.tensor(np.random.default_rng(n).integers(0, 23, (2, n)))
    with minitx.no_grad():
        full = model(ids, kv_caches=model.new_caches() if cached else None).numpy()
        last = model(ids, kv_caches=model.new_caches() if cached else None,
                     logits_to_keep=k).numpy()
    # equal to rounding: BLAS may block a product of fewer rows differently
    np.testing.assert_allclose(last, full[:, -min(k, n):], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, logits_to_keep=-1)
