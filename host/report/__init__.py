"""`epi report`: a self-contained HTML/Markdown report with figures from an analysis directory."""
