"""A signal that arrives while a module is imported acts once it is."""

import os
import signal
import sys

import pytest

from trax_revplus import cli
from trax_revplus import import_signals
from trax_revplus import interrupt

# The module's body sends the signal to its own process half way through
# and must still run to its end.
_BODY = """
import os, signal
started = True
os.kill(os.getpid(), signal.{name})
finished = True
"""


def _import_signalling_module(tmp_path, name, signame):
  (tmp_path / f'{name}.py').write_text(_BODY.format(name=signame))
  sys.path.insert(0, str(tmp_path))
  try:
    __import__(name)
  finally:
    sys.path.remove(str(tmp_path))


@pytest.mark.parametrize('signame', ['SIGINT', 'SIGTERM'])
def test_stop_on_signal_raises_after_the_import(tmp_path, signame):
  name = f'signalling_{signame.lower()}'
  with interrupt.StopOnSignal() as stop:
    with pytest.raises(interrupt.Interrupted) as raised:
      with import_signals.signals_wait_for_imports():
        _import_signalling_module(tmp_path, name, signame)
  assert raised.value.signum == getattr(signal, signame)
  assert sys.modules[name].finished  # The import was not cut short.
  assert stop.signum == getattr(signal, signame)


def test_without_the_block_the_handler_raises_inside_the_import(tmp_path):
  # What the block prevents: the exception unwinds through the import.
  with interrupt.StopOnSignal():
    with pytest.raises(interrupt.Interrupted):
      _import_signalling_module(tmp_path, 'signalling_unblocked', 'SIGTERM')
  assert 'signalling_unblocked' not in sys.modules


def test_a_command_stopped_during_the_import_answers_after_it(tmp_path):
  # `trax-revplus`'s own handler (for commands without one of theirs).
  previous = signal.signal(signal.SIGTERM, cli._stop)  # pylint: disable=protected-access
  try:
    with pytest.raises(cli._Stopped) as raised:  # pylint: disable=protected-access
      with import_signals.signals_wait_for_imports():
        _import_signalling_module(tmp_path, 'signalling_cli', 'SIGTERM')
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert raised.value.signum == signal.SIGTERM
  assert sys.modules['signalling_cli'].finished


def test_a_second_signal_during_the_import_is_not_deferred():
  raised = []

  def handler(signum, frame):
    del frame
    if not import_signals.defer(signum):
      raised.append(signum)
      raise KeyboardInterrupt

  previous = signal.signal(signal.SIGINT, handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      with import_signals.signals_wait_for_imports():
        os.kill(os.getpid(), signal.SIGINT)  # Deferred.
        assert not raised
        os.kill(os.getpid(), signal.SIGINT)  # Asked twice: at once.
  finally:
    signal.signal(signal.SIGINT, previous)
  assert raised == [signal.SIGINT]


def test_outside_the_block_nothing_is_deferred():
  assert not import_signals.defer(signal.SIGTERM)
