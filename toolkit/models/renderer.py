"""Renderers: chat messages -> prompt token ids, completion token ids -> text, and the policy's stop tokens.

The orchestrator samples token-in/token-out: a renderer turns the conversation into the exact token ids sent
to the engine, and the completion comes back as token ids that are never re-tokenised. Renderers:

- ``auto``: the model's own chat template (``transformers`` tokenizer loaded from the model directory).
- ``plain``: no template, ``"<role>: <content>\\n"`` lines ending in ``"assistant:"`` (for base models).
- ``import_path = "pkg.module:Class"`` (or ``pkg.module.Class``): a custom class constructed as
  ``Class(model_path)`` that has the same methods as ``Renderer``.

transformers is imported on first use only (login-node code imports this module for validation).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]


@runtime_checkable
class Renderer(Protocol):
    """What the rollout needs from a renderer. Token ids are ints of the policy's vocabulary."""

    name: str
    stop_token_ids: list[int]
    """Token ids that end a turn (sent as the request's ``stop_token_ids``)."""

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids for ``messages`` (role/content dicts), ending in the assistant generation prompt."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of completion ids, special tokens included (a reward must see filler tokens)."""
        ...


class _TokenizerRenderer:
    def __init__(self, model_path: Path | str | None = None, *, tokenizer: Any = None) -> None:
        if tokenizer is None:
            if model_path is None:
                raise ValueError("a renderer needs a model_path or a tokenizer")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer = tokenizer
        self.stop_token_ids = self._stop_ids()

    def _stop_ids(self) -> list[int]:
        ids: list[int] = []
        eos = self.tokenizer.eos_token_id
        for t in eos if isinstance(eos, list) else [eos]:
            if t is not None and t not in ids:
                ids.append(int(t))
        # ChatML-style templates end a turn with <|im_end|>, which may differ from the tokenizer's eos.
        for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid not in ids:
                ids.append(tid)
        return ids

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)


class ChatTemplateRenderer(_TokenizerRenderer):
    """``auto``: the tokenizer's chat template (``tokenizer_config.json`` / ``chat_template.jinja``).

    Raises ValueError at construction when the tokenizer has no chat template.
    """

    name = "auto"

    def __init__(self, model_path: Path | str | None = None, *, tokenizer: Any = None) -> None:
        super().__init__(model_path, tokenizer=tokenizer)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer at {model_path} has no chat template; use renderer name 'plain'")

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> list[int]:
        """Prompt ids through the chat template; ``tools`` (OpenAI function schemas) go to the template as is."""
        extra = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
        return self.encode(text)


class PlainRenderer(_TokenizerRenderer):
    """``plain``: ``"<role>: <content>\\n"`` per message, then ``"assistant:"``; bos first if the tokenizer has one."""

    name = "plain"

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant:"
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + self.encode(text)


RENDERERS: dict[str, type] = {"auto": ChatTemplateRenderer, "plain": PlainRenderer}


def _plain_message(m: Any) -> bool:
    return (
        isinstance(m, dict)
        and len(m) == 2
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
    )


class CachedRenderer:
    """A renderer that remembers its last ``maxsize`` renders (least recently used dropped first).

    A group's ``group_size`` rollouts open with the same conversation, and applying a chat template costs about
    a millisecond of CPU per call (jinja rendering plus tokenisation), so the orchestrator renders it once per
    group instead of once per rollout. Renderers are pure functions of the messages, so the ids are the same;
    each call returns a fresh list (callers extend and slice it). ``decode`` and every other attribute are
    the wrapped renderer's.
    """

    def __init__(self, renderer: Renderer, maxsize: int = 4096) -> None:
        self.inner = renderer
        self.name = renderer.name
        self.stop_token_ids = renderer.stop_token_ids
        self._cached = functools.lru_cache(maxsize=max(1, int(maxsize)))(self._render_key)

    def _render_key(self, key: tuple) -> tuple[int, ...]:
        add_generation_prompt, *pairs = key
        messages = [{"role": role, "content": content} for role, content in pairs]
        return tuple(self.inner.render(messages, add_generation_prompt=add_generation_prompt))

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
        # Only plain role/content messages with string content are cached: the key must hold all the input.
        if not all(_plain_message(m) for m in messages):
            return self.inner.render(messages, add_generation_prompt=add_generation_prompt)
        return list(self._cached((add_generation_prompt, *((m["role"], m["content"]) for m in messages))))

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)

    def __getattr__(self, name: str) -> Any:  # tokenizer, encode, ... of the wrapped renderer
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _import_object(path: str) -> Any:
    module_path, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not module_path or not attr:
        raise ValueError(f"renderer import_path {path!r} must be 'pkg.module:Class' or 'pkg.module.Class'")
    return getattr(importlib.import_module(module_path), attr)


def load_renderer(renderer_cfg: Any, model_path: Path | str) -> Renderer:
    """The renderer named by ``renderer_cfg`` (``name``, ``import_path``; None means ``auto``) for a model.

    ``import_path`` wins over ``name``. Raises ValueError for an unknown name, TypeError for a class that lacks
    ``render``/``decode``/``stop_token_ids``/``name``.
    """
    name = (renderer_cfg.name if renderer_cfg is not None else None) or "auto"
    if renderer_cfg is not None and renderer_cfg.import_path:
        renderer = _import_object(renderer_cfg.import_path)(model_path)
    elif name in RENDERERS:
        renderer = RENDERERS[name](model_path)
    else:
        raise ValueError(f"unknown renderer {name!r}; known: {sorted(RENDERERS)} (or set import_path)")
    if not isinstance(renderer, Renderer):
        raise TypeError(f"renderer {type(renderer).__name__} lacks render/decode/stop_token_ids/name")
    return renderer
