"""Text in, text out: ``generation.generate_text`` / ``chat_text`` and the ``generate`` and
``chat`` commands.

The stopping rules are checked on a scripted model (its ``generate`` replays fixed ids through
``on_token`` as ``Decoder.generate`` does), so each rule is met exactly when the test says; a
tiny random Decoder checks the seed; the real SmolLM2, when installed, the commands as a
person types them.
"""
import subprocess
import sys

import numpy as np
import pytest

import minitx
from minitx import chat, cli
from minitx.models import Decoder, DecoderConfig
from minitx.pretrained import real
from minitx.pretrained.bpe import bytes_to_unicode
from minitx.pretrained.generation import chat_text, end_ids, generate_text
from minitx.pretrained.hf_tokenizer import Tokenizer

from support import REPO, need


def _tokenizer():
    """Byte-level: one token per byte, and <|endoftext|> / <|im_end|> as special tokens."""
    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    added = [{"id": 256 + i, "content": t, "special": True, "normalized": False,
              "lstrip": False, "rstrip": False, "single_word": False}
             for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    spec = {"added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "use_regex": False},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return Tokenizer(spec, {"eos_token": "<|endoftext|>", "chat_template": template})


class Scripted:
    """A stand-in model whose ``generate`` yields ``script``, honouring ``on_token``'s
    StopIteration and the end ids, as ``Decoder.generate`` does; ``interrupt_at`` raises
    KeyboardInterrupt (Ctrl-C) before that step."""

    def __init__(self, script, interrupt_at=None):
        self.script, self.interrupt_at, self.seen = list(script), interrupt_at, None

    def generate(self, idx, n, eos_token_id=None, on_token=None, **sampling):
        self.seen = (idx.numpy().tolist(), n, eos_token_id, sampling)
        for step, t in enumerate(self.script[:n]):
            if step == self.interrupt_at:
                raise KeyboardInterrupt
            try:
                on_token(step, np.array([t]))
            except StopIteration:
                break
            if eos_token_id and t in eos_token_id:
                break


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_the_text_streams_in_pieces_that_add_up_and_ends_at_the_end_token():
    tok = _tokenizer()
    script = _ids(tok, "héllo wörld ✨") + [tok.vocab["<|im_end|>"]] + _ids(tok, "more")
    pieces = []
    out = generate_text(Scripted(script), tok, "Say:", stream=pieces.append)
    assert out.stopped == "end" and out.text == "héllo wörld ✨"
    assert "".join(pieces) == out.text
    assert all("\ufffd" not in p for p in pieces)     # no half character is ever shown
    assert out.ids == script[:len(out.ids)] and out.ids[-1] == tok.vocab["<|im_end|>"]
    assert set(end_ids(tok)) == {tok.vocab["<|endoftext|>"], tok.vocab["<|im_end|>"]}


def test_a_stop_string_cuts_the_text_before_it():
    tok = _tokenizer()
    pieces = []
    out = generate_text(Scripted(_ids(tok, "one two\nUser: three")), tok, "x",
                        stop=["\nUser:"], stream=pieces.append)
    assert out.stopped == "stop string" and out.text == "one two"
    assert "".join(pieces) == "one two"


def test_max_new_tokens_and_the_sampling_options_reach_the_model():
    tok = _tokenizer()
    model = Scripted(_ids(tok, "abcdefgh"))
    out = generate_text(model, tok, "hi", max_new_tokens=3, temperature=0.7, top_k=5,
                        top_p=0.9, seed=11)
    assert out.stopped == "length" and out.text == "abc" and out.prompt_tokens == 2
    prompt, n, ends, sampling = model.seen
    assert prompt == [_ids(tok, "hi")] and n == 3 and set(ends) == set(end_ids(tok))
    assert sampling == {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 11}


def test_ctrl_c_ends_the_answer_with_the_text_so_far():
    tok = _tokenizer()
    out = generate_text(Scripted(_ids(tok, "partial answer"), interrupt_at=7), tok, "q")
    assert out.stopped == "interrupted" and out.text == "partial"


def test_chat_text_renders_the_template_with_the_generation_prompt():
    need("jinja2")
    tok = _tokenizer()
    model = Scripted(_ids(tok, "Hi!") + [tok.vocab["<|im_end|>"]])
    out = chat_text(model, tok, [{"role": "user", "content": "Hello"}])
    assert out.text == "Hi!" and out.stopped == "end"
    assert tok.decode(model.seen[0][0]) == \
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


def test_the_same_seed_gives_the_same_text_on_a_real_decoder():
    tok = _tokenizer()
    minitx.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=len(tok), hidden_size=16, num_layers=1,
                                  num_heads=2, max_position=64)).eval()
    runs = [generate_text(model, tok, "ab", max_new_tokens=12, temperature=1.0, seed=s)
            for s in (5, 5, 6)]
    assert runs[0].ids == runs[1].ids and runs[0].ids != runs[2].ids
    assert runs[0].text == tok.decode([i for i in runs[0].ids if i < 256])


def test_without_a_model_one_line_names_the_command(monkeypatch, capsys):
    monkeypatch.setattr(real, "smollm2_gguf", lambda: None)
    assert cli.main(["generate", "Hello"]) == 2
    err = capsys.readouterr().err
    assert f"{real.FETCH_COMMAND} smollm2" in err and "--model PATH" in err


def _smollm2():
    path = real.smollm2_gguf()
    if path is None:
        pytest.skip(f"needs SmolLM2's GGUF file: {real.FETCH_COMMAND}")
    return path


@pytest.mark.slow
@pytest.mark.xdist_group("real_llm")
def test_generate_as_typed_continues_the_sentence():
    _smollm2()
    run = subprocess.run([sys.executable, "-m", "minitx", "generate",
                          "The capital of France is", "--max-new-tokens", "6"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("The capital of France is Paris.")
    assert "tokens/s" in run.stderr and "prompt tokens" in run.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("real_llm")
def test_chat_answers_each_message_and_ends_at_ctrl_d(monkeypatch, capsys):
    _smollm2()
    lines = iter(["What is the capital of France?", "/exit"])
    args = cli.build_parser().parse_args(["chat", "--max-new-tokens", "24"])
    assert chat.cmd_chat(args, read=lambda prompt: next(lines)) == 0
    out = capsys.readouterr()
    assert "Paris" in out.out and "stopped: end" in out.err
