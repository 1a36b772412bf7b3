"""Error types. Every bad input raises a ``ValueError`` subclass whose message names the input."""


def one_line(x, limit: int | None = None) -> str:
    """str(x) on one line (a message's several lines joined), cut to ``limit`` characters where given: how an
    exception that is not ddsim's is quoted in a line of a verdict or a refusal."""
    s = " ".join(str(x).split())
    return s if limit is None or len(s) <= limit else s[: limit - 1] + "…"


class DDSimError(ValueError):
    """Base class for bad input to ddsim. The command line turns it into one line and exit 2."""


class TreeError(DDSimError):
    """A malformed verify tree; the message names the first bad node and why."""


class ConfigError(DDSimError):
    """A model configuration or preset that cannot be built."""


class InputError(DDSimError):
    """Bad tensors, logits, files or options handed to a public function."""


class NotInstalled(InputError):
    """An engine package an adapter needs cannot be imported. Its message says which and how to install it;
    ddsim.engines.load puts the option that asked for the engine (--impl, --fast-path) in front."""


class EngineError(DDSimError):
    """An engine's kernel (an audit's --fast-path) raised, or returned what its contract does not allow: the audit
    stops, in one line naming the kernel, and writes no report."""


class MeasurementError(DDSimError):
    """A measurement came out non-finite (a fast path produced NaN or Inf): never summarised away."""
