"""Progress lines off a terminal (issue 48): coulomb_attention.progress.Ticker prints a line at
least every 30 s in a long loop, with a fake clock here; and the loops that use it."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention import progress
from coulomb_attention.progress import EVERY_S, Ticker, format_seconds


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def lines_on(monkeypatch):
    monkeypatch.setattr(progress, "_LINES", True)


def test_a_line_at_most_every_30_seconds(lines_on):
    clock, out = FakeClock(), []
    tick = Ticker("refine (all layers)", total=200, clock=clock, log=out.append)
    assert EVERY_S == 30.0
    for t, step in ((10, 1), (29.9, 2)):  # seconds since the start
        clock.t = 100 + t
        assert not tick.update(step, energy=0.5)
    clock.t = 130
    assert tick.update(3, energy=0.123456)
    assert out == ["refine (all layers): step 3/200, 30 s elapsed, energy 0.1235"]
    clock.t = 159.9  # 29.9 s after the last line
    assert not tick.update(4)
    clock.t = 160 + 65
    assert tick.update(5, loss=1.5, lr="1e-3")
    assert out[-1] == "refine (all layers): step 5, 2 min 05 s elapsed, loss 1.5, lr 1e-3" \
        .replace("step 5", "step 5/200")
    assert tick.lines == 2


def test_every_30_seconds_in_a_long_loop(lines_on):
    """A loop of 1 s steps for 10 minutes: 20 lines, never more than 30 s apart."""
    clock, out, at = FakeClock(0.0), [], []
    tick = Ticker("fine-tune 1/2", total=600, clock=clock,
                  log=lambda line: (out.append(line), at.append(clock.t)))
    for step in range(1, 601):
        clock.t = float(step)
        tick.update(step, loss=1.0 / step)
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert len(out) == 20 and at[0] == 30 and max(gaps) == 30
    assert out[-1].startswith("fine-tune 1/2: step 600/600, 10 min 00 s elapsed, loss ")


def test_off_unless_lines_mode_or_disabled(monkeypatch):
    clock, out = FakeClock(), []
    monkeypatch.setattr(progress, "_LINES", False)  # a bar on a terminal, or --no-progress
    tick = Ticker("x", clock=clock, log=out.append)
    clock.t += 1000
    assert not tick.update(1) and out == []
    monkeypatch.setattr(progress, "_LINES", True)
    tick = Ticker("x", clock=clock, log=out.append, enabled=False)  # the caller's progress=False
    clock.t += 1000
    assert not tick.update(1) and out == []
    with pytest.raises(ValueError, match="every must be > 0"):
        Ticker("x", every=0)


def test_progress_mode_switches_the_lines():
    from coulomb_attention.commands._args import progress_mode

    class Pipe:
        def isatty(self):
            return False

    class Tty(Pipe):
        def isatty(self):
            return True

    try:
        assert progress_mode("auto", stream=Pipe()) == "lines" and progress.lines_on()
        assert progress_mode("auto", stream=Tty()) == "bar" and not progress.lines_on()
        assert progress_mode("none") == "none" and not progress.lines_on()
        assert progress_mode("lines") == "lines" and progress.lines_on()
    finally:
        progress_mode("bar")  # tqdm's own behaviour again, lines off


def test_format_seconds():
    assert format_seconds(0.4) == "0 s" and format_seconds(59) == "59 s"
    assert format_seconds(61) == "1 min 01 s" and format_seconds(3725) == "1 h 02 min"


def _fake_clock(monkeypatch, step: float = 31.0) -> None:
    """Every reading of the tickers' clock is ``step`` seconds after the previous one."""
    state = {"t": 0.0}

    def clock():
        state["t"] += step
        return state["t"]

    monkeypatch.setattr(progress, "_clock", clock)


def test_the_particle_driver_prints_its_lines(lines_on, monkeypatch, capsys):
    """The Langevin loop (a conversion's layers and its joint refinement, phase A) prints
    ``label: step i/n, elapsed, energy`` off a terminal; with progress off it prints nothing."""
    from coulomb_attention.commands._args import progress_mode
    from coulomb_attention.dynamics import Ball, LangevinSchedule, learn_particles

    class Quadratic:
        def value_and_grad(self, omega, batch=None, comm=None, **kw):
            e = (omega ** 2).sum()
            return e, 2 * omega, {"energy": float(e), "repulsion": 0.0, "boundary_fraction": 0.0}

    _fake_clock(monkeypatch)
    progress_mode("lines")  # tqdm bars off, as the CLI does off a terminal
    try:
        learn_particles(Quadratic(), torch.ones(4, 2), LangevinSchedule(steps=3, eta=0.1,
                                                                         beta=float("inf")),
                        None, projection=Ball(3.0), generator=torch.Generator().manual_seed(0),
                        progress="refine")
        out = capsys.readouterr().out.splitlines()
        assert [line.split(",")[0] for line in out] == [f"refine: step {i}/3" for i in (1, 2, 3)]
        assert "s elapsed, energy " in out[0]
        learn_particles(Quadratic(), torch.ones(4, 2), LangevinSchedule(steps=3, eta=0.1,
                                                                         beta=float("inf")),
                        None, projection=Ball(3.0), generator=torch.Generator().manual_seed(0),
                        progress=False)
        assert capsys.readouterr().out == ""
    finally:
        progress_mode("bar")
