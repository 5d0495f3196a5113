"""A study's `[analysis]` values are refused by exactly the rule `epi analyze` refuses them by.

The same setting written in a study and given as an option must not pass one and fail the
other: each key is probed with values on and around its bounds, and a study holding the value
must load exactly when the command line's option type accepts it.
"""

from __future__ import annotations

import click
import pytest

from epi.commands.analyze import analyze
from epi.core.errors import UserError
from host.campaign.study import load_study
from tests.host.test_campaign import write_study

REAL_PROBES = ("-0.5", "0", "0.0", "1e-9", "0.5", "1", "1.0", "1.000001", "2", "nan", "inf")
INT_PROBES = ("-1", "0", "1", "2", "3", "1000000", "1000001")
# `[analysis]` key → `epi analyze` option, and the probes of its kind
KEYS = {
    "cv_threshold": ("--cv-threshold", REAL_PROBES),
    "max_offset_frac": ("--max-offset-frac", REAL_PROBES),
    "max_lag_error_frac": ("--max-lag-error-frac", REAL_PROBES),
    "ppl_tolerance": ("--ppl-tolerance", REAL_PROBES),
    "max_resolution_frac": ("--max-resolution-frac", REAL_PROBES),
    "min_samples": ("--min-samples", INT_PROBES),
}


def _cli_accepts(option: str, text: str) -> bool:
    [param] = [p for p in analyze.params if option in getattr(p, "opts", ())]
    try:
        param.type.convert(text, param, None)
    except click.BadParameter:
        return False
    return True


def _study_accepts(tmp_path, key: str, text: str) -> bool:
    p = write_study(tmp_path, f"[analysis]\n{key} = {text}")
    try:
        load_study(p)
    except UserError as exc:
        assert f"analysis.{key}" in str(exc)  # refused for this field, not for another reason
        return False
    return True


@pytest.mark.parametrize("key", sorted(KEYS))
def test_study_refuses_what_the_option_refuses(tmp_path, key: str) -> None:
    option, probes = KEYS[key]
    cli = {v: _cli_accepts(option, v) for v in probes}
    study = {v: _study_accepts(tmp_path, key, v) for v in probes}
    assert study == cli


@pytest.mark.parametrize("key", ["cv_threshold", "max_offset_frac", "max_lag_error_frac",
                                 "max_resolution_frac"])
def test_a_zero_threshold_is_refused_in_both(tmp_path, key: str) -> None:
    """A zero threshold would refuse every run: neither the option nor the study takes it."""
    option, _ = KEYS[key]
    assert not _cli_accepts(option, "0")
    assert not _study_accepts(tmp_path, key, "0")
    assert _cli_accepts(option, "1") and _study_accepts(tmp_path, key, "1")
