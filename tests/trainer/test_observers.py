"""trax_revplus.trainer._step.observers: what a step's observers do at
its points."""

from trax_revplus.trainer._step import observers


class _Releaser:
  def __init__(self):
    self.kept = []
    self.released_bytes = 0

  def release(self, keep_bytes=0):
    self.kept.append(keep_bytes)


class _Context:
  grad_stack = None

  def __init__(self, working_set_bytes):
    self._bytes = working_set_bytes

  def host_working_set_bytes(self):
    return self._bytes

  def block(self, unused_tree):
    pass


def test_releases_within_a_step_keep_the_steps_own_working_set():
  release = observers.ReleaseHostMemory()
  release._releaser = _Releaser()  # pylint: disable=protected-access
  ctx = _Context(123 * 2**20)
  for phase in ('forward', 'loss', 'backward'):
    release.pass_ends(ctx, phase)
  # The loss and backward ends release, each keeping the working set.
  assert release._releaser.kept == [123 * 2**20] * 2  # pylint: disable=protected-access


def test_the_working_set_on_the_cpu_backend_is_the_accounted_peak():
  # pylint: disable=g-import-not-at-top,protected-access
  import trainer_cases as cases
  from trax_revplus.trainer._step import step_context

  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  planned = trainer.planned(batch)
  ctx = step_context.StepContext.for_step(
    planned, 1, cases.RNGS[0], batch, trainer._parts
  )
  assert planned.memory is not None
  assert ctx.host_working_set_bytes() == planned.memory.peak_device_bytes
