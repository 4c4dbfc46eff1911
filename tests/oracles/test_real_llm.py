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
import copy
import json

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

# the real models' files, loaded twice (minitx and the oracle): the slow lane (setup.cfg)
pytestmark = pytest.mark.slow

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


# one group per model: each worker that takes a model's tests loads that model once
@pytest.fixture(scope="module", params=[pytest.param(name, marks=pytest.mark.xdist_group(
    f"real_llm_{name}")) for name in MODELS])
def pair(request):
    """(name, minitx float64 model, tokenizer, transformers float64 model); the float32
    models are built in the test that needs them. transformers is loaded once, in float32
    (the dequantized weights are float32 numbers), and widened exactly."""
    path = _path(request.param)
    model, tok = pt.load(path, dtype="float64")
    hf = _hf(path, torch.float32)
    request.module.HF32[request.param] = copy.deepcopy(hf)
    return request.param, model, tok, hf.double()


HF32 = {}


def _logits_hf(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def test_float32_logits_equal_transformers(pair):
    name, _, tok, _ = pair
    model, _ = pt.load(_path(name), dtype="float32", tokenizer=False)
    ids = tok.encode(PROMPTS[0] + " and the capital of Italy is Rome.")
    want = _logits_hf(HF32.pop(name), ids)
    got = model(Tensor(np.asarray([ids]))).numpy()[0]
    assert got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, f"{name}: max |Δ| / max |logit| = {err:.2e}"


def test_float64_logits_equal_transformers(pair):
    name, model, tok, hf = pair
    ids = tok.encode(PROMPTS[1] + "    if n < 2:\n        return n")
    want = _logits_hf(hf, ids)
    got = model(Tensor(np.asarray([ids]))).numpy()[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-5, f"{name}: max |Δ| / max |logit| = {err:.2e}"


def test_64_greedy_tokens_equal_transformers(pair):
    """The prompts as one batch, padded on the left (the mask says where), 64 greedy tokens
    each: one pass over the weights per step serves every prompt (Gemma 3's unembedding alone
    is 262,144 × 640 numbers)."""
    name, model, tok, hf = pair
    rows = [tok.encode(p) for p in PROMPTS]
    n = max(map(len, rows))
    ids = np.asarray([[0] * (n - len(r)) + r for r in rows])           # 0: any token id
    mask = np.asarray([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                           max_new_tokens=64, do_sample=False, pad_token_id=0)[:, n:]
    got = model.generate(Tensor(ids), 64, attention_mask=Tensor(mask)).numpy()[:, n:]
    assert want.shape == (len(PROMPTS), 64)
    for prompt, g, w in zip(PROMPTS, got.tolist(), want.tolist()):
        assert g == w, (name, prompt, tok.decode(g), tok.decode(w))


def test_the_known_continuations(pair):
    """The issue's two sentences: greedy " Paris." and " the capital of the country of
    France." — read off transformers, and now minitx's own text."""
    name, model, tok, _ = pair
    expected = {"smollm2": " Paris.", "gemma3": " the capital of the country of France."}
    out = generate_text(model, tok, PROMPTS[0], max_new_tokens=12)
    assert out.text.startswith(expected[name]), out.text


def test_a_chat_answer_stops_at_the_end_of_turn_as_transformers(pair):
    """The conversation through the model's own chat template, then ``chat_text``'s stopping
    rule against transformers' ``generate`` ending at the same end-of-turn id. The Gemma 3
    base model's file carries no chat template: it gets Gemma 3's own, from the instruction-
    tuned model's tokenizer_config.json (the npm tokenizer package)."""
    name, model, tok, hf = pair
    if name == "gemma3":
        folder = real.tokenizer_folder("gemma3")
        if folder is None:
            pytest.skip(f"needs Gemma 3's tokenizer files: {real.FETCH_COMMAND} "
                        "tokenizer:gemma3")
        config = json.loads((folder / "tokenizer_config.json").read_text("utf-8"))
        tok = copy.copy(tok)                     # the module's tokenizer keeps its own state
        tok.chat_template = config["chat_template"]
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
