"""`python -m benchmarks.run`: the benchmark suite, darkpy against PyTorch CPU and ONNX Runtime (see
README.md).

    python -m benchmarks.run                    # the whole suite (an hour or more on 2 cores)
    python -m benchmarks.run --quick            # fewer samples, smaller batches (to check the harness)
    python -m benchmarks.run cifar resnet50     # some networks of the suite
    python -m benchmarks.run --layers cfg/x.cfg # any cfg, with a per-layer timing table per phase

Writes benchmarks/results/latest.json and latest.md (git-ignored); `--publish` also writes the
Markdown to benchmarks/RESULTS.md, the committed table the README points to. `--render JSON`
re-writes the Markdown of saved results without measuring. Measure on a quiet machine: the run
records the busy share of the machine before every sample and says how many windows were not quiet.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import engine, reference, report
from .engine import ROOT, SHARED, NetSpec, Options
from .environment import machine_info
from .onnx_models import ONNX_EXPORTERS

PJ = SHARED / "cfg" / "pjreddie"
AB = SHARED / "cfg" / "alexeyab"

#: The suite (issue #9). train_batch: the batch of the timed training step (None: inference only).
SUITE = [
    NetSpec("digits", ROOT / "cfg" / "digits.cfg", None, 32, "bundled classifier, 16x16x1, cfg batch 32"),
    NetSpec("cifar", PJ / "cifar.cfg", None, 128, "Darknet's cifar.cfg (28x28x3 crops), cfg batch 128"),
    NetSpec("darknet19", PJ / "darknet19.cfg", 224, 16, "224x224; training at batch 16 (the cfg's is 128 in "
            "2 subdivisions: 64 takes minutes per step on 2 cores)"),
    NetSpec("shapes-tiny", ROOT / "cfg" / "shapes-tiny.cfg", None, 32, "the bundled detector, 128x128; "
            "training at the cfg's batch 32 with its yolo loss on both sides (random truth boxes)"),
    NetSpec("tiny-gpt", ROOT / "cfg" / "tiny-gpt.cfg", None, 16, "the bundled Transformer (4 blocks, width "
            "128, context 64): one training step at the cfg's batch of 16 sequences (1024 tokens), AdamW "
            "and clip_norm on both sides (torch: benchmarks/torch_seq.py), random token ids"),
    NetSpec("tiny", PJ / "tiny.cfg", 224, None, "Darknet reference: tiny.cfg at 224, inference"),
    NetSpec("darknet", PJ / "darknet.cfg", 224, None, "Darknet reference: darknet.cfg at 224, inference"),
    NetSpec("yolov3-tiny", PJ / "yolov3-tiny.cfg", 416, None, "416x416, inference (heads compared)"),
    NetSpec("yolov4-tiny", AB / "yolov4-tiny-custom.cfg", 416, None, "AlexeyAB's yolov4-tiny (80 classes) at "
            "416, inference (heads compared)"),
    NetSpec("resnet50", PJ / "resnet50.cfg", 224, None, "224x224, inference"),
]
#: --quick: training batches small enough that the whole suite takes a few minutes.
QUICK_TRAIN_BATCH = {"cifar": 32, "darknet19": 4, "shapes-tiny": 8}
QUICK_INFER_BATCH = 16


def pick_networks(names: list[str], quick: bool, train_batch: int | None = None) -> list[NetSpec]:
    by_name = {s.name: s for s in SUITE}
    chosen = []
    for name in names or [s.name for s in SUITE]:
        if name in by_name:
            spec = by_name[name]
        elif Path(name).is_file():
            spec = NetSpec(Path(name).stem, Path(name).resolve(), None, train_batch, "given on the command line")
        else:
            raise SystemExit(f"{name}: not a network of the suite ({', '.join(by_name)}) nor a cfg file")
        if not spec.cfg.is_file():
            if spec.optional:
                continue
            raise SystemExit(f"{spec.name}: {spec.cfg} not found (the pjreddie cfgs live in ../shared/cfg)")
        if quick and spec.name in QUICK_TRAIN_BATCH:
            spec = NetSpec(spec.name, spec.cfg, spec.size, QUICK_TRAIN_BATCH[spec.name],
                           spec.note + f" (--quick: training at {QUICK_TRAIN_BATCH[spec.name]})")
        chosen.append(spec)
    return chosen


def publish_summary(results: dict) -> None:
    """Replace the block between the `results` markers of benchmarks/README.md with the summary."""
    readme = ROOT / "benchmarks" / "README.md"
    text = readme.read_text()
    start, end = "<!-- results -->\n", "<!-- /results -->"
    i, j = text.index(start) + len(start), text.index(end)
    readme.write_text(text[:i] + report.summary_block(results) + "\n" + text[j:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("networks", nargs="*", help="suite names or cfg paths (default: the whole suite)")
    ap.add_argument("--quick", action="store_true",
                    help=f"few samples, small training batches, inference at batch {QUICK_INFER_BATCH} (not 64)")
    ap.add_argument("--batch", type=int, help="the large inference batch (default 64)")
    ap.add_argument("--layers", action="store_true", help="print the per-layer timing table of every phase")
    ap.add_argument("--threads", type=int, default=2, help="threads for each contender (default 2)")
    ap.add_argument("--reps", type=int, help="timed rounds per phase, one sample per contender each (default 5, "
                    "--quick 2)")
    ap.add_argument("--train-batch", type=int, help="batch of the training step for cfgs given by path")
    ap.add_argument("--contenders", default="darkpy,torch,torch-cl,onnxruntime",
                    help="comma-separated subset of darkpy,torch,torch-cl,onnxruntime (darkpy always runs)")
    ap.add_argument("--onnx-from", choices=sorted(ONNX_EXPORTERS), default="darkpy",
                    help="where onnxruntime's model comes from (default: darkpy's exporter; torch: the "
                         "torch translation, as a cross-check)")
    ap.add_argument("--fixed-threads", action="store_true",
                    help="darkpy runs every layer on --threads threads (no per-layer choice; A/B only)")
    ap.add_argument("--darkpy-as", choices=["command", "library"], default="command",
                    help="command: darkpy's worker sets what the `darkpy` command sets for itself (default); "
                         "library: nothing")
    ap.add_argument("--settle", type=float, help="seconds between one worker's exit and the next start "
                    "(default 1, --quick 0.5)")
    ap.add_argument("--max-busy", type=float, default=0.10,
                    help="wait before each sample until the machine is at most this busy (default 0.10)")
    ap.add_argument("--no-startup", action="store_true", help="skip the darkpy predict start-up timing")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the results")
    ap.add_argument("--publish", action="store_true",
                    help="also write benchmarks/RESULTS.md (refused when some sample window was not quiet)")
    ap.add_argument("--publish-noisy", action="store_true",
                    help="with --publish: publish even when some windows were not quiet (they are marked)")
    ap.add_argument("--keep-temp", action="store_true", help="keep the temporary folder (weights, outputs)")
    ap.add_argument("--render", type=Path, metavar="JSON",
                    help="measure nothing: write the Markdown of a saved results file (with --publish too)")
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render, args.out, args.publish)

    specs = pick_networks(args.networks, args.quick, args.train_batch)
    contenders = tuple(["darkpy"] + [k for k in args.contenders.split(",") if k and k != "darkpy"])
    unknown = [k for k in contenders if k not in ("darkpy", "torch", "torch-cl", "onnxruntime")]
    if unknown:
        raise SystemExit(f"--contenders: unknown {', '.join(unknown)}")
    opts = Options(threads=args.threads, reps=args.reps or (2 if args.quick else 5),
                   min_sample_s=0.1 if args.quick else 0.3, warm_s=0.1 if args.quick else 0.3,
                   settle_s=args.settle if args.settle is not None else (0.5 if args.quick else 1.0),
                   max_busy=args.max_busy, infer_batch=args.batch or (QUICK_INFER_BATCH if args.quick else 64),
                   onnx_from=args.onnx_from, darkpy_as=args.darkpy_as, contenders=contenders,
                   fixed_threads=args.fixed_threads)
    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {"command": command.strip(), "machine": machine_info(args.threads), "networks": [],
               "options": {"reps": opts.reps, "min_sample_s": opts.min_sample_s, "warm_s": opts.warm_s,
                           "settle_s": opts.settle_s, "max_busy": opts.max_busy, "onnx_from": opts.onnx_from,
                           "darkpy_as": opts.darkpy_as, "contenders": list(contenders),
                           "fixed_threads": opts.fixed_threads},
               "check_logits": True}   # larger batches also compare the logits under a softmax head
    t_start = time.perf_counter()
    try:
        print(f"sgemm peak at {args.threads} threads ...", file=sys.stderr, flush=True)
        results["sgemm"] = reference.sgemm_peak(args.threads)
        peak = results["sgemm"].get("numpy_gflops")
        print(f"   numpy {peak or float('nan'):.1f} GFLOP/s, torch "
              f"{results['sgemm'].get('torch_gflops') or float('nan'):.1f} GFLOP/s "
              f"({(results['sgemm'].get('blas') or {}).get('architecture')} kernels)", file=sys.stderr)
        for spec in specs:
            results["networks"].append(engine.bench_network(spec, opts))
            if args.layers:
                for ph in results["networks"][-1]["phases"]:
                    if ph.get("layers"):
                        print(report.layer_text(results["networks"][-1], ph) + "\n")
        b1 = {}
        for net in results["networks"]:
            for ph in net["phases"]:
                if ph["mode"] == "infer" and ph["batch"] == 1 and "median_s" in ph["contenders"].get("darkpy", {}):
                    b1[net["name"]] = ph["contenders"]["darkpy"]["median_s"]
        results["darknet"] = reference.darknet_reference(specs, opts, b1)
        if "skipped" in results["darknet"]:
            print(f"Darknet C reference: skipped ({results['darknet']['skipped']})", file=sys.stderr)
        if not args.no_startup:
            print("start-up of `darkpy predict` (cold, then warm) ...", file=sys.stderr, flush=True)
            results["startup"] = reference.startup_bench(opts, warm_runs=1 if args.quick else 3)
    finally:
        if not args.keep_temp:
            shutil.rmtree(opts.tmp, ignore_errors=True)
        else:
            print(f"temporary files kept in {opts.tmp}", file=sys.stderr)
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t_start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    publish = args.publish
    noisy = sum((ph.get("quiet") or {}).get("not_quiet", 0) for net in results["networks"] for ph in net["phases"])
    if publish and noisy and not args.publish_noisy:
        print(f"NOT publishing: {noisy} sample windows started on a busy machine (see latest.md); rerun on a "
              "quiet machine, or pass --publish-noisy", file=sys.stderr)
        publish = False
    write_markdown(results, args.out, publish)
    print(f"wrote {args.out / 'latest.json'} and latest.md ({results['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def write_markdown(results: dict, out: Path, publish: bool) -> None:
    md = report.markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.md").write_text(md)
    if publish:
        (ROOT / "benchmarks" / "RESULTS.md").write_text(md)
        publish_summary(results)
    print(md)


def render(path: Path, out: Path, publish: bool) -> int:
    write_markdown(json.loads(path.read_text()), out, publish)
    return 0


if __name__ == "__main__":
    sys.exit(main())
