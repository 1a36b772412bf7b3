"""ddsim: tree speculative decoding on hybrid recurrent/attention models, checked against an exact oracle."""
from ddsim.errors import ConfigError, DDSimError, InputError, TreeError
from ddsim.trees.tree import Tree, chain

__version__ = "0.2.0"
__all__ = ["Tree", "chain", "DDSimError", "TreeError", "InputError", "ConfigError", "__version__"]
