"""Hand-written replacements of library pieces, kept where they are measurably faster than the library."""
