"""The library's version, in a module below every part: the manifest records it at each commit,
and nothing below the package root may import the root to read it."""

__version__ = "0.1.0"
