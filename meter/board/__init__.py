"""A board: what its file says and how its channels open.

`config` holds the board's data (dataclasses, no I/O, below the chip factory); `file` reads a
board TOML (and calibration JSON) into them; `channels` turns a board into started channels
(and re-exports the other two for callers that need all of it). Kept apart so that the data
can be imported without the drivers and the factory, and the three import one way only.
"""
