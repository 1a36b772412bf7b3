"""Prompts for the audit: JSONL files of token ids or text, and a small built-in set.

One JSON object per line: {"tokens": [ids...]} or {"text": "..."} (tokenised with the checkpoint's
own tokenizer.json through the `tokenizers` library), optionally with "chat": true to wrap the text
in the checkpoint's chat template (tokenizer_config.json) as one user turn.
"""
from __future__ import annotations

from pathlib import Path

from ddsim.errors import InputError
from ddsim.jsonl import read_json, read_jsonl
from ddsim.values import is_int

# Written for this project: one math, one code and one chat prompt.
BUILTIN_PROMPTS = (
    {"text": "A train leaves a station at 3:40 pm and travels 192 km at an average speed of 72 km/h. "
             "At what time does it arrive? Show each step of the calculation.", "chat": True},
    {"text": "Write a Python function that merges two sorted lists into one sorted list in linear time, "
             "then explain why it is linear.", "chat": True},
    {"text": "My tomato plants have yellow leaves near the bottom but the new growth looks healthy. "
             "What are the likely causes, and what should I check first?", "chat": True},
)


class TextEncoder:
    """A checkpoint's tokenizer (tokenizer.json) and chat template (tokenizer_config.json)."""

    def __init__(self, directory: str | Path):
        d = Path(directory)
        self.directory = d
        if not (d / "tokenizer.json").is_file():
            raise InputError(f"--model {d}: no tokenizer.json, so text prompts cannot be tokenised "
                             "(give {\"tokens\": [...]} prompts)")
        from tokenizers import Tokenizer
        try:
            self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # the tokenizers library raises its own exception type
            raise InputError(f"{d / 'tokenizer.json'}: cannot load tokenizer ({e})") from None
        self.template, self.template_file = None, None
        jinja_file, tc = d / "chat_template.jinja", d / "tokenizer_config.json"
        if jinja_file.is_file():  # transformers 4.43+ saves the template beside the tokenizer, and prefers it
            try:
                self.template, self.template_file = jinja_file.read_text(), jinja_file
            except (OSError, UnicodeDecodeError) as e:
                raise InputError(f"{jinja_file}: cannot read chat template ({getattr(e, 'strerror', None) or e})") from None
        elif tc.is_file():
            config = read_json(tc, "tokenizer config")
            self.template = config.get("chat_template") if isinstance(config, dict) else None
            self.template_file = tc
        if self.template is not None and not isinstance(self.template, str):
            raise InputError(f"{self.template_file}: chat_template must be a string (named templates are not supported)")

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        if chat and self.template:
            text = render_chat_template(self.template, text, where=str(self.template_file))
            return self.tok.encode(text, add_special_tokens=False).ids
        return self.tok.encode(text).ids


TEMPLATE_SECONDS = 2.0  # a chat template renders one user turn: far below a millisecond for real ones
TEMPLATE_OUTPUT = 1 << 20  # characters


class _TemplateLimit(Exception):
    pass


def render_chat_template(template: str, text: str, *, where: str, seconds: float = TEMPLATE_SECONDS,
                         max_chars: int = TEMPLATE_OUTPUT) -> str:
    """One user turn through a checkpoint's chat template, in jinja2's immutable sandbox (as
    transformers renders them): a template is data from a checkpoint ddsim did not write, so it may
    not reach Python internals, call unsafe methods or change its arguments, and it gets ``seconds``
    of time (checked on every line the compiled template runs, so a loop that prints nothing is
    stopped too) and ``max_chars`` of output. A template that oversteps is refused with one line."""
    import sys
    import time

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise InputError(f"{where}: chat template raised: {msg}")

    env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    deadline = time.monotonic() + seconds

    def tracer(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TemplateLimit(f"did not finish within {seconds:g} s")
        return tracer

    previous = sys.gettrace()
    try:
        compiled = env.from_string(template)
        parts, size = [], 0
        sys.settrace(tracer)
        try:
            for chunk in compiled.generate(messages=[{"role": "user", "content": text}], add_generation_prompt=True):
                size += len(chunk)
                if size > max_chars:
                    raise _TemplateLimit(f"rendered more than {max_chars} characters for one user turn")
                parts.append(chunk)
        finally:
            sys.settrace(previous)
        return "".join(parts)
    except _TemplateLimit as e:
        raise InputError(f"{where}: chat template refused: it {e}") from None
    except jinja2.exceptions.SecurityError as e:
        raise InputError(f"{where}: chat template refused: it reaches outside the sandbox ({e})") from None
    except jinja2.TemplateError as e:
        raise InputError(f"{where}: chat template: {e}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"{where}: chat template failed ({type(e).__name__}: {e})") from None


def _check_tokens(toks, vocab, where):
    if not isinstance(toks, list) or not toks or not all(is_int(t) for t in toks):
        raise InputError(f"{where}: expected {{\"tokens\": [non-empty list of token ids]}} or {{\"text\": ...}}")
    bad = [t for t in toks if not 0 <= t < vocab]
    if bad:
        raise InputError(f"{where}: token {bad[0]} is outside the vocabulary ({vocab})")
    return toks


def load_prompts(path: str | Path, vocab: int, encoder: TextEncoder | None = None) -> list[list[int]]:
    out = []
    for where, rec in read_jsonl(path, "prompts"):
        if isinstance(rec, dict) and set(rec) not in ({"tokens"}, {"text"}, {"text", "chat"}):
            # (a misspelt "chat" was dropped, and the prompt went without its template; with both, tokens won)
            raise InputError(f'{where}: expected {{"tokens": [...]}} or {{"text": "...", "chat": true|false}}, got the '
                             f"keys {sorted(rec)}")
        if isinstance(rec, dict) and not isinstance(rec.get("chat", False), bool):  # ("false" is truthy)
            raise InputError(f"{where}: 'chat' must be true or false, got {rec['chat']!r}")
        if isinstance(rec, dict) and "text" in rec:
            if encoder is None:
                raise InputError(f"{where}: text prompts need a tokenizer (a --model checkpoint with tokenizer.json); "
                                 "synthetic presets take {\"tokens\": [...]}")
            if not isinstance(rec["text"], str) or not rec["text"]:
                raise InputError(f"{where}: 'text' must be a non-empty string")
            out.append(_check_tokens(encoder.encode(rec["text"], chat=rec.get("chat", False)), vocab, where))
            continue
        out.append(_check_tokens(rec.get("tokens") if isinstance(rec, dict) else None, vocab, where))
    if not out:
        raise InputError(f"{path}: no prompts")
    return out


def builtin_prompts(encoder: TextEncoder, vocab: int) -> list[list[int]]:
    return [_check_tokens(encoder.encode(r["text"], chat=r["chat"]), vocab, "built-in prompt") for r in BUILTIN_PROMPTS]
