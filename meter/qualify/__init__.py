"""`epi meter qualify`: a guided qualification of a board against a reference.

analysis.py judges measured windows (pure), session.py runs the steps on any board, emulated.py
builds an emulated board with injectable faults. docs/meter.md "Qualifying a board".
"""
