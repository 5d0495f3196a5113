"""`epi campaign`: a whole study as one resumable command (docs/campaign.md)."""
