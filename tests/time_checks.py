"""CI's time checks of a whole test run (tests/conftest.py calls them; .ci/run sets their
variables): the aim, reported, and the gate, which fails a broken run naming its slowest tests."""

from __future__ import annotations

from pathlib import Path

import pytest


class SecondsPerTest:

    """Each test's seconds (setup, call and teardown), kept by the process that sees the whole
    run (pytest-xdist's controller receives its workers' reports): a run past CI's time gate
    names its slowest tests."""

    def __init__(self) -> None:
        self.by_test: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        self.by_test[report.nodeid] = self.by_test.get(report.nodeid, 0.0) + report.duration


def check_time(session, took: float, aim: str | None, gate: str | None, seconds_file: str | None) -> None:
    """Report this run's seconds (with ``seconds_file``, one line of seconds per earlier run:
    theirs too, and this run's are added to it) against ``aim``, and fail the run past
    ``gate``, naming its five slowest tests."""
    if aim is None and gate is None:
        return
    earlier = [float(line) for line in Path(seconds_file).read_text().split()] if seconds_file else []
    if seconds_file:
        with open(seconds_file, "a") as record:
            record.write(f"{took:.1f}\n")
    total = took + sum(earlier)
    together = f" together with {len(earlier)} earlier ({sum(earlier):.0f} s; {total:.0f} s in all)" if earlier else ""
    writer = session.config.get_terminal_writer()
    if aim is not None:
        verdict = "within" if total <= float(aim) else f"missed by {total - float(aim):.0f} s:"
        writer.line(f"[ci] the test run took {took:.0f} s{together}, {verdict} the aim of {float(aim):g} s "
                    f"(BASIN_TEST_AIM_S, .ci/run; reported, not a failure)")
    if gate is None or total <= float(gate):
        return
    slowest = sorted(session.config.basin_test_seconds.by_test.items(), key=lambda item: -item[1])[:5]
    named = "; ".join(f"{nodeid} {seconds:.0f} s" for nodeid, seconds in slowest) or "no test finished"
    writer.line(f"error: the test run took {took:.0f} s{together}, past CI's gate of {float(gate):g} s (BASIN_TEST_GATE_S, "
                f".ci/run: a healthy run takes well under it, so something hangs or waits); its slowest tests: {named}",
                red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
