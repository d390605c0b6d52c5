"""Work done around a step's schedule, at fixed points of it.

The schedule (`trainer.ReversibleSerialTrainer.one_step`) calls a
`StepHooks` at each point; what runs there depends on the trainer's
settings. Hooks observe the step and tidy memory; none changes its plan.

  FreeAccelerators   frees device buffers nothing can read, before the
                     forward pass and after the loss (trax's Loop mode 2).
  ReleaseHostMemory  gives free C-allocator memory back to the system after
                     compilations and twice per step.
"""

from trax_revplus.memory import host_release


class StepHooks:
  """Points of the step where work may be added; here all do nothing.

  `ctx` is the step's `step.StepContext`.
  """

  def step_begins(self, ctx):
    """The step's context exists; its batch is not placed yet."""

  def forward_unit_done(self, unit, outputs):
    """`unit` ran forward; `outputs` are its outputs."""

  def loss_done(self, ctx):
    """The loss unit ran (`ctx.grad_stack`); its phase is not recorded yet."""

  def loss_phase_ended(self, ctx):
    """The loss phase is recorded; the backward pass has not begun."""

  def backward_unit_done(self, unit):
    """`unit` ran backward."""

  def step_ends(self, ctx):
    """Every update is committed; the backward phase is not recorded yet."""


class HookList(StepHooks):
  """Runs several hooks at each point, in order."""

  def __init__(self, hooks):
    self._hooks = list(hooks)

  def step_begins(self, ctx):
    for hook in self._hooks:
      hook.step_begins(ctx)

  def forward_unit_done(self, unit, outputs):
    for hook in self._hooks:
      hook.forward_unit_done(unit, outputs)

  def loss_done(self, ctx):
    for hook in self._hooks:
      hook.loss_done(ctx)

  def loss_phase_ended(self, ctx):
    for hook in self._hooks:
      hook.loss_phase_ended(ctx)

  def backward_unit_done(self, unit):
    for hook in self._hooks:
      hook.backward_unit_done(unit)

  def step_ends(self, ctx):
    for hook in self._hooks:
      hook.step_ends(ctx)


class FreeAccelerators(StepHooks):
  """Frees device buffers before the forward pass and after the loss.

  As trax's `free_accelerators_on_step` (Loop mode 2), with
  `placement.Placement.free_device_buffers`; after the loss, the
  activations and cotangents wait on the host meanwhile. Each freeing is a
  'free' phase of the memory log.
  """

  def __init__(self, placement, keep):
    """Args:
      placement: the trainer's `placement.Placement`.
      keep: callable returning what the trainer holds between steps.
    """
    self._placement = placement
    self._keep = keep

  def step_begins(self, ctx):
    freed_arrays, freed_bytes = self._placement.free_device_buffers(
        self._keep())
    ctx.end_phase('free', freed_arrays=freed_arrays, freed_bytes=freed_bytes)

  def loss_phase_ended(self, ctx):
    p = self._placement
    ctx.stack, ctx.grad_stack = p.gather_to_host((ctx.stack, ctx.grad_stack))
    freed_arrays, freed_bytes = p.free_device_buffers(
        [self._keep()] + ctx.held_arrays())
    ctx.end_phase('free', freed_arrays=freed_arrays, freed_bytes=freed_bytes)


class ReleaseHostMemory(StepHooks):
  """Gives the memory the C allocator holds free back to the system.

  After the first call of each compiled function (which compiled it, or
  was compiled ahead: the compiler's temporaries are free by then, and
  kept by the allocator they would stay under every later peak), once the
  loss has run (the forward pass's temporaries are free), and at the end of
  each step. Each release makes the next phase fault its pages in again, so
  not after every call.
  """

  def __init__(self):
    self._releaser = host_release.HostMemoryReleaser()
    self._first_calls_done = set()  # ids of compiled functions called

  def release(self):
    """Releases now, if host memory grew enough since the last release."""
    self._releaser.release()

  def released_bytes(self):
    """int, host bytes released so far."""
    return self._releaser.released_bytes

  def forward_unit_done(self, unit, outputs):
    self._after_call(unit.forward_fn)

  def backward_unit_done(self, unit):
    self._after_call(unit.backward_fn)

  def loss_done(self, ctx):
    ctx.block(ctx.grad_stack)
    self.release()

  def step_ends(self, ctx):
    self.release()

  def _after_call(self, fn):
    if fn is not None and id(fn) not in self._first_calls_done:
      self._first_calls_done.add(id(fn))
      self.release()
