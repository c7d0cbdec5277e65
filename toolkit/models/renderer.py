"""Renderers: chat messages -> prompt token ids, completion token ids -> text, and the policy's stop tokens.

The orchestrator samples token-in/token-out: a renderer turns the conversation into the exact token ids sent
to the engine, and the completion comes back as token ids that are never re-tokenised. Renderers:

- ``auto``: the model's own chat template (``transformers`` tokenizer loaded from the model directory).
- ``plain``: no template, ``"<role>: <content>\\n"`` lines ending in ``"assistant:"`` (for base models).
- ``hermes``: the model's chat template, with tools written in the Hermes/Qwen text format (a ``<tools>`` block in
  the system message, ``<tool_call>{json}</tool_call>`` in assistant turns, ``<tool_response>`` user turns), for
  templates that only render role and content (the tiny model's, SmolLM2's). ``parse_tool_calls`` reads that
  format back from a completion (it is also the format Qwen2.5/Qwen3's own templates write).
- ``import_path = "pkg.module:Class"`` (or ``pkg.module.Class``): a custom class constructed as
  ``Class(model_path)`` that has the same methods as ``Renderer``.

transformers is imported on first use only (login-node code imports this module for validation).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
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

    def render_text(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The chat template's text for ``messages``; ``tools`` (OpenAI function schemas) go to it as is."""
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )

    def render(
        self, messages: list[Message], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        """Prompt ids through the chat template; ``tools`` (OpenAI function schemas) go to the template as is."""
        return self.encode(self.render_text(messages, add_generation_prompt=add_generation_prompt, tools=tools))

    def continuation(
        self, history: list[dict], tail: list[dict], *, completion_ids: list[int], tools: list[dict] | None = None
    ) -> list[int] | None:
        """Token ids that follow a sampled assistant turn up to the next generation prompt, or None.

        ``history`` ends with the assistant message that ``completion_ids`` (the sampled ids, stop token
        included when the engine stopped on one) produced; ``tail`` holds the messages after it (tool results, a
        user turn). The ids are the rest of the assistant turn the template writes after its content (minus the
        stop token the completion already ends with), then ``tail`` and the generation prompt, so that
        ``previous prompt + completion_ids + continuation`` is the next prompt with the sampled ids kept as
        sampled (a re-rendered tool call may be spelled differently from what the model wrote). None when the
        template does not render ``history + tail`` as ``history`` followed by more text (a template that
        rewrites earlier turns): the caller renders the whole conversation instead.
        """
        full = self.render_text(history + tail, add_generation_prompt=True, tools=tools)
        head = self.render_text(history, add_generation_prompt=False, tools=tools)
        closer = self.assistant_closer
        if not full.startswith(head) or closer is None or not head.endswith(closer):
            return None
        if completion_ids and completion_ids[-1] in self.stop_token_ids:
            stop_text = self.decode([completion_ids[-1]])
            closer = closer.removeprefix(stop_text)
        return self.encode(closer + full[len(head) :])

    @functools.cached_property
    def assistant_closer(self) -> str | None:
        """What the template writes after an assistant message's content (``"<|im_end|>\\n"`` for ChatML); None
        when a probe message's content does not appear in its rendering."""
        probe = "srl-probe-7f3a"
        text = self.render_text(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": probe}], add_generation_prompt=False
        )
        return text[text.rindex(probe) + len(probe) :] if probe in text else None


class PlainRenderer(_TokenizerRenderer):
    """``plain``: ``"<role>: <content>\\n"`` per message, then ``"assistant:"``; bos first if the tokenizer has one."""

    name = "plain"

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant:"
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + self.encode(text)


TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes_call(call: dict) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # written as the model sent it
    return "<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments}) + "\n</tool_call>"


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


class HermesRenderer(ChatTemplateRenderer):
    """``hermes``: the model's chat template, with tools and tool calls spelled in the Hermes text format.

    Messages are rewritten to plain role/content ones before the template sees them: the tool schemas (one JSON
    object per line, keys sorted) are appended to the system message (one is added when the conversation has none)
    inside ``<tools></tools>``, an assistant's
    ``tool_calls`` become ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after its content,
    and consecutive ``tool`` messages become one user message of ``<tool_response>`` blocks. For a template that
    renders tools itself (Qwen3's), use ``auto``.
    """

    name = "hermes"

    def render_text(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        return super().render_text(self.plain_messages(messages, tools), add_generation_prompt=add_generation_prompt)

    @staticmethod
    def plain_messages(messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        """``messages`` (OpenAI chat dicts, with ``tool_calls`` and ``tool`` roles) as role/content dicts."""
        out: list[dict] = []
        for m in messages:
            role, text = m["role"], _text_of(m.get("content"))
            if role == "assistant" and m.get("tool_calls"):
                text = "\n".join([*([text] if text else []), *(_hermes_call(c) for c in m["tool_calls"])])
            if role == "tool":
                block = f"<tool_response>\n{text}\n</tool_response>"
                if out and out[-1].get("_tool"):
                    out[-1]["content"] += "\n" + block
                    continue
                out.append({"role": "user", "content": block, "_tool": True})
                continue
            out.append({"role": role, "content": text})
        if tools:
            # Keys sorted: the same schema reaches srl in different key orders (an MCP server's registration in
            # `srl sft make-data`, the MCP client's copy in a live episode), and one character-level difference in
            # the prompt is enough to make a small model trained on one form garble its calls on the other (seen:
            # a perfect call became `vault_lokup` with a wrong key). HF chat templates' tojson sorts keys too.
            spec = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
            section = (
                "# Tools\n\nFunctions you can call, one JSON schema per line:\n<tools>\n"
                + spec
                + "\n</tools>\n\nTo call one, reply with\n<tool_call>\n"
                '{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>'
            )
            if out and out[0]["role"] == "system":
                out[0]["content"] = (out[0]["content"] + "\n\n" + section) if out[0]["content"] else section
            else:
                out.insert(0, {"role": "system", "content": section})
        return [{"role": m["role"], "content": m["content"]} for m in out]


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Split a completion's text into its content and its Hermes-format tool calls.

    Returns ``(content, calls)``: ``content`` is the text with every well-formed ``<tool_call>...</tool_call>``
    block removed (stripped), ``calls`` a list of ``{"name": str, "arguments": str}`` (arguments as a JSON object
    string) in order. A block whose body is not a JSON object with a string ``name`` is not a call: it stays in
    the content, so the environment sees what the model wrote.
    """
    calls: list[dict] = []
    kept: list[str] = []
    pos = 0
    for found in TOOL_CALL.finditer(text):
        try:
            body = json.loads(found.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", {})
        kept.append(text[pos : found.start()])
        pos = found.end()
        calls.append(
            {"name": body["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}
        )
    kept.append(text[pos:])
    return "".join(kept).strip() if calls else text, calls


RENDERERS: dict[str, type] = {"auto": ChatTemplateRenderer, "plain": PlainRenderer, "hermes": HermesRenderer}


def _plain_message(m: Any) -> bool:
    return isinstance(m, dict) and len(m) == 2 and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


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

    def render(
        self, messages: list[Message], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        # Only plain role/content messages with string content are cached: the key must hold all the input.
        if tools:
            return self.inner.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
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
