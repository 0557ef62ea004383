"""Each exception to Ansible's sanity tests says why it is one.

ansible-test checks that an ignore line names a real file and a test that really fails there;
what it cannot check is the reason, which is how google.cloud and amazon.aws keep their ignore
files honest. An exception without one is a finding nobody looked at.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.release import __version__ as ansible_version

IGNORE_FILES = sorted(Path(__file__).parent.glob("ignore-*.txt"))


def test_the_ignore_file_is_the_one_the_installed_ansible_core_reads():
    """ansible-test reads ignore-<major.minor>.txt only: after an ansible-core upgrade, carry it over."""
    major_minor = ".".join(ansible_version.split(".")[:2])
    assert [p.name for p in IGNORE_FILES] == [f"ignore-{major_minor}.txt"]


@pytest.mark.parametrize("path", IGNORE_FILES, ids=lambda p: p.name)
def test_every_ignore_line_names_a_file_a_test_and_its_reason(path: Path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        entry, _, reason = line.partition(" # ")
        fields = entry.split()
        assert len(fields) == 2, f"{path.name}:{number}: want 'PATH TEST[:CODE]  # reason', got {line!r}"
        assert len(reason.strip().split()) >= 5, f"{path.name}:{number}: say why {fields[0]} is an exception"
