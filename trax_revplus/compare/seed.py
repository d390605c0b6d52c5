"""The seed both runs use: found in the configs without importing them."""

import os
from typing import Sequence

import gin
from gin import config_parser

DEFAULT_SEED = 0


def _statements(text):
  """The gin statements of `text` (list), without importing what they name."""
  delegate = gin.config.ParserDelegate(skip_unknown=True)
  return list(config_parser.ConfigParser(text, delegate))


def config_seed(
  config_files: Sequence[str], bindings: Sequence[str]
) -> tuple[bool, int | None]:
  """Finds a `train.random_seed` binding in configs and bindings.

  Follows `include` statements (looked up next to the including file, then
  relative to the working directory), as `trax-revplus train` does. Nothing
  is imported: gin's parser reads the statements only.

  Args:
    config_files: list of str, .gin paths.
    bindings: list of str, gin bindings applied after the files.

  Returns:
    (found, value): found (bool) is True if some file or binding binds
    `train.random_seed`, or if a config cannot be read (then the seed is left
    to the config); value is the last bound literal (int) or None.
  """
  found, value = False, None
  seen = set()

  def visit(statements, base_dir):
    nonlocal found, value
    for statement in statements:
      if isinstance(statement, config_parser.IncludeStatement):
        for candidate in (
          os.path.join(base_dir, statement.filename),
          statement.filename,
        ):
          if os.path.isfile(candidate):
            visit_file(candidate)
            break
      elif isinstance(statement, config_parser.BindingStatement):
        if (
          statement.selector.split('.')[-1] == 'train'
          and statement.arg_name == 'random_seed'
        ):
          found = True
          value = statement.value if isinstance(statement.value, int) else None

  def visit_file(path):
    path = os.path.abspath(path)
    if path in seen:
      return
    seen.add(path)
    with open(path, encoding='utf-8') as f:
      visit(_statements(f.read()), os.path.dirname(path))

  try:
    for path in config_files:
      visit_file(path)
    for binding in bindings:
      visit(_statements(binding), os.getcwd())
  except Exception:  # pylint: disable=broad-except
    # The training runs report an unreadable config themselves.
    return True, None
  return found, value
