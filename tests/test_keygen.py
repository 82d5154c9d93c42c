"""``milarun keygen``: both files new, with their modes from the start whatever the umask,
and nothing written or left behind when the pair cannot be written."""

import os
import stat

import pytest

from milarun.cli import main
from milarun.verify import keys


def cli(argv):
    """``milarun ARGV`` in this process; its exit status."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    return exc.value.code


def one_error(capsys, argv):
    """The one line ``milarun keygen ARGV`` printed to stderr, after checking it exits 2."""
    assert cli(["keygen", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("milarun: error: ")
    return err.strip()


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one back afterwards."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_keygen_modes_are_0600_and_0644_whatever_the_umask(tmp_path, umask, mask):
    umask(mask)
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    assert cli(["keygen", private, public]) == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert (
        keys.load_private(private).public_key().public_bytes_raw()
        == keys.load_public(public).public_bytes_raw()
    )


def test_keygen_creates_the_private_key_never_wider_than_0600(tmp_path, umask, monkeypatch):
    # the mode os.open creates the file with: under umask 000 it is the file's mode
    # until the fchmod, so it must already be 0600
    umask(0)
    opened = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        opened.append((os.fspath(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(keys.os, "open", spy)
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    keys.keygen(private, public)
    modes = {path: (flags, mode) for path, flags, mode in opened}
    for path, want in ((private, 0o600), (public, 0o644)):
        flags, mode = modes[str(path)]
        assert mode == want and flags & os.O_EXCL and flags & os.O_CREAT


@pytest.mark.parametrize("second", ["k.pem", "./k.pem", "sub/../k.pem", "link/k.pem"])
def test_keygen_refuses_one_file_as_both_keys(tmp_path, capsys, monkeypatch, second):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path)
    err = one_error(capsys, ["k.pem", second])
    assert err == (
        f"milarun: error: {second}: is given as both the private and the public key; name two files"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "sub"]


@pytest.mark.parametrize("which", ["private", "public"])
def test_keygen_refuses_an_existing_file_and_writes_nothing(tmp_path, capsys, which):
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    there = private if which == "private" else public
    there.write_text("mine\n")
    err = one_error(capsys, [private, public])
    assert err == f"milarun: error: {there}: exists already; milarun keygen never overwrites a key"
    assert sorted(p.name for p in tmp_path.iterdir()) == [there.name]
    assert there.read_text() == "mine\n"


def test_keygen_refuses_a_dangling_symlink(tmp_path, capsys):
    link = tmp_path / "k.pub"
    link.symlink_to(tmp_path / "elsewhere")
    err = one_error(capsys, [tmp_path / "k.pem", link])
    assert err.endswith("exists already; milarun keygen never overwrites a key")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "k.pem").exists()


@pytest.mark.parametrize("which", ["private", "public"])
def test_keygen_refuses_a_path_under_a_file_and_writes_nothing(tmp_path, capsys, which):
    (tmp_path / "file").write_text("x")
    good, bad = tmp_path / "k", tmp_path / "file" / "k.pub"
    argv = [bad, good] if which == "private" else [good, bad]
    err = one_error(capsys, argv)
    assert err == (
        f"milarun: error: {bad}: cannot write the key: its folder {tmp_path / 'file'} "
        "is not a folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_keygen_refuses_a_missing_folder_and_writes_nothing(tmp_path, capsys):
    err = one_error(capsys, [tmp_path / "k.pem", tmp_path / "nowhere" / "k.pub"])
    assert err == (
        f"milarun: error: {tmp_path / 'nowhere' / 'k.pub'}: cannot write the key: "
        f"its folder {tmp_path / 'nowhere'} does not exist"
    )
    assert list(tmp_path.iterdir()) == []


def test_keygen_removes_the_private_key_when_the_public_one_fails(tmp_path, capsys, monkeypatch):
    # a failure the checks before writing cannot see (here: the public key's file
    # appears between the check and its creation)
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    real = keys._write_new

    def racing(path, data, mode):
        if path == public:
            public.write_text("someone else's\n")
        return real(path, data, mode)

    monkeypatch.setattr(keys, "_write_new", racing)
    err = one_error(capsys, [private, public])
    assert err == f"milarun: error: {public}: exists already; milarun keygen never overwrites a key"
    assert not private.exists() and public.read_text() == "someone else's\n"


def test_keygen_removes_a_key_it_could_not_finish(tmp_path, capsys, monkeypatch):
    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keys.os, "fsync", full)
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    err = one_error(capsys, [private, public])
    assert err == f"milarun: error: {private}: cannot write the key: No space left on device"
    assert list(tmp_path.iterdir()) == []
