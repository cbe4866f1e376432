"""Tessera, a fast deep-learning trainer whose speed-up methods are binary plugins.

This package carries the ``tessera`` binary (``bin/tessera``), its bundled plugins
(``lib/tessera/plugins``) and the ``tessera-plugin-api`` crate for plugin authors
(``share/tessera/plugin-api``). The binary runs on the libtorch of the installed ``torch``
package; the ``tessera`` command is :func:`tessera.__main__.main`.
"""

import os

__version__ = "@VERSION@"


def binary() -> str:
    """The path of the ``tessera`` binary inside this package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tessera")
