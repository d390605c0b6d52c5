"""Whether a checkpoint set is the one its manifest describes.

Every file of a set must have the size and the CRC-32 (`zlib.crc32` of all
its bytes) its manifest records: a truncated file, a flipped bit, a file of
another set or a save interrupted while installing makes a set
inconsistent. (trax's own `np_from_file` keeps the arrays read before a cut
or a CRC error without a word.)
"""

import os
import zlib
from typing import Any

from trax_revplus.checkpoints import manifest as manifest_lib

_CHUNK_BYTES = 1 << 20


def file_crc32(path: str) -> str:
  """CRC-32 of a file's bytes (`zlib.crc32`), as 8 hex digits.

  Raises:
    OSError: the file cannot be read.
  """
  crc = 0
  with open(path, 'rb') as f:
    while chunk := f.read(_CHUNK_BYTES):
      crc = zlib.crc32(chunk, crc)
  return f'{crc:08x}'


def describe_file(path: str) -> dict[str, Any]:
  """A manifest's entry for a file: {'bytes': size, 'crc32': 8 hex digits}."""
  return {'bytes': os.path.getsize(path), 'crc32': file_crc32(path)}


def gzip_trailer(path: str) -> str:
  """The last 8 bytes of a gzip file (CRC-32 + length of its content), hex."""
  with open(path, 'rb') as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - 8, 0))
    return f.read(8).hex()


def verify(
  directory: str, basename: str, contents: bool = True
) -> tuple[bool, dict[str, Any] | None, str]:
  """Checks set `basename` in `directory` against its manifest.

  Args:
    directory: the output dir.
    basename: e.g. 'model'.
    contents: also recompute each file's CRC-32 (reads every byte); False
      checks sizes only.

  Returns:
    (ok, manifest, reason): ok a bool; manifest the parsed dict, {} if
    unusable, None if there is none (a set written by stock trax, or no
    set); reason says what is inconsistent ('' if ok), naming the file.
  """
  manifest, reason = manifest_lib.read_manifest(directory, basename)
  if not manifest:
    return False, manifest, reason
  if manifest.get('state') != 'complete':
    return (
      False,
      manifest,
      (f'writing the set of step {manifest.get("step")} was interrupted'),
    )
  step = manifest.get('step')
  for suffix, expected in sorted(manifest.get('files', {}).items()):
    name = basename + suffix
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      return False, manifest, f'{name} is missing'
    size = os.path.getsize(path)
    if size != expected.get('bytes'):
      return (
        False,
        manifest,
        (
          f'{name} has {size} bytes, the set of step '
          f'{step} wrote {expected.get("bytes")} '
          f'(truncated or replaced)'
        ),
      )
    if not contents:
      continue
    if 'crc32' in expected:
      found, what = file_crc32(path), 'CRC-32 of its bytes'
      wanted = expected['crc32']
    else:  # FORMAT_1
      found, what = gzip_trailer(path), 'gzip trailer'
      wanted = expected.get('gzip_trailer')
    if found != wanted:
      return (
        False,
        manifest,
        (
          f'{name} is damaged or not the file the set '
          f'of step {step} wrote ({what} differs)'
        ),
      )
  return True, manifest, ''


def describe_last_good(directory: str | None, basename: str = 'model') -> str:
  """One clause naming the checkpoint a resumed run would load.

  Checks sizes against the manifests (not contents: cheap enough for an
  error message).

  Args:
    directory: the run's output dir, or None.
    basename: the set.

  Returns:
    e.g. 'the last good checkpoint /run/model.pkl.gz (step 10) is intact'.
  """
  if directory is None:
    return 'no checkpoint directory is set'
  for name in (basename, basename + manifest_lib.PREVIOUS):
    ok, manifest, _ = verify(directory, name, contents=False)
    if ok and manifest is not None:
      pkl = os.path.join(directory, name + '.pkl.gz')
      return (
        f'the last good checkpoint {pkl} (step {manifest["step"]}) is intact'
      )
  pkl = os.path.join(directory, basename + '.pkl.gz')
  if os.path.exists(pkl):
    return f'the checkpoint {pkl} was not touched'
  return f'no checkpoint was written to {directory} yet'
