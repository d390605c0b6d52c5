"""`byte_sizes.format_apart`: sizes a line compares never read alike."""

from trax_revplus import byte_sizes


def test_sizes_in_their_units_where_they_read_apart():
  assert byte_sizes.format_apart(3 * 2**30, 2**30) == ['3.0 GiB', '1.0 GiB']


def test_sizes_in_bytes_where_a_unit_would_show_them_alike():
  # 1 GiB + 1 byte and 1 GiB both round to '1.0 GiB'.
  assert byte_sizes.format_apart(2**30 + 1, 2**30) == [
    '1073741825 bytes',
    '1073741824 bytes',
  ]


def test_equal_sizes_stay_in_their_unit():
  assert byte_sizes.format_apart(2**20, 2**20) == ['1.0 MiB', '1.0 MiB']
