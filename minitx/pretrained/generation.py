"""Text in, text out: a model and its tokenizer generating as a user expects.

``generate_text(model, tokenizer, prompt)`` encodes the prompt, runs ``Decoder.generate``
(temperature, top-k, top-p, a seed) through the KV caches, and stops at the first of: an
end-of-text or end-of-turn token (``end_ids``), a stop string, ``max_new_tokens``. With
``stream`` it hands each piece of text to a callback as soon as it is complete (an
incremental decoder holds back a character whose bytes are split across tokens), so a
program can print as the model writes. ``chat_text`` renders a conversation with the
tokenizer's chat template first. Both return a ``Generation``: the new text, the new ids,
why it stopped, and the time of the prompt (prefill) and of the new tokens (decode).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import validate
from ..autograd.tensor import Tensor
from .hf_tokenizer import StreamDecoder

__all__ = ["Generation", "END_OF_TURN", "end_ids", "generate_text", "chat_text"]

#: end-of-turn tokens of the chat formats minitx reads (ChatML, Gemma, Llama 3)
END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end_of_text|>",
               "<|endoftext|>")


@dataclasses.dataclass
class Generation:
    """What ``generate_text`` produced: ``text`` (the new text only), ``ids`` (the new ids),
    ``stopped`` ("end" — an end id, "stop string", "length" — max_new_tokens, "interrupted"),
    ``prompt_tokens``, ``prefill_s`` (seconds to the first new token) and ``decode_s`` (the
    rest), ``tokens_per_second`` (new tokens after the first, per second of decode)."""

    text: str
    ids: list
    stopped: str
    prompt_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def tokens_per_second(self) -> float:
        return (len(self.ids) - 1) / self.decode_s if len(self.ids) > 1 and self.decode_s \
            else 0.0


def end_ids(tokenizer) -> list:
    """The ids that end a text or a turn: the tokenizer's eos and each ``END_OF_TURN`` token
    its vocabulary has."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids += [tokenizer.vocab[t] for t in END_OF_TURN if t in tokenizer.vocab]
    return list(dict.fromkeys(ids))


def generate_text(model, tokenizer, prompt, max_new_tokens: int = 64,
                  temperature: float = 0.0, top_k: int = None, top_p: float = None,
                  seed: int = None, stop=(), stream=None, add_special_tokens: bool = True,
                  ids=None) -> Generation:
    """Continue ``prompt`` (a string; or pass its token ``ids`` instead); see the module
    docstring. ``stop``: strings that end the generation where they appear (the text is cut
    before them). ``stream(text)``: called with each completed piece of the new text.
    Ctrl-C (KeyboardInterrupt) during the generation ends it with ``stopped="interrupted"``
    and the text so far."""
    who = "generate_text"
    if ids is None:
        if not isinstance(prompt, str):
            raise TypeError(f"{who}: prompt must be a str, got {type(prompt).__name__}")
        ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    ids = [int(i) for i in ids]
    if not ids:
        raise validate.OptionError(f"{who}: the prompt encodes to no tokens; the first new "
                                   "token needs at least one")
    stops = [s for s in ([stop] if isinstance(stop, str) else list(stop)) if s]
    decoder = StreamDecoder(tokenizer)
    # "shown": how much of the text went to ``stream``; the tail that could still begin a
    # stop string is held back until the next token settles it
    state = {"text": "", "shown": 0, "ids": [], "stopped": "length", "first": None}
    t0 = time.perf_counter()

    def show(upto):                            # stream the text up to ``upto``, once
        if stream and upto > state["shown"]:
            stream(state["text"][state["shown"]:upto])
        state["shown"] = max(state["shown"], upto)

    def on_token(step, new):
        """Called by ``generate`` with each new token: decode it, stop at an end id or a stop
        string, stream what no stop string can still claim."""
        if state["first"] is None:             # the first token ends the prefill's time
            state["first"] = time.perf_counter()
        token = int(new[0])
        state["ids"].append(token)
        if token in ends:
            state["stopped"] = "end"
            return
        text = state["text"] = state["text"] + decoder.push(token)
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:                           # a stop string: keep the text before it
            state["text"], state["stopped"] = text[:cut], "stop string"
            show(cut)
            raise StopIteration
        # the longest tail that is a stop string's beginning waits for the next token
        held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])),
                   default=0)
        show(len(text) - held)

    ends = end_ids(tokenizer)
    try:
        model.generate(Tensor(np.asarray([ids], dtype=np.int64)), max_new_tokens,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       eos_token_id=ends or None, on_token=on_token)
    except KeyboardInterrupt:                  # Ctrl-C: the answer ends, the text so far stays
        state["stopped"] = "interrupted"
    if state["stopped"] != "stop string":
        state["text"] += decoder.flush()
        show(len(state["text"]))
    t1 = time.perf_counter()
    first = state["first"] or t1
    return Generation(state["text"], state["ids"], state["stopped"], len(ids), first - t0,
                      t1 - first)


def chat_text(model, tokenizer, messages, **options) -> Generation:
    """The assistant's next turn in ``messages`` ([{"role", "content"}, …]): the conversation
    rendered by the tokenizer's chat template with the generation prompt, then
    ``generate_text`` (its options)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return generate_text(model, tokenizer, None, ids=ids, **options)
