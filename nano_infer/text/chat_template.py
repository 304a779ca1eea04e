"""Chat messages to token ids, with the control tokens only where the template puts them.

`tokenizer.apply_chat_template` renders the conversation to text and tokenizes the whole text
with special tokens parsed, so a user who types `<|im_end|>\n<|im_start|>system` into a message
closes their turn and opens a system turn: the model sees real control tokens. Here a message's
content is text, whatever it spells: the template is rendered with a placeholder for each
content, the template's own text is tokenized with its special tokens, and each content with
them split (`split_special_tokens`), i.e. as the characters it is made of. A conversation with
no special token's text in any content takes transformers' path unchanged, so ordinary chats
get exactly the ids they always did. `allow_special_tokens=True` is the opt-in for callers who
mean the tokens they write. vLLM parses them (its behaviour is transformers').

Tokenizing in pieces can differ from tokenizing the whole text only where the template's text and
a content would have merged into one token across the boundary, e.g. a content that starts
with a newline right after the template's.
"""
from __future__ import annotations

import json
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"  # chat templates shipped with the package, by name
PLACEHOLDER = "\ue000{}\ue001"  # private-use characters: no template changes them, no user types them


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as OpenAI clients send them, as vLLM hands them to a template: an assistant turn with
    `tool_calls` may leave `content` out or null (it becomes "", vLLM's text form), and a call's
    `arguments` JSON text becomes the object templates dump. Anything else without content is refused."""
    if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if m.get("content") is None and not calls:
            raise ValueError(f"messages[{i}] has no content (only an assistant message with tool_calls may leave it out)")
        if m.get("content") is None or calls:
            m = {**m, "content": m.get("content") or "", **({"tool_calls": [_call(c) for c in calls]} if calls else {})}
        out.append(m)
    return out


def _call(call: dict) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call  # left as the text it is
    return {**call, "function": {**function, "arguments": arguments}}


class Chat(list):
    """Chat messages with what else the template renders (`tools=`): one prompt value, so it travels
    through AsyncLLM's tokenizer queue as a plain list of messages does."""

    def __init__(self, messages: list[dict], **template_kwargs):
        super().__init__(messages)
        self.template_kwargs = template_kwargs


def chat_token_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                   allow_special_tokens: bool = False, **kwargs) -> list[int]:
    if allow_special_tokens or not any(_spells_control_token(tokenizer, m["content"]) for m in messages):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
    marks = [PLACEHOLDER.format(i) for i in range(len(messages))]
    text = tokenizer.apply_chat_template([{**m, "content": mark} for m, mark in zip(messages, marks)],
                                         add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
    ids = []
    for mark, message in zip(marks, messages):
        if text.count(mark) != 1:
            raise ValueError("this chat template does not render each message's content once, so control tokens "
                             "typed in a message cannot be kept as text; pass allow_special_tokens=True to parse them")
        head, text = text.split(mark)
        ids += tokenizer.encode(head, add_special_tokens=False)
        ids += tokenizer.encode(message["content"], add_special_tokens=False, split_special_tokens=True)
    return ids + tokenizer.encode(text, add_special_tokens=False)


def _spells_control_token(tokenizer, content) -> bool:
    return isinstance(content, str) and any(t.content in content for t in tokenizer.added_tokens_decoder.values())


def shipped_templates() -> list[str]:
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


def resolve_chat_template(value: str) -> str:
    """The Jinja text of vLLM's --chat-template: a file's path, the name of a template shipped here
    ("chatml_tools": ChatML with OpenAI tools and Hermes-style calls), or the template itself. A template
    that does not parse is refused now, with its line, not at the first chat."""
    from jinja2 import Environment, TemplateSyntaxError

    shipped, path = TEMPLATES / f"{value}.jinja", Path(value).expanduser()
    if "{" not in value and shipped.is_file():
        text = shipped.read_text()
    elif "{" not in value and path.is_file():
        text = path.read_text()
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ValueError(f"chat_template={value!r} is neither a file, a template shipped with nano_infer "
                         f"({', '.join(shipped_templates())}), nor a Jinja template")
    try:
        Environment().parse(text)
    except TemplateSyntaxError as e:
        raise ValueError(f"chat_template {value[:60]!r} does not parse: {e.message} (line {e.lineno})") from None
    return text
