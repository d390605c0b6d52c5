"""What can go wrong with a checkpoint set, and how a full disk is told.

`CheckpointError` and its subclasses are the errors `save_checkpoint` and
`load_checkpoint` raise for a set; `trax-revplus train` turns each into one
line (`trax_revplus.cli.failures`).
"""

import errno
import shutil


class CheckpointError(RuntimeError):
  """No checkpoint set to resume from, though one was written.

  Attributes:
    directory: str, the output dir.
    basename: str, the set, e.g. 'model'.
    problem: str, what is wrong, without the fix.
  """

  def __init__(
    self,
    message: str,
    directory: str = '',
    basename: str = '',
    problem: str = '',
  ):
    super().__init__(message)
    self.directory = directory
    self.basename = basename
    self.problem = problem or message


class CheckpointMismatchError(CheckpointError, IndexError):
  """A verified checkpoint set that does not fit the Loop's model.

  An `IndexError` too, as stock trax's `Loop` raises when it restores a
  checkpoint of another model into this one.
  """


class CheckpointWriteError(CheckpointError):
  """A checkpoint set could not be written; the sets already there are kept.

  Attributes:
    free_bytes: int or None, space left on the output dir's file system.
    step: int, the step whose set was not written.
  """

  def __init__(
    self,
    message: str,
    directory: str = '',
    basename: str = '',
    problem: str = '',
    free_bytes: int | None = None,
    step: int = 0,
  ):
    super().__init__(message, directory, basename, problem)
    self.free_bytes = free_bytes
    self.step = step


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` means the disk is full (or the quota used up).

  Args:
    error: an `OSError` (ENOSPC, EDQUOT) or one of TensorFlow's file API
      errors (e.g. `ResourceExhaustedError`), whose message carries the
      system's.

  Returns:
    bool.
  """
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
    return True
  # TensorFlow's file API (tf.io.gfile) raises its own errors, e.g.
  # ResourceExhaustedError, whose message carries the system's.
  text = str(error)
  return 'No space left on device' in text or 'Disk quota exceeded' in text


def free_bytes(directory: str) -> int | None:
  """Bytes free on the file system of `directory`, or None if unknown."""
  try:
    return shutil.disk_usage(directory).free
  except OSError:
    return None
