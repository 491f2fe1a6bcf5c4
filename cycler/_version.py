"""torch-cycler's version, in a module below every part: the manifest records it at each commit
(nothing below the package root may import the root to read it), and ``cycle --version`` shows it.
Where matplotlib's ``cycler`` shares the import name, ``cycler.__version__`` is that package's
(matplotlib checks it at import); this one is always torch-cycler's."""

VERSION = "0.1.0"
__version__ = VERSION
