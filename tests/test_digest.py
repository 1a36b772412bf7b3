"""ddsim.digest's files_digest: a checkpoint's digest looked up where this process read the same files unchanged,
and read again wherever a file may have changed (a write, a rename over it, a file written too recently to tell)."""
import os

import pytest

from ddsim import digest
from ddsim.errors import InputError


@pytest.fixture
def reads(monkeypatch):
    """The files files_digest reads, in order; the cache empty and every file old enough to keep a digest for."""
    seen = []
    real = digest._update

    def counted(h, path):
        seen.append(path.name)
        real(h, path)

    monkeypatch.setattr(digest, "_update", counted)
    monkeypatch.setattr(digest, "_DIGESTS", {})
    monkeypatch.setattr(digest, "_SETTLED_NS", -10**12)  # (a file's ctime is "settled" however recent)
    return seen


def _files(tmp_path):
    a, b = tmp_path / "config.json", tmp_path / "model.safetensors"
    a.write_bytes(b"{}")
    b.write_bytes(b"\x01" * 4096)
    return [a, b]


def test_an_unchanged_set_of_files_is_read_once(tmp_path, reads):
    paths = _files(tmp_path)
    first = digest.files_digest(paths)
    assert digest.files_digest(paths) == first and digest.files_digest([str(p) for p in paths]) == first
    assert reads == ["config.json", "model.safetensors"]


def test_a_file_written_since_is_read_again_even_with_its_times_set_back(tmp_path, reads):
    paths = _files(tmp_path)
    first = digest.files_digest(paths)
    st = os.stat(paths[1])
    paths[1].write_bytes(b"\x02" * 4096)  # the same size, and its mtime put back
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert digest.files_digest(paths) != first
    assert reads == ["config.json", "model.safetensors"] * 2


def test_a_file_replaced_by_another_is_read_again(tmp_path, reads):
    paths = _files(tmp_path)
    first = digest.files_digest(paths)
    other = tmp_path / "other"
    other.write_bytes(b"\x01" * 4095 + b"\x03")
    os.replace(other, paths[1])
    assert digest.files_digest(paths) != first and len(reads) == 4


def test_files_written_within_the_settling_time_are_not_kept(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(digest, "_SETTLED_NS", 10**15)  # every file "just written"
    paths = _files(tmp_path)
    assert digest.files_digest(paths) == digest.files_digest(paths) and len(reads) == 4
    assert digest._DIGESTS == {}


def test_the_digest_is_the_names_and_bytes_in_order(tmp_path, reads):
    import hashlib
    paths = _files(tmp_path)
    want = hashlib.sha256(b"config.json\0{}" + b"model.safetensors\0" + b"\x01" * 4096).hexdigest()
    assert digest.files_digest(paths) == want
    assert digest.files_digest(paths[::-1]) != want  # the order given is part of it


def test_a_missing_file_is_one_line_naming_it(tmp_path, reads):
    with pytest.raises(InputError, match=r"nothere: cannot read"):
        digest.files_digest([tmp_path / "nothere"])
