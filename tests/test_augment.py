"""Detector augmentations (darkpy/augment.py): deterministic under the seed, and the boxes checked
against the pixels they label (solid red rectangles on black images), plus the preview command."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from darkpy.augment import AugmentOptions, augmented_sample, gaussian_blur
from darkpy.cli import main
from darkpy.datasets import DetectionData
from darkpy.train import augment_rng


@pytest.fixture(scope="module")
def red_boxes(tmp_path_factory):
    """10 images (various sizes) with 1-3 solid red rectangles each, and their label files."""
    root = tmp_path_factory.mktemp("red")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for k in range(10):
        w, h = int(rng.integers(60, 120)), int(rng.integers(60, 120))
        img = np.zeros((h, w, 3), np.uint8)
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            bw, bh = int(rng.integers(12, w // 2)), int(rng.integers(12, h // 2))
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            if (img[y0:y0 + bh, x0:x0 + bw, 0] > 0).any():
                continue                                  # keep rectangles apart
            img[y0:y0 + bh, x0:x0 + bw, 0] = 255
            lines.append(f"0 {(x0 + bw / 2) / w} {(y0 + bh / 2) / h} {bw / w} {bh / h}\n")
        p = root / "images" / f"r{k}.png"
        Image.fromarray(img).save(p)
        (root / "labels" / f"r{k}.txt").write_text("".join(lines))
        paths.append(str(p))
    (root / "train.txt").write_text("\n".join(paths) + "\n")
    return root, paths


def dataset(paths, **opts):
    d = DetectionData(paths, 1, None, augment=True, jitter=0.2, hue=0, saturation=1, exposure=1)
    d.options = AugmentOptions(**opts)
    return d


def red_mask(img, strict=False):
    r, g = img[0], img[1]
    return (r > 0.9) & (g < 0.1) if strict else (r > 0.7) & (g < 0.3)


def check_boxes_match_pixels(img, boxes, inside=True, margin=2):
    """Every clearly red pixel lies in some box (grown by `margin` px for resampling); with `inside`,
    each box (shrunk by `margin`) is at least 95 % red."""
    _, h, w = img.shape
    covered = np.zeros((h, w), bool)
    for x, y, bw, bh, _ in boxes:
        x0, x1 = (x - bw / 2) * w, (x + bw / 2) * w
        y0, y1 = (y - bh / 2) * h, (y + bh / 2) * h
        rows = slice(max(int(y0) - margin, 0), int(np.ceil(y1)) + margin)
        covered[rows, max(int(x0) - margin, 0):int(np.ceil(x1)) + margin] = True
        if inside and x1 - x0 > 2 * margin + 1 and y1 - y0 > 2 * margin + 1:
            core = red_mask(img)[int(np.ceil(y0)) + margin:int(y1) - margin, int(np.ceil(x0)) + margin:int(x1) - margin]
            assert core.mean() >= 0.95, (x, y, bw, bh, core.mean())
    stray = red_mask(img, strict=True) & ~covered
    assert not stray.any(), f"{stray.sum()} red pixels outside every box"


OPTIONS = {
    "plain_letter_box": dict(letter_box=True),
    "mosaic_bound": dict(mosaic=True, mosaic_bound=True),
    "mosaic": dict(mosaic=True),
    "cutmix": dict(cutmix=True),
    "blur_background": dict(blur=1),
    "blur_all": dict(blur=6),
    "noise": dict(gaussian_noise=10),
    "mixup": dict(mixup=True),
    "mosaic_mixup": dict(mosaic=True, mixup=True, mosaic_bound=True),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_deterministic_under_the_seed(red_boxes, name):
    _, paths = red_boxes
    d = dataset(paths, **OPTIONS[name])
    x1, t1 = d.load([0, 3, 5], augment_rng(7, 2), 64, 48)
    x2, t2 = d.load([0, 3, 5], augment_rng(7, 2), 64, 48)
    x3, t3 = d.load([0, 3, 5], augment_rng(8, 2), 64, 48)
    assert np.array_equal(x1, x2) and np.array_equal(t1, t2)
    assert not np.array_equal(x1, x3)


@pytest.mark.parametrize("name", ["plain_letter_box", "mosaic_bound", "blur_background", "noise"])
def test_boxes_follow_the_pixels(red_boxes, name):
    _, paths = red_boxes
    d = dataset(paths, **OPTIONS[name])
    for k in range(12):
        img, boxes = augmented_sample(d, k % len(paths), augment_rng(1, k), 96, 80, d.options)
        assert img.shape == (3, 80, 96) and boxes.shape[1] == 5
        check_boxes_match_pixels(img, boxes)


@pytest.mark.parametrize("name", ["mosaic", "cutmix"])
def test_boxes_cover_the_pixels(red_boxes, name):
    """mosaic_bound=0 lets a box reach past its quadrant and cutmix may cover an item's box, so only
    the "every red pixel is labelled" half holds."""
    _, paths = red_boxes
    d = dataset(paths, **OPTIONS[name])
    for k in range(12):
        img, boxes = augmented_sample(d, k % len(paths), augment_rng(2, k), 96, 80, d.options)
        check_boxes_match_pixels(img, boxes, inside=False)


def test_mosaic_uses_four_images_and_quadrant_bounds(red_boxes):
    _, paths = red_boxes
    d = dataset(paths, mosaic=True, mosaic_bound=True)
    counts = [len(augmented_sample(d, 0, augment_rng(3, k), 96, 80, d.options)[1]) for k in range(10)]
    single = len(d.boxes(0))
    assert max(counts) > single                 # boxes from the other quadrants' images


@pytest.fixture(scope="module")
def coordinate_images(tmp_path_factory):
    """3 copies of a 96x80 image whose red and green channels encode the pixel's x and y."""
    root = tmp_path_factory.mktemp("coord")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    w, h = 96, 80
    img = np.zeros((h, w, 3), np.uint8)
    img[:, :, 0] = (np.arange(w) * 255 // (w - 1))[None, :]
    img[:, :, 1] = (np.arange(h) * 255 // (h - 1))[:, None]
    paths = []
    for k in range(3):
        p = root / "images" / f"c{k}.png"
        Image.fromarray(img).save(p)
        (root / "labels" / f"c{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
        paths.append(str(p))
    return paths, img.transpose(2, 0, 1).astype(np.float32) / 255


def test_mosaic_places_each_crop_next_to_the_cut_point(coordinate_images):
    """Without jitter a piece is its whole image, and the fork's quadrant q shows the corner of it
    that meets the cut point: top-left shows the image's bottom-right, top-right its bottom-left,
    and so on. The cut point is read from the first pixel; every pixel must then match."""
    from darkpy.augment import mosaic
    paths, src = coordinate_images
    w, h = 96, 80
    d = DetectionData(paths, 1, None, augment=True, jitter=0.0, hue=0, saturation=1, exposure=1, flip=False)
    d.options = AugmentOptions(mosaic=True, mosaic_bound=True)
    cuts = set()
    for k in range(8):
        out, boxes = mosaic(d, 0, augment_rng(6, k), w, h, d.options)
        cx = w - int(np.abs(src[0, 0, :] - out[0, 0, 0]).argmin())      # the codes are distinct
        cy = h - int(np.abs(src[1, :, 0] - out[1, 0, 0]).argmin())
        assert 0.2 * w <= cx <= 0.8 * w + 1 and 0.2 * h <= cy <= 0.8 * h + 1
        want = np.empty_like(out)
        want[:, :cy, :cx] = src[:, h - cy:, w - cx:]
        want[:, :cy, cx:] = src[:, h - cy:, :w - cx]
        want[:, cy:, :cx] = src[:, :h - cy, w - cx:]
        want[:, cy:, cx:] = src[:, :h - cy, :w - cx]
        assert np.abs(out - want).max() < 2e-3, (k, cx, cy)
        cuts.add((cx, cy))
        # each piece's one box (the image centre), moved with its window: 4 boxes at most
        check_boxes_match_pixels(np.zeros_like(out), boxes, inside=False)
        assert len(boxes) <= 4
    assert len(cuts) > 4


def test_mosaic_is_applied_to_about_half_the_images(red_boxes, monkeypatch):
    """The fork turns mosaic off for half of its loads (`random_gen() % 2 == 0`): about half of what
    it trains on are plain images. darkpy tosses that coin per image."""
    import darkpy.augment as augment
    _, paths = red_boxes
    d = dataset(paths, mosaic=True, mosaic_bound=True)
    calls = []
    real = augment.mosaic
    monkeypatch.setattr(augment, "mosaic", lambda *a: calls.append(1) or real(*a))
    n = 400
    for k in range(n):
        augmented_sample(d, k % len(paths), augment_rng(5, k), 48, 40, d.options)
    assert 0.43 < len(calls) / n < 0.57, len(calls)


def test_mixup_blends_and_keeps_both_box_lists(red_boxes):
    _, paths = red_boxes
    d = dataset(paths, mixup=True)
    found = False
    for k in range(10):
        img, boxes = augmented_sample(d, 1, augment_rng(4, k), 96, 80, d.options)
        plain = dataset(paths)
        if len(boxes) > len(plain.boxes(1)):
            found = True
            vals = np.unique(np.round(img[0], 3))
            assert ((vals > 0.05) & (vals < 0.95)).any()    # blended red
    assert found


def test_gaussian_blur_is_normalised():
    img = np.random.default_rng(0).random((3, 20, 30)).astype(np.float32)
    out = gaussian_blur(img, 2.0)
    assert out.shape == img.shape and abs(out.mean() - img.mean()) < 0.01 and out.std() < img.std()


def test_preview_command_writes_images(red_boxes, tmp_path):
    root, _ = red_boxes
    data = tmp_path / "r.data"
    data.write_text(f"classes=1\ntrain={root / 'train.txt'}\n")
    cfg = tmp_path / "r.cfg"
    cfg.write_text("[net]\nwidth=64\nheight=64\nchannels=3\nmosaic=1\nmosaic_bound=1\n\n[convolutional]\n"
                   "filters=12\nsize=1\nstride=4\nactivation=linear\n\n[yolo]\nmask=0,1\nanchors=8,8,16,16\n"
                   "classes=1\nnum=2\n")
    out = tmp_path / "prev"
    r = CliRunner().invoke(main, ["augment-preview", str(cfg), "--data", str(data), "--out", str(out), "-n", "3"])
    assert r.exit_code == 0, r.output
    files = sorted(out.glob("aug_*.png"))
    assert len(files) == 3
    a = np.asarray(Image.open(files[0]))
    assert a.shape == (64, 64, 3)


def test_training_with_mosaic_mixup_runs(red_boxes, tmp_path):
    from darkpy.settings import Settings
    from darkpy.train import train
    root, _ = red_boxes
    data = tmp_path / "r.data"
    data.write_text(f"classes=1\ntrain={root / 'train.txt'}\n")
    cfg = tmp_path / "r.cfg"
    cfg.write_text("[net]\nbatch=2\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.001\nmax_batches=3\n"
                   "mosaic=1\nmixup=1\ncutmix=1\nblur=1\ngaussian_noise=5\nletter_box=1\n\n[convolutional]\n"
                   "filters=12\nsize=1\nstride=4\nactivation=linear\n\n[yolo]\nmask=0,1\nanchors=8,8,16,16\n"
                   "classes=1\nnum=2\n")
    r = train(str(cfg), data=str(data), max_batches=3, backup=str(tmp_path / "b"), settings=Settings(), evaluate=False)
    assert r.loss is not None and np.isfinite(r.loss)


MOSAIC_OFF_CFG = ("[net]\nbatch=8\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.001\nmax_batches=5\n"
                  "mosaic=1\nmosaic_bound=1\nmosaic_off=3\n\n[convolutional]\nfilters=12\nsize=1\nstride=4\n"
                  "activation=linear\n\n[yolo]\nmask=0,1\nanchors=8,8,16,16\nclasses=1\nnum=2\n")


def test_mosaic_off_stops_mosaic_at_that_iteration(red_boxes, tmp_path, monkeypatch):
    """`mosaic_off=3` (darkpy's close-mosaic key): the trainer's batches 0-2 hold mosaics, batches 3
    and 4 none (nor batch 5, which the loader may prefetch). Loads may overlap (the first batch and
    the prefetch): each thread's mosaics are counted to the batch it is loading."""
    import threading

    import darkpy.augment as augment
    from darkpy.datasets import DetectionData
    from darkpy.settings import Settings
    from darkpy.train import train
    root, _ = red_boxes
    data = tmp_path / "r.data"
    data.write_text(f"classes=1\ntrain={root / 'train.txt'}\n")
    cfg = tmp_path / "r.cfg"
    cfg.write_text(MOSAIC_OFF_CFG)
    mosaics: dict[int, int] = {}
    current = threading.local()
    real_load, real_mosaic = DetectionData.load, augment.mosaic

    def load(self, indices, rng, w, h, iteration=None):
        current.k = iteration
        mosaics.setdefault(iteration, 0)
        return real_load(self, indices, rng, w, h, iteration=iteration)

    def mosaic(*a):
        mosaics[current.k] += 1
        return real_mosaic(*a)

    monkeypatch.setattr(DetectionData, "load", load)
    monkeypatch.setattr(augment, "mosaic", mosaic)
    train(str(cfg), data=str(data), max_batches=5, backup=str(tmp_path / "b"), settings=Settings(), evaluate=False)
    assert set(mosaics) >= {0, 1, 2, 3, 4}
    assert all(mosaics[k] > 0 for k in (0, 1, 2)), mosaics
    assert all(n == 0 for k, n in mosaics.items() if k >= 3), mosaics


def test_mosaic_off_options_by_iteration():
    opt = AugmentOptions(mosaic=True, mosaic_bound=True, mixup=True, mosaic_off=100)
    assert opt.at(99) is opt and opt.at(None) is opt
    late = opt.at(100)
    assert not late.mosaic and late.mixup and late.mosaic_bound and late.active
    assert AugmentOptions(mosaic=True).at(10 ** 6).mosaic          # 0: mosaic to the end


def test_mosaic_off_bad_value_names_file_and_line(tmp_path):
    import warnings

    from darkpy.cfg import CfgError, CfgWarning
    from darkpy.network import load_network
    cfg = tmp_path / "r.cfg"
    cfg.write_text(MOSAIC_OFF_CFG.replace("mosaic_off=3", "mosaic_off=-1"))
    with pytest.raises(CfgError) as e:
        load_network(cfg)
    assert str(e.value).startswith(f"{cfg}:10 [net] mosaic_off: must be >= 0") and "\n" not in str(e.value)
    cfg.write_text(MOSAIC_OFF_CFG.replace("mosaic=1\n", "mosaic=0\n"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        load_network(cfg)
    assert any(issubclass(x.category, CfgWarning) and "mosaic_off without mosaic=1" in str(x.message) for x in w)
