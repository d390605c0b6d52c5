"""trax_revplus.multiprocess.errors: each error carries its exit status."""

import signal

from trax_revplus.multiprocess import errors


def test_error_classes_carry_exit_statuses():
  assert issubclass(errors.DistributedUsageError, ValueError)
  assert issubclass(errors.DistributedRuntimeError, RuntimeError)
  assert errors.DistributedUsageError('x').exit_code == 2
  assert errors.JoinTimeoutError('x').exit_code == 1
  assert errors.JoinInterruptedError('x', signal.SIGINT).exit_code == 130
