"""The paper's §4 theory, checked on real memories and queries (docs/theory.md; the modules
are listed in docs/architecture.md)."""
