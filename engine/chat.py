"""Chat prompts: OpenAI-style messages and tools, rendered with the model's template, encoded safely.

Safety: every message's content, tool result and tool-call argument is untrusted. The template is
rendered twice, once with the real texts and once with a random sentinel in place of each untrusted
text; the sentinel rendering tells us which characters are the template's own scaffolding. Only
special tokens written by the scaffolding become special ids; everything else is encoded with
`allow_special=False`, so a message containing "<|im_start|>system" stays plain text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.constrained.grammar import HERMES, LLAMA3, tool_dialect
from engine.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")

# Used when neither the caller nor the model supplies a template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOLS_HEADER = (
    "# Tools\n\n"
    "You can call the functions below. Each is a JSON object with the function's name, what it "
    "does, and a JSON schema of its arguments:\n<tools>\n"
)
TOOLS_FOOTER = (
    "</tools>\n\n"
    "When you need a function, answer with one block per call, exactly in this form:\n"
    '<tool_call>{"name": <function-name>, "arguments": <arguments-as-a-JSON-object>}</tool_call>\n'
    "Each result comes back to you inside <tool_response></tool_response>. "
    "When you do not need a function, answer in plain text, without any <tool_call> block."
)
# Llama 3.1's own form (its template asks for "parameters"), one call as the whole answer.
LLAMA3_TOOLS_FOOTER = (
    "</tools>\n\n"
    "When you need a function, answer with nothing but one JSON object, exactly in this form:\n"
    '{"name": <function-name>, "parameters": <arguments-as-a-JSON-object>}\n'
    "Its result comes back to you in the next message. "
    "When you do not need a function, answer in plain text."
)
# The tool-instruction template: `{tools}` marks where the tools' JSON lines go; the text before
# it stands for TOOLS_HEADER, the text after it for the footer (openclaw prompts "tools").
TOOLS_PLACEHOLDER = "{tools}"
BUILTIN_TOOL_INSTRUCTIONS = TOOLS_HEADER + TOOLS_PLACEHOLDER + TOOLS_FOOTER

# Turn-ending tokens worth stopping on when the template writes them.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
_TOOL_ROLE = re.compile(r"""(['"])tool\1""")


@dataclass(frozen=True)
class Part:
    """A piece of a message: `trusted` only for text the engine itself wrote (our tool prompt)."""

    text: str
    trusted: bool = False


@dataclass
class Turn:
    role: str
    parts: list[Part] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(p.text for p in self.parts)


def normalize_messages(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    tool_role: bool = False,
    dialect: str = HERMES,
    tool_instructions: str | None = None,
) -> list[Turn]:
    """OpenAI-style messages (+ tools) as turns a plain chat template can render.

    Tools go into the system turn (one is created if absent); assistant tool calls become calls
    in the `dialect`'s form after the content (`<tool_call>` blocks, or Llama 3's JSON objects);
    tool results become `tool` turns when the template knows that role (`tool_role`), else user
    turns of `<tool_response>` blocks, consecutive results sharing one turn. `tool_instructions`:
    the template of the tools' section (tool_prompt_parts), checked even when no tool is offered.
    """
    if tool_instructions is not None:
        split_tool_instructions(tool_instructions)
    turns: list[Turn] = []
    tool_turn: Turn | None = None  # the user turn that holds the latest run of tool results
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"message {i} is a {type(message).__name__}, not a dict")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
        content = _content_text(message.get("content"), i)
        if role == "tool" and not tool_role:
            response = [Part("<tool_response>\n", True), Part(content), Part("\n</tool_response>", True)]
            if tool_turn is not None:
                tool_turn.parts += [Part("\n", True), *response]
            else:
                tool_turn = Turn("user", response)
                turns.append(tool_turn)
            continue
        tool_turn = None
        parts = [Part(content)]
        if role == "assistant" and message.get("tool_calls"):
            parts += _tool_call_parts(message["tool_calls"], i, bool(content), dialect)
        turns.append(Turn(role, parts))
    if tools:
        tool_parts = tool_prompt_parts(tools, dialect, tool_instructions)
        if turns and turns[0].role == "system":
            sep = [Part("\n\n", True)] if turns[0].content else []
            turns[0].parts += sep + tool_parts
        else:
            turns.insert(0, Turn("system", tool_parts))
    return turns


def split_tool_instructions(template: str) -> tuple[str, str]:
    """The (header, footer) of a tool-instruction template: the text before and after its one
    `{tools}`. ValueError, naming the template and the fix, when it has none or several."""
    if not isinstance(template, str):
        raise ValueError(f"tool_instructions must be a text, got {type(template).__name__}")
    count = template.count(TOOLS_PLACEHOLDER)
    if count != 1:
        found = "has no" if count == 0 else f"has {count} times the"
        raise ValueError(
            f"tool_instructions: the template {found} placeholder {TOOLS_PLACEHOLDER}: write it "
            "exactly once, where the tools' JSON lines go (the text before it replaces the "
            "built-in header, the text after it the footer)")
    header, footer = template.split(TOOLS_PLACEHOLDER)
    return header, footer


def tool_prompt_parts(tools: Sequence[dict[str, Any]], dialect: str = HERMES,
                      instructions: str | None = None) -> list[Part]:
    """The system-prompt section that lists the tools and says how to call them (in `dialect`).

    `instructions`: a tool-instruction template (split_tool_instructions) in place of the
    built-in header and footer; the worked examples stay. None, or the built-in text itself:
    the dialect's built-in section. A template is the admin's, like the system prompt, so it is
    encoded as ordinary text: a token's name written in it stays text, never a role marker."""
    footer: list[Part] | None = None  # None: the dialect's built-in one
    if instructions is None or instructions == BUILTIN_TOOL_INSTRUCTIONS:
        parts = [Part(TOOLS_HEADER, True)]
    else:
        head, foot = split_tool_instructions(instructions)
        parts, footer = [Part(head)] if head else [], [Part(foot)] if foot else []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(
                f"tool {i}: expected {{'type': 'function', 'function': {{'name': ..., "
                f"'description': ..., 'parameters': {{...}}}}}}, got {tool!r:.200}"
            )
        spec = {
            "name": fn["name"],
            "description": fn.get("description", ""),
            "parameters": fn.get("parameters", {"type": "object", "properties": {}}),
        }
        # Names, descriptions and schemas may come from outside (plugins, MCP servers): untrusted.
        parts += [Part(json.dumps(spec, ensure_ascii=False)), Part("\n", True)]
    if footer is not None:
        return parts + footer + ([] if dialect == LLAMA3 else example_parts(tools))
    if dialect == LLAMA3:
        return parts + [Part(LLAMA3_TOOLS_FOOTER, True)]
    return parts + [Part(TOOLS_FOOTER, True), *example_parts(tools)]


# Answers without a call, between the example calls: the examples must show both choices.
_PLAIN_EXAMPLES = (("What is the capital of Italy?", "The capital of Italy is Rome."),
                   ("Write a line about rain.", "Soft rain taps on the window."))
_E_G = re.compile(r"e\.g\.,? ([^,;()]+)")


def example_parts(tools: Sequence[dict[str, Any]]) -> list[Part]:
    """Worked examples after the Hermes tool prompt: a call of each of the first two tools (their
    required arguments filled from the schema) and two answers without one. A small model copies
    the pattern of an example far more readily than it follows a rule (bench/agent_eval.py)."""
    parts = [Part("\n\nExamples:\n", True)]
    for i, tool in enumerate(tools[:2]):
        fn = tool.get("function", tool)
        args = example_arguments(fn.get("parameters") or {})
        # The request in words ("Call the files tool with action read, path notes/todo.md."):
        # measured, it ranks more explicit requests above the plain ones than "Use the files tool."
        words = ", ".join(f"{key} {value}" for key, value in args.items())
        call = {"name": fn["name"], "arguments": args}
        parts += [Part("User: Call the ", True), Part(fn["name"]),
                  Part(" tool with " if words else " tool", True), Part(words),
                  Part(".\nAssistant: <tool_call>", True),
                  Part(json.dumps(call, ensure_ascii=False)), Part("</tool_call>\n", True)]
        question, answer = _PLAIN_EXAMPLES[i]
        parts.append(Part(f"User: {question}\nAssistant: {answer}\n", True))
    return parts


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments for an example call: each required property, with its first enum value, the
    example its description gives ("e.g. ls -la"), or a plain value of its type."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    args: dict[str, Any] = {}
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        if not isinstance(name, str):
            continue
        prop = props.get(name) if isinstance(props.get(name), dict) else {}
        kind = prop.get("type")
        if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
            kind = next((k for k in kind if k != "null"), None)
        kind = kind if isinstance(kind, str) else None
        if isinstance(prop.get("enum"), list) and prop["enum"]:
            args[name] = prop["enum"][0]
        elif kind in (None, "string") and (m := _E_G.search(str(prop.get("description", "")))):
            args[name] = m.group(1).strip().split(" or ")[0]
        else:
            args[name] = {"integer": 1, "number": 1, "boolean": True, "array": [],
                          "object": {}}.get(kind, "text")
    return args


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: text only
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ValueError(f"message {index}: only text content parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ValueError(f"message {index}: content must be a string, got {type(content).__name__}")


def _tool_call_parts(calls: Any, index: int, after_content: bool, dialect: str) -> list[Part]:
    if not isinstance(calls, list):
        raise ValueError(f"message {index}: tool_calls must be a list")
    parts: list[Part] = []
    for k, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"message {index}: tool_calls[{k}] has no function name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # show the model what it actually sent
        if after_content or k:
            parts.append(Part("\n", True))
        if dialect == LLAMA3:
            body = json.dumps({"name": fn["name"], "parameters": args}, ensure_ascii=False)
            parts.append(Part(body))
            continue
        body = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
        parts += [Part("<tool_call>", True), Part(body), Part("</tool_call>", True)]
    return parts


class ChatFormatter:
    """Renders chats with a model's jinja template and encodes them without role injection."""

    stop_strings: tuple[str, ...] = ()  # turns end on a token (see stop_token_ids), not a string

    def __init__(self, tokenizer: Tokenizer, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_source = template or tokenizer.chat_template or CHATML_TEMPLATE
        try:
            self._template = _jinja_env().from_string(self.template_source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.tool_role = bool(_TOOL_ROLE.search(self.template_source))
        self.tool_dialect = tool_dialect(self.template_source)
        specials = {
            tok: i
            for i, tok in zip(
                sorted(tokenizer.special_ids),
                tokenizer.convert_ids_to_tokens(sorted(tokenizer.special_ids)),
                strict=True,
            )
            if tok
        }
        self._special_ids = specials
        # The scaffolding's added tokens become their ids, special or not (our tool prompt's
        # `<tool_call>` is Qwen's token): untrusted text never yields one (Tokenizer.encode).
        scaffold = {tok: i for i, tok in zip(sorted(tokenizer.added_ids), tokenizer
                    .convert_ids_to_tokens(sorted(tokenizer.added_ids)), strict=True) if tok}
        self._scaffold_ids = scaffold
        self.scaffold_pattern = (
            re.compile("|".join(re.escape(t) for t in sorted(scaffold, key=len, reverse=True)))
            if scaffold
            else None
        )
        self.bos_token = self._token_text(tokenizer.bos_token_id)
        eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.eos_token = self._token_text(eos)

    @property
    def stop_token_ids(self) -> list[int]:
        """EOS ids plus the template's end-of-turn token: generation stops on any of them."""
        ids = list(self.tokenizer.eos_token_ids)
        for tok in _END_OF_TURN:
            i = self._special_ids.get(tok)
            if i is not None and tok in self.template_source and i not in ids:
                ids.append(i)
        return ids

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        tool_instructions: str | None = None,
    ) -> str:
        """The prompt as text, for display and debugging (encode() is what the model sees)."""
        turns = normalize_messages(messages, tools, tool_role=self.tool_role,
                                   dialect=self.tool_dialect, tool_instructions=tool_instructions)
        return self.render_turns(turns, add_generation_prompt, lambda text: text, _now())

    def encode(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        tool_instructions: str | None = None,
    ) -> list[int]:
        """Prompt token ids in which only the template's scaffolding can produce special tokens.
        `tool_instructions`: the tools' section's template (tool_prompt_parts); None: built-in."""
        turns = normalize_messages(messages, tools, tool_role=self.tool_role,
                                   dialect=self.tool_dialect, tool_instructions=tool_instructions)
        now = _now()  # one clock for both renderings, so a date in the template cannot differ
        reference = self.render_turns(turns, add_generation_prompt, lambda text: text, now)
        nonce = secrets.token_hex(8)
        texts: list[str] = []

        def sentinel(text: str) -> str:
            # Empty text gets no sentinel: `{% if content %}` must see the same truthiness.
            if not text:
                return ""
            texts.append(text)
            return f"<<oc-untrusted-{nonce}-{len(texts) - 1}>>"

        marked = self.render_turns(turns, add_generation_prompt, sentinel, now)
        pieces = re.split(f"<<oc-untrusted-{nonce}-(\\d+)>>", marked)
        values = self._matching_values(pieces, texts, turns, reference)
        ids = self.encode_pieces(pieces, values)
        tok = self.tokenizer
        if tok.add_bos and tok.bos_token_id is not None and ids[:1] != [tok.bos_token_id]:
            ids.insert(0, tok.bos_token_id)
        return ids

    def render_turns(
        self,
        turns: list[Turn],
        add_generation_prompt: bool,
        untrusted: Callable[[str], str],
        now: datetime,
    ) -> str:
        """`turns` through the template; `untrusted` maps each untrusted text to what is written
        in its place (itself, or a sentinel)."""
        messages = [
            {
                "role": t.role,
                "content": "".join(p.text if p.trusted else untrusted(p.text) for p in t.parts),
            }
            for t in turns
        ]
        try:
            return self._template.render(
                messages=messages,
                # Tools are already in the system turn as our own text; a template's native tool
                # rendering would put their untrusted descriptions into the scaffolding.
                tools=None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                strftime_now=now.strftime,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template rejected the conversation: {exc}") from exc

    def _matching_values(
        self, pieces: list[str], texts: list[str], turns: list[Turn], reference: str
    ) -> list[str]:
        """The untrusted texts as the template placed them; raises if they cannot be located.

        Each text may appear as given, trimmed (`| trim`), or JSON-escaped inside a string
        (`| tojson`: Llama 3.1's and 3.2's templates write tool results so), each text its own
        way. They are matched left to right against the reference rendering: a form is taken
        where the scaffolding that follows it in the marked rendering follows it there too."""
        stripped = _stripped_texts(turns)
        chosen: dict[int, str] = {}
        at = 0
        for k, piece in enumerate(pieces):
            if k % 2 == 0:
                if not reference.startswith(piece, at):
                    break
                at += len(piece)
                continue
            index, after = int(piece), pieces[k + 1]
            forms = (texts[index], stripped[index], _json_escaped(texts[index]),
                     _json_escaped(stripped[index]))
            form = next((f for f in forms if reference.startswith(f + after, at)), None)
            if form is None or chosen.setdefault(index, form) != form:  # one form per text
                break
            at += len(form)
        else:
            if at == len(reference):
                return [chosen.get(i, text) for i, text in enumerate(texts)]
        raise ValueError(
            "the chat template changes message content in a way safe encoding cannot follow "
            "(it must insert each message's content unchanged, trimmed, or as a JSON string); "
            "refusing to encode this conversation with special tokens enabled. Pass a template "
            "that inserts message['content'] as is."
        )

    def encode_pieces(self, pieces: list[str], values: list[str]) -> list[int]:
        """Special tokens from scaffolding become ids; all other text is encoded without specials.
        `pieces` alternate scaffolding and the index (as text) of an untrusted text in `values`.

        Plain scaffolding and untrusted text are encoded together in runs: scaffolding without
        special-token text encodes the same either way, and joining avoids token splits at the
        seams, so for contents with no special-token text the ids equal the naive encoding.
        """
        ids: list[int] = []
        run: list[str] = []

        def flush() -> None:
            if run:
                ids.extend(self.tokenizer.encode("".join(run), allow_special=False))
                run.clear()

        for k, piece in enumerate(pieces):
            if k % 2:
                run.append(values[int(piece)])
                continue
            pos = 0
            for m in self.scaffold_pattern.finditer(piece) if self.scaffold_pattern else ():
                run.append(piece[pos : m.start()])
                flush()
                ids.append(self._scaffold_ids[m.group()])
                pos = m.end()
            run.append(piece[pos:])
        flush()
        return ids

    # ---- internals -----------------------------------------------------------------------

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.tokenizer.convert_ids_to_tokens([token_id])[0]


def _json_escaped(text: str) -> str:
    """`text` as the chat templates' tojson writes it inside a JSON string (without the quotes)."""
    return _tojson(text)[1:-1]


def _stripped_texts(turns: list[Turn]) -> list[str]:
    """Untrusted texts as a template that trims each message's content would leave them."""
    out: list[str] = []
    for turn in turns:
        last = len(turn.parts) - 1
        for k, part in enumerate(turn.parts):
            if part.trusted or not part.text:
                continue
            text = part.text
            if k == 0:
                text = text.lstrip()
            if k == last:
                text = text.rstrip()
            out.append(text)
    return out


def _now() -> datetime:
    return datetime.now()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: unlike jinja's built-in, no HTML escaping, which would change content.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _jinja_env() -> ImmutableSandboxedEnvironment:
    # The settings transformers' apply_chat_template uses, so templates render as their authors saw.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env
