"""README.md and docs/: a user guide of at most 300 lines, its test command
the one CI runs, its commands working right after its set-up command, and
every link between the pages resolving."""

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
  """.ci/run runs the README's test command: each of its steps (joined by
  `&&` there) a line of its own, in order, with only comments and the
  lines that time its parts (`part NAME`) between them; under `set -e`, a
  failing step ends the run as it ends the README's command."""
  ci = _read(os.path.join(_REPO, '.ci', 'run'))
  assert '\nset -euo pipefail\n' in ci
  command = next(
    c for c in _shell_commands(_read(_README)) if ' -m pytest ' in c
  )
  steps = command.split(' && ')
  assert steps[0].startswith('python3 -m venv ') and len(steps) == 3
  lines = [line.strip() for line in ci.splitlines()]
  assert steps[0] in lines
  run = [
    line
    for line in lines[lines.index(steps[0]) :]
    if line and not line.startswith(('#', 'part '))
  ]
  assert run[: len(steps)] == steps


# What the README's set-up command installs in .venv/bin: a command that
# calls one of them bare runs whatever is on PATH (or nothing), not the
# environment just made. `python3 -m venv` makes that environment.
_VENV_PROGRAMS = ('trax-revplus', 'python', 'python3', 'pip', 'pip3', 'pytest')


def _shell_commands(text):
  """The commands a page gives to run: each line of its ```sh blocks, and
  inline code that is a command line (a word, then flags)."""
  commands = []
  for block in re.findall(r'^```sh\n(.*?)^```', text, flags=re.S | re.M):
    commands += [
      line.strip()
      for line in block.splitlines()
      if line.strip() and not line.strip().startswith('#')
    ]
  prose = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
  for span in re.findall(r'`([^`]+)`', prose):
    span = ' '.join(span.split())
    if re.match(r'[\w./-]+ ', span) and ' --' in span:
      commands.append(span)
  return commands


def _bare_venv_calls(command):
  """The simple commands of a shell line that call a program of the
  virtualenv by its bare name."""
  calls = []
  for part in re.split(r'&&|\|\||[;|]', command):
    words = part.split()
    if (
      words
      and words[0] in _VENV_PROGRAMS
      and words[:3] != ['python3', '-m', 'venv']
    ):
      calls.append(part.strip())
  return calls


def test_shell_command_parsing_finds_bare_calls():
  text = (
    '```sh\n'
    'python3 -m venv .venv && .venv/bin/pip install -e .\n'
    'trax-revplus launch --num_processes=2 -- --output_dir=runs/two\n'
    '```\n'
    'Then run `python tools/bench.py\n--steps=7`, or `.venv/bin/trax-revplus\n'
    'estimate --config_file=F`; `trax-revplus estimate` is its name.\n'
  )
  commands = _shell_commands(text)
  assert commands == [
    'python3 -m venv .venv && .venv/bin/pip install -e .',
    'trax-revplus launch --num_processes=2 -- --output_dir=runs/two',
    'python tools/bench.py --steps=7',
    '.venv/bin/trax-revplus estimate --config_file=F',
  ]
  assert [c for command in commands for c in _bare_venv_calls(command)] == [
    'trax-revplus launch --num_processes=2 -- --output_dir=runs/two',
    'python tools/bench.py --steps=7',
  ]


def test_readme_commands_call_the_virtualenv_s_programs():
  """Every command runs as written right after the README's set-up command
  (`python3 -m venv .venv && .venv/bin/pip install ...`), with nothing
  activated: `.venv/bin/trax-revplus`, never a bare `trax-revplus`."""
  commands = _shell_commands(_read(_README))
  assert any('.venv/bin/trax-revplus launch' in c for c in commands)
  assert any('.venv/bin/trax-revplus estimate' in c for c in commands)
  bare = [c for command in commands for c in _bare_venv_calls(command)]
  assert not bare, bare


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
