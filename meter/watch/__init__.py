"""`epi meter watch URL`: a terminal live view of a running meter daemon's stream.

`stream` reads the daemon's `/stream` (newline-delimited JSON), `state` keeps what the view
shows (per-channel power with a short history, events, sample rate, clock offset), and `view`
draws it with rich. Standard library plus rich (the `meter` extra); nothing from host/.
"""
