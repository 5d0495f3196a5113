"""Results that travel: one archive per analysis (`epi bundle`), read back and compared
side by side (`epi compare`). docs/bundle.md describes the format and the checks.

- `archive`: the gzip'd tar with its sha256 manifest; safe reading and unpacking.
- `collect`: what an analysis directory and its inputs contribute.
- `facts`: what a comparison needs from one bundle.
- `compare`: the side-by-side report and the unfair differences.
"""
