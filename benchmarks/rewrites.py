"""Inference rewrites on ResNet-50 (issue 45): batch norm folded into the convolution before it, convolution chains
run channels-last.

The arms of one model, timed interleaved in one run: eager, torch.compile default, and for each rewrite set of
``--sets`` (default: the fold alone) eager + the set (the forward captured as a graph by an eager deployment,
``Deployment(rewrites=names)``) and compile default + the set (``compile_with(rewrites=...)``). Each round times a
block of forwards of every arm, in an order that rotates by a round; each "+ set" arm's ratio over its baseline is
read from the paired per-round times
(``kforge.deploy._fallback.comparison_of``: the median of the paired differences, noise three robust standard
errors of them), printed with that noise and its label. Outputs are compared with the model computed in float64
(relative L2) for every arm, on the timed inputs and on a fresh batch. It also says whether plain Inductor folds
the batch norms itself: its generated code is searched for the normalisation's square root.

The model is torchvision's ResNet-50 layer for layer (stem, bottlenecks [3, 4, 6, 3], widths 64-512, expansion 4),
built here: torchvision does not install beside the CPU torch. Batch norm statistics are drawn away from their
defaults (a fold of mean 0, variance 1 changes almost nothing).

    python benchmarks/rewrites.py --batch 2 --resolution 160 --rounds 12 --threads 2 --json-out /tmp/rewrites.json
    python benchmarks/rewrites.py --sets fold_batch_norm,channels_last,fold_batch_norm+channels_last ...
    python benchmarks/rewrites.py --device cuda --batch 32 --resolution 224 --rounds 20 --reps 10 --json-out $OUT/rw.json
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.deploy import Deployment  # noqa: E402
from kforge.deploy._fallback import comparison_of  # noqa: E402
from kforge.deploy._graph import compile_with, no_recompile_limit  # noqa: E402
from kforge.rewrites import as_rewrites  # noqa: E402

FOLD = "fold_batch_norm"


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        stages, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layer = []
            for i in range(blocks):
                layer.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50(seed: int = 0) -> ResNet50:
    torch.manual_seed(seed)
    model = ResNet50()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.5)
                m.bias.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
    return model.eval()


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double().cpu() - ref.double()).norm() / ref.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--resolution", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3, help="forwards per arm per round")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--sets", default=FOLD, help="the rewrite sets timed, each in eager and compiled: names joined by "
                    "'+', sets by ',' (e.g. fold_batch_norm,channels_last,fold_batch_norm+channels_last)")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    sets = [tuple(as_rewrites(tuple(part.split("+")))) for part in a.sets.split(",") if part]
    if a.threads:
        torch.set_num_threads(a.threads)

    device = torch.device(a.device)
    model = resnet50()
    x = torch.randn(a.batch, 3, a.resolution, a.resolution, generator=torch.Generator().manual_seed(1))
    fresh = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    model64 = copy.deepcopy(model).double()   # NB: the float64 reference on the CPU, whatever the device
    model, x, fresh = model.to(device), x.to(device), fresh.to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    started = time.perf_counter()

    plain_compiled = compile_with(model, [])
    arms = {"eager": model, "compile default": plain_compiled}
    deployments, compiled_sets = {}, {}
    for names in sets:
        label = " + ".join(names)
        dep = deployments[label] = Deployment([], model, rewrites=names)
        compiled_sets[label] = compile_with(model, [], rewrites=names)

        def eager_with(inp, dep=dep):
            with dep:
                return model(inp)
        arms[f"eager + {label}"] = eager_with
        arms[f"compile default + {label}"] = compiled_sets[label]
    out: dict = {"device": str(device), "name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                 "batch": a.batch, "resolution": a.resolution, "threads": torch.get_num_threads(),
                 "torch": torch.__version__, "machine": platform.processor() or platform.machine(), "arms": {}}
    with torch.no_grad(), no_recompile_limit():
        ref = {name: model64(inp.double().cpu()) for name, inp in (("timed", x), ("fresh", fresh))}
        for name, fn in arms.items():   # warm-up: compiles, captures
            t0 = time.perf_counter()
            fn(x)
            sync()
            warm = time.perf_counter() - t0
            out["arms"][name] = {"first_forward_s": round(warm, 2),
                                 "rel_vs_float64": {k: rel(fn(inp), ref[k]) for k, inp in (("timed", x),
                                                                                              ("fresh", fresh))}}
            print(f"{name}: first forward {warm:.1f} s, rel to float64 {out['arms'][name]['rel_vs_float64']}",
                  file=sys.stderr, flush=True)
        out["sites"] = {label: {"eager": len(deployments[label].rewritten),
                                "compile": sum(len(r.sites) for r in compiled_sets[label].kforge_backend.rewritten)}
                        for label in deployments}

        times: dict[str, list[float]] = {name: [] for name in arms}
        names = list(arms)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                fn = arms[name]
                fn(x)   # untimed: the first forward after another arm's block can stall on this CPU
                sync()
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    fn(x)
                sync()
                times[name].append((time.perf_counter() - t0) / a.reps * 1e6)

    # does plain Inductor fold the batch norms? Its generated code computes the normalisation's square root if not
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(model), x)
    out["inductor_default_sqrt_sites"] = len(re.findall(r"sqrt", "\n".join(code)))

    lines = [f"ResNet-50 (torchvision's layers, built here) batch {a.batch} {a.resolution}x{a.resolution} float32, "
             f"{torch.get_num_threads()} thread(s), {a.rounds} rounds x {a.reps} forwards, torch {torch.__version__}",
             "sites rewritten: " + "; ".join(f"{label}: eager {n['eager']}, compile {n['compile']}"
                                             for label, n in out["sites"].items())
             + f"; plain Inductor's code computes sqrt at {out['inductor_default_sqrt_sites']} site(s) (0 would mean "
             "it folds the batch norms)"]
    for name in names:
        med = statistics.median(times[name])
        out["arms"][name]["median_us"] = med
        out["arms"][name]["rounds_us"] = times[name]
        lines.append(f"  {name:24s} {med / 1e3:8.2f} ms   rel to float64 {out['arms'][name]['rel_vs_float64']['timed']:.1e}"
                     f" (fresh {out['arms'][name]['rel_vs_float64']['fresh']:.1e})")
    pairs = [(base, f"{base} + {label}") for label in deployments for base in ("eager", "compile default")]
    for base, with_ in pairs + [("eager", "compile default")]:
        cmp = comparison_of(times[with_], times[base])
        out.setdefault("ratios", {})[f"{with_} / {base}"] = {"ratio": cmp.speedup, "text": cmp.ratio()}
        lines.append(f"  {with_} over {base}: {cmp.ratio()}")
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print("\n".join(lines))
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
