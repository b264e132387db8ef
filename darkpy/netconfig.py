"""The `[net]` section, typed (spec §3): its keys, defaults and checks (`NetConfig.from_section`).

Darknet reads `[net]` without checking it; darkpy reads the keys either repo knows and warns about
any other (KNOWN_NET_KEYS), and refuses values that cannot work (batch < 1, scales that do not match
steps, no input size) with a one-line located error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .cfg import Section

POLICIES = ("constant", "step", "steps", "exp", "poly", "random", "sigmoid", "sgdr", "cosine")

# [net] keys darknet (either repo) reads; anything else is warned about (darknet never checks [net]).
KNOWN_NET_KEYS = frozenset("""
batch subdivisions time_steps width height channels inputs learning_rate momentum decay policy burn_in
power step scale steps scales gamma max_batches adam B1 B2 eps max_crop min_crop max_ratio min_ratio angle
aspect saturation exposure hue center clip random notruth seen learning_rate_min sgdr_cycle sgdr_mult
sequential_subdivisions seq_scales track augment_speed try_fix_nan weights_reject_freq equidistant_point
badlabels_rejection_percentage num_sigmas_reject_badlabels ema_alpha use_cuda_graph loss_scale
dynamic_minibatch optimized_memory workspace_size_limit_MB flip blur gaussian_noise mixup cutmix mosaic
letter_box mosaic_bound contrastive contrastive_jit_flip contrastive_color unsupervised label_smooth_eps
resize_step attention adversarial_lr max_chart_loss show_receptive_field max_epochs
adamw weight_decay clip_norm warmup mosaic_off
""".split())


@dataclass
class NetConfig:
    """The `[net]` section, typed (spec §3). `batch` here is the cfg's full batch per update."""

    batch: int = 1
    subdivisions: int = 1
    time_steps: int = 1
    width: int = 0
    height: int = 0
    channels: int = 0
    inputs: int = 0
    learning_rate: float = 0.001
    momentum: float = 0.9
    decay: float = 0.0001
    policy: str = "constant"
    burn_in: int = 0
    power: float = 4.0
    step: int = 1
    scale: float = 1.0
    steps: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    gamma: float = 1.0
    max_batches: int = 0
    adam: bool = False
    B1: float = 0.9
    B2: float = 0.999
    eps: float = 1e-7
    learning_rate_min: float = 1e-5
    sgdr_cycle: int = 0
    sgdr_mult: int = 2
    # classifier augmentation
    max_crop: int = 0
    min_crop: int = 0
    max_ratio: float = 0.0
    min_ratio: float = 0.0
    angle: float = 0.0
    aspect: float = 1.0
    saturation: float = 1.0
    exposure: float = 1.0
    hue: float = 0.0
    center: int = 0
    flip: int = 1
    random: int = 0
    clip: float = 0.0
    label_smooth_eps: float = 0.0     # classifier truth: 1 - eps for the class, eps/(k-1) elsewhere
    # detector augmentation (darkpy/augment.py)
    mosaic: int = 0
    mosaic_bound: int = 0
    mixup: int = 0
    cutmix: int = 0
    blur: int = 0
    gaussian_noise: int = 0
    letter_box: int = 0
    mosaic_off: int = 0               # darkpy: mosaic stops at this iteration (0: never); Darknet ignores it
    seen: int = 0
    # darkpy (optim.py): AdamW, global-norm gradient clipping, linear warm-up
    adamw: bool = False
    weight_decay: float = 0.01
    clip_norm: float = 0.0
    warmup: int = 0

    @property
    def minibatch(self) -> int:
        """Rows per forward pass: batch/subdivisions, times time_steps (Darknet's net.batch)."""
        return max(self.batch // self.subdivisions, 1) * self.time_steps

    @property
    def full_batch(self) -> int:
        """B of the update rule: minibatch · subdivisions."""
        return self.minibatch * self.subdivisions

    @classmethod
    def from_section(cls, sec: Section) -> "NetConfig":
        c = cls()
        for key in ("batch", "subdivisions", "time_steps", "width", "height", "channels", "inputs",
                    "burn_in", "step", "max_batches", "max_crop", "min_crop", "center", "random",
                    "sgdr_cycle", "sgdr_mult", "flip", "warmup", "mosaic", "mosaic_bound", "mixup", "cutmix",
                    "blur", "gaussian_noise", "letter_box", "mosaic_off"):
            setattr(c, key, sec.get_int(key, getattr(c, key)))
        for key in ("learning_rate", "momentum", "decay", "power", "scale", "gamma", "B1", "B2", "eps",
                    "angle", "aspect", "saturation", "exposure", "hue", "clip", "learning_rate_min",
                    "max_ratio", "min_ratio", "weight_decay", "clip_norm", "label_smooth_eps"):
            setattr(c, key, sec.get_float(key, getattr(c, key)))
        c.adam = sec.get_bool("adam", False)
        c.adamw = sec.get_bool("adamw", False)
        c.policy = sec.get_choice("policy", POLICIES, "constant")
        for key, lo in (("batch", 1), ("subdivisions", 1), ("time_steps", 1)):
            if getattr(c, key) < lo:
                raise sec.error(f"must be >= {lo} (got {getattr(c, key)})", key)
        if c.mosaic_off < 0:
            raise sec.error(f"must be >= 0 (the iteration mosaic stops at; 0: never), got {c.mosaic_off}",
                            "mosaic_off")
        if c.mosaic_off and not c.mosaic:
            sec.warn("mosaic_off without mosaic=1 changes nothing", "mosaic_off")
        if c.batch % c.subdivisions:
            sec.warn(f"batch={c.batch} is not a multiple of subdivisions={c.subdivisions}; "
                     f"each pass uses {c.batch // c.subdivisions or 1} images", "subdivisions")
        if c.policy == "steps":
            c.steps = sec.get_int_list("steps")
            c.scales = sec.get_float_list("scales", [1.0] * len(c.steps))
            if len(c.scales) != len(c.steps):
                raise sec.error(f"needs as many values as steps (got {len(c.scales)}, expected "
                                f"{len(c.steps)})", "scales")
        else:
            for key in ("steps", "scales"):
                if sec.has(key):
                    sec.raw(key)  # read, so `cfg check` does not call them unknown
        if c.inputs == 0:
            if c.width <= 0 or c.height <= 0 or c.channels <= 0:
                missing = [k for k in ("width", "height", "channels") if getattr(c, k) <= 0]
                raise sec.error(f"no input size: set width, height and channels (or inputs); "
                                f"missing {', '.join(missing)}", missing[0])
            c.inputs = c.width * c.height * c.channels
        c.min_crop = c.min_crop or c.width
        c.max_crop = c.max_crop or 2 * c.width
        c.min_ratio = c.min_ratio or (c.min_crop / c.width if c.width else 1.0)
        c.max_ratio = c.max_ratio or (c.max_crop / c.width if c.width else 1.0)
        for key, opt in sec.options.items():
            if key not in KNOWN_NET_KEYS:
                sec.warn(f"unknown [net] key (value {opt.value!r}); darknet ignores it", key)
            opt.used = True
        return c

    @property
    def input_shape(self) -> tuple:
        if self.width and self.height and self.channels and self.width * self.height * self.channels == self.inputs:
            return (self.channels, self.height, self.width)
        return (self.inputs,)
