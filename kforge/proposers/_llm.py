"""What every LLM proposer shares: settings, the prompt, the retry policy and reading the reply.

A provider module (``_anthropic``, ``_openai``) only says how to send a :class:`Prompt` and how
to read its SDK's reply and errors; everything a user could notice is decided here once.
"""
from __future__ import annotations

import abc
import ast
import email.utils
import enum
import inspect
import logging
import os
import random
import re
import time
import tomllib
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from .._redact import redact
from ._base import Attempt, Proposal, ProposalRequest, ProposerError, Usage
from ._pricing import PriceLike, as_price, cost

log = logging.getLogger("kforge.proposers")

DEFAULT_MAX_TOKENS = 32768   # room for adaptive thinking before the code
DEFAULT_TIMEOUT_S = 600.0
COMPILE_LOG_CHARS = 4000


class PricingWarning(UserWarning):
    """An LLM call was recorded at $0 because no price is known for its model."""


# ----------------------------------------------------------------------------- settings


def config_path() -> Path:
    """$KFORGE_CONFIG, else $XDG_CONFIG_HOME/kforge/config.toml (~/.config by default)."""
    if os.environ.get("KFORGE_CONFIG"):
        return Path(os.environ["KFORGE_CONFIG"]).expanduser()
    root = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(root) / "kforge" / "config.toml"


def load_config(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The parsed config file, or {} when there is none."""
    file = Path(path).expanduser() if path is not None else config_path()
    if not file.exists():
        return {}
    try:
        with open(file, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProposerError(f"{file} is not valid TOML ({e}); fix it or point KFORGE_CONFIG elsewhere") from None


class Settings:
    """One proposer's settings: each looked up in its argument, then the environment, then the
    ``[section]`` table of the config file."""

    def __init__(self, section: str, path: str | os.PathLike | None = None):
        config = load_config(path)
        self.path = Path(path).expanduser() if path is not None else config_path()
        self.section = section
        self.table: Mapping[str, Any] = config.get(section, {})
        self.pricing: dict[str, PriceLike] = dict(config.get("pricing", {}))

    def get(self, key: str, arg: Any, env: Sequence[str] = (), parse: Callable[[Any], Any] = str) -> Any:
        if arg is not None:
            return arg
        for name in env:
            if os.environ.get(name):
                return _parse(parse, os.environ[name], name)
        if key in self.table:
            return _parse(parse, self.table[key], f"{key} in [{self.section}] of {self.path}")
        return None


def _parse(parse: Callable[[Any], Any], value: Any, where: str) -> Any:
    try:
        return parse(value)
    except ValueError:
        raise ValueError(f"{where} = {value!r} is not a valid {getattr(parse, '__name__', 'value')}") from None


# ----------------------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts with exponential backoff and jitter; a server's retry-after is honoured."""

    max_attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0   # cap on any one wait, a server's retry-after included

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


@dataclass(frozen=True)
class Failure:
    """One failed request as the retry loop sees it."""

    message: str
    retryable: bool
    retry_after: float | None = None


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if present."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        return max(0.0, when.timestamp() - time.time())
    return None


def status_failure(status: int, headers: Mapping[str, str], detail: str, key_hint: str) -> Failure:
    """Classify an HTTP error status: 408, 409, 429 and 5xx (529 overloaded included) are retried."""
    retry_after = parse_retry_after(headers)
    if status == 401:
        return Failure(f"the API key was rejected (HTTP 401: {detail}); {key_hint}", False)
    if status == 404:
        return Failure(f"not found (HTTP 404: {detail}); check the model name and base_url", False)
    if status == 413:
        return Failure(f"the prompt is too large (HTTP 413: {detail})", False)
    retryable = status in (408, 409, 429) or status >= 500
    return Failure(f"HTTP {status}: {detail}", retryable, retry_after)


# ----------------------------------------------------------------------------- the prompt


@dataclass(frozen=True)
class Prompt:
    """What is sent, in the order that lets providers cache it: ``system`` (the contract: same for
    every call on a backend), ``card`` (same for every call on a card), ``task`` (this call)."""

    system: str
    card: str
    task: str

    @property
    def text(self) -> str:
        return f"[system]\n{self.system}\n\n[user]\n{self.card}\n\n{self.task}"


def _header_text() -> str:
    from ..kernels import INCLUDE_DIR

    return (INCLUDE_DIR / "kforge.h").read_text()


def code_language(backend: str) -> str:
    return "cuda" if backend == "cuda" else "c"


_EXAMPLE_CUDA = r'''#include "kforge.h"

// relu on a contiguous float32 tensor: correct, not tuned.
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        y[i] = fmaxf(x[i], 0.0f);
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    int64_t n = 1;
    for (int d = 0; d < inputs[0].ndim; ++d) n *= inputs[0].sizes[d];
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 4096) blocks = 4096;
    if (blocks < 1) blocks = 1;
    relu_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
        (const float*)inputs[0].data, (float*)outputs[0].data, n);
    return (int)cudaGetLastError();
}
'''

_EXAMPLE_CPU = r'''#include "kforge.h"

/* relu on a contiguous float32 tensor: correct, not tuned. */
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)inputs[0].data;
    float* y = (float*)outputs[0].data;
    int64_t n = 1;
    for (int d = 0; d < inputs[0].ndim; ++d) n *= inputs[0].sizes[d];
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return 0;
}
'''


def example_kernel(backend: str) -> str:
    """A short kernel that satisfies the contract on ``backend`` (shown to the model)."""
    return _EXAMPLE_CUDA if backend == "cuda" else _EXAMPLE_CPU


def system_prompt(backend: str, arch: str) -> str:
    """The role, the contract and the answer format: the same for every call on one device."""
    lang = code_language(backend)
    if backend == "cuda":
        who = "CUDA performance engineer"
        unit = f"one CUDA C++ file (.cu), compiled with nvcc -O3 -std=c++17 -arch={arch} -shared"
        extra = ("- Launch only on the given stream, `(cudaStream_t)stream`; never synchronise the "
                 "device, never allocate or free device memory.\n"
                 "- Return (int)cudaGetLastError() after your launches.\n"
                 "- No libraries beyond the CUDA runtime and headers (no cuBLAS, cuDNN, CUTLASS, torch).\n")
    else:
        who = "CPU performance engineer (C, SIMD, OpenMP)"
        unit = "one C file (.c), compiled with gcc -O3 -march=native -std=gnu11 -fopenmp -shared"
        extra = ("- `stream` is NULL; run synchronously and return 0 when done. OpenMP and compiler "
                 "vector extensions are allowed; no other libraries.\n")
    return f"""You are an expert {who}. You write one kernel at a time for kforge, which compiles it, \
checks it against eager PyTorch on captured and random inputs, and times it against eager. \
The goal: a kernel that is correct and faster than eager PyTorch for one exact operator signature.

# The kernel contract
A candidate is {unit}. It includes "kforge.h" and defines the entry point kf_launch. The header:

```c
{_header_text().strip()}
```

Rules:
- inputs[] and outputs[] follow the order in the operator description; sizes and strides are in \
elements. Honour the strides you are given.
- Outputs are allocated by the harness with the listed shapes, dtypes and strides; they are poisoned \
before each run, so write every element of every output. Never modify an input.
- You may specialise for the exact shapes, dtypes, strides and parameters given (bake them in as \
constants): the kernel is only ever called with that signature.
- Optional scratch memory: define `KF_ENTRY size_t kf_workspace_bytes(void)`; that many \
uninitialised bytes arrive as `workspace`.
{extra}- Match eager's numerics within the stated tolerance; accumulate half and bfloat16 in float.

# A minimal kernel that satisfies the contract
```{lang}
{example_kernel(backend).strip()}
```

# How to answer
First line: `Intent: <one sentence: what this version does differently and why it should be faster>`.
Then exactly one fenced ```{lang} code block holding the complete source file. Keep any \
explanation short and outside the code block."""


def _callable_name(fn: Any) -> str:
    if not callable(fn):
        return repr(fn)
    module = getattr(fn, "__module__", None) or "torch.Tensor"
    module = {"torch._C._nn": "torch.nn.functional", "torch._C": "torch"}.get(module, module)
    return f"{module}.{getattr(fn, '__name__', repr(fn))}"


def _reference_source(fn: Callable) -> str:
    """The reference's source; for a lambda, just the lambda, with its free variables named."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        return _callable_name(fn)
    if getattr(fn, "__name__", "") == "<lambda>" and "lambda" in text:
        text = text[text.index("lambda"):]
        for end in range(len(text), 0, -1):
            try:
                tree = ast.parse(text[:end], mode="eval")
            except SyntaxError:
                continue
            if isinstance(tree.body, ast.Lambda):
                text = text[:end]
                break
    source = inspect.cleandoc(text) if "\n" in text else text.strip()
    free = inspect.getclosurevars(fn).nonlocals
    if free:
        source += "\n# where " + ", ".join(f"{k} = {_callable_name(v)}" for k, v in free.items())
    return source


def _tensor_line(sig: Any) -> str:
    layout = "contiguous" if sig.is_contiguous else "NOT contiguous"
    return (f"{sig.dtype}, shape ({', '.join(map(str, sig.shape))}), strides "
            f"({', '.join(map(str, sig.stride))}), {layout}, {sig.numel} elements")


def card_prompt(request: ProposalRequest) -> str:
    """The operator, its exact signature, its timing and the device: same for every call on a card."""
    from ..kernels import param_vector
    from ..ops import get_spec

    card, device = request.card, request.device
    variant = card.variant
    spec = get_spec(card.op)
    eager = (f"eager PyTorch calls {card.vendor}, a tuned vendor library" if card.vendor
             else "eager runs PyTorch's own kernel")
    lines = [
        "# The operator",
        f"{spec.name}: {spec.doc} ({spec.kind}; {eager}).",
        "Reference, the exact computation to reproduce (x = the inputs in the order below, "
        "p = the params by name):",
        "```python",
        _reference_source(spec.reference),
        "```",
        "It stands for these torch calls: "
        + ", ".join(_callable_name(t) for t in spec.targets if t is not None) + ".",
        "",
        "# The exact signature",
        variant.signature,
        "Inputs:",
    ]
    for i, (name, sig) in enumerate(zip(spec.inputs, variant.inputs)):
        lines.append(f"  inputs[{i}] {name}: " + (_tensor_line(sig) if sig is not None
                                                  else "absent (data == NULL)"))
    lines.append("Outputs (allocated by the harness):")
    for i, sig in enumerate(variant.outputs):
        rtol, atol = spec.tolerance(sig.dtype)
        lines.append(f"  outputs[{i}]: {_tensor_line(sig)}; tolerance rtol={rtol:g}, atol={atol:g} "
                     f"(relative to the reference's scale)")
    lines.append("Params (params[] holds them as doubles in this order; None is NaN; strings are not "
                 "passed, bake them in):")
    index = 0
    for name, value in variant.params:
        flat = param_vector(replace(variant, params=((name, value),)))
        where = (f"params[{index}]" if len(flat) == 1 else f"params[{index}:{index + len(flat)}]"
                 if flat else "not passed")
        lines.append(f"  {name} = {value!r} -> {where}")
        index += len(flat)
    roofline = card.roofline_us(device.bandwidth_gbs)
    lines += [
        "",
        "# Performance",
        f"Eager: {card.eager_us:.2f} us per call; the model makes {card.calls} such calls, "
        f"{card.share * 100:.0f}% of its captured operator time.",
        f"Bytes floor: {variant.io_bytes} bytes (each input read once, each output written once) "
        f"take {roofline:.3g} us at {device.bandwidth_gbs:.0f} GB/s; eager runs at "
        f"{roofline / card.eager_us * 100 if card.eager_us else 0:.2g}% of that floor.",
        f"Device ({request.backend}): {device.describe()}",
    ]
    return "\n".join(lines)


_ADVICE = {
    "compile_error": "It did not compile. Fix the errors in the log and keep the idea.",
    "rejected": "The source check refused it before compiling (see the log): a kernel only computes on its "
                "tensors: no process, file, network, environment, signal, assembly or load-time code.",
    "launch_error": "kf_launch returned an error: check the launch configuration (block size, grid "
                    "limits, shared memory, which needs cudaFuncSetAttribute above 48 KB).",
    "crashed": "It crashed the worker: look for out-of-bounds indexing, wrong strides or a wrong dtype "
               "cast.",
    "timed_out": "It did not finish in time: look for an infinite loop or a deadlock at a barrier.",
    "wrong_result": "It ran but disagreed with eager: find the bug (indexing, strides, reduction order, "
                    "precision, an output element never written).",
    "slower": "It is correct but slower than eager: try a different approach, not a small tweak.",
    "no_gain": "It is correct but no faster than eager: find where the time goes and remove it.",
    "faster": "It is correct and faster than eager: push further toward the bytes floor.",
}


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut in the middle to about ``limit`` characters (the first errors matter most)."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


def _fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} us"


def _feedback(attempt: Attempt) -> list[str]:
    ev = attempt.evaluation
    lines = [f"Status: {ev.status.value}" + (f". {ev.message}" if ev.message else "")]
    if ev.compile_log.strip():
        lines += ["Compile log:", "```", truncate_middle(ev.compile_log.strip(), COMPILE_LOG_CHARS), "```"]
    errors = [f"{label} {value:.3g}" for label, value in (
        ("max abs error", ev.max_abs_error), ("max rel error", ev.max_rel_error),
        ("mismatched fraction", ev.mismatch_fraction)) if value is not None]
    if errors:
        lines.append("Accuracy: " + ", ".join(errors))
    if ev.candidate_us is not None:
        timing = f"Time: {_fmt_us(ev.candidate_us)} vs eager {_fmt_us(ev.eager_us)}, speedup {ev.speedup:.2f}x"
        if ev.roofline_fraction is not None:
            timing += f", {ev.roofline_fraction * 100:.0f}% of the bytes floor"
        lines.append(timing)
    if ev.checks:
        lines.append("Checks passed: " + ", ".join(ev.checks))
    return lines


def _outcome(attempt: Attempt) -> str:
    ev = attempt.evaluation
    if ev.status.is_correct:
        return f"{ev.status.value}, {ev.speedup:.2f}x"
    return ev.status.value + (f": {ev.message}" if ev.message else "")


def task_prompt(request: ProposalRequest) -> str:
    """The parent, its feedback, its lineage and its failed siblings: what changes call to call."""
    lang = code_language(request.backend)
    parent = request.parent
    if parent is None:
        return ("# Your task\nWrite the first candidate for this signature: correct first, then fast. "
                "Reply with the Intent line and one complete code block.")
    lines = ["# Your task", f"Revise candidate #{parent.candidate_id} ({parent.intent or 'no intent given'}).",
             "", f"## Candidate #{parent.candidate_id}", f"```{lang}", parent.source.strip(), "```",
             "", "## Its evaluation", *_feedback(parent)]
    if request.lineage:
        lines += ["", "## How it was reached (oldest first)"]
        lines += [f"- #{a.candidate_id} {a.intent or 'no intent given'}: {_outcome(a)}" for a in request.lineage]
    failed = [s for s in request.siblings if not s.evaluation.status.is_win]
    if failed:
        lines += ["", "## Revisions of this candidate already tried that did not win (do not repeat them)"]
        lines += [f"- #{s.candidate_id} {s.intent or 'no intent given'}: {_outcome(s)}" for s in failed]
    lines += ["", "## What to do", _ADVICE[parent.evaluation.status.value],
              "Reply with the Intent line and one complete code block."]
    return "\n".join(lines)


def build_prompt(request: ProposalRequest) -> Prompt:
    return Prompt(system_prompt(request.backend, request.device.arch), redact(card_prompt(request)),
                  redact(task_prompt(request)))  # NB: the task quotes compile logs and crash messages


# ----------------------------------------------------------------------------- the reply


class Stop(enum.Enum):
    """Why the model stopped writing."""

    COMPLETE = "complete"
    TRUNCATED = "truncated"   # hit max tokens or the context window
    REFUSED = "refused"


@dataclass(frozen=True)
class Reply:
    """One provider response, reduced to what kforge keeps."""

    text: str
    stop: Stop
    usage: Usage              # tokens and model as the server reported them; dollars are added later


@dataclass(frozen=True)
class CodeBlock:
    lang: str
    code: str
    closed: bool


_C_LANGS = {"", "cuda", "cu", "c", "cpp", "c++", "cc", "cxx", "h", "hpp"}
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+#.-]*)")
_INTENT = re.compile(r"^[\s>*_#`-]*intent[*_`]*\s*:[*_`\s]*(.+?)[*_`\s]*$", re.IGNORECASE | re.MULTILINE)


def code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced block in ``text``; a last block left open is returned with closed=False."""
    blocks: list[CodeBlock] = []
    fence, lang, body = "", "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not fence:
            if match:
                fence, lang, body = match.group(1), match.group(2).lower(), []
        elif match and line.strip() == match.group(1) and match.group(1).startswith(fence):
            blocks.append(CodeBlock(lang, "\n".join(body) + "\n", True))
            fence = ""
        else:
            body.append(line)
    if fence:
        blocks.append(CodeBlock(lang, "\n".join(body) + "\n", False))
    return blocks


def extract_code(text: str, *, truncated: bool) -> str | None:
    """The kernel source in a reply: the last block that defines kf_launch, else the longest C/CUDA
    block. A block cut off by the token limit is never taken; one merely left open otherwise is."""
    blocks = [b for b in code_blocks(text) if b.closed or not truncated]
    with_entry = [b for b in blocks if "kf_launch" in b.code]
    if with_entry:
        return with_entry[-1].code
    c_like = [b for b in blocks if b.lang in _C_LANGS and b.code.strip()]
    return max(c_like, key=lambda b: len(b.code)).code if c_like else None


def extract_intent(text: str) -> str:
    match = _INTENT.search(text)
    return match.group(1).strip()[:300] if match else "no intent given"


# ----------------------------------------------------------------------------- the proposer


class LLMProposer(abc.ABC):
    """Shared behaviour of the LLM proposers: settings, prompt, retries, parsing and accounting.

    Subclasses set ``name``, ``section`` (their config-file table) and ``default_model``, and
    implement ``_connect``, ``_send`` and ``_failure``.
    """

    name: str
    section: ClassVar[str]
    default_model: ClassVar[str | None]
    base_url_env: ClassVar[tuple[str, ...]]

    def __init__(self, model: str | None = None, *, api_key: str | None = None,
                 base_url: str | None = None, max_tokens: int | None = None,
                 timeout_s: float | None = None, max_attempts: int | None = None,
                 max_wait_s: float | None = None, pricing: Mapping[str, PriceLike] | None = None,
                 config: str | os.PathLike | None = None, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        settings = Settings(self.section, config)
        self.base_url: str | None = settings.get("base_url", base_url, self.base_url_env)
        self.model: str | None = settings.get("model", model, ("KFORGE_MODEL",)) or self.default_model
        self.api_key: str | None = self._api_key(settings, api_key)
        self.max_tokens: int = settings.get("max_tokens", max_tokens, ("KFORGE_MAX_TOKENS",), int) \
            or DEFAULT_MAX_TOKENS
        self.timeout_s: float = settings.get("timeout_s", timeout_s, ("KFORGE_TIMEOUT_S",), float) \
            or DEFAULT_TIMEOUT_S
        attempts = settings.get("max_attempts", max_attempts, ("KFORGE_MAX_ATTEMPTS",), int)
        wait = settings.get("max_wait_s", max_wait_s, ("KFORGE_MAX_WAIT_S",), float)
        self.retry = RetryPolicy(attempts or RetryPolicy.max_attempts, max_delay_s=wait or RetryPolicy.max_delay_s)
        if self.max_tokens < 1 or self.timeout_s <= 0 or self.retry.max_attempts < 1:
            raise ValueError("max_tokens and max_attempts must be at least 1 and timeout_s positive; got "
                             f"{self.max_tokens}, {self.retry.max_attempts}, {self.timeout_s}")
        self.pricing: dict[str, PriceLike] = {**settings.pricing, **(pricing or {})}
        for value in self.pricing.values():
            as_price(value)  # fail now, not after the first paid call
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._unpriced_warned: set[str] = set()
        self._client = self._connect()

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self.model!r}{where})"

    # -- provider hooks

    @abc.abstractmethod
    def _api_key(self, settings: Settings, arg: str | None) -> str | None:
        """The key to send, or raise ProposerError saying how to provide one."""

    @abc.abstractmethod
    def _connect(self) -> Any:
        """The SDK client, with the SDK's own retries off (``max_retries=0``)."""

    @abc.abstractmethod
    def _send(self, prompt: Prompt) -> Reply:
        """One request; SDK exceptions propagate to ``_failure``."""

    @abc.abstractmethod
    def _failure(self, exc: Exception) -> Failure | None:
        """How the retry loop should treat ``exc``; None for an exception that is not the API's."""

    def _is_free(self) -> bool:
        """Whether calls cost nothing when the model has no price (self-hosted endpoints)."""
        return False

    # -- the call

    def propose(self, request: ProposalRequest) -> Proposal:
        prompt = build_prompt(request)
        start = time.perf_counter()
        reply = self._send_with_retries(prompt)
        usage = self._priced(reply.usage, time.perf_counter() - start)
        if reply.stop is Stop.REFUSED:
            raise ProposerError(f"{self.name}: the model declined to answer (refusal); the tokens were "
                                "recorded. Retry, or use another model", usage, prompt.text, reply.text)
        source = extract_code(reply.text, truncated=reply.stop is Stop.TRUNCATED)
        if source is None:
            reason = (f"the reply was cut off at max_tokens={self.max_tokens} before a complete code "
                      "block; raise max_tokens" if reply.stop is Stop.TRUNCATED
                      else "the reply has no C/CUDA code block")
            raise ProposerError(f"{self.name}: {reason}", usage, prompt.text, reply.text)
        return Proposal(source=source, intent=extract_intent(reply.text), usage=usage,
                        prompt=prompt.text, response=reply.text)

    def _send_with_retries(self, prompt: Prompt) -> Reply:
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                return self._send(prompt)
            except Exception as exc:
                failure = self._failure(exc)
                if failure is None:
                    raise
                if not failure.retryable or attempt == self.retry.max_attempts:
                    tries = f" (gave up after {attempt} attempts)" if failure.retryable else ""
                    raise ProposerError(f"{self.name} ({self.model}): {failure.message}{tries}",
                                        Usage(model=self.model or ""), prompt.text) from exc
                wait = self.retry.delay(attempt, failure.retry_after, self._rng)
                log.warning("%s: %s; retrying in %.1f s (attempt %d of %d)", self.name, failure.message,
                            wait, attempt + 1, self.retry.max_attempts)
                self._sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

    def _priced(self, usage: Usage, latency_s: float) -> Usage:
        model = usage.model or self.model or ""
        price = cost(usage, model, self.pricing)
        if not price.priced and not self._is_free() and model not in self._unpriced_warned:
            self._unpriced_warned.add(model)
            warnings.warn(f"kforge has no price for model {model!r}: its calls are recorded at $0. Add "
                          f"[pricing.\"{model}\"] with input/output dollars per million tokens to "
                          f"{config_path()} or pass pricing={{...}}", PricingWarning, stacklevel=3)
        return replace(usage, model=model, dollars=price.dollars, latency_s=latency_s)


def missing_key(provider: str, env: str, section: str) -> ProposerError:
    return ProposerError(
        f"no {provider} API key: set {env}, pass api_key=..., or add api_key under [{section}] in "
        f"{config_path()}. To search without an LLM, use proposer=\"builtin\" (no key needed).")
