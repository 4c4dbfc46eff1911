"""Two real LLMs, text to text in minitx, against ``transformers`` loading the same GGUF
files (``from_pretrained(folder, gguf_file=name)``, which dequantizes them with the ``gguf``
package): SmolLM2-135M-Instruct (Llama architecture, Q4_1) and Gemma 3 270M (base, Q4_K_M).

- the logits of a prompt: float32 within 1e-4 of the largest logit, float64 within 1e-5;
- 64 greedy tokens for each of several prompts, identical (both in float64, so that a near
  tie cannot flip one argmax and not the other; the same ids enter both models);
- SmolLM2's chat template through ``generate_text``'s stopping rules: the answer ends at
  ``<|im_end|>``, as transformers' ``generate`` ends at its end-of-sequence id;
- ``pretrained.load`` returns the tokenizer with the model; ``tokenizer=False`` none.

The tokenizers and chat templates alone are ``test_hf_tokenizer.py``'s; the tensors
``test_gguf.py``'s.
"""
import numpy as np
import pytest

from support import need

import minitx.pretrained as pt
from minitx import Tensor
from minitx.pretrained import real
from minitx.pretrained.generation import chat_text, generate_text

torch = need("torch")
transformers = need("transformers")
need("gguf")

MODELS = {"smollm2": real.smollm2_gguf, "gemma3": real.gemma3_gguf}
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a",
           "1, 2, 3, 5, 8, 13,"]


def _path(name):
    path = MODELS[name]()
    if path is None:
        pytest.skip(f"needs {name}'s GGUF file: {real.FETCH_COMMAND}")
    return path


def _hf(path, dtype):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=dtype)
    model.generation_config.eos_token_id = None        # 64 tokens, whatever they are
    return model.eval()


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request):
    """(name, minitx float64 model, tokenizer, transformers float64 model)."""
    path = _path(request.param)
    model, tok = pt.load(path, dtype="float64")
    return request.param, model, tok, _hf(path, torch.float64)


def _logits_hf(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.xdist_group("real_llm")
@pytest.mark.parametrize("name", list(MODELS))
def test_float32_logits_equal_transformers(name):
    path = _path(name)
    model, tok = pt.load(path, dtype="float32")
    ids = tok.encode(PROMPTS[0] + " and the capital of Italy is Rome.")
    hf = _hf(path, torch.float32)
    want = _logits_hf(hf, ids)
    got = model(Tensor(np.asarray([ids]))).numpy()[0]
    assert got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, f"{name}: max |Δ| / max |logit| = {err:.2e}"


@pytest.mark.xdist_group("real_llm")
def test_float64_logits_equal_transformers(pair):
    name, model, tok, hf = pair
    ids = tok.encode(PROMPTS[1] + "    if n < 2:\n        return n")
    want = _logits_hf(hf, ids)
    got = model(Tensor(np.asarray([ids]))).numpy()[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-5, f"{name}: max |Δ| / max |logit| = {err:.2e}"


@pytest.mark.xdist_group("real_llm")
def test_64_greedy_tokens_equal_transformers(pair):
    name, model, tok, hf = pair
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=64,
                               do_sample=False)[0, len(ids):].tolist()
        got = model.generate(Tensor(np.asarray([ids])), 64).numpy()[0, len(ids):].tolist()
        assert len(want) == 64 and got == want, (name, prompt, tok.decode(got),
                                                 tok.decode(want))


@pytest.mark.xdist_group("real_llm")
def test_the_known_continuations(pair):
    """The issue's two sentences: greedy " Paris." and " the capital of the country of
    France." — read off transformers, and now minitx's own text."""
    name, model, tok, _ = pair
    expected = {"smollm2": " Paris.", "gemma3": " the capital of the country of France."}
    out = generate_text(model, tok, PROMPTS[0], max_new_tokens=12)
    assert out.text.startswith(expected[name]), out.text


@pytest.mark.xdist_group("real_llm")
def test_a_chat_answer_stops_at_the_end_of_turn_as_transformers(pair):
    """The conversation through the model's own chat template, then ``chat_text``'s stopping
    rule against transformers' ``generate`` ending at the same end-of-turn id."""
    name, model, tok, hf = pair
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    end = tok.convert_tokens_to_ids({"smollm2": "<|im_end|>",
                                     "gemma3": "<end_of_turn>"}[name])
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                           eos_token_id=end)[0, len(ids):].tolist()
    out = chat_text(model, tok, messages, max_new_tokens=48)
    assert out.ids == want, (out.text, tok.decode(want))
    if want[-1] == end:
        assert out.stopped == "end" and out.text == tok.decode(want[:-1])
    else:
        assert out.stopped == "length" and len(want) == 48
    if name == "smollm2":                # the instruction-tuned one answers, and ends its turn
        assert out.stopped == "end" and "Paris" in out.text


def test_load_returns_the_tokenizer_and_tokenizer_false_none():
    path = _path("smollm2")
    model, tok = pt.load(path, tokenizer=False)
    assert tok is None and model.config.num_layers == 30
    tok = pt.load_tokenizer(path)
    assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!"
