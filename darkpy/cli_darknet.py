"""Darknet's own command forms, as aliases of the darkpy commands, and `darkpy partial`.

A Darknet user types `darknet detector train obj.data cfg/x.cfg yolov4-tiny.conv.29 -map`; here
`darkpy detector train obj.data cfg/x.cfg yolov4-tiny.conv.29 -map` runs `darkpy train cfg/x.cfg
--data obj.data --weights yolov4-tiny.conv.29 --map`, after printing that command once (on stderr)
so the user learns it. The forms: `detector train|test|map|valid`, `classifier train|predict|valid`,
each with Darknet's single-dash options (`-map`, `-clear`, `-thresh 0.3`, ...). Options that only
matter to Darknet's GUI or GPUs (`-dont_show`, `-gpus 0`, ...) are accepted and ignored; others
are an error naming the darkpy option to use.

`darkpy train obj.data ...` (Darknet's argument order given to a darkpy command) answers with the
darkpy command to type (`check_darknet_order`, called by the `darkpy` group before it parses).

The module also builds the command line that resumes an interrupted run (`resume_command`).
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

import click

from .errors import DarkpyError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
PASS_ALL = {**CONTEXT, "ignore_unknown_options": True, "allow_extra_args": True}

#: Darknet options that change nothing in darkpy (display, GPUs, servers): accepted, ignored.
IGNORED_FLAGS = frozenset({"dont_show", "show_imgs", "ext_output", "nogpu", "benchmark", "show",
                           "letter_box", "json"})
IGNORED_VALUES = frozenset({"gpus", "i", "mjpeg_port", "json_port", "hier", "points", "avgframes"})


class DarknetUsage(DarkpyError):
    """A Darknet-form command that darkpy cannot translate (arguments missing, an unknown option)."""


@dataclass
class Form:
    """One Darknet command form: its positional arguments and how it maps to a darkpy command."""

    target: str                           # the darkpy command
    usage: str
    required: int                         # positional arguments that must be given
    optional: int                         # ... and that may follow
    flags: dict[str, str | None] = field(default_factory=dict)  # Darknet flag -> darkpy flag (None: the
    #                                                                translation reads it)
    values: dict[str, str] = field(default_factory=dict)   # Darknet option with a value -> darkpy option


def _translate_detector_train(pos, opts):
    data, cfg, *rest = pos
    argv = ["train", cfg, "--data", data]
    if rest:
        argv += ["--weights", rest[0]]
        if opts.pop("-clear", None):
            argv.append("--clear")
    opts.pop("-clear", None)               # Darknet's -clear without weights changes nothing
    return argv


def _translate_test(pos, opts):
    data, cfg, weights, *img = pos
    argv = ["detect", cfg, weights, img[0] if img else "-", "--data", data]
    if not img:
        argv.append("--no-draw")           # Darknet's `< list.txt` form: one predictions image per list
    return argv


def _translate_map(pos, opts):
    data, cfg, weights = pos
    return ["map", cfg, weights, "--data", data]


def _translate_classifier_train(pos, opts):
    return _translate_detector_train(pos, opts)


def _translate_predict(pos, opts):
    data, cfg, weights, *img = pos
    if not img:
        raise DarknetUsage("classifier predict: give the image path after the weights (darkpy does not "
                           "prompt for it)")
    return ["predict", cfg, weights, img[0], "--data", data]


def _translate_valid(pos, opts):
    data, cfg, weights = pos
    return ["valid", cfg, weights, "--data", data]


FORMS: dict[tuple[str, str], tuple[Form, object]] = {
    ("detector", "train"): (Form("train", "DATA CFG [WEIGHTS] [-map] [-clear]", 2, 1,
                                 {"-map": "--map", "-clear": None}), _translate_detector_train),
    ("detector", "test"): (Form("detect", "DATA CFG WEIGHTS [IMAGE] [-thresh T] [-save_labels]", 3, 1,
                                {"-save_labels": "--save-labels"}, {"-thresh": "--thresh"}), _translate_test),
    ("detector", "map"): (Form("map", "DATA CFG WEIGHTS [-iou_thresh T] [-thresh T]", 3, 0, {},
                               {"-iou_thresh": "--iou", "-thresh": "--thresh"}), _translate_map),
    ("detector", "valid"): (Form("map", "DATA CFG WEIGHTS", 3, 0), _translate_map),
    ("classifier", "train"): (Form("train", "DATA CFG [WEIGHTS] [-clear]", 2, 1, {"-clear": None}),
                              _translate_classifier_train),
    ("classifier", "predict"): (Form("predict", "DATA CFG WEIGHTS IMAGE [-t TOP]", 3, 1, {}, {"-t": "--top"}),
                                _translate_predict),
    ("classifier", "valid"): (Form("valid", "DATA CFG WEIGHTS", 3, 0), _translate_valid),
}

NOTES = {("detector", "valid"): "Darknet's `detector valid` writes per-class result files for an external "
                                "VOC/COCO scorer; darkpy measures the mAP on the valid list directly"}


def translate(group: str, verb: str, words: list[str]) -> list[str]:
    """The darkpy arguments for `darknet GROUP VERB WORDS...` (a DarknetUsage error when they do not fit)."""
    key = (group, verb)
    if key not in FORMS:
        known = ", ".join(v for g, v in FORMS if g == group)
        raise DarknetUsage(f"darkpy has no equivalent of `darknet {group} {verb}`; the {group} forms it knows: "
                           f"{known} (see `darkpy --help` for its own commands)")
    form, fn = FORMS[key]
    pos: list[str] = []
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and w != "-" and not _is_number(w):
            name = w[1:]
            if w in form.flags:
                opts[w] = True
            elif w in form.values or name in IGNORED_VALUES:
                if i + 1 >= len(words):
                    raise DarknetUsage(f"{group} {verb}: {w} needs a value")
                opts[w] = words[i + 1]
                i += 1
            elif name not in IGNORED_FLAGS:
                raise DarknetUsage(f"{group} {verb}: unknown Darknet option {w} (usage: darkpy {group} {verb} "
                                   f"{form.usage}; darkpy's own options: darkpy {form.target} --help)")
        else:
            pos.append(w)
        i += 1
    if not form.required <= len(pos) <= form.required + form.optional:
        raise DarknetUsage(f"usage: darkpy {group} {verb} {form.usage} (Darknet's form; got {len(pos)} "
                           f"argument{'s' if len(pos) != 1 else ''})")
    argv = fn(pos, opts)
    for flag, ours in form.flags.items():
        if ours and opts.get(flag):
            argv.append(ours)
    for opt, ours in form.values.items():
        if opt in opts:
            argv += [ours, str(opts[opt])]
    return argv


def _is_number(w: str) -> bool:
    try:
        float(w)
    except ValueError:
        return False
    return True


def command_text(argv: list[str]) -> str:
    return "darkpy " + " ".join(shlex.quote(a) for a in argv)


def _run(ctx: click.Context, group: str, verb: str, words: list[str]) -> None:
    argv = translate(group, verb, list(words))
    note = NOTES.get((group, verb))
    click.echo(f"note: `darkpy {group} {verb}` is Darknet's form; darkpy's own is `{command_text(argv)}`"
               + (f" ({note})" if note else ""), err=True)
    root = ctx.find_root()
    cmd = root.command.get_command(root, argv[0])
    with cmd.make_context(argv[0], argv[1:], parent=root) as sub:
        return cmd.invoke(sub)


class _AliasGroup(click.Group):
    """A Darknet command group: a verb it does not know is answered with the ones it does."""

    def get_command(self, ctx: click.Context, cmd_name: str):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None:
            translate(self.name, cmd_name, [])        # raises DarknetUsage: no such form
        return cmd


def _alias_group(name: str, doc: str) -> click.Group:
    @click.group(name, cls=_AliasGroup, context_settings=CONTEXT, help=doc)
    def group():
        pass

    for (g, verb), (form, _fn) in FORMS.items():
        if g != name:
            continue

        def make(verb=verb, form=form):
            @click.command(verb, context_settings=PASS_ALL, add_help_option=False, options_metavar="",
                           help=f"Darknet's `{name} {verb} {form.usage}`: prints and runs the darkpy command.",
                           short_help=f"{form.usage}")
            @click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar=form.usage)
            @click.pass_context
            def alias(ctx, words):
                if "--help" in words or "-h" in words:
                    click.echo(ctx.get_help())
                    return None
                return _run(ctx, name, verb, list(words))
            return alias

        group.add_command(make())
    return group


detector = _alias_group("detector", "Darknet's `detector train|test|map|valid` forms (DATA CFG ...), run as "
                                    "the darkpy commands they name.")
classifier = _alias_group("classifier", "Darknet's `classifier train|predict|valid` forms (DATA CFG ...), run "
                                        "as the darkpy commands they name.")


@click.command("partial", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("n", type=click.IntRange(min=1))
def partial_command(cfg, weights, out, n):
    """Write the first N layers of WEIGHTS (a file of the network CFG) to OUT, with the iteration
    count reset to 0: a pretrained backbone to start other networks from (Darknet's `partial`).

    \b
    darkpy partial cfg/yolov4-tiny.cfg yolov4-tiny.weights yolov4-tiny.conv.29 29
    darkpy train cfg/my-tiny.cfg --data obj.data --weights yolov4-tiny.conv.29
    """
    from .partial import make_partial

    net = make_partial(cfg, weights, out, n)
    floats = sum(a.size for layer in net.layers[:n] if not layer.dontsave for a in layer.weight_arrays())
    click.echo(f"wrote {out}: layers 0..{n - 1} of {weights} ({floats:,} values), seen 0")


def register(group: click.Group) -> None:
    """Add `partial`, `detector` and `classifier` to the `darkpy` command group."""
    group.add_command(partial_command)
    group.add_command(detector)
    group.add_command(classifier)


# -- Darknet's argument order given to a darkpy command ------------------------------------------------

_ORDER_FORMS = {"train": ("detector", "train"), "detect": ("detector", "test"), "map": ("detector", "map"),
                "valid": ("classifier", "valid"), "predict": ("classifier", "predict")}


def check_darknet_order(args: list[str], command: click.Command | None = None) -> None:
    """`darkpy train obj.data x.cfg ...`: a .data file where the cfg goes. Raises a DarknetUsage
    error naming the darkpy command to type (and Darknet's form that also works). `command` (the
    darkpy command named by args[0]) tells which options take a value, to skip it."""
    if not args or args[0] not in _ORDER_FORMS:
        return
    rest = args[1:]
    valued = {o for p in (command.params if command else ()) if isinstance(p, click.Option) and not p.is_flag
              and not p.count for o in p.opts}
    first, skip = None, False
    for w in rest:
        if skip:
            skip = False
        elif w in valued:
            skip = True
        elif not w.startswith("-") or w == "-":
            first = w
            break
    if first is None or not first.endswith(".data"):
        return
    group, verb = _ORDER_FORMS[args[0]]
    words = rest[rest.index(first):]
    try:
        argv = translate(group, verb, words)
    except DarknetUsage:
        raise DarknetUsage(f"{first} is a .data file; darkpy takes the network's cfg first and the .data "
                           f"file with --data: `darkpy {args[0]} CFG{' WEIGHTS' if verb != 'train' else ''} "
                           f"--data {shlex.quote(first)} ...`") from None
    raise DarknetUsage(f"{first} is a .data file; darkpy takes the network's cfg first: `{command_text(argv)}` "
                       f"(Darknet's order works as `darkpy {group} {verb} {' '.join(map(shlex.quote, words))}`)")


# -- the command that resumes an interrupted run ---------------------------------------------------------

#: options of `train` that do not belong in the command resuming it from its last checkpoint
_NOT_ON_RESUME = ("weights", "clear", "upto")


def resume_command(ctx: click.Context, weights: str) -> str:
    """The `darkpy train` command that continues the run of `ctx` from `weights`: the cfg, every
    option given a non-default value (--data, --backup, --max-batches, --map, ...), and --weights."""
    argv = [ctx.info_name or "train"] + [a for a in _positional(ctx)]
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in _NOT_ON_RESUME:
            continue
        value = ctx.params.get(p.name)
        if value is None or value == p.default or (p.is_flag and not value):
            continue
        flag = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        argv += [flag] if p.is_flag else [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    argv += ["--weights", os.fspath(weights)]
    return command_text(argv)


def _positional(ctx: click.Context) -> list[str]:
    return [str(ctx.params[p.name]) for p in ctx.command.params if isinstance(p, click.Argument)]
