"""Language models measured as they are used: prefill latency and greedy decode with a static KV cache."""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Mapping

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Decode:
    """Greedy decoding of ``new_tokens`` tokens at batch 1 after a prompt."""

    tokens: tuple[int, ...]          # the generated token ids
    logits: torch.Tensor             # [new_tokens, vocab] float32 on the CPU, one row per step
    tokens_per_s: float              # decode steps only: (N - 1) / (time for N tokens - time for 1)
    cache: str                       # "static", or "dynamic (why the static cache was not usable)"

    def agreed(self, reference: "Decode") -> int:
        """How many tokens, from the first, are the same as ``reference``'s."""
        n = 0
        for a, b in zip(self.tokens, reference.tokens):
            if a != b:
                break
            n += 1
        return n

    def agrees_with(self, reference: "Decode") -> tuple[bool, float]:
        """(same tokens as ``reference``, largest logit difference relative to the reference's scale).

        The logits are compared at the steps both decodes took from the same context: up to and
        including the first differing token. After it, each continues its own text and their logits
        differ by construction (in bfloat16 a near-tie between two tokens flips with any change of
        summation order, which is where two correct decodes part)."""
        same = self.tokens == reference.tokens
        n = min(len(self.logits), len(reference.logits), self.agreed(reference) + 1)
        diff = (self.logits[:n] - reference.logits[:n]).abs().max().item()
        scale = reference.logits[:n].abs().max().clamp_min(1e-12).item()
        return same, diff / scale


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(model: nn.Module, input_ids: torch.Tensor, n: int, cache: str | None) -> Any:
    kwargs: dict[str, Any] = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, return_dict_in_generate=True,
                                  output_logits=True, pad_token_id=0)
    if cache is not None:
        kwargs["cache_implementation"] = cache
    # NB: transformers compiles the forward by itself under a static cache; the caller decides here.
    kwargs["disable_compile"] = True
    with torch.no_grad():
        return model.generate(input_ids, **kwargs)


def _first_generate(model: nn.Module, input_ids: torch.Tensor, n: int) -> tuple[Any, str | None, str]:
    """``generate`` with a static KV cache, or a dynamic one where the static cache fails (e.g. a linear-attention
    layer's recurrent state, which some transformers versions give no static cache): (its output, the cache used:
    "static" or None, why not static)."""
    try:
        return _generate(model, input_ids, n, "static"), "static", ""
    except Exception as exc:  # NB: transformers raises several types for a cache it cannot make
        return _generate(model, input_ids, n, None), None, f"{type(exc).__name__}: {str(exc)[:120]}"


def greedy_decode(model: nn.Module, input_ids: torch.Tensor, new_tokens: int = 32, *,
                  forward: Callable | None = None, repeats: int = 3) -> Decode:
    """Greedy decode with a static KV cache (a dynamic one where the model has no static cache),
    timed as the median of ``repeats`` runs after one warm-up (which also compiles ``forward``).

    ``forward`` replaces ``model.forward`` for the run (a compiled forward); the model is restored after.
    """
    if new_tokens < 2:
        raise ValueError("new_tokens must be at least 2: decode speed is measured over the steps after the first")
    device = input_ids.device
    if forward is not None:
        model.forward = forward
    try:
        out, cache, why = _first_generate(model, input_ids, new_tokens)

        def timed(n: int) -> float:
            _sync(device)
            start = time.perf_counter()
            _generate(model, input_ids, n, cache)
            _sync(device)
            return time.perf_counter() - start

        _generate(model, input_ids, 1, cache)  # warm: a compiled forward compiles for both shapes here
        runs = sorted((timed(new_tokens) - timed(1)) for _ in range(repeats))
        steps_s = max(runs[len(runs) // 2], 1e-9)
    finally:
        if forward is not None:
            del model.forward
    tokens = tuple(out.sequences[0, input_ids.shape[1]:].tolist())
    logits = torch.stack([step[0].float().cpu() for step in out.logits])
    return Decode(tokens, logits, (new_tokens - 1) / steps_s, "static" if cache else f"dynamic ({why})")


@dataclass(frozen=True)
class DecodeArm:
    """One way of decoding in ``compare_decode``: its result (None if it failed), and against the
    reference arm its speed ratio (median of the per-round ratios), tokens and logits."""

    label: str
    decode: Decode | None
    ratio: float | None = None          # tokens/s over the reference's, paired per round; 1.0 for the reference
    same_tokens: bool | None = None
    logit_rel_diff: float | None = None   # at the steps decoded from the reference's context (Decode.agrees_with)
    error: str | None = None
    agreed: int | None = None           # leading tokens the same as the reference's

    def line(self, reference: str) -> str:
        if self.decode is None:
            return f"decode {self.label}: failed: {self.error}"
        text = f"decode {self.label}: {self.decode.tokens_per_s:.1f} tokens/s"
        if self.label != reference:
            tokens = "identical" if self.same_tokens else \
                f"identical for the first {self.agreed} of {len(self.decode.tokens)}"
            text += (f" ({self.ratio:.3f}x {reference}, same run), tokens {tokens}, logits {self.logit_rel_diff:.1e}"
                     f" (same context)")
        return text + f" ({self.decode.cache} cache)"


_UNSET = object()


class Generate(nn.Module):
    """A language model's greedy decoding of ``new_tokens`` tokens as one forward, so that a
    session sees what decoding runs: ``kforge.Session(Generate(model, 16), input_ids)`` captures the prompt's
    forward and every one-token step after it (``Session(model, input_ids)`` sees the prompt's forward only),
    searches both, and its model-level check times the whole decode. ``forward(input_ids)`` returns the
    logits of each step, ``[new_tokens, batch, vocab]``.

    The KV cache is static where the model has one, else dynamic (a linear-attention layer's recurrent state
    has no static cache in some transformers versions): decided at the first forward, kept after it
    (``cache``). transformers' own compilation of the decode steps is off. To decode compiled, compile the
    model's one-token steps (``decode_steps``, as ``benchmarks/region_e2e.py --decode`` does with and without
    the session's kernels), not this wrapper, whose forward is transformers' generation loop.

    The model-level check compares two decodings step by step only as far as they decoded from the same
    context (``same_context``): up to and including the first step whose chosen token differs.
    """

    def __init__(self, model: nn.Module, new_tokens: int = 16):
        super().__init__()
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be at least 1 (got {new_tokens})")
        if not callable(getattr(model, "generate", None)):
            raise TypeError(f"Generate needs a model with a generate() method (a transformers causal LM); "
                            f"{type(model).__name__} has none")
        self.model = model
        self.new_tokens = new_tokens
        self.cache: str | None = "static"
        self._decided = False

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("Generate's forward takes the prompt's token ids, a [batch, tokens] tensor")
        if self._decided:
            out = _generate(self.model, input_ids, self.new_tokens, self.cache)
        else:
            out, self.cache, _ = _first_generate(self.model, input_ids, self.new_tokens)
            self._decided = True
        logits = torch.stack(list(out.logits))
        # NB: the tokens chosen travel with the logits (same_context reads them): transformers' logits
        # processors (the minimum length's EOS mask, a repetition penalty) choose from other scores than these
        logits.kforge_tokens = out.sequences[:, input_ids.shape[1]:].t()
        return logits

    def same_context(self, reference: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The steps of two of this module's outputs (``[new_tokens, batch, vocab]`` logits) decoded from the
        same context: every step up to and including the first where the chosen tokens differ. After that
        step each decoding continues its own text, so the logits differ by construction (in bfloat16 a near-tie
        between two tokens flips with any change of summation order, which is where two correct decodings
        part). The model-level check compares only these steps (``deploy._report.relative_difference``).

        The tokens are those the decoding chose where the output carries them (``forward`` attaches them),
        else each step's largest logit outside the end-of-sequence tokens (which ``min_new_tokens`` masks)."""
        if reference.dim() != 3 or reference.shape != output.shape:
            return reference, output
        a, b = self._chosen(reference), self._chosen(output)
        differs = (a != b).any(dim=1).nonzero()
        steps = reference.shape[0] if len(differs) == 0 else int(differs[0]) + 1
        return reference[:steps], output[:steps]

    def _chosen(self, logits: torch.Tensor) -> torch.Tensor:
        tokens = getattr(logits, "kforge_tokens", None)
        if isinstance(tokens, torch.Tensor) and tokens.shape == logits.shape[:2]:
            return tokens.to(logits.device)
        scores = logits.float().clone()
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        eos = [e for e in eos if 0 <= e < scores.shape[-1]]
        if eos:
            scores[..., eos] = float("-inf")
        return scores.argmax(dim=-1)

    def extra_repr(self) -> str:
        return f"new_tokens={self.new_tokens}, cache={self.cache if self._decided else 'not decided yet'}"


def decode_steps(model: nn.Module, compiled: Callable) -> Callable:
    """A forward for ``generate`` that runs ``compiled`` on the decode steps (one new token) and the
    model's own forward on the prefill, as transformers' generate does when it compiles (its
    CompileConfig: the prompt's shape is not the steps' shape, so one compiled graph serves the
    steps; compile ``compiled`` with ``dynamic=None`` as that config does, or a cache length kept as
    a Python int, e.g. Gemma's sliding-window layers, recompiles at every step)."""
    own = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        step = ids is not None and ids.dim() >= 2 and ids.shape[1] == 1
        return (compiled if step else own)(*args, **kwargs)
    return forward


@contextlib.contextmanager
def forward_as(model: nn.Module, forward: Callable) -> Iterator[None]:
    """``model.forward`` is ``forward`` (e.g. a compiled one) inside the block; after it, what the
    instance had before (its own forward set by someone else, or the class's)."""
    before = model.__dict__.get("forward", _UNSET)
    model.forward = forward
    try:
        yield
    finally:
        if before is _UNSET:
            del model.forward
        else:
            model.forward = before


def compare_decode(model: nn.Module, input_ids: torch.Tensor, new_tokens: int,
                   arms: Mapping[str, Callable[[], ContextManager[Any]]], *, rounds: int = 5) -> dict[str, DecodeArm]:
    """Greedy decode under each arm, timed interleaved in one run: every round decodes once under
    each arm (the order rotating by a round), so a drift of the host or the GPU's clocks shows in
    all arms alike; ``rounds`` is rounded up to a multiple of the number of arms, so that each arm
    goes first equally often. The first arm is the reference: each other arm's ``ratio`` is the
    median of its per-round ratios of tokens/s against the reference's, its tokens and logits are
    compared with the reference's. ``arms`` maps a label to a factory of the context the arm decodes
    in (e.g. ``lambda: session.apply()`` or ``lambda: forward_as(model, compiled)``); an arm that
    raises, in its warm-up or in a round, is reported with its error and its timings are dropped;
    the others go on. The reference's errors are raised (there is nothing to compare with). The
    reference decides the KV cache: static where the model has one, else dynamic."""
    if new_tokens < 2:
        raise ValueError("new_tokens must be at least 2: decode speed is measured over the steps after the first")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1 (got {rounds}): each round decodes once under every arm")
    if not arms:
        raise ValueError("compare_decode needs at least one arm (the first is the reference)")
    device = input_ids.device
    labels = list(arms)
    cache: str | None = "static"
    why = ""
    warm: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for label in labels:
        try:
            with arms[label]():
                if label == labels[0]:
                    out, cache, why = _first_generate(model, input_ids, new_tokens)
                else:
                    out = _generate(model, input_ids, new_tokens, cache)
                _generate(model, input_ids, 1, cache)  # a compiled forward compiles for both shapes here
            warm[label] = out
        except Exception as exc:
            if label == labels[0]:
                raise
            failed[label] = f"{type(exc).__name__}: {str(exc)[:200]}"
    live = [x for x in labels if x in warm]

    def steps(label: str) -> float:
        with arms[label]():
            times = []
            for n in (new_tokens, 1):
                _sync(device)
                start = time.perf_counter()
                _generate(model, input_ids, n, cache)
                _sync(device)
                times.append(time.perf_counter() - start)
        return max(times[0] - times[1], 1e-9)

    per_round: dict[str, list[float]] = {x: [] for x in live}
    total = -(-rounds // len(live)) * len(live)
    for r in range(total):
        order = [x for x in live[r % len(live):] + live[:r % len(live)] if x not in failed]
        for label in order:
            try:
                per_round[label].append(steps(label))
            except Exception as exc:
                if label == labels[0]:
                    raise
                failed[label] = f"{type(exc).__name__} in round {r + 1}: {str(exc)[:200]}"
                del per_round[label]

    def decode_of(label: str) -> Decode:
        out = warm[label]
        tokens = tuple(out.sequences[0, input_ids.shape[1]:].tolist())
        logits = torch.stack([step[0].float().cpu() for step in out.logits])
        return Decode(tokens, logits, (new_tokens - 1) / statistics.median(per_round[label]),
                      "static" if cache else f"dynamic ({why})")

    ref = decode_of(labels[0])
    result: dict[str, DecodeArm] = {}
    for label in labels:
        if label in failed:
            result[label] = DecodeArm(label, None, error=failed[label])
            continue
        d = ref if label == labels[0] else decode_of(label)
        same, rel = d.agrees_with(ref)
        ratio = statistics.median(a / b for a, b in zip(per_round[labels[0]], per_round[label]))
        result[label] = DecodeArm(label, d, ratio, same, rel, agreed=d.agreed(ref))
    return result
