"""Region winners end to end: capture a model with its regions, search only the region cards with the
built-in generator, then the model's forward in one run: eager, torch.compile in each mode, and each
with kforge (the model-level check per mode keeps only kernels that make the model faster).

    python benchmarks/region_e2e.py gemma4_e2b --layers 2 --iterations 4 --max-cards 8
    python benchmarks/region_e2e.py tiny_transformer --device cpu --iterations 2   # a smoke test
    python benchmarks/region_e2e.py sd35_vae_decoder --ops group_norm_silu --modes default   # fused cards
    python benchmarks/region_e2e.py qwen35_moe --layers 4 --experts grouped_mm --ops gated_delta_rule --no-regions
    python benchmarks/region_e2e.py qwen35_moe --layers 4 --experts grouped_mm --ops gated_delta_rule --no-regions \
        --decode 16 --modes reduce-overhead   # greedy decoding: the prompt and the one-token steps

With ``--decode N`` (language models) the session's model is ``kforge.models.Generate(model, N)``: capture sees
the prompt's forward and every one-token step after it, the search takes the cards of both, and the table is the
whole decode's (eager against eager + kforge, the model-level check over it). Then decode tokens/s, one
interleaved run a mode (``compare_decode``): eager, eager + kforge (what the check kept), torch.compile of the
decode steps in each of ``--modes`` and the same with every winner in its graphs (no model-level check there).

Writes region_e2e_<model>.json to $OUT (or runs/, which git ignores). With ``--store PATH.tgz`` the session's
store is unpacked from PATH when it exists (cards searched there are not searched again) and packed back
to PATH (and into $OUT) after the search, so a later call can time other modes without searching
(``--lean-store``: without the captured examples, which the later call's capture records again).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kforge  # noqa: E402
from kforge.ops import is_fused  # noqa: E402


def _model(name: str, args):
    try:
        return kforge.example(name, device=args.device)
    except (KeyError, ValueError):
        pass
    from seed_workloads import LANGUAGE, seed_model

    layers = (args.layers or 2) if name in LANGUAGE else args.layers
    extra = {"tokens": args.tokens} if args.tokens else {}
    model, inputs = seed_model(name, args.device, layers=layers, attn=args.attn, resolution=args.resolution,
                               dtype=args.dtype, **extra)
    if args.experts and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(args.experts)   # Qwen 3.5: grouped_mm, as its end-to-end rows run
    return model, inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None, help="language models: depth (2 when not given)")
    ap.add_argument("--attn", default="eager")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--max-cards", type=int, default=8, help="region cards searched, largest share first")
    ap.add_argument("--ops", default="region", help="which cards to search: region cards, fused operators "
                    "(group_norm_silu: with or without its convolution's bias), or any operator, comma-separated")
    ap.add_argument("--resolution", type=int, default=None, help="diffusion models: image size")
    ap.add_argument("--tokens", type=int, default=None, help="language models: prompt tokens (the seed's 512 if not given)")
    ap.add_argument("--experts", default=None, help="MoE models: the experts implementation (grouped_mm)")
    ap.add_argument("--no-regions", action="store_true",
                    help="operator cards only (no graph capture): for --ops naming operators, e.g. gated_delta_rule")
    ap.add_argument("--dtype", default=None, help="the seed workloads: override the model's dtype (float32, bfloat16)")
    ap.add_argument("--modes", default="default,reduce-overhead")
    ap.add_argument("--no-inductor-baseline", action="store_true",
                    help="skip compiling each region alone for the cards' Inductor ratio (saves capture time)")
    ap.add_argument("--profile", default=None, metavar="MODE",
                    help="after the table (CUDA): GPU time per kernel of the compiled forward in MODE with every "
                         "winner against plain compile through kforge's backend, the kernels that differ most")
    ap.add_argument("--store", type=Path, default=None,
                    help="a .tgz of the session's store: resumed from when it exists, written after the search")
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="language models: capture, search and time greedy decoding of N tokens instead of the "
                         "prompt's forward, then decode tokens/s in eager and each of --modes, with and without kforge")
    ap.add_argument("--rounds", type=int, default=6, help="--decode: interleaved rounds of each decode comparison")
    ap.add_argument("--lean-store", action="store_true",
                    help="write the store without its tensors (blobs/: the captured examples, which the resumed "
                         "capture records again): the SD3.5 VAE's were gigabytes, too large to come back from a call; "
                         "the resumed capture's examples replace the stored ones, whatever their values)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    # NB: kforge's INFO lines (each compiled arm's compile time) on stdout with the time since the start, so a
    # call cut inside the end-to-end check says how far it got
    shown = logging.StreamHandler(sys.stdout)
    shown.setFormatter(logging.Formatter("  [%(since)6.0f s] %(message)s"))
    shown.addFilter(lambda record: setattr(record, "since", time.perf_counter() - t0) or True)
    logging.getLogger("kforge").addHandler(shown)
    logging.getLogger("kforge").setLevel(logging.INFO)
    model, inputs = _model(args.model, args)
    workdir = Path(tempfile.mkdtemp(prefix="kforge-region-e2e-"))
    if args.store is not None and args.store.exists():
        with tarfile.open(args.store) as tar:
            tar.extractall(workdir, filter="data")
    if args.decode:
        from kforge.models import Generate

        if not isinstance(inputs, torch.Tensor) or not callable(getattr(model, "generate", None)):
            raise SystemExit(f"--decode needs a language model (a generate() method and token ids): {args.model} is not one")
        s = kforge.Session(Generate(model, args.decode), inputs, device=args.device, workdir=workdir)
    else:
        s = kforge.Session(model, inputs, device=args.device, workdir=workdir)
    cards = s.capture(inductor_baseline=False if args.no_inductor_baseline else None, regions=not args.no_regions)
    ops = set(args.ops.split(","))
    if "group_norm_silu" in ops:   # NB: where its convolution's bias is its prologue, the fused card is biased_...
        ops.add("biased_group_norm_silu")
    regions = sorted((c for c in cards if c.op in ops and c.share > 0), key=lambda c: -c.share)[: args.max_cards]
    t1 = time.perf_counter()
    print(f"# {args.model}: {len(cards)} cards, {sum(c.op == 'region' for c in cards)} regions, "
          f"{sum(is_fused(c.op) for c in cards)} fused (group_norm+silu, linear+gelu, rms_norm+rope); "
          f"searching {len(regions)} "
          f"of {args.ops} (capture {t1 - t0:.0f} s)", flush=True)
    for c in cards:   # NB: every card of the operators asked for, those left out (no share) too
        if c.op in ops:
            print(f"#   {c.op} {c.variant.inputs[0].shape}: {c.calls} calls, {c.examples} examples, share "
                  f"{c.share:.1%}{'' if c.key in {r.key for r in regions} else ', not searched'}", flush=True)
    if not regions:
        raise SystemExit(f"no {args.ops} cards were captured: nothing to search")
    done = {r.key for r in s.results if r.status.is_searched}
    todo = [c.key for c in regions if c.key not in done]
    if todo:
        # NB: a progress line per evaluation (with its time since the start), so a call cut during the
        # search says how far it got (a 2026-12-03 H200 call was cut there with nothing to show)
        def progress(e):
            if e.kind.value in ("card_started", "evaluated", "card_finished", "error", "proposer_failed"):
                print(f"  [{time.perf_counter() - t0:6.0f} s] {e.kind.value:<14} {(e.card_key or '')[:8]} "
                      f"{e.message[:120]}", flush=True)

        s.optimize(cards=todo, iterations=args.iterations, confirm=False, on_event=progress)
    t2 = time.perf_counter()
    if args.store is not None:
        s.store.checkpoint()   # NB: the database whole in kforge.db, not half in its write-ahead log
        _archive(workdir, args.store, lean=args.lean_store)
    searched = {c.key for c in regions}
    for r in s.results:
        if r.key in searched:
            print(f"  {r.signature[:70]:<70} share {r.share * 100:5.1f}%  {r.status.value:<12} {r.speedup:.2f}x",
                  flush=True)
    print(f"# search {t2 - t1:.0f} s; {len(s.results.winners)} winner(s)", flush=True)
    # NB: not benchmarks/results by default: a CPU smoke run's file there was committed twice as a result
    out = Path(os.environ.get("OUT") or ROOT / "runs")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"region_e2e_{args.model}.json"

    def save(report, final: bool) -> dict:
        result = {"model": args.model, "layers": args.layers, "iterations": args.iterations,
                  "regions_searched": len(regions), "winners": len(s.results.winners), "end_to_end": report.to_json(),
                  "capture_s": t1 - t0, "search_s": t2 - t1, "e2e_s": time.perf_counter() - t2, "complete": final}
        path.write_text(json.dumps(result, indent=1, default=str))
        return result

    def so_far(report) -> None:
        # NB: the table and its JSON after eager and after each mode: a step cut by its timeout in its second
        # mode lost the whole table (the SD3.5 VAE, 2026-12-03o)
        print(report.table(), flush=True)
        save(report, False)

    modes = tuple(m for m in args.modes.split(",") if m)
    if args.decode:
        # NB: the table is the whole decode's, eagerly (a compiled generate() would be dynamo tracing transformers'
        # generation loop); compiled decoding is the decode steps compiled, below
        report = s.end_to_end(compile=False, on_mode=so_far)
        result = save(report, False)

        def save_decode(rows: dict) -> None:
            result["decode"] = rows
            path.write_text(json.dumps(result, indent=1, default=str))

        _decode(s, model, inputs, report, modes, args, save_decode)
        print("# complete", flush=True)
        result["complete"] = True
        path.write_text(json.dumps(result, indent=1, default=str))
        s.close()
        return
    report = s.end_to_end(modes=modes, on_mode=so_far)
    print("# complete", flush=True)   # NB: the last table printed (after the last mode) is the whole one
    result = save(report, True)   # NB: before the profile, which a timeout may cut
    if args.profile and args.device.startswith("cuda"):
        try:
            result["profile"] = _profile(s, model, inputs, args.profile)
            path.write_text(json.dumps(result, indent=1, default=str))
        except Exception as exc:  # NB: a diagnosis that fails costs its lines, not the table's JSON
            print(f"# profile failed: {type(exc).__name__}: {exc}", flush=True)
    s.close()


def _decode(s, model, prompt, report, modes: tuple, args, save) -> dict:
    """Decode tokens/s in interleaved runs (``compare_decode``): eager against eager + kforge (the kernels the
    model-level check kept), then a run a compile mode with its plain compiled decode steps the reference, the
    same steps with every winner in their graphs, and eager. ``save(rows so far)`` after each run: a mode that
    kills the process leaves the others."""
    import contextlib

    from kforge.deploy import Deployment
    from kforge.deploy._graph import compile_with, no_recompile_limit
    from kforge.deploy._select import _patched_eagerly
    from kforge.models import compare_decode, decode_steps, forward_as

    kernels = list(s._deployable(all_winners=True).kernels)
    kept = {f.mode: set(f.kept) for f in report.fallback}
    eager_ks = [dk for dk in kernels if _patched_eagerly(dk.variant.op)
                and ("eager" not in kept or dk.variant.signature in kept["eager"])]

    @contextlib.contextmanager
    def installed(ks):
        with Deployment(ks, model):
            yield

    rows: dict = {}
    if not eager_ks:
        rows["eager + kforge"] = {"same_as": "eager", "why": "no kernel kept" if kernels else "no winner"}
        print("decode eager + kforge: the same as eager (no kernel kept)", flush=True)
    groups: list = []
    if eager_ks:
        groups.append((None, {"eager": contextlib.nullcontext, "eager + kforge": lambda: installed(eager_ks)}))
    groups += [(mode, None) for mode in modes]
    for mode, arms in groups:
        if arms is None:
            # NB: the plain compiled steps are the reference (the + kforge arm's ratio is over them), eager an arm
            torch._dynamo.reset()
            arms = {}
            for label, ks in ((f"compile {mode}", []), (f"compile {mode} + kforge", kernels)):
                if label.endswith("+ kforge") and not ks:
                    continue
                # NB: the decode steps only, dynamic=None, as transformers' generate compiles (decode_steps)
                try:
                    fwd = compile_with(model.forward, ks, mode=mode, dynamic=None)
                    arms[label] = lambda fwd=fwd: forward_as(model, decode_steps(model, fwd))
                except Exception as exc:  # noqa: BLE001
                    rows[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            if f"compile {mode}" not in arms:
                save(rows)
                continue
            arms["eager"] = contextlib.nullcontext
        reference = next(iter(arms))
        try:
            with no_recompile_limit(), torch.no_grad():
                results = compare_decode(model, prompt, args.decode, arms, rounds=args.rounds)
        except Exception as exc:  # noqa: BLE001  (the reference arm failed: the next mode may still run)
            rows[reference] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"decode {reference}: failed: {rows[reference]['error']}", flush=True)
            save(rows)
            continue
        print(f"decode, one interleaved run{f' with compile {mode}' if mode else ''}:", flush=True)
        for label, arm in results.items():
            print("  " + arm.line(reference), flush=True)
            key = label if label not in rows else f"{label} (with compile {mode})"
            rows[key] = {"tokens_per_s": arm.decode.tokens_per_s if arm.decode else None, "over": reference,
                         "ratio": arm.ratio, "same_tokens": arm.same_tokens, "agreed": arm.agreed,
                         "logit_rel_diff": arm.logit_rel_diff, "error": arm.error,
                         "cache": arm.decode.cache if arm.decode else None}
        save(rows)
    calls = {dk.variant.signature[:90]: dk.calls for dk in kernels}
    print(f"# kernel calls over every decode: {calls}", flush=True)
    rows["kernel_calls"] = calls
    save(rows)
    torch._dynamo.reset()
    return rows


def _profile(s, model, inputs, mode: str) -> dict:
    """Where compile + kforge's GPU time differs from plain compile's: every winner placed (no check),
    against kforge's backend with no kernel, both in ``mode``; printed and returned."""
    import torch
    from compiled_profile import profile_diff, profile_forward

    from kforge.capture import split_batch
    from kforge.deploy._graph import compile_with

    args_, kwargs_ = split_batch(inputs)
    kw = {} if mode == "default" else {"mode": mode}
    out = {}
    for arm in ("plain", "kforge"):
        torch._dynamo.reset()
        compiled = compile_with(model, [], **kw) if arm == "plain" else s.compile(guard=False, **kw)
        run = lambda: compiled(*args_, **kwargs_)  # noqa: E731,B023
        out[arm] = profile_forward(run)
        with torch.no_grad():   # NB: wall time too: a host-bound forward's loss is not in its kernels
            walls = []
            for _ in range(30):
                t = time.perf_counter()
                run()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t) * 1e6)
        out[f"{arm}_wall_us"] = sorted(walls)[len(walls) // 2]
        if arm == "kforge":
            out["placed"] = compiled.kforge_backend.replaced
            out["relayouts"] = {dk.variant.signature: dk.relayouts for dk in compiled.kforge_backend.kernels}
    torch._dynamo.reset()
    print(f"# profile, compile {mode}: {len(out['placed'])} kernel call(s) placed; wall a forward (median of 30, "
          f"synchronized) {out['plain_wall_us']:.1f} us plain, {out['kforge_wall_us']:.1f} us with kforge", flush=True)
    for line in profile_diff(out["plain"], out["kforge"]):
        print(line, flush=True)
    return out


def _archive(workdir: Path, archive: Path, lean: bool = False) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for item in sorted(workdir.iterdir()):
            if lean and item.name == "blobs":
                continue
            tar.add(item, arcname=item.name)
    if os.environ.get("OUT"):
        copy = Path(os.environ["OUT"]) / archive.name
        if not (copy.exists() and copy.samefile(archive)):
            shutil.copyfile(archive, copy)
    print(f"# store: {archive} ({archive.stat().st_size / 1e6:.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
