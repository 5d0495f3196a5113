"""The one parser per file format (docs/formats.md), standard library only.

Both halves import these: the meter daemon (which runs on a Pi without numpy or pandas) and
the host analysis (which puts a thin pandas view on top, `host.analysis.traces` and
`host.analysis.tokenlog_reader`). Every reader validates the type, range and finiteness of
every field it returns and raises `epi.core.errors.UserError` (one line naming the file, the
field and what was expected) for anything else.
"""
