"""darkpy.images: decoding, Darknet's resize/letterbox/placement/rotation, HSV jitter, drawing."""
from __future__ import annotations

import colorsys
import math

import numpy as np
import pytest
from PIL import Image

from darkpy import images as I
from darkpy.errors import DataError


# ---------------------------------------------------------------------------------------------------
# resize_image against a literal transcription of Darknet's formula
# ---------------------------------------------------------------------------------------------------
def ref_resize(im: np.ndarray, w: int, h: int) -> np.ndarray:
    """Darknet's resize_image, one pixel at a time in float32 (columns pass, then rows pass), with
    darkpy's one change: the last output row takes the last input row (as the last column does)."""
    f = np.float32
    c, ih, iw = im.shape
    part = np.zeros((c, ih, w), f)
    out = np.zeros((c, h, w), f)
    ws = f(iw - 1) / f(w - 1) if w > 1 else f(0)
    hs = f(ih - 1) / f(h - 1) if h > 1 else f(0)
    for k in range(c):
        for r in range(ih):
            for x in range(w):
                if x == w - 1 or iw == 1:
                    part[k, r, x] = im[k, r, iw - 1]
                else:
                    sx = f(x) * ws
                    ix = int(sx)
                    dx = sx - f(ix)
                    part[k, r, x] = (f(1) - dx) * im[k, r, ix] + dx * im[k, r, ix + 1]
        for r in range(h):
            if r == h - 1 or ih == 1:
                out[k, r] = part[k, ih - 1]
                continue
            sy = f(r) * hs
            iy = int(sy)
            dy = sy - f(iy)
            for x in range(w):
                out[k, r, x] = (f(1) - dy) * part[k, iy, x] + dy * part[k, iy + 1, x]
    return out


@pytest.mark.parametrize("shape,w,h", [
    ((3, 4, 5), 13, 9),      # upscale, non-square
    ((3, 30, 40), 7, 11),    # downscale in x, downscale in y, aspect changes
    ((1, 6, 6), 6, 6),       # same size
    ((2, 5, 1), 4, 3),       # one-pixel-wide input
    ((3, 7, 9), 1, 1),       # one-pixel output (Darknet divides by zero here)
    ((1, 2, 3), 5, 42),      # 2 -> 42 rows: Darknet's float rounding darkens the last row
])
def test_resize_matches_darknet_formula(shape, w, h):
    rng = np.random.default_rng(1)
    im = rng.random(shape, dtype=np.float32)
    got = I.resize_image(im, w, h)
    assert got.dtype == np.float32 and got.shape == (shape[0], h, w)
    np.testing.assert_array_equal(got, ref_resize(im, w, h))


def test_resize_corners_and_last_row():
    im = np.ones((1, 2, 2), np.float32)
    out = I.resize_image(im, 3, 42)
    # constant in, constant out: in Darknet the last row would be ~6e-8 here
    np.testing.assert_array_equal(out, np.ones_like(out))
    im = np.random.default_rng(0).random((3, 9, 13), dtype=np.float32)
    out = I.resize_image(im, 31, 17)
    for y, x in ((0, 0), (0, -1), (-1, 0), (-1, -1)):
        np.testing.assert_array_equal(out[:, y, x], im[:, y, x])


def test_resize_float64():
    im = np.random.default_rng(2).random((2, 5, 7))
    out = I.resize_image(im, 9, 3)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref_resize(im.astype(np.float32), 9, 3), atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------------------
def test_load_png_gray_rgba_palette_and_16bit(tmp_path):
    gray = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    Image.fromarray(gray).save(tmp_path / "g.png")
    im = I.load_image(tmp_path / "g.png")
    assert im.shape == (3, 6, 8) and im.dtype == np.float32
    for k in range(3):   # grey replicated, exactly byte/255 in float32
        np.testing.assert_array_equal(im[k], gray.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(I.load_image(tmp_path / "g.png", channels=1)[0], im[0])

    rgba = np.zeros((4, 5, 4), np.uint8)
    rgba[..., 0], rgba[..., 1], rgba[..., 2] = 10, 200, 30
    rgba[..., 3] = np.arange(20).reshape(4, 5) * 10   # alpha is dropped, not composited
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    im = I.load_image(tmp_path / "a.png")
    assert im.shape == (3, 4, 5)
    np.testing.assert_array_equal(im[:, 0, 0], np.array([10, 200, 30], np.float32) / np.float32(255))
    np.testing.assert_array_equal(im[1], np.full((4, 5), np.float32(200) / np.float32(255)))

    pal = Image.fromarray(np.array([[0, 1], [1, 0]], np.uint8), "P")
    pal.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    pal.info["transparency"] = 0
    pal.save(tmp_path / "p.png", transparency=0)
    im = I.load_image(tmp_path / "p.png")
    np.testing.assert_array_equal(im[:, 0, 0], [1, 0, 0])
    np.testing.assert_array_equal(im[:, 0, 1], [0, 0, 1])

    wide = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000)
    Image.fromarray(wide).save(tmp_path / "w.png")
    im = I.load_image(tmp_path / "w.png")
    np.testing.assert_array_equal(im[0], (wide >> 8).astype(np.float32) / np.float32(255))


def test_load_jpeg_and_luminance(tmp_path):
    yy, xx = np.mgrid[0:24, 0:32]
    rgb = np.stack([xx * 8, yy * 10, 255 - xx * 8], axis=2).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "c.jpg", quality=95)
    im = I.load_image(tmp_path / "c.jpg")
    assert im.shape == (3, 24, 32)
    assert np.abs(im - rgb.transpose(2, 0, 1) / 255).mean() < 0.02   # lossy, but the same picture
    lum = I.load_image(tmp_path / "c.jpg", channels=1)
    expect = np.asarray(Image.open(tmp_path / "c.jpg").convert("L"), np.float32) / 255
    assert lum.shape == (1, 24, 32)
    np.testing.assert_allclose(lum[0], expect, atol=1e-7)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="nope.png"):
        I.load_image(tmp_path / "nope.png")
    (tmp_path / "junk.png").write_bytes(b"this is not an image")
    with pytest.raises(DataError, match="junk.png"):
        I.load_image(tmp_path / "junk.png")
    Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 99).save(tmp_path / "t.png")
    data = (tmp_path / "t.png").read_bytes()
    (tmp_path / "trunc.png").write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError, match="trunc.png"):
        I.load_image(tmp_path / "trunc.png")


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    im = (rng.integers(0, 256, (3, 5, 7)) / 255).astype(np.float32)
    I.save_image(im, tmp_path / "x.png")
    np.testing.assert_array_equal(I.load_image(tmp_path / "x.png"), im)
    I.save_image(im[:1], tmp_path / "g.png")
    np.testing.assert_array_equal(I.load_image(tmp_path / "g.png", 1), im[:1])
    with pytest.raises(DataError, match="x.unknownext"):
        I.save_image(im, tmp_path / "x.unknownext")


# ---------------------------------------------------------------------------------------------------
# geometry
# ---------------------------------------------------------------------------------------------------
def test_letterbox_crop_flip():
    rng = np.random.default_rng(3)
    im = rng.random((3, 10, 20), dtype=np.float32)
    box = I.letterbox_image(im, 16, 16)
    assert box.shape == (3, 16, 16)
    np.testing.assert_array_equal(box[:, :4], 0.5)
    np.testing.assert_array_equal(box[:, 12:], 0.5)
    np.testing.assert_array_equal(box[:, 4:12], I.resize_image(im, 16, 8))
    crop = I.crop_image(im, -2, 8, 5, 4)   # clamps to the edge
    assert crop.shape == (3, 4, 5)
    np.testing.assert_array_equal(crop[:, 0, 0], im[:, 8, 0])
    np.testing.assert_array_equal(crop[:, 1, 1], im[:, 9, 0])
    np.testing.assert_array_equal(crop[:, 3, 4], im[:, 9, 2])
    np.testing.assert_array_equal(I.flip_image(im)[:, :, 0], im[:, :, -1])
    c = I.center_crop_image(im, 4, 4)
    np.testing.assert_array_equal(c, I.resize_image(im[:, :, 5:15], 4, 4))


def test_place_image():
    rng = np.random.default_rng(4)
    im = rng.random((3, 6, 9), dtype=np.float32)
    canvas = np.full((3, 20, 20), 0.5, np.float32)
    I.place_image(im, 9, 6, 3, 5, canvas)   # same size: an exact copy
    np.testing.assert_array_equal(canvas[:, 5:11, 3:12], im)
    canvas[:, 5:11, 3:12] = 0.5
    np.testing.assert_array_equal(canvas, 0.5)
    canvas = np.zeros((3, 10, 10), np.float32)
    I.place_image(im, 18, 12, 0, 0, canvas)   # 2x: even pixels are source pixels; clipped at the edge
    np.testing.assert_array_equal(canvas[:, 0:10:2, 0:10:2], im[:, :5, :5])
    np.testing.assert_allclose(canvas[:, 0, 1], (im[:, 0, 0] + im[:, 0, 1]) / 2, rtol=1e-6)


def test_rotate_crop_identity_and_half_turn():
    im = np.random.default_rng(5).random((3, 8, 8), dtype=np.float32)
    np.testing.assert_array_equal(I.rotate_crop_image(im, 0.0, 1.0, 8, 8, 0, 0, 1.0), im)
    rot = I.rotate_crop_image(im, math.pi, 1.0, 8, 8, 0, 0, 1.0)
    # Darknet rotates about (w/2, h/2), so x -> w - x; x = 0 samples outside (0)
    np.testing.assert_allclose(rot[:, 1:, 1:], im[:, ::-1, ::-1][:, :-1, :-1], atol=1e-6)
    np.testing.assert_allclose(rot[:, 0, :], 0, atol=1e-6)


def test_random_augment_identity_when_nothing_varies():
    im = np.random.default_rng(6).random((3, 12, 12), dtype=np.float32)
    out = I.random_augment_image(im, 0, 1, 12, 12, 12, 12, np.random.default_rng(0))
    np.testing.assert_array_equal(out, im)


def test_random_augment_dy_uses_width():
    # 10 wide, 20 high, scale 1, 10x4 crop: P's dy range is ±(20-10)/2 = 5 (it uses w, not h=4: ±8)
    ih, iw = 20, 10
    im = np.broadcast_to((np.arange(ih, dtype=np.float32) / ih)[None, :, None], (1, ih, iw)).copy()
    dys = []
    for seed in range(300):
        out = I.random_augment_image(im, 0, 1, 10, 10, 10, 4, np.random.default_rng(seed))
        # row 0 samples source row (0 - 4/2) + dy + 10
        dys.append(out[0, 0, 5] * ih - 8)
    dys = np.array(dys)
    assert dys.max() <= 5 + 1e-4 and dys.min() >= -5 - 1e-4
    assert dys.max() > 4 and dys.min() < -4


def test_augment_determinism():
    im = np.random.default_rng(7).random((3, 30, 40), dtype=np.float32)

    def run(seed):
        rng = np.random.default_rng(seed)
        a = I.random_augment_image(im, 15, 1.3, 24, 48, 24, 24, rng)
        return I.random_distort_image(a, 0.1, 1.5, 1.5, rng)

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


# ---------------------------------------------------------------------------------------------------
# colour
# ---------------------------------------------------------------------------------------------------
def _colour_test_image():
    rng = np.random.default_rng(8)
    im = rng.random((3, 9, 11), dtype=np.float32)
    im[:, 0, 0] = 0           # black
    im[:, 0, 1] = 1           # white
    im[:, 0, 2] = 0.4         # grey (Darknet's 0/0 hue)
    im[:, 0, 3] = [1, 0, 0]   # pure red (h = 0)
    return im


def test_distort_identity():
    im = _colour_test_image()
    np.testing.assert_array_equal(I.distort_image(im, 0, 1, 1), im)
    np.testing.assert_array_equal(I.random_distort_image(im, 0, 1, 1, np.random.default_rng(0)), im)


@pytest.mark.parametrize("hue,sat,val", [(0.1, 1.3, 0.8), (-0.25, 0.5, 1.4), (0.0, 1.0, 1.0 + 1e-7)])
def test_distort_matches_hsv_reference(hue, sat, val):
    im = _colour_test_image()
    got = I.distort_image(im, hue, sat, val)
    ref = np.empty_like(got)
    for y in range(im.shape[1]):
        for x in range(im.shape[2]):
            h, s, v = colorsys.rgb_to_hsv(*map(float, im[:, y, x]))
            s, v, h = s * sat, v * val, h + hue
            h = h - 1 if h > 1 else h + 1 if h < 0 else h
            if s == 0:
                rgb = (v, v, v)
            else:   # colorsys' hsv_to_rgb, but without its s <= 1 assumption
                i = math.floor(h * 6)
                f = h * 6 - i
                p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
                rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][min(i, 5)]
            ref[:, y, x] = np.clip(rgb, 0, 1)
    np.testing.assert_allclose(got, ref, atol=2e-6)


def test_distort_one_channel_scales_value():
    im = np.random.default_rng(9).random((1, 4, 4), dtype=np.float32)
    np.testing.assert_allclose(I.distort_image(im, 0.3, 2.0, 1.5), np.clip(im * 1.5, 0, 1), rtol=1e-6)


def test_rand_scale_range_and_symmetry():
    rng = np.random.default_rng(0)
    draws = np.array([I.rand_scale(1.5, rng) for _ in range(2000)])
    assert draws.min() >= 1 / 1.5 - 1e-12 and draws.max() <= 1.5
    assert 0.4 < (draws > 1).mean() < 0.6
    assert all(I.rand_int(3, 5, rng) in (3, 4, 5) for _ in range(50))
    assert {I.rand_int(5, 3, rng) for _ in range(200)} == {3, 4, 5}


# ---------------------------------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------------------------------
def test_draw_box_and_label():
    im = np.zeros((3, 40, 60), np.float32)
    I.draw_box(im, 10, 12, 30, 25, (1.0, 0.5, 0.0), width=2)
    np.testing.assert_array_equal(im[:, 12, 10], [1, 0.5, 0])
    np.testing.assert_array_equal(im[:, 13, 20], [1, 0.5, 0])    # second ring
    np.testing.assert_array_equal(im[:, 25, 30], [1, 0.5, 0])
    np.testing.assert_array_equal(im[:, 14:24, 12:29], 0)         # inside untouched
    assert im[:, :12].sum() == 0 and im[:, :, 31:].sum() == 0
    I.draw_box(im, -5, -5, 100, 100, (0, 0, 1))                   # clamped to the image
    np.testing.assert_array_equal(im[:, 0, 0], [0, 0, 1])
    np.testing.assert_array_equal(im[:, 39, 59], [0, 0, 1])

    im = np.zeros((3, 100, 120), np.float32)
    I.draw_label(im, "dog 97%", 10, 50, (0.0, 1.0, 0.0))
    ys, xs = np.nonzero(im[1] > 0.99)
    assert ys.max() < 50 and xs.min() == 10                       # above the box top, from x
    tag = im[:, ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    assert (tag[1] < 0.2).sum() > 5                               # black text on the green tag
    assert tag[0].max() == 0 and tag[2].max() == 0
    im2 = np.zeros((3, 100, 120), np.float32)
    I.draw_label(im2, "dog", 10, 2, (0.0, 1.0, 0.0))              # no room above: below y
    assert np.nonzero(im2[1] > 0.99)[0].min() == 2
