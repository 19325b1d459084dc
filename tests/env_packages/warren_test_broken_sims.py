"""An env package for tests that fails to import, as one whose native library is missing."""

from __future__ import annotations

raise ImportError("libsims.so: cannot open shared object file")
