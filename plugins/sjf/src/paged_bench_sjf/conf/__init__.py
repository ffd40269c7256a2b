"""Config options this package adds to paged_bench's groups: ``<group>/<option>.yaml``."""
