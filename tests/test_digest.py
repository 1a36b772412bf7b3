"""ddsim.digest: a checkpoint's digest looked up where this process read the same files unchanged, and read again
wherever a file may have changed (a write, a rename over it, a file written too recently to tell); an audit's input
files digested as the bytes it parsed, and the files it opened refused where they changed since (reading, read_bytes,
note_opened)."""
import hashlib
import os
import time
from pathlib import Path

import pytest

from ddsim import digest
from ddsim.errors import InputError
from tests.file_times import set_back


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
    time.sleep(0.05)  # (past a coarse clock's tick: its ctime, which no caller sets back, then moves; tests/file_times.py)
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


def test_a_file_read_twice_with_other_bytes_inside_an_audits_reading_is_refused(tmp_path, monkeypatch):
    """Inside reading() each read through ddsim.jsonl is noted by its stat and its bytes; a second read after a write
    is one line naming the file (by its stat; by its bytes where the stat did not move: a file system whose times are
    coarser than the write, faked). Outside it nothing is noted and a changed file is simply read."""
    from ddsim.jsonl import read_text
    f = tmp_path / "p.jsonl"
    f.write_text('{"tokens": [1]}\n')
    set_back(f)
    with digest.reading() as noted:
        read_text(f, "prompts")
        read_text(tmp_path / "." / "p.jsonl", "prompts")  # the same file by another spelling, the same bytes
        assert noted == {str(f.resolve()): hashlib.sha256(b'{"tokens": [1]}\n').hexdigest()}
        f.write_text('{"tokens": [2]}\n')
        with pytest.raises(InputError, match=r"p\.jsonl: changed while it was read \(its inode, size or times are not"):
            read_text(f, "prompts")
        monkeypatch.setattr(digest, "_raw_key", lambda p: (str(p.resolve()), 0))
        noted.opened.clear()
        with pytest.raises(InputError, match=r"p\.jsonl: changed while it was read \(two reads gave other bytes\)"):
            read_text(f, "prompts")
        with pytest.raises(RuntimeError, match="no read of it was noted"):
            digest.read_digest(tmp_path / "other.jsonl")
    assert read_text(f, "prompts") == '{"tokens": [2]}\n'
    with pytest.raises(RuntimeError, match="no read of it was noted"):  # (no reading() running)
        digest.read_digest(f)


def test_an_audits_input_digests_are_of_the_bytes_it_parsed_not_of_the_files_later(tmp_path, monkeypatch):
    """The prompts and cost files replaced after the audit read them (as a file can be in an audit's minutes): the
    report's inputs_sha256 names the bytes the audit ran on. A second audit in the same process then reads the new
    files and digests them, each audit noting its own reads."""
    from ddsim.measure import audit
    from ddsim.measure.settings import AuditConfig
    prompts, cost = tmp_path / "p.jsonl", tmp_path / "c.json"
    old_p, new_p = b'{"tokens": [5, 6, 7, 8]}\n', b'{"tokens": [9, 10, 11]}\n'
    old_c, new_c = b'{"ar_step_us": 100, "verify_us": {"1": 100, "65": 200}}', b'{"ar_step_us": 90, "verify_us": {"1": 90}}'
    prompts.write_bytes(old_p)
    cost.write_bytes(old_c)
    real = audit.audit_prompts

    def then_replaced(*a, **kw):
        out = real(*a, **kw)
        prompts.write_bytes(new_p)
        cost.write_bytes(new_c)
        return out

    monkeypatch.setattr(audit, "audit_prompts", then_replaced)
    ac = AuditConfig(preset="micro", budgets=[4], steps=1, prompts_file=str(prompts), cost_file=str(cost),
                     device="cpu")
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    first = audit.run_audit(ac)
    assert first.prompts[0].tokens == [5, 6, 7, 8]
    assert first.provenance.inputs_sha256 == {"prompts": sha(old_p), "cost": sha(old_c)}
    monkeypatch.setattr(audit, "audit_prompts", real)
    second = audit.run_audit(ac)
    assert second.prompts[0].tokens == [9, 10, 11]
    assert second.provenance.inputs_sha256 == {"prompts": sha(new_p), "cost": sha(new_c)}


def test_a_file_opened_twice_with_another_stat_inside_an_audits_reading_is_refused(tmp_path):
    """note_opened (a checkpoint's weight file, before and after its tensors are read): a write in between, even of
    the same bytes, moves its ctime and is one line naming the file; outside reading() nothing is noted."""
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x01" * 64)
    set_back(f)
    with digest.reading() as noted:
        digest.note_opened(f)
        digest.note_opened(f)
        assert list(noted.opened) == [str(f.resolve())] and not noted
        f.write_bytes(b"\x01" * 64)
        with pytest.raises(InputError, match=r"model\.safetensors: changed while it was read \(its inode, size or "
                                             "times are not those it was opened with\\)"):
            digest.note_opened(f)
    digest.note_opened(f)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_checkpoint_file_written_after_the_audit_loaded_it_fails_its_digest(tmp_path, monkeypatch, name):
    """A copy of the shipped hybrid, one file of it written again (its own bytes) after the audit loaded the model:
    the weights' digest, taken from disk after the load, would not be of what ran; the audit stops with one line naming
    the file (config.json at the digest's read of the config, the weights at the digest). The same audit with nothing
    written passes that point (its digest, the copy's)."""
    import shutil

    from ddsim import cli
    from ddsim.measure import audit
    from ddsim.measure.settings import AuditConfig
    from ddsim.model.checkpoint import checkpoint_digest
    ck = tmp_path / "ck"
    shutil.copytree(Path(cli.__file__).with_name("models") / cli.SHIPPED["model"], ck)
    set_back(ck)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"tokens": [5, 6, 7, 8]}\n')
    real, digests = audit.load_model, []

    def then_written(*a, **kw):
        out = real(*a, **kw)
        (ck / name).write_bytes((ck / name).read_bytes())
        return out

    monkeypatch.setattr(audit, "weights_digest", lambda *a, r=audit.weights_digest: digests.append(r(*a)) or 1 / 0)
    ac = AuditConfig(model_path=str(ck), budgets=[4], steps=1, prompts_file=str(prompts), device="cpu")
    with pytest.raises(ZeroDivisionError):  # (stopped once the digest is taken)
        audit.run_audit(ac)
    assert digests == [checkpoint_digest(ck)]
    monkeypatch.setattr(audit, "load_model", then_written)
    with pytest.raises(InputError, match=rf"{name}: changed (since it was read|while it was read) \(its inode, "):
        audit.run_audit(ac)


def test_a_weight_file_written_while_the_audit_reads_its_tensors_is_refused(tmp_path, monkeypatch):
    """The shipped hybrid's copy, its weight file written again (its own bytes) after the first tensor was read from
    it: one line naming the file, before anything is built on a mix of two files."""
    import shutil

    from ddsim import cli
    from ddsim.measure import audit
    from ddsim.measure.settings import AuditConfig
    from ddsim.model import checkpoint
    ck = tmp_path / "ck"
    shutil.copytree(Path(cli.__file__).with_name("models") / cli.SHIPPED["model"], ck)
    set_back(ck)
    real, calls = checkpoint._Mapper.__call__, []

    def writes_once(self, key, t):
        if not calls:
            (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
        calls.append(key)
        return real(self, key, t)

    monkeypatch.setattr(checkpoint._Mapper, "__call__", writes_once)
    ac = AuditConfig(model_path=str(ck), budgets=[4], steps=1, n_prompts=1, device="cpu")
    with pytest.raises(InputError) as e:
        audit.run_audit(ac)
    assert str(e.value) == f"{ck / 'model.safetensors'}: changed while it was read (its inode, size or times are not " \
                           "those it was opened with)"
    assert len(calls) > 1
