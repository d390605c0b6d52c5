"""trax_revplus.output_files: what an output path is, and what is left after.

Each case makes the kind of file a user might name (a regular file, a link,
a named pipe, a character device, a directory, a socket, a missing
directory) and checks, against the file system itself, what `write` did to
it: written in place, replaced, refused, and that no temporary file is left.
"""

import errno
import os
import socket
import stat
import threading

import pytest

from trax_revplus import output_files
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE


def _writer(data):
  return lambda f: f.write(data)


def _entries(directory):
  return sorted(os.listdir(directory))


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path):
  path = tmp_path / 'out.json'
  path.write_bytes(b'old content')
  os.chmod(path, 0o640)
  inode = os.stat(path).st_ino
  assert output_files.write(str(path), _writer(b'new')) == str(path)
  assert path.read_bytes() == b'new'
  assert os.stat(path).st_ino != inode  # Renamed over, not rewritten.
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
  assert _entries(tmp_path) == ['out.json']


def test_an_absent_path_is_created(tmp_path):
  path = tmp_path / 'new.json'
  output_files.write(str(path), _writer(b'x'))
  assert path.read_bytes() == b'x'
  assert _entries(tmp_path) == ['new.json']


def test_a_link_stays_a_link_and_its_target_is_written(tmp_path):
  target = tmp_path / 'target.json'
  target.write_bytes(b'old')
  link = tmp_path / 'link.json'
  link.symlink_to('target.json')
  assert output_files.write(str(link), _writer(b'new')) == str(link)
  assert link.is_symlink() and os.readlink(link) == 'target.json'
  assert target.read_bytes() == b'new'
  assert _entries(tmp_path) == ['link.json', 'target.json']


def test_a_named_pipe_is_written_through_not_replaced(tmp_path):
  fifo = tmp_path / 'fifo'
  os.mkfifo(fifo)
  got = []
  reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
  reader.start()
  output_files.write(str(fifo), _writer(b'through the pipe'))
  reader.join()
  assert got == [b'through the pipe']
  assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
  assert _entries(tmp_path) == ['fifo']


def test_a_character_device_is_written_in_place():
  before = os.stat('/dev/null')
  output_files.write('/dev/null', _writer(b'x' * 1000))
  after = os.stat('/dev/null')
  assert stat.S_ISCHR(after.st_mode)
  assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_full_device_is_one_runtime_error():
  with pytest.raises(output_files.OutputFileError) as error:
    output_files.write('/dev/full', _writer(b'x' * 100000), '--json')
  assert error.value.exit_code == EXIT_RUNTIME
  assert str(error.value) == (
    'cannot write --json=/dev/full: No space left on device'
  )


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / 'out.png'
  path.write_bytes(b'old')

  def fill(f):
    f.write(b'half')
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  with pytest.raises(output_files.OutputFileError) as error:
    output_files.write(str(path), fill)
  assert error.value.exit_code == EXIT_RUNTIME
  assert 'No space left on device' in str(error.value)
  assert path.read_bytes() == b'old'
  assert _entries(tmp_path) == ['out.png']


def test_an_error_in_the_content_leaves_no_temporary(tmp_path):
  def fill(f):
    f.write(b'half')
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    output_files.write(str(tmp_path / 'new.png'), fill)
  assert not _entries(tmp_path)


@pytest.mark.parametrize('kind', ['directory', 'socket'])
def test_a_directory_or_socket_is_refused_untouched(tmp_path, kind):
  path = tmp_path / 'thing'
  holder = None
  if kind == 'directory':
    path.mkdir()
  else:
    holder = socket.socket(socket.AF_UNIX)
    holder.bind(str(path))
  try:
    mode = os.lstat(path).st_mode
    for call in (
      lambda: output_files.check(str(path), '--json'),
      lambda: output_files.write(str(path), _writer(b'x'), '--json'),
    ):
      with pytest.raises(output_files.OutputFileError) as error:
        call()
      assert error.value.exit_code == EXIT_USAGE
      assert str(error.value) == (
        f'--json={path} is a {kind}; give the path of a file'
      )
    assert os.lstat(path).st_mode == mode
  finally:
    if holder is not None:
      holder.close()
  assert _entries(tmp_path) == ['thing']


def test_a_block_device_is_refused(tmp_path):
  path = tmp_path / 'disk'
  try:
    os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
  except (PermissionError, OSError):
    pytest.skip('cannot make a block device node here (not root)')
  with pytest.raises(output_files.OutputFileError) as error:
    output_files.check(str(path), '--json')
  assert error.value.exit_code == EXIT_USAGE
  assert 'is a block device' in str(error.value)
  assert stat.S_ISBLK(os.lstat(path).st_mode)


def test_a_missing_or_unusable_directory_is_a_runtime_error(tmp_path):
  not_a_dir = tmp_path / 'file'
  not_a_dir.write_text('x')
  cases = {
    str(
      tmp_path / 'no' / 'out.json'
    ): f'directory {tmp_path / "no"} does not exist; create it first',
    str(
      not_a_dir / 'out.json'
    ): f'{not_a_dir} is not a directory; give a path in a directory',
  }
  for path, text in cases.items():
    with pytest.raises(output_files.OutputFileError) as error:
      output_files.check(path, '--output')
    assert error.value.exit_code == EXIT_RUNTIME
    assert str(error.value) == f'cannot write --output={path}: {text}'


def test_a_dash_is_standard_output_only_where_allowed(capfdbinary):
  output_files.check('-', '--json', allow_stdout=True)
  with pytest.raises(output_files.OutputFileError) as error:
    output_files.check('-', '--output')
  assert error.value.exit_code == EXIT_USAGE
  assert output_files.write('-', _writer(b'{"a": 1}\n')) == '-'
  assert capfdbinary.readouterr().out == b'{"a": 1}\n'


@pytest.mark.parametrize(
  'args',
  [
    ['estimate', '--config_file=c.gin', '--json='],
    ['plot-memory', 'run', '--output='],
    ['compare', '--config_file=c.gin', '--output_dir='],
  ],
  ids=['estimate_json', 'plot_memory_output', 'compare_output_dir'],
)
def test_an_empty_path_is_a_usage_error_not_the_default(args, capsys):
  # --json= or --output= from an unset shell variable must not read as no
  # flag (no JSON, the run dir's memory.png replaced).
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top

  assert cli.main(['trax-revplus'] + args) == 2
  err = capsys.readouterr().err
  flag = args[-1].rstrip('=')
  assert err == (
    f'trax-revplus {args[0]}: error: argument {flag}: must be '
    f'a path, got an empty one\n'
  )
