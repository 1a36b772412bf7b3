"""Install packages into the project's venv with uv, which unpacks wheels in parallel and compiles no
bytecode up front (the suite's interpreters compile what they import), reading the pip configuration that
pip itself would read (``pip config list``: index, extra indexes, find-links, constraints, certificate,
timeout), so both installers see the same sources; pip is the fallback wherever uv cannot be had or fails.

    python tests/venv_setup.py VENV_PYTHON PIP_ARGS...      # run by the Makefile's setup

Where a package lies in several of the configured indexes, uv takes the newest release that fits from any of
them, as pip does, so both install the same versions. Prints which installer ran.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

# pip configuration key -> uv option (each value of a space-separated list passed once)
LIST_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}


def pip_config(python: str) -> dict[str, list[str]]:
    """pip's effective configuration (files, then environment): key -> values, the later source winning."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    config: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1]  # "global.find-links" or ":env:.find-links"
        value = value.strip()
        try:  # pip prints each value's repr: a list spread over lines in pip.conf comes as '\nA\nB'
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        config[name] = str(value).split()
    return config


def uv_command(python: str, config: dict[str, list[str]], args: list[str]) -> tuple[list[str], dict]:
    """uv's install command for pip ``args`` into ``python``'s environment, and its environment variables."""
    uv = os.path.join(os.path.dirname(python), "uv")
    # the newest release that fits, whichever configured index has it, as pip chooses (uv's default takes the
    # first index that has the package at all: a local mirror's older triton and transformers failed tests)
    cmd = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match"]
    for key, option in LIST_OPTIONS.items():
        for value in config.get(key, []):
            cmd += [option, value]
    if config.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        cmd.append("--no-index")
    env = dict(os.environ)
    if config.get("cert"):
        env["SSL_CERT_FILE"] = config["cert"][0]
    for key in ("timeout", "default-timeout"):
        if config.get(key):
            env["UV_HTTP_TIMEOUT"] = config[key][0]
    return cmd + [a for a in args if a != "-q"] + ["-q"], env


def install(python: str, args: list[str]) -> str:
    """Install pip ``args`` into ``python``'s environment with uv, else pip; returns the installer's name."""
    has_uv = os.path.exists(os.path.join(os.path.dirname(python), "uv")) or subprocess.run(
        [python, "-m", "pip", "install", "-q", "uv"], capture_output=True).returncode == 0
    if has_uv:
        cmd, env = uv_command(python, pip_config(python), args)
        if subprocess.run(cmd, env=env).returncode == 0:
            return "uv"
        print("venv_setup: uv failed; installing with pip", file=sys.stderr)
    subprocess.run([python, "-m", "pip", "install", "-q", *args], check=True)
    return "pip"


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print("venv_setup: usage: venv_setup.py VENV_PYTHON PIP_ARGS...", file=sys.stderr)
        sys.exit(2)
    print(f"venv_setup: {' '.join(sys.argv[2:])} installed with {install(sys.argv[1], sys.argv[2:])}")
