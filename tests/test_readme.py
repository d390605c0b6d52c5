"""README.md and docs/: a user guide of at most 300 lines, its test command
the one CI runs, and every link between the pages resolving."""

import os
import re

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_README = os.path.join(_REPO, 'README.md')
_MAX_README_LINES = 300


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _pages():
  docs = os.path.join(_REPO, 'docs')
  return [_README, os.path.join(_REPO, 'CHANGELOG.md')] + sorted(
    os.path.join(docs, name)
    for name in os.listdir(docs)
    if name.endswith('.md')
  )


def _anchors(path):
  """GitHub's anchors of the headings of a Markdown file."""
  anchors, seen = set(), {}
  text = re.sub(r'^```.*?^```', '', _read(path), flags=re.S | re.M)
  for heading in re.findall(r'^#+\s+(.*)$', text, flags=re.M):
    anchor = re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
    n = seen.get(anchor, 0)
    seen[anchor] = n + 1
    anchors.add(anchor if n == 0 else f'{anchor}-{n}')
  return anchors


def test_readme_is_a_short_guide():
  assert len(_read(_README).splitlines()) <= _MAX_README_LINES


def test_readme_test_command_is_the_one_ci_runs():
  ci = _read(os.path.join(_REPO, '.ci', 'run'))
  command = next(
    line for line in ci.splitlines() if line.startswith('python3 -m venv')
  )
  assert f'```sh\n{command}\n```' in _read(_README)


def test_every_relative_link_resolves():
  broken = []
  for page in _pages():
    text = re.sub(r'^```.*?^```', '', _read(page), flags=re.S | re.M)
    for link in re.findall(r'\]\(([^)\s]+)\)', text):
      if re.match(r'[a-z]+:', link):
        continue
      target, _, anchor = link.partition('#')
      path = (
        os.path.normpath(os.path.join(os.path.dirname(page), target))
        if target
        else page
      )
      if not os.path.exists(path):
        broken.append(f'{os.path.relpath(page, _REPO)}: {link} (no file)')
      elif anchor and path.endswith('.md') and anchor not in _anchors(path):
        broken.append(f'{os.path.relpath(page, _REPO)}: {link} (no heading)')
  assert not broken, broken
