"""Greyscaling a real image: a 2-D grid with 2-D masks.

The image is Grace Hopper's portrait that matplotlib ships as sample data
(matplotlib.cbook.get_sample_data("grace_hopper.jpg"), 512 x 600 pixels, RGB); matplotlib comes with
tritonkit's `bench` and `dev` extras, and reading the JPEG needs only matplotlib and Pillow, which
matplotlib depends on.

tk.ops.rgb_to_grey takes a (3, H, W) image and runs a 2-D grid of 32 x 32 tiles: program (a, b)
converts rows a*32 .. a*32+31 and columns b*32 .. b*32+31, with a mask on both edges, since neither
512 nor 600 needs to be a multiple of 32 (600 is not). The image arrives from matplotlib as (H, W, 3):
permuting it to (3, H, W) costs nothing, and the kernel reads it through its strides.

For uint8 the kernel computes 0.2989 R + 0.5870 G + 0.1140 B exactly in integers and rounds to
nearest, so it matches the torch reference bit for bit. Under the interpreter the lesson converts
every second pixel in each direction (256 x 300), to keep it quick; on a GPU the full image.
With --out DIR it writes the greyscale image as DIR/grace_hopper_grey.png.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tritonkit import debug


def load_image() -> torch.Tensor:
    """Grace Hopper as a (3, H, W) uint8 tensor (a view of matplotlib's (H, W, 3) array)."""
    import matplotlib.cbook
    import matplotlib.image

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as file:
        pixels = matplotlib.image.imread(file, format="jpg")
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


def run(out_dir: str | None = None) -> None:
    import tritonkit as tk

    img = load_image()
    print(f"image: {tuple(img.shape)} {img.dtype}, strides {img.stride()} (channels last in memory)")
    if debug.interpreting():
        img = img[:, ::2, ::2]
        print(f"under the interpreter: every second pixel, {tuple(img.shape)}")
    else:
        img = img.cuda()
    grey = tk.ops.rgb_to_grey(img)
    r, g, b = img.to(torch.int64)
    expected = ((2989 * r + 5870 * g + 1140 * b + 5000) // 10000).to(torch.uint8)
    assert torch.equal(grey, expected)
    height, width = grey.shape
    print(f"grey: {tuple(grey.shape)}, equal to the integer reference; grid {-(-height // 32)} x {-(-width // 32)}")
    if out_dir:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(out_dir) / "grace_hopper_grey.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        plt.imsave(path, grey.cpu().numpy(), cmap="gray", vmin=0, vmax=255)
        print(f"wrote {path}")


if __name__ == "__main__":
    run()
