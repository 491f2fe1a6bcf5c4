"""cycler's benchmarks: each ``bench_*.py`` is a script that measures one claim against a
baseline in the same run (see README.md); ``python -m benchmarks --smoke`` runs them all at
their smallest size and checks that they run and that their own checks of their runs hold."""
