"""torch-cycler's version, apart from ``cycler.__version__``: where matplotlib's ``cycler`` shares
the import name, ``cycler.__version__`` is that package's (matplotlib checks it at import)."""

VERSION = "0.1.0"
