"""`trax-revplus plot-memory`: damaged logs, output paths, one-line errors.

In-process (`cli.main`). The reference for what was drawn is the log
itself: the figure's title counts the records it drew, which must be the
valid lines written here, no more.
"""

import os
import stat

import pytest

from trax_revplus import cli
from trax_revplus.memory import reading

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
GOOD = (
  '{"step": 1, "phase": "forward", "host_rss_bytes": 1048576}\n'
  '{"step": 1, "phase": "step", "host_peak_bytes": 2097152}\n'
)


def _main(capsys, *args):
  code = cli.main(['trax-revplus', 'plot-memory', *args])
  out, err = capsys.readouterr()
  return code, out, err


def _one_line(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert 'Traceback' not in err
  return lines[0]


def test_bad_lines_are_named_and_the_rest_is_drawn(tmp_path, capsys):
  log = tmp_path / 'memory.jsonl'
  log.write_bytes(
    GOOD.encode()
    + b'{"step": "x", "phase": 3}\n\x80\x81junk\n'
    + b'{"step": 2, "phase": "step", "host_peak_bytes": 3}\n'
    + b'{"step": 3, "pha'
  )
  code, out, err = _main(capsys, str(tmp_path))
  assert code == 0, err
  assert _one_line(err) == (
    f'trax-revplus plot-memory: warning: {log}: 3 of 6 lines are not '
    f"memory records and were skipped (the first, line 3: field 'step' "
    f'is not a number)'
  )
  assert out == f'{tmp_path / "memory.png"}\n'
  assert (tmp_path / 'memory.png').read_bytes()[:8] == PNG_MAGIC
  assert len(reading.read(log).records) == 3


@pytest.mark.parametrize(
  'content,problem',
  [
    (bytes(range(256)) * 4, 'not a JSON object'),
    (
      b'{"step": "1", "phase": "forward", "host_rss_bytes": "x"}\n',
      "field 'step' is not a number",
    ),
    (
      b'{"step": 1, "phase": "forward", "host_rss_bytes": "x"}\n',
      "field 'host_rss_bytes' is not a number",
    ),
    (b'[1, 2, 3]\n', 'not a JSON object'),
  ],
  ids=['binary', 'step_type', 'figure_type', 'not_an_object'],
)
def test_a_log_without_any_record_is_corrupt_and_nothing_is_written(
  tmp_path, capsys, content, problem
):
  log = tmp_path / 'memory.jsonl'
  log.write_bytes(content)
  code, out, err = _main(capsys, str(tmp_path))
  assert code == 1
  line = _one_line(err)
  assert line.startswith(f'trax-revplus plot-memory: error: {log} is corrupt: ')
  assert f'(line 1: {problem})' in line
  assert not out
  assert os.listdir(tmp_path) == ['memory.jsonl']


def test_an_empty_log_holds_no_records_yet(tmp_path, capsys):
  (tmp_path / 'memory.jsonl').write_text('\n\n')
  code, _, err = _main(capsys, str(tmp_path))
  assert code == 2
  assert 'holds no memory records yet; train with the memory log enabled' in (
    _one_line(err)
  )
  assert os.listdir(tmp_path) == ['memory.jsonl']


def test_the_png_is_written_at_exactly_the_path_printed(tmp_path, capsys):
  (tmp_path / 'memory.jsonl').write_text(GOOD)
  for name in ('X', 'plot.v2', 'out.png'):
    code, out, err = _main(
      capsys, str(tmp_path / 'memory.jsonl'), f'--output={tmp_path / name}'
    )
    assert code == 0, err
    assert out == f'{tmp_path / name}\n'
    assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
  assert sorted(os.listdir(tmp_path)) == [
    'X',
    'memory.jsonl',
    'out.png',
    'plot.v2',
  ]


def test_a_linked_output_keeps_its_link(tmp_path, capsys):
  (tmp_path / 'memory.jsonl').write_text(GOOD)
  (tmp_path / 'link.png').symlink_to('real.png')
  code, out, _ = _main(capsys, str(tmp_path), f'--output={tmp_path}/link.png')
  assert code == 0 and out == f'{tmp_path}/link.png\n'
  assert (tmp_path / 'link.png').is_symlink()
  assert (tmp_path / 'real.png').read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
  'output,code,text',
  [
    ('{dir}', 2, '--output={dir} is a directory; give the path of a file'),
    (
      '{dir}/none/m.png',
      1,
      'cannot write --output={dir}/none/m.png: '
      'directory {dir}/none does not exist',
    ),
    ('{dir}/memory.jsonl/m.png', 1, 'is not a directory'),
    ('-', 2, '--output=- is not allowed here; give a file path'),
  ],
  ids=['directory', 'missing_dir', 'file_as_dir', 'dash'],
)
def test_an_output_that_cannot_be_written_is_refused_before_drawing(
  tmp_path, capsys, output, code, text
):
  (tmp_path / 'memory.jsonl').write_text(GOOD)
  output = output.format(dir=tmp_path)
  got, out, err = _main(capsys, str(tmp_path), f'--output={output}')
  assert got == code
  assert text.format(dir=tmp_path) in _one_line(err)
  assert not out
  assert os.listdir(tmp_path) == ['memory.jsonl']


def test_a_full_disk_leaves_no_png_and_no_temporary(tmp_path, capsys):
  (tmp_path / 'memory.jsonl').write_text(GOOD)
  (tmp_path / 'out.png').symlink_to('/dev/full')
  code, out, err = _main(capsys, str(tmp_path), f'--output={tmp_path}/out.png')
  assert code == 1
  assert _one_line(err) == (
    f'trax-revplus plot-memory: error: cannot write '
    f'{tmp_path}/out.png: No space left on device'
  )
  assert not out
  assert sorted(os.listdir(tmp_path)) == ['memory.jsonl', 'out.png']
  assert stat.S_ISCHR(os.stat(tmp_path / 'out.png').st_mode)


def test_a_missing_run_or_log_is_a_usage_error(tmp_path, capsys):
  code, _, err = _main(capsys, str(tmp_path / 'nope'))
  assert code == 2 and 'run directory not found' in _one_line(err)
  code, _, err = _main(capsys, str(tmp_path))
  assert code == 2
  assert _one_line(err).startswith(
    f'trax-revplus plot-memory: error: No memory log at {tmp_path}/memory.jsonl'
  )


@pytest.mark.parametrize(
  'where', ['nope', '.'], ids=['missing_dir', 'dir_without_log']
)
def test_the_command_says_what_the_library_finds(tmp_path, capsys, where):
  """The command finds the log and names the PNG as `memory.plot` does."""
  from trax_revplus.memory import plot  # pylint: disable=g-import-not-at-top

  given = str(tmp_path / where)
  with pytest.raises(FileNotFoundError) as raised:
    plot.resolve_jsonl(given)
  code, out, err = _main(capsys, given)
  assert code == 2 and not out
  assert _one_line(err) == f'trax-revplus plot-memory: error: {raised.value}'
  (tmp_path / 'memory.jsonl').write_text(GOOD)
  code, out, err = _main(capsys, str(tmp_path))
  assert code == 0, err
  assert out == f'{plot.default_png(plot.resolve_jsonl(tmp_path))}\n'
