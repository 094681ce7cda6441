"""A composed production backend for Django monoliths.

The public pieces live in submodules (``composition.lifecycle``, ``composition.outbox``,
``composition.jobs``, ``composition.cache``, ``composition.locks``, ...); importing this
package has no side effects.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
