"""JAX's persistent compilation cache, as `trax-revplus train` uses it.

Each check runs JAX in a fresh process, where the cache is opened at the
first compilation, as in a run: the test process has a cache of its own
(conftest)."""

import logging as std_logging
import os
import subprocess
import sys
import textwrap

import pytest

from trax_revplus import compilation_cache
from trax_revplus.cli import cache_flags
from trax_revplus.cli import noise

# Compiles one program with the cache in argv[1] and prints how many
# programs XLA compiled and how many were read from the cache (JAX's events;
# `progress.compiles.CompileCounter` counts the same, but imports trax).
_COMPILE_ONE = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp
    from trax_revplus import compilation_cache
    events = []
    jax.monitoring.register_event_listener(
        lambda event, **kwargs: events.append(event))
    compilation_cache.enable(sys.argv[1])
    jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()
    print(events.count('/jax/compilation_cache/cache_misses'),
          events.count('/jax/compilation_cache/cache_hits'))
""")


def _compile_one(directory):
  done = subprocess.run(
    [sys.executable, '-c', _COMPILE_ONE, str(directory)],
    capture_output=True,
    text=True,
    check=True,
  )
  programs, hits = map(int, done.stdout.split())
  return programs, hits, done.stderr


def test_a_second_process_reads_the_programs_the_first_compiled(tmp_path):
  misses, hits, _ = _compile_one(tmp_path / 'cache')
  assert misses >= 1 and hits == 0
  assert any(name.endswith('-cache') for name in os.listdir(tmp_path / 'cache'))
  misses_again, hits_again, _ = _compile_one(tmp_path / 'cache')
  assert misses_again == 0 and hits_again == misses


def test_a_damaged_entry_compiles_again_and_is_said_once(tmp_path):
  cache = tmp_path / 'cache'
  _compile_one(cache)
  for name in os.listdir(cache):
    if name.endswith('-cache'):
      (cache / name).write_bytes(b'not an executable')
  misses, hits, stderr = _compile_one(cache)
  assert hits == 0 and misses >= 1
  assert 'Error reading persistent compilation cache entry' in stderr
  # What the commands show of those warnings: the first, as one line.
  records = []
  handler = std_logging.Handler()
  handler.emit = records.append
  logger = std_logging.getLogger('py.warnings')
  with noise.route_warnings(std_logging.NullHandler(), handler):
    with cache_flags.enabled(str(cache)):
      for line in stderr.splitlines():
        if 'UserWarning' in line:
          logger.warning(line)
  assert len(records) == 1
  message = records[0].getMessage()
  assert str(cache) in message and 'remove that directory' in message
  assert '\n' not in message


def test_an_unwritable_directory_is_named_with_the_fix(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  with pytest.raises(compilation_cache.CompilationCacheError) as e:
    compilation_cache.check_writable(str(blocker / 'cache'))
  assert str(blocker / 'cache') in str(e.value)
  assert '--nocompilation_cache' in str(e.value)


def test_enabled_leaves_jax_s_settings_as_they_were(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top

  before = jax.config.jax_compilation_cache_dir
  with compilation_cache.enabled(str(tmp_path)) as directory:
    assert jax.config.jax_compilation_cache_dir == directory
  assert jax.config.jax_compilation_cache_dir == before


def test_auto_is_the_user_cache_directory(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert compilation_cache.resolve('auto') == str(
    tmp_path / 'trax_revplus' / 'jax'
  )


# `_COMPILE_ONE` where the `filelock` package cannot be imported.
_WITHOUT_FILELOCK = (
  'import sys\nsys.modules["filelock"] = None\n' + _COMPILE_ONE
)


def test_without_filelock_the_cache_still_serves_a_second_process(tmp_path):
  """JAX bounds a cache only under a file lock: without the package, the
  cache is unbounded (one line says so) instead of unreadable."""

  def compile_one():
    done = subprocess.run(
      [sys.executable, '-c', _WITHOUT_FILELOCK, str(tmp_path / 'cache')],
      capture_output=True,
      text=True,
      check=True,
    )
    return *map(int, done.stdout.split()), done.stderr

  misses, hits, err = compile_one()
  assert misses >= 1 and hits == 0
  assert 'no size limit: the filelock package is not installed' in err
  misses_again, hits_again, err = compile_one()
  assert misses_again == 0 and hits_again == misses
  assert 'cannot be read' not in err
