"""What a value read from a file, a dump or an argument must be, where Python's types blur it: ``True`` is an int to
isinstance (and equals 1), so "an integer" and "a number" here never take a bool. Finiteness and ranges are each
reader's own (its message names them). ``ddsim.trees.builders.is_whole`` is the wider integer a tree's builders
take: anything with ``__index__`` (numpy's integers, a 0-d integer tensor) but a bool."""
import numbers


def is_int(v) -> bool:
    """A Python int, as JSON and TOML integers read, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_integral(v) -> bool:
    """An integer of any integral type (numpy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A Python int or float, as JSON and TOML numbers read, not a bool (NaN and the infinities included)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)
