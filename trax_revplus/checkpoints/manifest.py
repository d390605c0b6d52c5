"""A checkpoint set's manifest: its format, its files' names, its own CRC-32.

A set `<basename>` in an output dir is the files trax writes,
`<basename>.weights.npy.gz`, `<basename>.opt_slots<i>.npy.gz` and
`<basename>.pkl.gz`, plus `<basename>.manifest.json`: a JSON object with

  format: `FORMAT` (`FORMAT_1` for sets written before file contents were
    checksummed);
  state: 'complete', or 'installing' while a save moves files into place;
  step: int, the training step of the set;
  files: {suffix: {'bytes': int, 'crc32': 8 hex digits}} per file;
  loop_rng: the Loop's random key (uint32 list) as its next step finds it;
  data_counters: {name: int}, `trax.data.inputs.data_counters` as the
    Loop's next step finds them (eval streams past the step's evals);
  manifest_crc32: CRC-32 of the manifest's other keys (compact JSON, keys
    sorted).

The set kept one save back is `<basename>.prev` (`PREVIOUS`); a save is
written into the staging directory `<basename>.tmp/` (`STAGING_SUFFIX`)
first.
"""

import json
import os
import zlib
from typing import Any

FORMAT = 'trax_revplus.checkpoint_set/2'
# Sets written before file contents were checksummed: verified by size and
# gzip trailer only.
FORMAT_1 = 'trax_revplus.checkpoint_set/1'
MANIFEST_SUFFIX = '.manifest.json'
PREVIOUS = '.prev'
STAGING_SUFFIX = '.tmp'


def manifest_path(directory: str, basename: str) -> str:
  """Path of the manifest of set `basename` in `directory`."""
  return os.path.join(directory, basename + MANIFEST_SUFFIX)


def staging_path(directory: str, basename: str) -> str:
  """Path of the directory where set `basename` is written before commit."""
  return os.path.join(directory, basename + STAGING_SUFFIX)


def manifest_crc32(manifest: dict[str, Any]) -> str:
  """CRC-32 of a manifest without its `manifest_crc32`, as 8 hex digits."""
  body = {k: v for k, v in manifest.items() if k != 'manifest_crc32'}
  text = json.dumps(body, sort_keys=True, separators=(',', ':'))
  return f'{zlib.crc32(text.encode("utf-8")):08x}'


def set_files(directory: str, basename: str) -> list[str]:
  """Suffixes of the `.gz` files of set `basename` in `directory`, sorted.

  The previous set's (`<basename>.prev.*`) and staged (`<basename>.tmp.*`)
  files are not the set's.

  Raises:
    OSError: `directory` cannot be listed.
  """
  prefix = basename + '.'
  return sorted(
    name[len(basename) :]
    for name in os.listdir(directory)
    if name.startswith(prefix)
    and name.endswith('.gz')
    and not name.startswith(prefix + 'prev.')
    and not name.startswith(prefix + 'tmp.')
  )


def read_manifest(
  directory: str, basename: str
) -> tuple[dict[str, Any] | None, str]:
  """Reads and checks the manifest of set `basename` in `directory`.

  Returns:
    (manifest, reason): manifest is the parsed dict, None if there is no
    manifest file, {} if it is unusable (unreadable, not JSON, another
    format, or its own CRC-32 differs); reason says why ('' if usable),
    naming the file.
  """
  path = manifest_path(directory, basename)
  name = os.path.basename(path)
  if not os.path.exists(path):
    return None, f'no {name}'
  try:
    with open(path, encoding='utf-8') as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    return {}, f'{name} is unreadable ({e})'
  if not isinstance(manifest, dict) or manifest.get('format') not in (
    FORMAT,
    FORMAT_1,
  ):
    return {}, f'{name} is not a {FORMAT} manifest'
  # A complete set's manifest carries a CRC-32 of its content; the short
  # "installing" marker has none.
  checked = manifest.get('format') == FORMAT and (
    manifest.get('state') == 'complete' or 'manifest_crc32' in manifest
  )
  if checked and manifest.get('manifest_crc32') != manifest_crc32(manifest):
    return {}, f'{name} is damaged (its CRC-32 differs)'
  return manifest, ''
