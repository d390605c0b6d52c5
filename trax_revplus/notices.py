"""Notices: what library code has to tell the person running it, one line.

A notice is a fact the person should see even when the run goes on, e.g.
that a device memory budget replaced a setting they set
(`trainer._search.overrides`). The commands of `trax-revplus` listen while they
run (`listening`) and print each notice as their own warning line on stderr;
with no listener, e.g. from Python, a notice is a Python warning
(`SettingReplacedWarning`), which Python shows once per place.

Progress is what the library is doing while the person waits, e.g. which
plan the trainer weighs before its first step (`trainer._search.planning_log`):
the commands show each line as it comes (`showing_progress`); with no
listener it goes to absl's log at INFO, never to the terminal.

Only the standard library is imported here, as in `errors`.
"""

import contextlib
import threading
from typing import Callable, Iterator
import warnings


class SettingReplacedWarning(UserWarning):
  """A setting given explicitly did not take effect as given."""


_lock = threading.Lock()
_listeners: list[Callable[[str], None]] = []


@contextlib.contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
  """Hands every notice to `listener` (called with the one-line message)
  while entered, instead of raising a Python warning."""
  with _lock:
    _listeners.append(listener)
  try:
    yield
  finally:
    with _lock:
      _listeners.remove(listener)


def notify(
  message: str, category: type[Warning] = SettingReplacedWarning
) -> None:
  """Hands `message` (one line) to the listeners, or warns with it."""
  with _lock:
    listeners = list(_listeners)
  if not listeners:
    warnings.warn(message, category, stacklevel=3)
  for listener in listeners:
    listener(message)


_progress_listeners: list[Callable[[str], None]] = []


@contextlib.contextmanager
def showing_progress(listener: Callable[[str], None]) -> Iterator[None]:
  """Hands every progress line to `listener` while entered."""
  with _lock:
    _progress_listeners.append(listener)
  try:
    yield
  finally:
    with _lock:
      _progress_listeners.remove(listener)


def progress(message: str) -> None:
  """Hands `message` (one line) to the progress listeners, or logs it
  (absl, INFO) where none listens."""
  with _lock:
    listeners = list(_progress_listeners)
  if not listeners:
    # absl only where a line goes nowhere else: this module imports the
    # standard library alone until then.
    from absl import logging  # pylint: disable=g-import-not-at-top

    logging.info('%s', message)
  for listener in listeners:
    listener(message)
