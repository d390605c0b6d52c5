"""trax_revplus.host_memory: free C-allocator memory goes back to the system."""

import ctypes

import pytest

from trax_revplus import host_memory
from trax_revplus import memory


def _fragmented_free_heap(n_chunks=200_000, chunk_bytes=1024, keep_every=64):
  """Frees most of ~200 MiB of small malloc chunks, keeping a few alive.

  The survivors pin the heap's top, so glibc cannot shrink it on its own;
  only `malloc_trim` gives the free pages between them back.
  """
  buffers = [ctypes.create_string_buffer(chunk_bytes) for _ in range(n_chunks)]
  for b in buffers:  # touch every page
    ctypes.memset(b, 1, chunk_bytes)
  return buffers[::keep_every]


@pytest.mark.skipif(not host_memory.available(), reason='needs glibc')
def test_release_returns_freed_memory_and_waits_for_growth():
  releaser = host_memory.HostMemoryReleaser(min_growth_bytes=64 * 2**20)
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

