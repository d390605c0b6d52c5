"""The block `train` prints at the end of a run, and the lines of a run a
signal stops (`trax_revplus.interrupt`): after which step, with which
checkpoint, and the step the same command resumes from."""

import signal
from typing import TYPE_CHECKING, Any

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.trax_door import loop as loop_door

if TYPE_CHECKING:  # Annotations only: the progress printer imports trax.
  from trax_revplus.progress.printer import RunSummary


def implementations(loop: Any) -> tuple[str, str, str | None]:
  """Which classes ran: the trainer and the reversible layers of the model.

  Named by `run_classes`, as run_stats.json and the memory log name them.

  Returns:
    (trainer, layers, fix), e.g.
    'trax_revplus.trainer.ReversibleSerialTrainer' and
    'trax_revplus.layers.ReversibleHalfResidual x8, ...' ('none' if the
    model has no reversible layers; 'n/a' where the Loop has no trainer or
    model), and what of stock's trainer was changed for current JAX
    (`run_classes.RunClasses.trainer_fix`; None: nothing).
  """
  # Here: it imports trax, and `trax-revplus train` reads its flags first.
  from trax_revplus import run_classes  # pylint: disable=g-import-not-at-top

  classes = run_classes.of_loop(loop)
  return (
    classes.trainer or 'n/a',
    classes.reversible_layers or 'n/a',
    classes.trainer_fix,
  )


def trainer_mode(loop: Any) -> str:
  """The Loop's trainer mode, from `use_memory_efficient_trainer`."""
  mode = loop_door.memory_efficient_mode(loop)
  if not mode:
    return (
      'default trainer (use_memory_efficient_trainer = False: weights '
      'and slots on the devices)'
    )
  if mode == 2:
    return (
      'memory-efficient, mode 2 (use_memory_efficient_trainer = 2: '
      'weights and slots on the host, device memory freed every step)'
    )
  return (
    'memory-efficient, mode 1 (use_memory_efficient_trainer = True: '
    'weights and slots on the host)'
  )


def _loss(value: float | None) -> str:
  return 'n/a' if value is None else f'{value:.4f} nats'


def _loss_rows(summary: 'RunSummary') -> list[tuple[str, str]]:
  """The train and eval loss rows, each saying which step(s) it is of.

  'train loss, last step' is the loss the run's last step returned
  (`run_stats.json`'s last `loss`, as `compare` shows it); 'train loss,
  mean' the mean over the last progress line's steps, where those are more
  than one; 'last eval loss' and 'first eval loss' name their step of the
  run's last, never calling an eval before the last step final.
  """
  rows = []
  last = summary.last_train_loss_step
  rows.append(
    (
      'train loss, last step',
      'n/a'
      if last is None
      else f'{_loss(summary.last_train_loss)} (step {last})',
    )
  )
  mean_from = summary.mean_train_loss_from_step
  if mean_from is not None and mean_from != summary.last_step:
    rows.append(
      (
        'train loss, mean',
        f'{_loss(summary.mean_train_loss)} (mean of steps '
        f'{mean_from}-{summary.last_step}, as on the last progress line)',
      )
    )
  evals = summary.eval_losses
  of = f' of {summary.last_step}'
  if evals:
    rows.append(
      ('last eval loss', f'{_loss(evals[-1][1])} (step {evals[-1][0]}{of})')
    )
    rows.append(
      ('first eval loss', f'{_loss(evals[0][1])} (step {evals[0][0]}{of})')
    )
  else:
    rows.append(('last eval loss', 'n/a (no eval ran)'))
  return rows


def _train_time(summary: 'RunSummary') -> str | None:
  """'25.5 s in steps, 0.98 steps/s (1 step compiling, 14.2 s, left out)'."""
  if not summary.steps_run:
    return None
  text = f'{summary.train_seconds:.1f} s in steps'
  compiling = summary.compiling_steps
  rate = summary.steps_per_second_without_compiling
  if rate is not None:
    text += f', {rate:.2f} steps/s'
  if compiling:
    seconds = sum(s for _, s, _ in compiling)
    steps = ', '.join(str(step) for step, _, _ in compiling[:5])
    if len(compiling) > 5:
      steps += ', ...'
    word = 'step' if len(compiling) == 1 else 'steps'
    text += (
      f' ({len(compiling)} compiling {word}, {seconds:.1f} s, left '
      f'out: {word} {steps})'
    )
  cached = summary.programs_from_cache
  if cached:
    text += (
      f'; {cached} {"program" if cached == 1 else "programs"} read '
      f'from the compilation cache'
    )
  return text


def _planning(lines: list[str] | None) -> str | None:
  """'12.0 s, 7.7 s of it tracing and compiling the chosen plan's 9
  programs; 10 programs compiled in all' (`RunSummary.planning`: per batch
  shape planned, joined)."""
  return '; '.join(lines) if lines else None


# Layer kinds the summary names, largest share of the floor first.
_FLOOR_KINDS_SHOWN = 4


def _against(median_step_seconds: float | None, seconds: float) -> str:
  """'; the median step is 1.25x it', or '' without a median step."""
  if not median_step_seconds:
    return ''
  return f'; the median step is {median_step_seconds / seconds:.2f}x it'


def _pairs(n: int | list | None, short: bool = False) -> str:
  """A setting of attention pairs at once in words (a list: by kind of
  attention layer, [[kind, n], ...] as run_stats.json holds a
  `plan.PairsByKind`)."""
  if n is None:
    return 'as configured'
  if isinstance(n, (list, tuple)):
    return ', '.join(f'{kind} {_pairs(k, short)}' for kind, k in n)
  return (
    f'{n}{"" if short else " (example, head)"} pair{"s" * (n != 1)} at once'
  )


def _attention_kinds(floor: dict[str, Any]) -> list[dict[str, Any]]:
  """The floor's layer kinds timed at settings of pairs at once (none in
  run_stats.json of a run before they were)."""
  return [
    k for k in floor.get('kinds') or () if k.get('parallel_heads_seconds')
  ]


def _settings_timed(kind: dict[str, Any]) -> str:
  """'2 (the plan's), 1 (the config's), 8, 4 refused': an attention kind's
  settings timed, in the order timed."""
  words = []
  configured = kind.get('configured_parallel_heads')
  for i, (n, seconds) in enumerate(kind['parallel_heads_seconds']):
    whose = ["the plan's"] if i == 0 else []
    if n is not None and n == configured:
      whose.append("the config's")
    word = ('as configured' if n is None else str(n)) + (
      f' ({" and ".join(whose)})' if whose else ''
    )
    words.append(word if seconds is not None else word + ' refused')
  return ', '.join(words)


def _floor_setting_rows(
  floor: dict[str, Any], median_step_seconds: float | None
) -> list[tuple[str, str]]:
  """The floor as configured and at the best setting of each attention
  kind, for a model with attention kinds (run_stats.json from a run that
  timed their settings)."""
  kinds = _attention_kinds(floor)
  if not kinds or 'best_step_floor_seconds' not in floor:
    return []
  rows = []
  plan_seconds = floor['step_floor_seconds']
  configured = floor['configured_step_floor_seconds']
  if configured is None:
    refused = ', '.join(
      k['name'] for k in kinds if k.get('configured_seconds') is None
    )
    rows.append(
      (
        'floor as configured',
        f"not measured: the backend refused the config's pairs at once of "
        f'{refused} for memory',
      )
    )
  elif floor.get('plan_is_configured'):
    rows.append(
      (
        'floor as configured',
        f"{configured:.4g} s, the step floor: the plan's attention pairs at "
        "once are the config's",
      )
    )
  else:
    rows.append(
      (
        'floor as configured',
        f'{configured:.4g} s (layer by layer, attention '
        + ', '.join(
          f'{k["name"]} '
          f'{_pairs(k.get("configured_parallel_heads"), short=True)}'
          for k in kinds
        )
        + f'){_against(median_step_seconds, configured)}',
      )
    )
  best = floor['best_step_floor_seconds']
  if best is not None:
    whole = best == floor.get('whole_program_seconds')
    how = (
      "the model as one program at the plan's setting, faster than layer "
      'by layer with'
      if whole
      else 'layer by layer,'
    )
    fastest = '; '.join(
      f'{k["name"]} {_pairs(k.get("best_parallel_heads"), short=True)}, of '
      f'{_settings_timed(k)}'
      for k in kinds
    )
    same = ' = the step floor' if best == plan_seconds else ''
    rows.append(
      (
        'floor at best setting',
        f'{best:.4g} s{same} ({how} each attention kind at its fastest '
        f'setting timed: {fastest}){_against(median_step_seconds, best)}',
      )
    )
  return rows


def _rate(value: float | None) -> str:
  return 'refused' if value is None else f'{value:.3g}'


def _kind_share(
  share: dict[str, Any], median_step_seconds: float | None
) -> str:
  """'Attn (layer 9) x 9: 55%, 40% of the step, 5.6 TFLOP/s (as configured
  2.1, fastest 9.5 at 16 (example, head) pairs at once)': a kind's share of
  the floor, of the median step (run_stats.json from a run that timed
  settings), its rate at the plan's setting and, for an attention kind, as
  configured and at its fastest."""
  text = f'{share["name"]} x {share["count"]}: {share["share_of_floor"]:.0%}, '
  per_step = share.get('seconds_per_step')
  if per_step is not None and median_step_seconds:
    text += f'{per_step / median_step_seconds:.0%} of the step, '
  text += f'{share["tflops_per_second"]:.3g} TFLOP/s'
  if share.get('attention'):
    text += (
      f' (as configured {_rate(share.get("configured_tflops_per_second"))}, '
      f'fastest {_rate(share.get("best_tflops_per_second"))} at '
      f'{_pairs(share.get("best_parallel_heads"), short=True)})'
    )
  return text


def _floor_rows(
  floor: dict[str, Any] | None, median_step_seconds: float | None
) -> list[tuple[str, str]]:
  """The 'step floor' (at the plan's attention pairs at once), 'floor as
  configured', 'floor at best setting', 'arithmetic' and 'floor by layer
  kind' rows of a measured floor (run_stats.json's `step_floor`; a run's
  before the floor timed attention settings has the first, the fourth and
  the fifth)."""
  if not floor:
    return []
  rows = []
  seconds = floor['step_floor_seconds']
  calls = floor['calls_per_step']
  how = (
    "the model's forward and gradient as one program"
    if seconds is not None and seconds == floor['whole_program_seconds']
    else "each distinct layer's forward and gradient alone, "
    f'{floor["rows_per_call"]} rows a call, x {calls} '
    f'call{"s" * (calls != 1)}'
  )
  heads = floor.get('parallel_heads')
  if heads is not None:
    how += f", attention at the plan's {_pairs(heads)}"
  elif _attention_kinds(floor):
    how += ', attention as configured'
  if seconds is not None:
    rows.append(
      (
        'step floor',
        f'{seconds:.4g} s ({how}){_against(median_step_seconds, seconds)}',
      )
    )
    rows.extend(_floor_setting_rows(floor, median_step_seconds))
  rate = (
    f'; {floor["flops_per_step"] / median_step_seconds / 1e12:.3g} TFLOP/s '
    'at the median step'
    if median_step_seconds
    else ''
  )
  rows.append(
    (
      'arithmetic',
      f'{floor["flops_per_step"] / 1e12:.4g} TFLOP a step a device (forward '
      f"and gradient, XLA's count){rate}",
    )
  )
  # Which layers hold the step back: each kind's share of the layer by
  # layer floor (and of the step), and the rate it ran at (run_stats.json
  # of an older run has no shares).
  shares = floor.get('shares') or []
  if shares:
    rows.append(
      (
        'floor by layer kind',
        '; '.join(
          _kind_share(s, median_step_seconds)
          for s in shares[:_FLOOR_KINDS_SHOWN]
        ),
      )
    )
  return rows


def format_summary(
  summary: 'RunSummary | None',
  loop: Any,
  checkpoint: str | None,
  checkpoint_step: int | None,
  log_path: str,
  total_steps: int | None,
) -> str:
  """The end-of-run block: classes, mode, losses, speed, memory, checkpoint.

  Args:
    summary: `ProgressPrinter.summary()` (a `printer.RunSummary`), or None
      without a printer.
    loop: the `training.Loop` that ran, or None.
    checkpoint: path of the final checkpoint's `.pkl.gz`, or None.
    checkpoint_step: its step.
    log_path: the run's full log.
    total_steps: `train.steps`.

  Returns:
    str, several lines, starting with an empty one and '== summary =='.
  """
  rows = []
  if loop is not None:
    trainer, layers, fix = implementations(loop)
    rows.append(('trainer', trainer))
    if fix:
      rows.append(('trainer fix', f'{fix} (as current JAX requires)'))
    rows.append(('trainer mode', trainer_mode(loop)))
    rows.append(('reversible layers', layers))
  if summary is not None:
    steps = f'{summary.last_step} ({summary.steps_run} in this run'
    if not summary.steps_run and total_steps is not None:
      steps += (
        f': the checkpoint was at train.steps = {total_steps} already'
        if summary.last_step == total_steps
        else f': the checkpoint was at step {summary.last_step}, past '
        f'train.steps = {total_steps}'
      )
    rows.append(('steps', steps + ')'))
    rows.extend(_loss_rows(summary))
    train_time = _train_time(summary)
    if train_time:
      rows.append(('train time', train_time))
    peak = format_bytes(summary.peak_host_rss_bytes, spec='.0f', suffix=False)
    rows.append(('peak host memory', f'{peak} MiB (RSS)'))
    planning = _planning(summary.planning)
    if planning:
      rows.append(('planning', planning))
    rows.extend(_floor_rows(summary.step_floor, summary.median_step_seconds))
  if checkpoint and summary is not None and not summary.steps_run:
    rows.append(
      (
        'checkpoint',
        f'{checkpoint} (step {checkpoint_step}, as '
        f'loaded: no step ran, nothing new to save)',
      )
    )
  elif checkpoint:
    rows.append(('checkpoint', f'{checkpoint} (step {checkpoint_step})'))
  else:
    rows.append(('checkpoint', 'none written'))
  rows.append(('full log', log_path))
  width = max(len(k) for k, _ in rows)
  return '\n'.join(
    ['', '== summary =='] + [f'{k.ljust(width)}  {v}' for k, v in rows]
  )


def summary_rows(text: str) -> dict[str, str]:
  """The summary block `format_summary` made, read back from what a run
  printed: {row name: value}; {} where `text` holds no summary."""
  if '== summary ==' not in text:
    return {}
  rows = {}
  for line in text.split('== summary ==', 1)[1].strip().splitlines():
    name, sep, value = line.partition('  ')
    if not sep:
      break
    rows[name.strip()] = value.strip()
  return rows


def _resumes(step: int, total_steps: int | None) -> str:
  """What the same command does from the checkpoint of `step`: trax's Loop
  loads it and runs its steps from `step` + 1 to train.steps."""
  if total_steps is not None and step >= total_steps:
    return (
      f'that is the last step of train.steps = {total_steps}: the same '
      f'command trains no more'
    )
  return f'the same command resumes from step {step + 1}'


def stopping_notice(
  signum: int, step: int, checkpoint: str, total_steps: int | None
) -> str:
  """The warning of a first signal during the steps (`interrupt`).

  Args:
    signum: the signal.
    step: the step the run stops after (`StopOnSignal.stops_after_step`).
    checkpoint: the `.pkl.gz` of the set saved after it.
    total_steps: train.steps, or None where unknown.

  Returns:
    One line, without the command's prefix.
  """
  name = signal.Signals(signum).name
  if total_steps is not None and step > total_steps:
    # The Loop ran its last step: it ends as planned, with its checkpoint.
    return (
      f'{name} received after the last step ({total_steps}): the run '
      f'ends as it would (send it again to stop at once)'
    )
  return (
    f'{name} received: stopping after step {step} with its checkpoint '
    f'{checkpoint}; {_resumes(step, total_steps)} (send it again to stop '
    f'at once: the checkpoint saved before then stands)'
  )


def interrupted_message(
  interrupted: Any, output_dir: str, total_steps: int | None = None
) -> str:
  """One line for a run stopped by SIGINT/SIGTERM (`interrupt.Interrupted`).

  Args:
    interrupted: the `interrupt.Interrupted`.
    output_dir: the run's output dir.
    total_steps: train.steps, or None where unknown.
  """
  name = signal.Signals(interrupted.signum).name
  if getattr(interrupted, 'planning', False):
    return (
      f'interrupted by {name} while planning the step, before it ran; '
      f'nothing new was saved in {output_dir}; run the same command to '
      f'start again'
    )
  if interrupted.checkpoint is None:
    return (
      f'interrupted by {name} before the first step; nothing new was '
      f'saved in {output_dir}'
    )
  return (
    f'interrupted by {name}: stopped after step {interrupted.step}, '
    f'checkpoint {interrupted.checkpoint} (step {interrupted.step}); '
    f'{_resumes(interrupted.step, total_steps)}'
  )


def interrupted_twice_message(
  stop: Any,
  standing: tuple[str, int] | None,
  output_dir: str,
  total_steps: int | None = None,
) -> str:
  """One line for a run a second signal stopped at once.

  Args:
    stop: the run's `interrupt.StopOnSignal` (its signals, the last step
      begun and ended).
    standing: (path of its `.pkl.gz`, step) of the checkpoint a resume of
      the same command loads, or None: none.
    output_dir: the run's output dir.
    total_steps: train.steps, or None where unknown.

  Returns:
    e.g. 'interrupted by a second SIGINT at step 10: the checkpoint
    runs/x/model.pkl.gz (step 8) stands; the same command resumes from
    step 9 (steps 9-10 run again)'.
  """
  first = signal.Signals(stop.signum).name
  second = signal.Signals(stop.second_signum).name
  how = f'a second {second}' if second == first else f'{second} after {first}'
  begun = stop.step_begun
  if begun is None:
    where = 'before the first step'
  elif stop.step_ended == begun:  # In its save or evals.
    where = f'after step {begun}'
  else:
    where = f'at step {begun}'
  if standing is None:
    stands, step = f'no checkpoint stands in {output_dir}', 0
    resumes = 'the same command starts from step 1'
  else:
    path, step = standing
    stands = f'the checkpoint {path} (step {step}) stands'
    resumes = _resumes(step, total_steps)
  again = ''
  if begun is not None and begun == step + 1:
    again = f' (step {begun} runs again)'
  elif begun is not None and begun > step:
    again = f' (steps {step + 1}-{begun} run again)'
  return f'interrupted by {how} {where}: {stands}; {resumes}{again}'
