"""History (``--osprey-compare DIR``): the drafters kept by an earlier campaign of the same
trace must not regress (verdict, speedup, own latency, accept length)."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import Judgement


@pytest.mark.osprey(kind="history")
def test_no_regression(
    osprey_history: str, osprey_results: Judgement, request: pytest.FixtureRequest
) -> None:
    """A drafter kept before: nothing the comparison checks got worse beyond the tolerance."""
    from pytest_osprey.pytest_adapter import pilot_run

    comparison = pilot_run(request.config).comparison
    assert comparison is not None
    if osprey_history == "none-kept":
        pytest.skip("; ".join(comparison.notes) or "no drafter was kept in the earlier campaign")
    if osprey_history not in {f.candidate for f in comparison.findings}:
        pytest.skip("; ".join(n for n in comparison.notes if osprey_history in n)
                    or f"{osprey_history}: nothing to compare")
    regressions = comparison.regressions(osprey_history)
    assert not regressions, (
        f"{osprey_history} regressed since {comparison.previous_dir}:\n"
        + "\n".join(f"  - {f.text}" for f in regressions)
    )
