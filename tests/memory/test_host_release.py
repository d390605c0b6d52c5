"""trax_revplus.memory.host_release: free C-allocator memory goes back."""

import ctypes
import os
import subprocess
import sys

import pytest

from trax_revplus import memory
from trax_revplus.memory import host_release


def _fragmented_free_heap(n_chunks=200_000, chunk_bytes=1024, keep_every=64):
  """Frees most of ~200 MiB of small malloc chunks, keeping a few alive.

  The survivors pin the heap's top, so glibc cannot shrink it on its own;
  only `malloc_trim` gives the free pages between them back.
  """
  buffers = [ctypes.create_string_buffer(chunk_bytes) for _ in range(n_chunks)]
  for b in buffers:  # touch every page
    ctypes.memset(b, 1, chunk_bytes)
  return buffers[::keep_every]


@pytest.mark.skipif(not host_release.available(), reason='needs glibc')
def test_release_returns_freed_memory_and_waits_for_growth():
  releaser = host_release.HostMemoryReleaser(min_growth_bytes=64 * 2**20)
  releaser.release()  # start from what the process holds now
  survivors = _fragmented_free_heap()
  held = memory.host_rss_bytes()
  released = releaser.release()
  assert released >= 100 * 2**20, released
  assert memory.host_rss_bytes() < held - 100 * 2**20
  assert releaser.released_bytes >= released
  # No growth since: nothing attempted.
  assert releaser.release() == 0
  del survivors


@pytest.mark.skipif(not host_release.available(), reason='needs glibc')
def test_growth_the_caller_keeps_is_not_released():
  releaser = host_release.HostMemoryReleaser(min_growth_bytes=0)
  releaser.release()
  survivors = _fragmented_free_heap()
  held = memory.host_rss_bytes()
  # The growth (~200 MiB touched) is within what the caller keeps.
  assert releaser.release(keep_bytes=1 << 40) == 0
  assert memory.host_rss_bytes() >= held - 16 * 2**20
  assert releaser.release(keep_bytes=0) >= 100 * 2**20
  del survivors


# Maps a 4 MiB block after glibc's threshold rose past it (argv[1] == 'set':
# with a fixed 1 MiB threshold first); prints the bytes glibc mapped for it.
_MAPPED_BLOCK_SCRIPT = """
import ctypes, sys
from trax_revplus.memory import host_release
class MallInfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in (
      'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks '
      'keepcost').split()]
libc = ctypes.CDLL('libc.so.6')
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(8 << 20))  # glibc's threshold rises to 8 MiB
if sys.argv[1] == 'set':
  assert host_release.set_mmap_threshold(1 << 20)
before = libc.mallinfo2().hblkhd
block = libc.malloc(4 << 20)
print(libc.mallinfo2().hblkhd - before)
libc.free(block)
"""


def _has_mallinfo2():  # glibc >= 2.33
  try:
    return hasattr(ctypes.CDLL('libc.so.6'), 'mallinfo2')
  except OSError:
    return False


def _mapped_bytes(mode):
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  out = subprocess.run(
    [sys.executable, '-c', _MAPPED_BLOCK_SCRIPT, mode],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  )
  return int(out.stdout.split()[-1])


@pytest.mark.skipif(
  not host_release.available() or not _has_mallinfo2(),
  reason='needs glibc >= 2.33',
)
def test_set_mmap_threshold_maps_blocks_glibc_would_keep_in_its_arenas():
  assert _mapped_bytes('default') == 0
  assert _mapped_bytes('set') >= 4 << 20


@pytest.mark.skipif(not host_release.available(), reason='needs glibc')
def test_set_mmap_threshold_keeps_the_users_glibc_tunable(monkeypatch):
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.mmap_threshold=65536')
  assert host_release.set_mmap_threshold(2**20) is False


@pytest.mark.parametrize('nbytes', [-1, 32 * 2**20 + 1, 1.5, True, '1'])
def test_set_mmap_threshold_rejects_what_glibc_cannot_take(nbytes):
  with pytest.raises(
    ValueError, match=r'int number of bytes in \[0, 33554432\]'
  ):
    host_release.set_mmap_threshold(nbytes)
