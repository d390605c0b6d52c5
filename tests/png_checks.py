"""What a PNG figure shows, read back from its pixels.

For tests of code that saves matplotlib figures (memory plots, compare's
figure): `read_png` reads the file with matplotlib's image reader, `panels`
finds the axes drawn in it from their frames, and `pixels_of` /
`vertical_lines` tell what was drawn inside one of them, by colour.
"""

import matplotlib
import matplotlib.colors
import matplotlib.image
import numpy as np

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# matplotlib's default colour cycle (tab10): 'C0', 'C1', ... as RGB.
TAB10 = [matplotlib.colors.to_rgb(f'C{i}') for i in range(10)]

# An axes frame (spine) is drawn black; anti-aliased, its pixels stay dark.
_DARK = 0.35


def read_png(path):
  """The image of the PNG at `path`: float RGB in [0, 1], (height, width, 3).

  Asserts the file is a PNG (its signature) of at least 100 x 100 pixels.
  """
  with open(path, 'rb') as f:
    assert f.read(8) == PNG_SIGNATURE, f'{path} is not a PNG'
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[2] in (3, 4), image.shape
  assert min(image.shape[:2]) >= 100, image.shape
  if image.dtype != np.float32:
    image = image.astype(np.float32) / np.iinfo(image.dtype).max
  return image[..., :3]


def _runs(column, min_length):
  """(start, end) of each run of True at least `min_length` long."""
  padded = np.concatenate([[False], column, [False]]).astype(np.int8)
  edges = np.flatnonzero(np.diff(padded))
  return [
    (int(s), int(e))
    for s, e in zip(edges[::2], edges[1::2])
    if e - s >= min_length
  ]


def panels(image, min_height_fraction=0.08, tolerance=3):
  """Pixel boxes of the framed axes in `image`, top to bottom, left to right.

  An axes is found by its left and right frame lines: dark vertical runs at
  least `min_height_fraction` of the image tall that start and end on the
  same rows (within `tolerance` pixels) in columns at least a fifth of the
  image apart. Axes drawn without a frame (`set_axis_off`) are not found.

  Returns:
    list of (top, bottom, left, right) boxes, inside the frame lines.
  """
  height, width = image.shape[:2]
  dark = np.all(image < _DARK, axis=2)
  min_length = max(10, int(min_height_fraction * height))
  by_rows = []  # [[start, end, [columns]]]
  for col in range(width):
    for start, end in _runs(dark[:, col], min_length):
      for entry in by_rows:
        if (
          abs(entry[0] - start) <= tolerance
          and abs(entry[1] - end) <= tolerance
        ):
          entry[2].append(col)
          break
      else:
        by_rows.append([start, end, [col]])
  boxes = []
  for start, end, cols in by_rows:
    left, right = min(cols), max(cols)
    if right - left >= width / 5:
      # Inside the frame: past the frame lines' columns and rows.
      inner_left = max(c for c in cols if c - left < width / 10) + 1
      inner_right = min(c for c in cols if right - c < width / 10) - 1
      boxes.append(
        (start + tolerance, end - tolerance, inner_left, inner_right)
      )
  return sorted(boxes)


def _crop(image, box):
  top, bottom, left, right = box
  return image[top:bottom, left : right + 1]


def _near(pixels, color, tolerance):
  return np.all(
    np.abs(pixels - np.asarray(color, np.float32)) <= tolerance, axis=-1
  )


def pixels_of(image, box, color, tolerance=0.06):
  """How many pixels inside `box` are `color` (RGB in [0, 1], or a name)."""
  return int(
    np.sum(_near(_crop(image, box), matplotlib.colors.to_rgb(color), tolerance))
  )


def vertical_lines(image, box, color, min_height_fraction=0.3, tolerance=0.12):
  """Columns of `box` where `color` covers a share of the height: lines.

  A vertical line, solid or dashed, of `color` covers at least
  `min_height_fraction` of the box's rows in its column; neighbouring such
  columns (an anti-aliased line) count as one line.

  Returns:
    list of int, the image column of each line found, left to right.
  """
  near = _near(_crop(image, box), matplotlib.colors.to_rgb(color), tolerance)
  columns = np.flatnonzero(near.mean(axis=0) >= min_height_fraction)
  lines = []
  for col in columns:
    if lines and col - lines[-1][-1] <= 2:
      lines[-1].append(col)
    else:
      lines.append([col])
  return [box[2] + int(round(np.mean(cols))) for cols in lines]
