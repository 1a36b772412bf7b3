"""The real command line run from a test: in a process of its own (a fork of the test worker, or a fresh
interpreter), its output, exit code and working directory its own. A module of its own, not the conftest: pytest
imports tests/conftest.py as a conftest, and a test importing ``tests.conftest`` would get a second copy of it."""
import os
import subprocess
import sys

# on the CPU wherever the suite runs (its reports are compared with reports made on the CPU, and under a CUDA torch
# --device auto would take the GPU: a bf16 fast path and a float32 oracle)
FAST_AUDIT = ["--preset", "micro", "--budget", "4,8", "--steps", "3", "--seed", "5", "--device", "cpu"]


def run_cli(*args, cwd=None, timeout=600, pythonpath=None, fork=None):
    """Run the real command line in a process of its own; returns CompletedProcess (text). ``pythonpath``:
    a directory put first on the process's import path (the engine packages under .engines).

    By default the process is a fork of this test worker running ``ddsim.cli.main`` (its own process,
    stdout, stderr, exit code, working directory and import path, without paying torch's import again:
    about a second a call over the suite's hundred-odd calls); ``fork=False`` or DDSIM_TEST_FORK=0 runs
    ``python -m ddsim.cli`` in a fresh interpreter instead, and so does every call on a machine with a CUDA device
    (a forked child cannot use CUDA once its parent has set up the driver, which merely asking whether there is a
    device does: on a GPU machine every check-kernel property failed, and the command line stopped in seconds)."""
    fork = os.environ.get("DDSIM_TEST_FORK", "1") != "0" if fork is None else fork
    fork = fork and not _cuda_present()
    if not fork:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
        return subprocess.run([sys.executable, "-m", "ddsim.cli", *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, timeout=timeout, env=env)
    return _forked_cli([str(a) for a in args], cwd=cwd, timeout=timeout, pythonpath=pythonpath)


def _cuda_present() -> bool:
    """Whether this process sees a CUDA device (asking sets the driver up in this process: a fork after it could not
    use CUDA, so on such a machine the command line always runs in a fresh interpreter)."""
    import torch
    return torch.cuda.is_available()


def _forked_cli(args, *, cwd, timeout, pythonpath):
    import io
    import signal
    import tempfile
    import time
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the command line, as `python -m ddsim.cli` would run it, then exit
        code = 2
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "160"})
            if cwd is not None:
                os.chdir(cwd)
            sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
            if pythonpath is not None:
                sys.path.insert(0, str(pythonpath))
            sys.argv = ["ddsim", *args]
            from ddsim.cli import main
            code = main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 (reported as an uncaught exception would be)
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(["ddsim", *args], timeout)
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(["ddsim", *args], code, out.read().decode(errors="replace"),
                                       err.read().decode(errors="replace"))


def one_line_error(r, *needles):
    """A bad-input refusal: exit 2, one line on stderr naming every needle, no traceback, nothing on stdout."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert r.stdout == "", r.stdout
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
