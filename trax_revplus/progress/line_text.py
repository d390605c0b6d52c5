"""The text of `ProgressPrinter`'s lines, from the figures it keeps.

`printer.ProgressPrinter` decides when a line is printed and keeps the
figures of the steps since the last one (a window: its losses, steps and
seconds, the steps that compiled); this module words them: the progress
line, its rate, and the notice of a step that compiled. The formats are
shown in the printer's docstring.
"""

from typing import Any, Sequence

from trax_revplus.byte_sizes import format_bytes

# Programs a compile notice names; the rest are counted.
MAX_NAMES_SHOWN = 3


def plural(n: int, word: str) -> str:
  """'1 step', '2 steps'."""
  return f'{n} {word}' if n == 1 else f'{n} {word}s'


def rate_text(window: dict[str, Any]) -> str:
  """'3.10 steps/s', 'compiling 14.2 s (9.8 s of it planning)', or the
  rate naming the compiles."""
  plain_steps = window['steps'] - window['compiling_steps']
  plain_seconds = window['seconds'] - window['compiling_seconds']
  compiling = window['compiling_steps']
  planning = window.get('planning_seconds', 0.0)
  of_it = f', {planning:.1f} s of it planning' if planning else ''
  if not plain_steps:
    text = f'compiling {window["compiling_seconds"]:.1f} s'
    return text + (f' ({of_it[2:]})' if planning else '')
  text = f'{plain_steps / max(plain_seconds, 1e-9):.2f} steps/s'
  if compiling:
    text += (
      f' ({plural(compiling, "step")} compiling, '
      f'{window["compiling_seconds"]:.1f} s{of_it}, left out)'
    )
  return text


def progress_line(
  step: int,
  total_steps: int | None,
  loss: float | None,
  window: dict[str, Any],
  rss_bytes: int,
) -> str:
  """'step 120/300  loss 2.912  3.10 steps/s  host 1530 MiB' for the window
  of steps ending at `step`; `loss` its mean (None: 'n/a'), `rss_bytes` the
  host's resident set size."""
  total = f'/{total_steps}' if total_steps is not None else ''
  loss_text = 'n/a' if loss is None else f'{loss:.3f}'
  return (
    f'step {step}{total}  loss {loss_text}  '
    f'{rate_text(window)}  '
    f'host {format_bytes(rss_bytes, spec=".0f", suffix=False)} MiB'
  )


def compile_notice(
  step: int,
  seconds: float,
  programs: int,
  names: Sequence[str],
  cause: str | None,
) -> str:
  """'step 57: 2 programs compiled in this step (4.1 s): jit(forward),
  jit(backward); CAUSE': at most `MAX_NAMES_SHOWN` of the programs' `names`,
  then `cause` (what changed since the step before) where there is one."""
  shown = ', '.join(names[:MAX_NAMES_SHOWN])
  if len(names) > MAX_NAMES_SHOWN:
    shown += f' and {len(names) - MAX_NAMES_SHOWN} more'
  line = (
    f'step {step}: {plural(programs, "program")} compiled in this '
    f'step ({seconds:.1f} s): {shown}'
  )
  if cause:
    line += f'; {cause}'
  return line
