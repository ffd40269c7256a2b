"""The OpenAI wire format as pydantic models: what ``/openapi.json`` declares and what request
bodies are validated against.

Fields follow the OpenAI API reference and vLLM's ``vllm/entrypoints/openai/protocol.py``:
every optional knob accepts an explicit ``null`` (= its default), ``seed`` is any 64-bit
integer, numbers must be finite, and text must be valid Unicode (no lone surrogates). Types are
strict, as OpenAI's API checks them: ``true`` is no integer, ``"4"`` no number, ``"yes"`` no
boolean (an integer is a number). Unknown
fields are ignored, as OpenAI-compatible servers do, so benchmark clients that send extra
knobs still work; known fields this server does not implement (``tools``, ``response_format``,
penalties, ...) are declared so that ``protocol`` can refuse them by name.

The schema refuses what the server refuses: a knob it does not implement lists the values it
takes (``NOT_IMPLEMENTED``: those that ask for nothing), an empty prompt or stop string, a
negative token id and ``max_tokens`` 0 (but with completions' ``echo``) are outside it. Those
bounds are declared here (``_declared``) and checked by ``protocol``, whose messages name the
value; ``openapi`` adds the bounds this server's settings set (context length, vocabulary, limits).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# the roles OpenAI's chat API takes (a message of another role is 400 there); vLLM takes any
# role its template renders, but this server's simple template writes the role into the prompt
ROLES = ("system", "user", "assistant", "tool", "developer", "function")

# What this server does not implement, and the values of each that ask for nothing (their
# default, or one that means the same): any other value is refused by name (``protocol``), and
# the schema lists these as the field's only values (``_Lenient``'s schema hook).
NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "top_k": (None, 0, -1),
    "min_p": (None, 0),
    # vLLM's extras, refused where they ask for what vLLM would do and this server does not
    "min_tokens": (None, 0),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),  # decoding skips them always
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "guided_json": (None, False, 0, "", [], {}),
    "guided_regex": (None, ""),
    "guided_choice": (None, []),
    "guided_grammar": (None, ""),
    "structured_outputs": (None, {}),
    "add_generation_prompt": (None, True),  # the prompt always ends with one
    "continue_final_message": (None, False),
    "chat_template": (None, ""),
    "chat_template_kwargs": (None, {}),
    "cache_salt": (None, ""),  # a salt for isolation, ignored, would share the cache it asked to keep apart
    "priority": (None, 0),  # vLLM refuses a priority but 0 unless its priority scheduling is on
    "logits_processors": (None, []),
}


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode ({e.reason} at character {e.start})") from None
    return text


def _declared(default: Any = ..., **schema: Any) -> Any:
    """A bound the schema states and ``protocol`` checks (so that its message names the value)."""
    return Field(default, json_schema_extra=schema)


def _list_only_values(schema: dict[str, Any]) -> None:
    for name, prop in schema.get("properties", {}).items():
        if name in NOT_IMPLEMENTED:
            prop["enum"] = list(NOT_IMPLEMENTED[name])
            prop["description"] = "not implemented by this server: any other value is refused (400)"


Text = Annotated[str, Strict(), AfterValidator(_valid_unicode)]
Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
TokenId = Annotated[int, Strict(), Field(json_schema_extra={"minimum": 0})]
Filled = Annotated[str, Strict(), AfterValidator(_valid_unicode), Field(json_schema_extra={"minLength": 1})]
_ONE_OR_MORE = Field(json_schema_extra={"minItems": 1})
Prompt = (Filled | Annotated[list[TokenId], _ONE_OR_MORE] | Annotated[list[Filled], _ONE_OR_MORE]
          | Annotated[list[Annotated[list[TokenId], _ONE_OR_MORE]], _ONE_OR_MORE])  # fmt: skip


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, json_schema_extra=_list_only_values)


class StreamOptions(_Lenient):
    include_usage: Bool | None = False
    continuous_usage_stats: Bool | None = False


class _SamplingRequest(_Lenient):
    model: Text | None = None
    max_tokens: Int | None = Field(None, description="chat's default: whatever room max_model_len leaves",
                                   json_schema_extra={"minimum": 1})  # fmt: skip
    temperature: Finite | None = Field(None, ge=0.0, le=2.0, description="default 1.0, at most 2; below 1e-5 is greedy "
                                                                         "(as vLLM)")
    top_p: Finite | None = Field(None, gt=0.0, le=1.0, description="default 1.0")
    n: Int | None = Field(None, ge=1, description="choices per prompt; default 1")
    seed: Int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="any 64-bit integer; null = random")
    stop: Filled | list[Filled] | None = None
    stream: Bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: Bool | None = False
    user: Text | None = None
    return_tokens_as_token_ids: Bool | None = Field(False, description="vLLM's: logprobs name tokens 'token_id:<id>'")
    # declared so that they are refused by name (see protocol.UNSUPPORTED), not silently ignored,
    # on either endpoint (a client that sends chat's tools to completions learns it too)
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    logit_bias: dict[str, Finite] | None = None
    response_format: dict[str, Any] | None = None
    best_of: Int | None = None
    top_k: Int | None = None
    min_p: Finite | None = None
    repetition_penalty: Finite | None = None
    suffix: Text | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: Bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM's: token ids that end a choice (counted, "
                                                                      "their text left out)")  # fmt: skip
    # vLLM's extra sampling and output knobs that would change what is generated or returned
    min_tokens: Int | None = None
    include_stop_str_in_output: Bool | None = None
    skip_special_tokens: Bool | None = None
    truncate_prompt_tokens: Int | None = None
    allowed_token_ids: list[Int] | None = None
    bad_words: list[Text] | None = None
    prompt_logprobs: Int | None = None
    use_beam_search: Bool | None = None
    guided_json: Any = None
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None
    guided_grammar: Text | None = None
    structured_outputs: dict[str, Any] | None = None
    cache_salt: Text | None = None  # vLLM salts the prefix-cache hashes with it; refused, not ignored
    priority: Int | None = None
    logits_processors: list[Any] | None = None


def _max_tokens_0_only_with_echo(schema: dict[str, Any]) -> None:
    _list_only_values(schema)
    schema["anyOf"] = [{"properties": {"echo": {"const": True}}, "required": ["echo"]},
                       {"properties": {"max_tokens": {"not": {"const": 0}}}}]  # fmt: skip


class CompletionRequest(_SamplingRequest):
    model_config = ConfigDict(json_schema_extra=_max_tokens_0_only_with_echo)
    prompt: Prompt
    max_tokens: Int | None = Field(16, description="16, as OpenAI's and vLLM's completions; null: whatever room "
                                                   "max_model_len leaves; 0 only with echo",
                                   json_schema_extra={"minimum": 0})  # fmt: skip
    echo: Bool | None = Field(False, description="prepend the prompt (and, with logprobs, its token logprobs)")
    logprobs: Int | None = Field(None, ge=0, description="top entries per token (0: only the chosen token)")


def _text_required(schema: dict[str, Any]) -> None:
    schema["required"] = ["type", "text"]


class ContentPart(_Lenient):
    model_config = ConfigDict(json_schema_extra=_text_required)  # a text part without its text is refused
    type: Text = _declared(enum=["text"])  # the only kind this server reads
    text: Text | None = _declared(None, type="string")


class ChatMessage(_Lenient):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Text | list[ContentPart] | None = None


class ChatRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, description="wins over max_tokens", json_schema_extra={"minimum": 1})
    logprobs: Bool | None = False
    top_logprobs: Int | None = Field(None, ge=0)
    # vLLM's chat-template knobs: this server renders every chat the one way
    add_generation_prompt: Bool | None = None
    continue_final_message: Bool | None = None
    chat_template: Text | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    echo: Bool | None = _declared(None, enum=[False, None])  # vLLM's: the reply opens with the last message (refused)


# -- responses (documented in /openapi.json; the routes build plain dicts) ----------------


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class HealthStatus(BaseModel):
    status: Literal["ok"]


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
