"""Which training steps get phase records in the memory log.

Every step gets one 'step' record (its true host peak, time and transfers);
the steps chosen here also get the records of their phases (forward, loss,
backward, free) and, with `memory_log_per_layer`, of each layer.
"""

# Steps at the start of each process that are always recorded: the first
# steps compile, allocate and settle, so their memory differs most.
FIRST_STEPS_RECORDED = 10


class RecordSchedule:
  """Steps with phase records: the first steps of a process, then every n.

  A step is recorded when it is one of the first `first_steps` steps this
  schedule is asked about (counted from the first step asked, so a run
  resumed at step 501 records 501..510), or when
  `step % every_n_steps == 1 % every_n_steps` (1, 1 + n, 1 + 2n, ..., as
  trax's `step % 100 == 1`).
  """

  def __init__(
    self, every_n_steps: int = 100, first_steps: int = FIRST_STEPS_RECORDED
  ):
    """Creates the schedule.

    Args:
      every_n_steps: int >= 1; 1 records every step.
      first_steps: int >= 0, steps recorded at the start of each process.
    """
    self.every_n_steps = int(every_n_steps)
    self.first_steps = int(first_steps)
    self._first_step: int | None = None

  def should_record(self, step: int) -> bool:
    """Whether step `step` (int) gets phase records (bool)."""
    step = int(step)
    if self._first_step is None:
      self._first_step = step
    first = self._first_step
    if first <= step < first + max(self.first_steps, 1):
      return True
    return step % self.every_n_steps == 1 % self.every_n_steps
