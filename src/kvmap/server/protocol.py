"""Request and response bodies of the OpenAI-compatible API, with vLLM's field names.

Requests are pydantic models: a body that does not fit (wrong type, out of range) is a
400 with the field named (see ``errors``). Unknown fields are ignored, as vLLM does.
Fields the engine cannot honour are accepted only at their neutral value (``n=1``,
``logprobs=null``, penalties 0, ...) and rejected otherwise with the field named --
``unsupported`` lists them. Non-streaming responses are built as these models by the
routes (``routes/``); streamed chunks are dicts of the same fields.

Every text field of a request is ``Text``: a string UTF-8 can encode. JSON may carry a
lone surrogate (``"\\ud800"``), which no tokenizer, hash or response can encode; it is a
400 naming its field (``messages.0.content``, ``cache_salt``, ...) when the body is
read -- before a route echoes the text or tokenizes it (issue 38: a 500 before).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from kvmap.engine.refusal import unencodable_at
from kvmap.request import SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20           # top log-probabilities one token may ask for (vLLM's default)
MIN_TEMPERATURE = 0.01      # vLLM's floor: logits / 1e-300 overflow to inf and NaN the softmax
# top_p below float32's smallest subnormal rounds to 0 in the sampler's comparison and
# would drop every token; any top_p <= 1/vocab keeps exactly the top token, so this
# floor changes no result for vocabularies up to 10^6
MIN_TOP_P = 1e-6
Float = Annotated[float, Field(allow_inf_nan=False)]


def _encodable(text: str) -> str:
    at = unencodable_at(text)
    if at is not None:
        raise ValueError(f"holds a lone surrogate (U+{ord(text[at]):04X} at character "
                         f"{at}), which is not valid Unicode text")
    return text


Text = Annotated[str, AfterValidator(_encodable)]      # a request's text field


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)   # "10" is not an int


class StreamOptions(_Base):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(_Base):
    """Fields shared by completions and chat completions."""

    model: Text | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None          # vLLM extra; -1/0 = off
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None   # vLLM extra
    ignore_eos: bool = False                                   # vLLM extra
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Float | None = 0.0
    frequency_penalty: Float | None = 0.0
    logit_bias: dict[str, Float] | None = None
    user: Text | None = None
    return_token_ids: bool = False       # vLLM extra: token ids in the response
    cache_salt: Text | None = None       # vLLM extra: this tenant's prefix-cache salt

    def unsupported(self) -> tuple[str, str] | None:
        """(field, why) for the first field set to a value the engine cannot honour."""
        if self.n != 1:
            return "n", f"n={self.n} is not supported; only n=1"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                return name, f"{name}={getattr(self, name)} is not supported; only 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """Raises ValueError naming the bad field."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=_temperature(self.temperature),
            top_p=1.0 if self.top_p is None else max(float(self.top_p), MIN_TOP_P),
            top_k=max(0, self.top_k or 0), seed=self.seed, stop=tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos)


def _temperature(value: float | None) -> float:
    """OpenAI's default 1.0; 0 is greedy; (0, 0.01) is raised to 0.01 as vLLM does."""
    if value is None:
        return 1.0
    return 0.0 if value == 0 else max(float(value), MIN_TEMPERATURE)


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``. ``prompt``: a string, a list of token ids, or a list
    holding one of those (batches of several prompts are rejected: send one per request)."""

    prompt: Text | list[Annotated[int, Field(ge=0)]] | list[Text] | list[list[
        Annotated[int, Field(ge=0)]]]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0)] | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: Text | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """With ``logprobs``: the output's log-probabilities, and with ``echo`` the
        prompt's too, gathered by the request as it runs (``kvmap.engine.logprobs``)."""
        params = super().sampling_params(default_max_tokens)
        if self.logprobs is None:
            return params
        return replace(params, logprobs=self.logprobs,
                       prompt_logprobs=self.logprobs if self.echo else None)

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs is not None and self.logprobs > MAX_LOGPROBS:
            return "logprobs", (f"logprobs={self.logprobs} is above this server's limit "
                                f"of {MAX_LOGPROBS}")
        if self.logprobs is not None and self.stream:
            return "logprobs", "logprobs are supported without stream only"
        if self.best_of not in (None, 1):
            return "best_of", f"best_of={self.best_of} is not supported; only 1"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().unsupported()


class ContentPart(_Base):
    type: Literal["text"]
    text: Text


class ChatMessage(_Base):
    role: Text
    content: Text | list[ContentPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Base):
    type: Text


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True          # vLLM extra
    echo: bool = False                          # vLLM extra: prefix the last message

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported"
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format", (f"response_format type "
                                       f"{self.response_format.type!r} is not supported")
        if self.tools:
            return "tools", "tools are not supported"
        return super().unsupported()


class TokenizeRequest(_Base):
    """``POST /tokenize``: either ``prompt`` or ``messages`` (vLLM's two forms)."""

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Base):
    model: Text | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


# ---- responses (schema only; bodies are built as dicts) ----------------------------------
class Usage(_Base):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Base):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Base):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class CompletionResponse(_Base):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class ChatResponseMessage(_Base):
    role: str
    content: str


class ChatChoice(_Base):
    index: int
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Base):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class ModelCard(_Base):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvmap"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(_Base):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Base):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(_Base):
    error: ErrorInfo
