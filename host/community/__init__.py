"""Community replication: one submission per lab and study (`epi submit`), a checker that
recomputes every figure from the submission's own bundle (`epi check-submission`), and a
static results site built from many submissions (`epi site`). docs/community.md.

- `record`: the summary file, a versioned dataclass record (schema: submission.schema.json).
- `make`: the summary of one verified bundle.
- `check`: every problem of one submission, one line each.
- `site`: the static leaderboard pages.
"""
