"""Benchmark the built-in CUDA strategies on the seed variants (run on a GPU machine).

For every seed variant and every applicable CUDA strategy (default config plus a few from its
space): compile (timed, in parallel), validate against the reference on fresh random inputs
(outputs poisoned with NaN, inputs checked unchanged), and time against eager (the operator's eager baseline,
``spec.run_eager``: what a model runs, e.g. transformers' batched_mm experts), interleaved, with
kforge.evaluate.timing.bench_pair (CUDA events, L2 flushed, median). Candidates run in a worker
process; a crash (e.g. an illegal address, which poisons the CUDA context) costs only that
candidate: the worker is restarted on the rest. Prints a table; writes $OUT/builtin_kernels.json.

    python benchmarks/builtin_kernels.py [--extra 3] [--only softmax,group_norm] [--strategies tiled]
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from kforge.kernels import CompileError, compile_source, device_info
from kforge.ops import TensorSig, Variant, get_spec
from kforge.proposers.builtin import strategies_for

BF = torch.bfloat16
COPY_BANDWIDTH = 4.25e12  # H200 measured device-to-device copy, bytes/s


def _variant(op: str, *args, **kwargs) -> Variant:
    spec = get_spec(op)
    call = spec.bind(*args, **kwargs)
    out = spec.reference(list(call.inputs), call.params)
    return spec.variant(call, out if isinstance(out, (tuple, list)) else (out,))


def _moe_decode() -> Variant:
    """Qwen 3.5 35B-A3B's experts at a decode step, as transformers' generate() runs them on a GPU (batched_mm): one
    token, 8 of 256 experts, hidden 2048, intermediate 512 (bf16 weights of 1.5 GB: signatures only here)."""
    def sig(shape, dtype):
        return TensorSig.of(torch.empty(shape, dtype=dtype, device="meta"))

    h = sig((1, 2048), BF)
    ins = (h, sig((1, 8), torch.long), sig((1, 8), BF), sig((256, 1024, 2048), BF), sig((256, 2048, 512), BF))
    return Variant("moe_experts", ins, (("impl", "batched_mm"),), (h,)).on("cuda")


def seeds() -> dict[str, Variant]:
    """The seed workloads, traced on the GPU (values do not matter, only signatures)."""
    e = lambda *s, dtype=torch.float32: torch.empty(*s, dtype=dtype, device="cuda")  # noqa: E731
    return {
        "softmax f32[8,262144]": _variant("softmax", e(8, 262144), -1),
        "softmax bf16[1,8,512,512]": _variant("softmax", e(1, 8, 512, 512, dtype=BF), -1),
        "softmax f32[512,256]": _variant("softmax", e(512, 256), -1),
        "group_norm bf16[1,512,128,128]": _variant("group_norm", e(1, 512, 128, 128, dtype=BF), 32,
                                                   e(512, dtype=BF), e(512, dtype=BF)),
        "group_norm bf16[1,512,256,256]": _variant("group_norm", e(1, 512, 256, 256, dtype=BF), 32,
                                                   e(512, dtype=BF), e(512, dtype=BF)),
        "group_norm bf16[1,256,512,512]": _variant("group_norm", e(1, 256, 512, 512, dtype=BF), 32,
                                                   e(256, dtype=BF), e(256, dtype=BF)),
        "layer_norm bf16[1,4096,1536]": _variant("layer_norm", e(1, 4096, 1536, dtype=BF), (1536,),
                                                 e(1536, dtype=BF), e(1536, dtype=BF)),
        "rms_norm bf16[1,512,1536]": _variant("rms_norm", e(1, 512, 1536, dtype=BF), (1536,),
                                              e(1536, dtype=BF), 1e-6),
        "adaptive_avg_pool2d f32[8,2048,7,7]": _variant("adaptive_avg_pool2d", e(8, 2048, 7, 7), (1, 1)),
        "max_pool2d f32[8,64,112,112]": _variant("max_pool2d", e(8, 64, 112, 112), 3, 2, 1),
        "silu bf16[1,512,128,128]": _variant("silu", e(1, 512, 128, 128, dtype=BF)),
        "gelu_tanh bf16[1,4096,6144]": _variant("gelu", e(1, 4096, 6144, dtype=BF), approximate="tanh"),
        "add f32[8,256,56,56]": _variant("add", e(8, 256, 56, 56), e(8, 256, 56, 56)),
        "add bf16[1,512,128,128]+[1,512,1,1]": _variant("add", e(1, 512, 128, 128, dtype=BF),
                                                        e(1, 512, 1, 1, dtype=BF)),
        "relu f32[8,64,112,112]": _variant("relu", e(8, 64, 112, 112)),
        "relu f32[8,512,28,28]": _variant("relu", e(8, 512, 28, 28)),
        "add f32[8,1024,14,14]": _variant("add", e(8, 1024, 14, 14), e(8, 1024, 14, 14)),
        "add bf16[1,512,128,128]": _variant("add", e(1, 512, 128, 128, dtype=BF), e(1, 512, 128, 128, dtype=BF)),
        "silu bf16[1,512,256,256]": _variant("silu", e(1, 512, 256, 256, dtype=BF)),
        "silu bf16[1,128,1024,1024]": _variant("silu", e(1, 128, 1024, 1024, dtype=BF)),
        "silu bf16[1,333,1536] (partial last tile)": _variant("silu", e(1, 333, 1536, dtype=BF)),
        "add f32[1,512,1]+1e-6 (last dim 1)": _variant("add", e(1, 512, 1), 1e-6),
        "embedding i64[1,512] -> bf16[262144,1536]": _variant(
            "embedding", torch.zeros(1, 512, dtype=torch.long, device="cuda"), e(262144, 1536, dtype=BF)),
        "moe_experts bf16[1,2048] 8 of 256 (Qwen 3.5 decode)": _moe_decode(),
    }


def plan(variants: dict[str, Variant], extra: int, strategies: list[str] = ()) -> list[dict]:
    """Jobs: every applicable strategy with its default config plus ``extra`` sampled configs."""
    dev = device_info("cuda")
    jobs = []
    for label, v in variants.items():
        for s in strategies_for(v.op, "cuda"):
            if not s.applies(v, dev) or (strategies and not any(w in s.name for w in strategies)):
                continue
            configs = list(s.configs(v, dev))
            picked = configs[:1] + random.Random(label + s.name).sample(configs[1:], min(extra, len(configs) - 1))
            for config in picked:
                jobs.append({"variant": label, "strategy": s.name, "config": config,
                             "source": s.render(v, config, dev)})
    return jobs


def compile_all(jobs: list[dict]) -> None:
    def build(job):
        start = time.perf_counter()
        try:
            built = compile_source(job["source"], "cuda", device_info("cuda").arch)
            job.update(path=str(built.path), compile_s=round(built.seconds, 2), cached=built.cached)
        except CompileError as e:
            job.update(error="compile error: " + e.log[-1500:], compile_s=round(time.perf_counter() - start, 2))

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(build, jobs))


# ----------------------------------------------------------------------------- worker process


_INPUTS: dict[tuple[str, int], list] = {}


def _fresh_inputs(label: str, v: Variant, seed: int) -> list:
    """New allocations of the variant's random inputs for ``seed`` (generated once per variant)."""
    if not any(key[0] == label for key in _INPUTS):
        _INPUTS.clear()  # jobs come grouped by variant: keep one variant's inputs at a time
    if (label, seed) not in _INPUTS:
        _INPUTS[(label, seed)] = get_spec(v.op).random_inputs(v, seed)
    return [t.clone() if t is not None else None for t in _INPUTS[(label, seed)]]


def _validate(kernel, label: str, v: Variant, spec, seed: int) -> str | None:
    from kforge.kernels import param_vector

    inputs = _fresh_inputs(label, v, seed)
    before = [t.clone() if t is not None else None for t in inputs]
    outs = [torch.empty_strided(s.shape, s.stride, dtype=getattr(torch, s.dtype), device="cuda").fill_(float("nan"))
            for s in v.outputs]
    ws = torch.empty(max(kernel.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
    kernel.launch(inputs, outs, param_vector(v), workspace=ws, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = spec.reference(inputs, v.param_dict)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    if any(a is not None and not torch.equal(a, b) for a, b in zip(inputs, before)):
        return "an input was modified"
    for out, r, sig in zip(outs, ref, v.outputs):
        rtol, atol = spec.tolerance(sig.dtype)
        o, r = out.float(), r.float()
        if not torch.isfinite(o).all() and torch.isfinite(r).all():
            return f"{int((~torch.isfinite(o)).sum())} non-finite (unwritten?) elements"
        scale = r.abs().max().item() or 1.0
        err = (o - r).abs()
        bad = err > atol * scale + rtol * r.abs()
        if bad.any():
            return f"{int(bad.sum())} mismatches, max error {err.max().item():.3g} (scale {scale:.3g})"
    return None


def worker(jobs_path: str) -> None:
    """Validate and time each job; one JSON line per event on stdout."""
    from kforge.evaluate.timing import bench_pair
    from kforge.kernels import Kernel, param_vector

    variants = seeds()
    with open(jobs_path) as f:
        jobs = json.load(f)
    for i, job in enumerate(jobs):
        print(json.dumps({"start": i}), flush=True)
        v = variants[job["variant"]]
        spec = get_spec(v.op)
        result = {"done": i}
        try:
            kernel = Kernel(job["path"])
            label = job["variant"]
            problem = _validate(kernel, label, v, spec, seed=1) or _validate(kernel, label, v, spec, seed=2)
            result["correct"] = problem is None
            if problem:
                result["error"] = problem
            inputs = _fresh_inputs(label, v, 3)
            outs = [torch.empty_strided(s.shape, s.stride, dtype=getattr(torch, s.dtype), device="cuda")
                    for s in v.outputs]
            ws = torch.empty(max(kernel.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
            frame = kernel.prepare(len(inputs), len(outs), param_vector(v))
            stream = torch.cuda.current_stream().cuda_stream
            cand, eager = bench_pair(lambda: frame.launch(inputs, outs, ws, stream),
                                     lambda: spec.run_eager(inputs, v.param_dict), device="cuda")
            result.update(kernel_us=cand.median_us, eager_us=eager.median_us)
        except Exception as e:  # a launch error or a Python-side failure: report, keep going
            result.update(correct=False, error=f"{type(e).__name__}: {e}")
        print(json.dumps(result), flush=True)


def _lines(proc: subprocess.Popen, timeout_s: float):
    """The worker's JSON messages; stops (killing the worker) after ``timeout_s`` of silence."""
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(ln) for ln in proc.stdout] + [q.put(None)], daemon=True).start()
    while True:
        try:
            line = q.get(timeout=timeout_s)
        except queue.Empty:
            proc.kill()
            return
        if line is None:
            return
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def run_all(jobs: list[dict], job_timeout_s: float = 90.0) -> None:
    """Run the compiled jobs in worker processes, restarting after a crash or a hang."""
    pending = [j for j in jobs if "path" in j]
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kforge-bench-{os.getpid()}.json")
    while pending:
        with open(tmp, "w") as f:
            json.dump(pending, f)
        proc = subprocess.Popen([sys.executable, __file__, "--worker", tmp], stdout=subprocess.PIPE, text=True)
        current, finished = None, False
        for msg in _lines(proc, job_timeout_s):
            if "start" in msg:
                current, finished = msg["start"], False
            else:
                pending[msg.pop("done")].update(msg)
                finished = True
        proc.wait()
        if proc.returncode == 0 or current is None:
            break
        if not finished:
            bad = pending[current]
            bad.update(correct=False, error=f"worker died or hung (exit {proc.returncode}): crash, illegal "
                                            f"address or no answer within {job_timeout_s:.0f} s")
            print(f"  ! {bad['strategy']} {bad['config']} on {bad['variant']} failed hard; restarting the worker",
                  file=sys.stderr)
        pending = pending[current + 1:]
    if os.path.exists(tmp):
        os.unlink(tmp)


def report(jobs: list[dict], variants: dict[str, Variant]) -> None:
    print(f"\n{'variant':42} {'strategy':38} {'config':44} {'ok':>3} {'eager':>8} {'kernel':>8} "
          f"{'speedup':>7} {'roof':>5} {'build':>5}")
    for j in jobs:
        v = variants[j["variant"]]
        k, e = j.get("kernel_us"), j.get("eager_us")
        floor_us = v.io_bytes / COPY_BANDWIDTH * 1e6
        j["floor_us"] = floor_us
        if k:
            j["speedup"], j["roofline_fraction"] = e / k, floor_us / k
        config = ",".join(f"{a}={b}" for a, b in j["config"].items())
        print(f"{j['variant'][:42]:42} {j['strategy'][:38]:38} {config[:44]:44} "
              f"{'yes' if j.get('correct') else 'NO':>3} {e or 0:8.2f} {k or 0:8.2f} "
              f"{j.get('speedup', 0):6.2f}x {j.get('roofline_fraction', 0):5.0%} {j.get('compile_s', 0):5.1f}")
        if j.get("error"):
            print(f"    {j['error'].strip()[:300]}")
    print("\nbest correct kernel per variant:")
    for label, v in variants.items():
        done = [j for j in jobs if j["variant"] == label and j.get("correct") and j.get("kernel_us")]
        if done:
            b = min(done, key=lambda j: j["kernel_us"])
            print(f"  {label:42} {b['strategy']:38} {b['kernel_us']:8.2f} us  eager {b['eager_us']:8.2f}  "
                  f"{b['speedup']:5.2f}x  floor {b['floor_us']:6.2f} us ({b['roofline_fraction']:.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", type=int, default=3, help="configs from the space beyond the default")
    parser.add_argument("--only", default="", help="comma-separated substrings of the variant labels to run")
    parser.add_argument("--strategies", default="", help="comma-separated substrings of the strategy names to run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    start = time.perf_counter()
    only = [w for w in args.only.split(",") if w]
    variants = {k: v for k, v in seeds().items() if not only or any(w in k for w in only)}
    jobs = plan(variants, args.extra, [w for w in args.strategies.split(",") if w])
    print(f"{len(jobs)} candidates over {len(variants)} variants on {device_info('cuda').describe()}")
    compile_all(jobs)
    built = [j["compile_s"] for j in jobs if "path" in j and not j.get("cached")]
    if built:
        print(f"compiled {len(built)} in {time.perf_counter() - start:.1f} s wall "
              f"(per kernel: median {sorted(built)[len(built) // 2]:.1f} s, max {max(built):.1f} s)")
    run_all(jobs)
    report(jobs, variants)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if os.environ.get("OUT"):
        for j in jobs:
            j.pop("source", None)
        with open(os.path.join(os.environ["OUT"], "builtin_kernels.json"), "w") as f:
            json.dump({"device": device_info("cuda").to_json(), "results": jobs}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
