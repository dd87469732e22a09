"""The prompt an LLM proposer sends: the kernel contract, the card, and feedback on earlier attempts."""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable

from .._redact import redact
from ._base import Attempt, ProposalRequest


COMPILE_LOG_CHARS = 4000


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
- The source is checked before compiling and refused if it has inline assembly, code that runs at load \
(constructors, global objects with constructors), `##` token pasting, or calls to process, file, network, \
environment, signal or dynamic-loading functions; include only kforge.h, standard C headers and the CUDA headers.

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
        spec.source(variant) if hasattr(spec, "source") else _reference_source(spec.reference),
        "```",
        "It stands for these calls: "
        + ", ".join([_callable_name(t) for t in spec.targets if t is not None]
                    + [f"{f.path} (a Python function of the model's library; eager timings run it)"
                       for f in getattr(spec, "functions", ())]) + ".",
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
    if hasattr(spec, "building_blocks"):   # a vendor-headed chain: the libraries and the problem as they name it
        lines += ["", spec.building_blocks(variant, request.backend)]
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
    "timing_mismatch": "Its timed calls disagreed with the judge's clock: a kernel must do the same work on "
                       "every call (no caching, call counting or work left running after it returns).",
    "infra_error": "The evaluation failed for reasons outside the kernel; improve the kernel as if it had "
                   "not been run.",
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
