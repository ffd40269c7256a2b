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
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode ({e.reason} at character {e.start})") from None
    return text


Text = Annotated[str, Strict(), AfterValidator(_valid_unicode)]
Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Lenient):
    include_usage: Bool | None = False
    continuous_usage_stats: Bool | None = False


class _SamplingRequest(_Lenient):
    model: Text | None = None
    max_tokens: Int | None = Field(None, description="chat's default: whatever room max_model_len leaves")
    temperature: Finite | None = Field(None, ge=0.0, le=2.0, description="default 1.0, at most 2; below 1e-5 is greedy "
                                                                         "(as vLLM)")
    top_p: Finite | None = Field(None, gt=0.0, le=1.0, description="default 1.0")
    n: Int | None = Field(None, ge=1, description="choices per prompt; default 1")
    seed: Int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="any 64-bit integer; null = random")
    stop: Text | list[Text] | None = None
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
    stop_token_ids: list[Int] | None = Field(None, description="vLLM's: token ids that end a choice (counted, "
                                                                  "their text left out)")
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


class CompletionRequest(_SamplingRequest):
    prompt: Text | list[Int] | list[Text] | list[list[Int]]
    max_tokens: Int | None = Field(16, description="16, as OpenAI's and vLLM's completions; null: whatever room "
                                                   "max_model_len leaves")  # fmt: skip
    echo: Bool | None = Field(False, description="prepend the prompt (and, with logprobs, its token logprobs)")
    logprobs: Int | None = Field(None, ge=0, description="top entries per token (0: only the chosen token)")


class ContentPart(_Lenient):
    type: Text
    text: Text | None = None


class ChatMessage(_Lenient):
    role: Text
    content: Text | list[ContentPart] | None = None


class ChatRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, description="wins over max_tokens")
    logprobs: Bool | None = False
    top_logprobs: Int | None = Field(None, ge=0)
    # vLLM's chat-template knobs: this server renders every chat the one way
    add_generation_prompt: Bool | None = None
    continue_final_message: Bool | None = None
    chat_template: Text | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    echo: Bool | None = None  # vLLM's: the reply opens with the last message when the roles match


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


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
