"""The request bodies the API takes (OpenAI's and vLLM's names), validated by pydantic so that a bad
field is a 400 naming it, and turned into the engine's SamplingParams.

Fields no model here declares are ignored, as vLLM ignores them (clients send `store`, `metadata`
and the like); the ones that would change what is generated and that this server does not do are
refused by name instead of ignored."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.chat import split_tool_instructions
from engine.sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutputs
from openclaw.serve.errors import APIError, bad_request, from_validation_error

NOT_YET = "is not supported yet by this server"
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
# A body must arrive within this once its head has: a client that sends a head and then nothing
# holds a connection no longer (the listener bounds the head's time, aiohttp nothing after it).
BODY_TIMEOUT_S = 60.0


class Body(BaseModel):
    # strict: "0.5" for a number or "true" for a boolean is a client's mistake worth a 400.
    model_config = ConfigDict(extra="ignore", strict=True)

    def check(self) -> None:
        """What no one field can say, raised as the APIError naming the field at fault."""


# ---- chat messages and tools ------------------------------------------------------------------

class FunctionCall(Body):
    name: str
    arguments: str = "{}"  # a JSON object, as OpenAI sends it


class ToolCall(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        if isinstance(content, list):
            for k, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"part {k}: only text parts ({{\"type\": \"text\", \"text\": "
                                     "...}) are supported; this model reads no images or audio")
        return content

    @model_validator(mode="after")
    def _check(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages")
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def engine_dict(self) -> dict[str, Any]:
        """The message as the engine's chat template takes it ("developer" is OpenAI's newer
        name for the system role)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Body):
    include_usage: bool = False


# ---- what every generating request shares ------------------------------------------------------

class SamplingFields(Body):
    model: str | None = None
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    logit_bias: dict[str, float] | None = None

    def check(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options: only allowed when stream is true", "stream_options")
        if self.logit_bias:
            raise bad_request(f"logit_bias {NOT_YET}", "logit_bias")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def cache_key(self) -> str | None:
        """The prefix cache's tenant: vLLM's cache_salt, else OpenAI's user, so one user's
        cached prompts are never served to another's requests."""
        return self.cache_salt if self.cache_salt is not None else self.user

    def sampling_params(self, max_tokens: int | None, index: int = 0, **extra: Any) -> SamplingParams:
        """The engine's params for choice `index`: with a seed, each choice gets its own (seed +
        index), so n > 1 gives n different answers that still come out the same each time."""
        seed = None if self.seed is None else self.seed + index
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0, min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            seed=seed, max_tokens=max_tokens,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, **extra)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None  # null as a client may send it: no logprobs
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: dict[str, Any] | None = None
    # Ours: the template of the tools' section of the system prompt (engine.chat), None: built-in.
    tool_instructions: str | None = None

    def check(self) -> None:
        super().check()
        check_tool_instructions(self.tool_instructions)
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs: needs logprobs: true", "top_logprobs")
        check_response_format(self.response_format)
        if self.json_output and self.engine_tools() is not None:
            raise bad_request(
                f"response_format {self.response_format['type']!r} cannot be combined with tools "
                f"the model may call (tool_choice {self.engine_tool_choice()!r} constrains its "
                "output to calls); send tool_choice \"none\" or no tools", "response_format")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise bad_request(f"tool_choice {self.tool_choice!r} needs tools", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise bad_request(f"tool_choice names {self.tool_choice.function.name!r}, which is "
                                  f"not one of the tools ({', '.join(names)})", "tool_choice")

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        """The field max_new_tokens came from, as an error names it."""
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def engine_tool_choice(self) -> str | dict[str, Any]:
        if self.tool_choice is None:
            return "auto"
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.model_dump()
        return self.tool_choice

    def engine_tools(self) -> list[dict[str, Any]] | None:
        """The tools shown to the model: none with tool_choice "none", as OpenAI does."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    @property
    def engine_logprobs(self) -> int | None:
        """The engine's logprobs: the top_logprobs asked for (0 for the sampled token's alone),
        None without logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def json_output(self) -> bool:
        return self.response_format is not None and self.response_format["type"] != "text"

    def structured_outputs(self) -> StructuredOutputs | None:
        """The engine's constraint for response_format: a json_schema without a schema is any
        JSON object, as json_object is. `strict` changes nothing: the output always matches."""
        if not self.json_output:
            return None
        schema = (self.response_format.get("json_schema") or {}).get("schema")
        return StructuredOutputs(json=schema) if schema is not None else \
            StructuredOutputs(json_object=True)


def check_response_format(fmt: dict[str, Any] | None) -> None:
    """OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or {"type":
    "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. The schema itself
    is the engine's to judge, when the request is added."""
    if fmt is None:
        return
    if fmt.get("type") not in RESPONSE_FORMATS:
        raise bad_request(f"response_format.type: must be one of {', '.join(RESPONSE_FORMATS)}",
                          "response_format.type")
    if fmt["type"] != "json_schema":
        return
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request('response_format.json_schema: required with type "json_schema", e.g. '
                          '{"name": "answer", "schema": {"type": "object", ...}}',
                          "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise bad_request("response_format.json_schema.name: required, 1 to 64 letters, digits, "
                          "_ or -", "response_format.json_schema.name")
    for key, kind, what in (("schema", dict, "a JSON Schema object"), ("strict", bool, "a boolean"),
                            ("description", str, "a string")):
        if spec.get(key) is not None and not isinstance(spec[key], kind):
            raise bad_request(f"response_format.json_schema.{key}: must be {what}",
                              f"response_format.json_schema.{key}")


Prompt = str | list[int]


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(
        min_length=1)] | Annotated[list[list[int]], Field(min_length=1)]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def check(self) -> None:
        super().check()
        if self.echo:
            raise bad_request("echo is not supported by this server", "echo")
        if self.suffix:
            raise bad_request("suffix is not supported by this server (no fill-in-the-middle)",
                              "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_request("best_of: only best_of = n is supported", "best_of")

    def prompts(self) -> list[Prompt]:
        """The prompts, one per batch entry: a text or a list of token ids each."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TokenizeRequest(Body):
    """vLLM's two shapes in one: a completion's `prompt`, or a chat's `messages` (and `tools`)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tool_instructions: str | None = None  # as ChatCompletionRequest's

    def check(self) -> None:
        check_tool_instructions(self.tool_instructions)
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give either prompt (a completion's text) or messages (a chat)",
                              "prompt" if self.prompt is None else "messages")


def check_tool_instructions(template: str | None) -> None:
    """A 400 naming `tool_instructions` for a template without its one `{tools}`."""
    if template is not None:
        try:
            split_tool_instructions(template)
        except ValueError as exc:
            raise bad_request(str(exc), "tool_instructions") from None


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


B = TypeVar("B", bound=Body)


async def read(request: web.Request, model: type[B]) -> B:
    """The request's JSON body as `model` (see parse); a 408 for a body that does not arrive
    within BODY_TIMEOUT_S."""
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            raw = await request.read()
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {BODY_TIMEOUT_S:.0f} s",
                       code="timeout") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise bad_request("the body is not valid JSON") from None
    return parse(model, data)


def parse(model: type[B], data: Any) -> B:
    """The body as `model`, or the APIError of a 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    body.check()
    return body
