"""mAP of cfg/shapes-tiny.cfg trained with and without `mosaic=1` on the bundled shapes generator.

One run (one arm, one seed):

    python benchmarks/mosaic_map.py --out /tmp/mosaic --size 128 --images 3000 --iterations 3000 \\
        --threads 1 [--mosaic] [--seed 1]

Both arms over several seeds, as parallel subprocesses (the figures in the README):

    python benchmarks/mosaic_map.py --out /tmp/mosaic --size 128 --images 3000 --iterations 3000 \\
        --threads 1 --compare --seeds 1,2,3,4,5 --jobs 2

Variants: `--edit SECTION.KEY=VALUE` (repeatable) edits the cfg of both arms, `--mosaic-edit` the
mosaic arm's only; SECTION is `net`, `yolo` (every [yolo] head) or a section index. `--tag NAME`
keeps a variant's runs apart (<out>/<NAME>-<arm>-s<seed>), `--arms` picks the arms `--compare` runs.
The README's history of the bundled cfg, for instance: the cfg before `iou_thresh`
(`--edit yolo.iou_thresh=1`), the shorter schedule (`--iterations 1500`), closing mosaic:

    python benchmarks/mosaic_map.py --out /tmp/mosaic --iterations 1500 --threads 1 --compare \\
        --seeds 1,2 --jobs 1 --tag close --arms mosaic --mosaic-edit net.mosaic_off=1125

Generates the dataset (once per --out), edits a copy of the cfg (size, schedule, mosaic), trains
with the seed, and prints one JSON line per run: the settings, mAP@0.5 (darknet rules, all-point) and
COCO's AP@[.5:.95] on the held-out images, and the training time. `--compare` runs every (arm, seed)
with the same data, schedule and seeds, then prints each arm's runs and mean. A run's folder is
<out>/[<tag>-]<plain|mosaic>-s<seed>.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--iterations", type=int, default=600)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mosaic", action="store_true")
    p.add_argument("--compare", action="store_true", help="both arms, every seed of --seeds")
    p.add_argument("--seeds", default="1", help="with --compare: comma-separated seeds")
    p.add_argument("--jobs", type=int, default=2, help="with --compare: runs at a time")
    p.add_argument("--arms", default="plain,mosaic", help="with --compare: the arms to run")
    p.add_argument("--edit", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="cfg edit for both arms (repeatable; SECTION: net, yolo or an index)")
    p.add_argument("--mosaic-edit", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="cfg edit for the mosaic arm only (repeatable)")
    p.add_argument("--tag", default="", help="a variant's name: runs go to <out>/<tag>-<arm>-s<seed>")
    a = p.parse_args()
    if a.compare:
        compare(a)
        return
    run_one(a)


def _dataset(out: Path, images: int, size: int) -> Path:
    shapes = out / f"shapes{size}"
    if not (shapes / "valid.list").is_file():
        spec = importlib.util.spec_from_file_location("gen", ROOT / "data" / "shapes" / "generate.py")
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        gen.generate(shapes, n=images, size=size, seed=0)
    return shapes


def compare(a) -> None:
    """Every (arm, seed) as a subprocess of this script, --jobs at a time; a summary per arm."""
    import os
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    _dataset(Path(a.out), a.images, a.size)          # once, before the runs share it
    arms = [arm for arm in ("plain", "mosaic") if arm in a.arms.split(",")]
    runs = [(arm, int(seed)) for seed in a.seeds.split(",") for arm in arms]

    def one(run):
        arm, seed = run
        cmd = [sys.executable, __file__, "--out", a.out, "--size", str(a.size), "--images", str(a.images),
               "--iterations", str(a.iterations), "--threads", str(a.threads), "--seed", str(seed)]
        cmd += ["--mosaic"] if arm == "mosaic" else []
        cmd += ["--tag", a.tag] if a.tag else []
        cmd += [f"--edit={e}" for e in a.edit] + [f"--mosaic-edit={e}" for e in a.mosaic_edit]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        line = done.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        return json.loads(line)

    with ThreadPoolExecutor(max(a.jobs, 1)) as pool:
        results = list(pool.map(one, runs))
    for arm in arms:
        rs = [r for r in results if r["mosaic"] == (arm == "mosaic")]
        m50 = sum(r["map50"] for r in rs) / len(rs)
        ap = sum(r["coco_ap"] for r in rs) / len(rs)
        seeds = ", ".join(f"s{r['seed']} {r['map50']:.4f}/{r['coco_ap']:.4f}" for r in rs)
        print(f"{arm:7s} mAP@0.5 mean {m50:.4f}, COCO AP mean {ap:.4f}  ({seeds})")


def _apply_edit(doc, edit: str) -> None:
    """`SECTION.KEY=VALUE` on the cfg document; SECTION `yolo` edits every [yolo] head."""
    path, sep, value = edit.partition("=")
    section, dot, key = path.partition(".")
    if not sep or not dot:
        raise SystemExit(f"--edit {edit!r}: expected SECTION.KEY=VALUE")
    if section == "yolo":
        heads = [i for i, sec in enumerate(doc.layers) if sec.kind == "yolo"]
        for i in heads:
            doc.set(f"{i}.{key}", value)
    else:
        doc.set(path, value)


def run_one(a) -> None:

    from darkpy.cfg import load_cfg
    from darkpy.detect import map_of_run, run_valid
    from darkpy.network import load_network
    from darkpy.settings import Settings
    from darkpy.train import configure_threads, train

    out = Path(a.out)
    shapes = _dataset(out, a.images, a.size)
    arm = "mosaic" if a.mosaic else "plain"
    run_dir = out / f"{a.tag + '-' if a.tag else ''}{arm}-s{a.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    data = run_dir / "shapes.data"
    data.write_text(f"classes=4\ntrain={shapes / 'train.list'}\nvalid={shapes / 'valid.list'}\n"
                    f"names={ROOT / 'data' / 'shapes.names'}\nbackup={run_dir / 'backup'}\n")
    doc = load_cfg(ROOT / "cfg" / "shapes-tiny.cfg")
    n = a.iterations
    for key, value in (("width", a.size), ("height", a.size), ("max_batches", n), ("burn_in", min(100, n // 6)),
                       ("steps", f"{n * 3 // 4},{n * 9 // 10}")):
        doc.set(f"net.{key}", str(value))
    if a.size != 128:
        f = a.size / 128
        anchors = ", ".join(f"{max(int(v * f), 1)},{max(int(v * f), 1)}" for v in (16, 22, 28, 36, 44, 54))
        for i, sec in enumerate(doc.layers):
            if sec.kind == "yolo":
                doc.set(f"{i}.anchors", anchors)
    if a.mosaic:
        doc.set("net.mosaic", "1")
        doc.set("net.mosaic_bound", "1")
    edits = a.edit + (a.mosaic_edit if a.mosaic else [])
    for edit in edits:
        _apply_edit(doc, edit)
    cfg = run_dir / "shapes-tiny.cfg"
    doc.write(cfg)
    settings = Settings(threads=a.threads)
    configure_threads(a.threads)
    t0 = time.perf_counter()
    result = train(cfg, data=data, seed=a.seed, settings=settings, evaluate=False)
    took = time.perf_counter() - t0
    net = load_network(cfg, result.weights, batch=16)
    run = run_valid(net, data)
    dk = map_of_run(run, 0.5, metric="darknet")
    coco = map_of_run(run, metric="coco")
    print(json.dumps({"mosaic": a.mosaic, "tag": a.tag, "edits": edits, "size": a.size, "images": a.images,
                      "iterations": n, "seed": a.seed,
                      "valid_images": len(run.paths), "map50": dk.map_all, "coco_ap": coco.coco["AP"],
                      "coco_ap50": coco.coco["AP50"], "coco_ap_small": coco.coco["APs"],
                      "train_s": round(took, 1)}))


if __name__ == "__main__":
    main()
