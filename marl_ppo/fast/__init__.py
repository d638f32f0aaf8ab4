"""Hand-written replacements of library pieces, each behind a `fast.*` switch back to the library's and
kept only while paired whole training runs cost measurably less with it (docs/benchmarks.md)."""
