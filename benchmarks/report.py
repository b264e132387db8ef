"""Turn a results dict (see engine.py / run.py) into Markdown: the throughput table, the environment
every contender ran with, convolution efficiency (per network and the worst layers), start-up times,
the Darknet reference, the targets of issue #9 (met or missed, and by how much) and the hotspots."""
from __future__ import annotations

from collections import defaultdict

# Targets (issue #9), all at the same thread count, in one run.
TRAIN_RATIO = 1.0           # darkpy / PyTorch's faster layout, training
INFER_B1_RATIO = 1.0        # ... inference at batch 1
INFER_BIG_RATIO = 1.0       # ... inference at batch 64
ORT_B1_RATIO = 0.5          # darkpy / ONNX Runtime, inference at batch 1
ORT_BIG_RATIO = 0.8         # ... at batch 64
CONV_FWD_SHARE = 0.4        # every conv layer's forward at batch 64, share of the sgemm rate
CONV_BWD_SHARE = 0.3        # ... its backward (training)
WARM_START_S = 1.5
COLD_START_S = 30.0
WORST_LAYERS = 10


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _ips(c: dict) -> str:
    if "error" in c:
        return "error"
    if "images_per_s" not in c:
        return "–"
    lo, hi = c["phase_batch"] / c["max_s"], c["phase_batch"] / c["min_s"]
    return f"{_num(c['images_per_s'])} ({_num(lo)}–{_num(hi)})"


def _peer_name(kind: str) -> str:
    return {"torch": "NCHW", "torch-cl": "channels_last"}.get(kind, kind)


def _peak(results: dict) -> float | None:
    return (results.get("sgemm") or {}).get("numpy_gflops")


def _phase_peak(results: dict, ph: dict) -> float | None:
    """The sgemm rate to compare a phase with: the one measured during that phase (same machine
    load), else the suite's."""
    return ph.get("sgemm_gflops") or _peak(results)


def throughput_table(results: dict) -> list[str]:
    lines = ["| network | phase | darkpy img/s (min–max) | PyTorch img/s (min–max), layout | darkpy / PyTorch "
             "| ONNX Runtime img/s (min–max) | darkpy / ONNX Runtime | darkpy GFLOP/s (% of sgemm) "
             "| peak RSS MB darkpy / PyTorch / ORT | outputs equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for net in results["networks"]:
        for ph in net["phases"]:
            cs = ph["contenders"]
            for c in cs.values():
                c["phase_batch"] = ph["batch"]
            d = cs.get("darkpy", {})
            peer = ph.get("peer")
            t = cs.get(peer, {}) if peer else {}
            o = cs.get("onnxruntime", {})
            torch_cell = f"{_ips(t)}, {_peer_name(peer)}" if peer else _torch_missing(ph)
            ratio = f"**{ph['ratio']:.2f}×**" if "ratio" in ph else "–"
            ort_cell = _ips(o) if "images_per_s" in o else ("skipped" if "skipped" in o else
                                                            "error" if "error" in o else "–")
            ratio_ort = f"**{ph['ratio_ort']:.2f}×**" if "ratio_ort" in ph else "–"
            gf = "–"
            peak = _phase_peak(results, ph)
            if "gflops" in d:
                share = f" ({100 * d['gflops'] / peak:.0f} %)" if peak else ""
                gf = f"{_num(d['gflops'])}{'*' if ph['mode'] == 'train' else ''}{share}"
            rss = " / ".join(f"{c['maxrss_mb']:.0f}" if "maxrss_mb" in c else "–" for c in (d, t, o))
            lines.append(f"| {net['name']} | {ph['phase']} | {_ips(d)} | {torch_cell} | {ratio} | {ort_cell} "
                         f"| {ratio_ort} | {gf} | {rss} | {_check_cell(ph)} |")
            for c in cs.values():
                c.pop("phase_batch", None)
    lines.append("")
    lines.append("GFLOP/s counts Darknet's FLOPs (convolutional and connected layers); \\* training counts "
                 "3× the forward FLOPs (forward, input gradient, weight gradient), less the first layer's input gradient, which no contender computes. The % compares with numpy's "
                 "sgemm measured in darkpy's sample windows of the same phase. darkpy computes "
                 "3×3 stride-1 convolutions by Winograd F(2×2, 3×3), which needs 2.25× fewer multiplications "
                 "than the count, so those layers can exceed 100 % of sgemm (PyTorch's oneDNN and ONNX "
                 "Runtime may do the same). At inference a linear 1×1 convolution read only by a global "
                 "[avgpool] averages its input first (layers/conv_averaged.py: the same values up to "
                 "rounding, h·w times fewer multiply-adds; neither peer does this): the network's "
                 "GFLOP/s still count it as a convolution, but the per-layer and convolution-layer "
                 "GFLOP/s count what darkpy computed (the tables say \"averaged first\").")
    return lines


def _torch_missing(ph: dict) -> str:
    if ph.get("torch_skipped"):
        return f"not translated ({ph['torch_skipped']})"
    errs = [k for k, c in ph["contenders"].items() if k != "darkpy" and "error" in c]
    return "error (" + ", ".join(errs) + ")" if errs else "–"


def _check_cell(ph: dict) -> str:
    checks = ph.get("checks") or {}
    if not checks:
        return "–"
    worst = max(c.get("max_rel_err", float("inf")) for c in checks.values())
    ok = all(c["ok"] for c in checks.values())
    n = max(c.get("outputs_compared", 0) for c in checks.values())
    what = f"{n} output{'s' if n != 1 else ''}"
    cell = f"{'yes' if ok else '**NO**'} ({what}, {worst:.1e})"
    losses = [c["train_loss"] for c in checks.values() if "train_loss" in c]
    if losses and not losses[0]["compared"]:
        cell += "; loss not compared (dropout)"
    return cell


def conv_table(results: dict) -> list[str]:
    lines = ["| network | phase | darkpy conv GFLOP/s | sgemm GFLOP/s (that phase, else the suite's) "
             "| darkpy % of sgemm | PyTorch conv GFLOP/s |", "|---|---|---|---|---|---|"]
    for net in results["networks"]:
        for ph in net["phases"]:
            if "conv_forward_gflops" not in ph:
                continue
            g, peak = ph["conv_forward_gflops"], _phase_peak(results, ph)
            share = f"{100 * g / peak:.0f} %" if peak else "–"
            tg = ph.get("torch_conv_forward_gflops")
            lines.append(f"| {net['name']} | {ph['phase']} | {g:.1f} | {peak or float('nan'):.0f} | {share} "
                         f"| {f'{tg:.1f}' if tg else '–'} |")
    return lines


def startup_lines(s: dict | None) -> list[str]:
    if not s:
        return ["(not run)"]
    if "skipped" in s:
        return [f"skipped: {s['skipped']}"]
    lines = ["| what | seconds | target |", "|---|---|---|",
             f"| cold start (fresh kernel cache), `{s['command']}` | {s['cold_s']:.1f} "
             f"(says it compiles: {'yes' if s['cold_says_compiling'] else '**no**'}) "
             f"| ≤ {COLD_START_S:.0f}, and says so |",
             f"| warm start, same command (median of {len(s['warm_samples_s'])}) | {s['warm_s']:.2f} "
             f"| ≤ {WARM_START_S} |"]
    for cmd, r in s["no_kernel_commands"].items():
        lines.append(f"| `{cmd}` | {r['s']:.2f} (kernels compiled: {r['compiled']}) | compiles none |")
    return lines


def darknet_lines(d: dict | None) -> list[str]:
    if not d:
        return ["(not run)"]
    if "skipped" in d:
        return [f"skipped: {d['skipped']}"]
    lines = [f"Executable: `{d['executable']}` (`darknet speed`, batch 1, same thread count via OMP_NUM_THREADS)",
             "", "| network | Darknet img/s |", "|---|---|"]
    for name, r in d["networks"].items():
        lines.append(f"| {name} | {r['images_per_s']:.3g} |" if "images_per_s" in r else f"| {name} | error |")
    return lines


def targets(results: dict) -> list[str]:
    """Each target of issue #9 with what was measured; a missed one says by how much."""
    out = []

    def mark(ok: bool | None, text: str) -> None:
        out.append(f"- {'met' if ok else '**missed**' if ok is not None else 'n/a'}: {text}")

    def ratio_mark(net: dict, ph: dict, r: float, goal: float, peer: str) -> None:
        label = f"{net['name']} {ph['phase']}: darkpy/{peer} {r:.2f}× (target ≥ {goal}×)"
        if r < goal:
            label += f", short by {100 * (1 - r / goal):.0f} % (needs {goal / r:.2f}× faster)"
        mark(r >= goal, label)

    for net in results["networks"]:
        for ph in net["phases"]:
            if "ratio" in ph:
                goal = (TRAIN_RATIO if ph["mode"] == "train" else INFER_B1_RATIO if ph["batch"] == 1
                        else INFER_BIG_RATIO)
                ratio_mark(net, ph, ph["ratio"], goal, "PyTorch")
            if "ratio_ort" in ph:
                ratio_mark(net, ph, ph["ratio_ort"], ORT_B1_RATIO if ph["batch"] == 1 else ORT_BIG_RATIO,
                           "ONNX Runtime")
                if ph["ratio_ort"] < 1.0:
                    out.append(f"  (the real goal is 1.0×: {1 / ph['ratio_ort']:.2f}× faster needed)")
    for row, goal, what in [*((r, CONV_FWD_SHARE, "forward") for r in conv_layers(results, "fwd")),
                            *((r, CONV_BWD_SHARE, "backward") for r in conv_layers(results, "bwd"))]:
        if row["share"] < goal:
            mark(False, f"{row['net']} {row['phase']} layer {row['index']} ({row['desc']}) {what} at "
                 f"{100 * row['share']:.0f} % of the sgemm rate (target ≥ {100 * goal:.0f} %)")
    for what, goal in (("fwd", CONV_FWD_SHARE), ("bwd", CONV_BWD_SHARE)):
        rows = conv_layers(results, what)
        if rows:
            n_bad = sum(r["share"] < goal for r in rows)
            mark(n_bad == 0, f"{n_bad} of {len(rows)} convolution layers below {100 * goal:.0f} % of the sgemm "
                 f"rate in their {'forward pass at batch ≥ 64' if what == 'fwd' else 'backward pass'}")
    for net in results["networks"]:
        for ph in net["phases"]:
            peer = ph.get("peer")
            d, t = ph["contenders"].get("darkpy", {}), ph["contenders"].get(peer or "", {})
            if "maxrss_mb" in d and "maxrss_mb" in t:
                ok = d["maxrss_mb"] <= t["maxrss_mb"]
                extra = "" if ok else f", {100 * (d['maxrss_mb'] / t['maxrss_mb'] - 1):.0f} % over"
                if not ok and d.get("darkpy_buffers_mb"):
                    extra += " (darkpy allocates " + ", ".join(
                        f"{k} {v:.0f}" for k, v in d["darkpy_buffers_mb"].items()) + " MB)"
                mark(ok, f"{net['name']} {ph['phase']} peak RSS {d['maxrss_mb']:.0f} MB vs PyTorch "
                     f"{t['maxrss_mb']:.0f} MB{extra}")
    s = results.get("startup") or {}
    if "warm_s" in s:
        mark(s["warm_s"] <= WARM_START_S, f"warm start {s['warm_s']:.2f} s (target ≤ {WARM_START_S} s)")
        mark(s["cold_s"] <= COLD_START_S and s["cold_says_compiling"],
             f"cold start {s['cold_s']:.1f} s (target ≤ {COLD_START_S:.0f} s), says it is compiling: "
             f"{'yes' if s['cold_says_compiling'] else 'no'}")
        for cmd, r in s["no_kernel_commands"].items():
            mark(r["compiled"] == 0 and r["rc"] == 0, f"`{cmd}` compiled {r['compiled']} kernel files (exit {r['rc']})")
    return out


def conv_layers(results: dict, what: str) -> list[dict]:
    """Every convolution layer's darkpy rate as a share of its phase's sgemm rate: `fwd` from the
    inference phases at batch >= 64 (or the suite's large batch), `bwd` from the training phases
    (input gradient + weight gradient: 2× the forward FLOPs; the first layer's weight gradient
    only: 1×)."""
    big = max((ph["batch"] for net in results["networks"] for ph in net["phases"] if ph["mode"] == "infer"),
              default=0)
    rows = []
    for net in results["networks"]:
        for ph in net["phases"]:
            if what == "fwd" and not (ph["mode"] == "infer" and ph["batch"] == big):
                continue
            if what == "bwd" and ph["mode"] != "train":
                continue
            peak = _phase_peak(results, ph)
            for r in ph.get("layers") or []:
                if r["kind"] != "convolutional" or not peak:
                    continue
                ms = r["darkpy_fwd_ms"] if what == "fwd" else r.get("darkpy_bwd_ms", 0.0)
                # the backward: input and weight gradients, but the first layer's weight gradient
                # only (the network's input needs no gradient)
                mflop = r["mflop"] * (1 if what == "fwd" or r["index"] == 0 else 2)
                if ms <= 0:
                    continue
                gf = mflop / ms
                rows.append({"net": net["name"], "phase": ph["phase"], "index": r["index"],
                             "desc": r.get("desc", ""), "ms": ms, "mflop": mflop, "gflops": gf,
                             "share": gf / peak, "sgemm": peak})
    return sorted(rows, key=lambda r: r["share"])


def worst_layers_table(results: dict, top: int = WORST_LAYERS) -> list[str]:
    lines = []
    for what, goal, title in (("fwd", CONV_FWD_SHARE, "forward pass, largest inference batch"),
                              ("bwd", CONV_BWD_SHARE, "backward pass (input and weight gradients; the first "
                                                     "layer's weight gradient only), training")):
        rows = conv_layers(results, what)
        lines += [f"The {top} convolution layers furthest below the sgemm rate, {title} (target ≥ "
                  f"{100 * goal:.0f} %; {len(rows)} layers measured):", ""]
        if not rows:
            lines += ["(no per-layer data)", ""]
            continue
        lines += ["| network | phase | layer | kernel/stride, channels, input | MFLOP | darkpy ms | GFLOP/s "
                  "| % of sgemm |", "|---|---|---|---|---|---|---|---|"]
        for r in rows[:top]:
            lines.append(f"| {r['net']} | {r['phase']} | {r['index']} | {r['desc']} | {r['mflop']:.0f} "
                         f"| {r['ms']:.2f} | {r['gflops']:.1f} | {100 * r['share']:.0f} % |")
        lines.append("")
    return lines


def environment_lines(results: dict) -> list[str]:
    """What every contender ran with: the environment given (the same for all) and what each
    process saw and loaded."""
    m = results["machine"]
    env = m.get("worker_env") or {}
    shown = {k: v for k, v in env.items() if k not in ("PATH", "HOME", "USER", "LOGNAME", "PYTHONPATH")}
    lines = [f"CPU: {m['cpu']}, {m['cores']} cores; SIMD: {', '.join(m.get('simd', [])) or 'unknown'}.", "",
             "Every worker process got the same environment, built from nothing (not the parent's): "
             + ", ".join(f"`{k}={v}`" for k, v in shown.items()) + " (plus PATH, HOME, PYTHONPATH)."]
    dropped = m.get("parent_env_dropped") or {}
    if dropped:
        lines.append("Set in the parent's shell and NOT passed on: "
                     + ", ".join(f"`{k}={v}`" for k, v in dropped.items()) + ".")
    opts = results.get("options") or {}
    if opts:
        lines.append(("darkpy's worker set for itself what the `darkpy` command sets (darkpy/process.py)"
                      if opts.get("darkpy_as") == "command" else
                      "darkpy's worker ran as a library user who set nothing (`--darkpy-as library`)")
                     + f"; ONNX Runtime's model came from the {opts.get('onnx_from')} exporter.")
    lines += ["", "| contender | threads | OMP_WAIT_POLICY | GOMP_SPINCOUNT | OPENBLAS_THREAD_TIMEOUT "
              "| BLAS (kernel) | OpenMP | other |", "|---|---|---|---|---|---|---|---|"]
    seen = {}
    for net in results["networks"]:
        for ph in net["phases"]:
            for kind, c in ph["contenders"].items():
                if "runtime" in c and kind not in seen:
                    seen[kind] = c["runtime"]
    for kind, rt in seen.items():
        pools = rt.get("threadpools") or []
        pools = pools if isinstance(pools, list) else []
        blas = [f"{p['internal_api']} {p['version']} ({p['architecture']}, {p['num_threads']} threads)"
                for p in pools if p.get("user_api") == "blas"]
        omp = [f"{p['prefix']} ({p['num_threads']} threads)" for p in pools if p.get("user_api") == "openmp"]
        if "numba" in rt:
            threads, other = rt["numba"]["threads"], f"numba threading layer {rt['numba']['threading_layer']}"
        elif "torch" in rt:
            threads = rt["torch"]["threads"]
            other = f"torch CPU capability {rt['torch']['cpu_capability']}, interop {rt['torch']['interop_threads']}"
        elif "onnxruntime" in rt:
            o = rt["onnxruntime"]
            threads = o["intra_op_num_threads"]
            other = f"onnxruntime {o['version']}, {o['execution_mode']}, {o['providers'][0]}, optimisation {o['graph_optimization_level']}"
        else:
            threads, other = "?", ""
        e = rt.get("env") or {}
        lines.append(f"| {kind} | {threads} | {e.get('OMP_WAIT_POLICY') or 'unset'} "
                     f"| {e.get('GOMP_SPINCOUNT') or 'unset'} "
                     f"| {e.get('OPENBLAS_THREAD_TIMEOUT') or 'unset'} | {'; '.join(blas) or '–'} "
                     f"| {'; '.join(omp) or '–'} | {other} |")
    return lines


def quiet_lines(results: dict) -> list[str]:
    opts = results.get("options") or {}
    total = not_quiet = unclean = others = 0
    worst = 0.0
    for net in results["networks"]:
        for ph in net["phases"]:
            q = ph.get("quiet") or {}
            total += q.get("windows", 0)
            not_quiet += q.get("not_quiet", 0)
            unclean += q.get("unclean_exits", 0)
            others += q.get("other_workers", 0)
            worst = max(worst, q.get("max_busy") or 0.0)
    return [f"One worker process at a time: {total} windows (each a process's whole life: set-up, warm-up, "
            f"one sample), each after the previous worker had exited, a {opts.get('settle_s', '?')} s settle "
            f"and a wait for the machine to be at most {100 * opts.get('max_busy', 0):.0f} % busy. "
            f"{not_quiet} windows started on a busier machine (up to {100 * worst:.0f} % busy); "
            f"{unclean} workers did not exit cleanly; {others} windows saw another benchmark worker alive."
            + (" **These numbers were not taken on a quiet machine.**" if not_quiet else "")]


def hotspots(results: dict, top: int = 8) -> list[str]:
    """Where darkpy loses most time to PyTorch, per layer and per layer kind (inference phases),
    and darkpy's own training profile (forward / backward / update per kind)."""
    lines = []
    rows = []
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for net in results["networks"]:
        for ph in net["phases"]:
            for row in ph.get("layers") or []:
                if ph["mode"] != "infer" or "torch_fwd_ms" not in row:
                    continue
                if row["darkpy_fwd_ms"] > row["torch_fwd_ms"]:
                    rows.append((row["darkpy_fwd_ms"] - row["torch_fwd_ms"], net["name"], ph["phase"], row))
                k = by_kind[row["kind"]]
                k[0] += row["darkpy_fwd_ms"]
                k[1] += row["torch_fwd_ms"]
    if rows:
        lines += ["Per layer kind, all networks and inference phases with per-layer timing (sums of "
                  "per-layer forward times):", "",
                  "| layer kind | darkpy ms | PyTorch ms | darkpy / PyTorch time |", "|---|---|---|---|"]
        for kind, (d, t) in sorted(by_kind.items(), key=lambda kv: kv[1][1] - kv[1][0]):
            ratio = f"{d / t:.1f}×" if t > 0 else "–"
            lines.append(f"| {kind} | {d:.0f} | {t:.0f} | {ratio} |")
        lines += ["", f"The {top} layers where darkpy loses the most time:", "",
                  "| network | phase | layer | output (c, h, w) | MFLOP | darkpy ms | PyTorch ms | darkpy GFLOP/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for gap, name, phase, row in sorted(rows, key=lambda r: -r[0])[:top]:
            gf = row["mflop"] / row["darkpy_fwd_ms"] if row["darkpy_fwd_ms"] > 0 and row["mflop"] else 0
            lines.append(f"| {name} | {phase} | {row['index']} {row['kind']} | {tuple(row['out_shape'])} | "
                         f"{row['mflop']:.0f} | {row['darkpy_fwd_ms']:.1f} | {row['torch_fwd_ms']:.1f} | "
                         f"{gf:.1f} |")
    train_rows = []
    for net in results["networks"]:
        for ph in net["phases"]:
            if ph["mode"] == "train" and ph.get("layers"):
                kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
                for row in ph["layers"]:
                    kinds[row["kind"]][0] += row.get("darkpy_fwd_ms", 0.0)
                    kinds[row["kind"]][1] += row.get("darkpy_bwd_ms", 0.0)
                total = sum(f + b for f, b in kinds.values())
                parts = ", ".join(f"{k} {f:.0f}+{b:.0f} ms" for k, (f, b) in
                                  sorted(kinds.items(), key=lambda kv: -sum(kv[1])) if f + b >= 0.02 * total)
                train_rows.append(f"- {net['name']} {ph['phase']} (forward+backward per kind, total "
                                  f"{total:.0f} ms): {parts}")
    if train_rows:
        lines += ["", "darkpy's training step by layer kind:", ""] + train_rows
    return lines or ["(no per-layer data: run with per-layer timing)"]


def layer_text(net: dict, ph: dict) -> str:
    """A plain-text per-layer table for one phase (`python -m benchmarks.run --layers CFG`)."""
    rows = ph.get("layers") or []
    train = ph["mode"] == "train"
    head = f"{net['name']} {ph['phase']}"
    cols = "  idx kind             output (c,h,w)        MFLOP   darkpy fwd ms" + (
        "  darkpy bwd ms" if train else "   torch fwd ms   ratio   darkpy GFLOP/s")
    lines = [head, cols]
    for r in rows:
        shape = "x".join(str(v) for v in r.get("out_shape", [])) if r["index"] is not None else ""
        idx = f"{r['index']:5d}" if r["index"] is not None else "    -"
        line = f"{idx} {r['kind']:<16} {shape:<18} {r.get('mflop', 0):9.1f} {r['darkpy_fwd_ms']:14.2f}"
        if train:
            line += f" {r.get('darkpy_bwd_ms', 0):14.2f}"
        elif "torch_fwd_ms" in r:
            t = r["torch_fwd_ms"]
            ratio = r["darkpy_fwd_ms"] / t if t > 0 else float("inf")
            gf = r.get("mflop", 0) / r["darkpy_fwd_ms"] if r["darkpy_fwd_ms"] > 0 else 0
            line += f" {t:14.2f} {ratio:7.1f}x {gf:14.1f}"
        lines.append(line)
    total_d = sum(r["darkpy_fwd_ms"] + r.get("darkpy_bwd_ms", 0) for r in rows)
    total_t = sum(r.get("torch_fwd_ms", 0) for r in rows)
    lines.append(f"      total darkpy {total_d:.1f} ms" + (f", torch {total_t:.1f} ms" if total_t else ""))
    return "\n".join(lines)


def machine_line(results: dict) -> str:
    m = results["machine"]
    v = m["versions"]
    blas = (results.get("sgemm") or {}).get("blas") or {}
    peak = _peak(results)
    tpk = (results.get("sgemm") or {}).get("torch_gflops")
    load = f"{m['loadavg_start'][0]:.1f} at the start, {m.get('loadavg_end', [float('nan')])[0]:.1f} at the end"
    return (f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m.get('simd', []))}), {m['memory_gb']} GB; "
            f"{m['threads']} threads for each contender; Python {v['python']}, numpy {v['numpy']}, numba "
            f"{v['numba']}, torch {v.get('torch')}, onnxruntime {v.get('onnxruntime')}; BLAS "
            f"{blas.get('internal_api')} {blas.get('version')} ({blas.get('architecture')} kernels). sgemm at "
            f"{m['threads']} threads: {peak or float('nan'):.0f} GFLOP/s through numpy"
            + (f", {tpk:.0f} through torch" if tpk else "") + f". Load average {load}.")


def summary_block(results: dict) -> str:
    """The machine and the throughput table, for benchmarks/README.md."""
    return "\n".join([f"From `{results['command']}`, {results['machine']['date']}. " + machine_line(results),
                      "", *quiet_lines(results), "", *throughput_table(results), "",
                      "Environment, targets, the worst layers and start-up times: [RESULTS.md](RESULTS.md)."])


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# darkpy benchmark results",
        "",
        f"Generated by `{results['command']}` on {m['date']}.",
        "",
        machine_line(results),
        "",
        *quiet_lines(results),
        "",
        "Every phase first checks that every contender gives darkpy's outputs (for PyTorch every layer at "
        "batch 1, otherwise the heads and the logits feeding a softmax head; for ONNX Runtime the heads and "
        "logits; the training loss; the cell gives the largest difference relative to the output's "
        "magnitude), then times them one at a time: median images/s over the samples, min–max in brackets. "
        "PyTorch is timed in NCHW and channels_last; the faster one is the peer of the ratio.",
        "",
        "## Throughput",
        "",
        *throughput_table(results),
        "",
        "## Environment of the contenders",
        "",
        *environment_lines(results),
        "",
        "## Convolution layers",
        "",
        *conv_table(results),
        "",
        *worst_layers_table(results),
        "## Start-up of the `darkpy` command",
        "",
        *startup_lines(results.get("startup")),
        "",
        "## Darknet C reference",
        "",
        *darknet_lines(results.get("darknet")),
        "",
        "## Targets (issue #9)",
        "",
        *targets(results),
        "",
        "## Where the time goes",
        "",
        *hotspots(results),
        "",
    ]
    return "\n".join(lines)
