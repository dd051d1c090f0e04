"""The mean-field study: the particle system versus its McKean-Vlasov limit.

One problem, two solvers (``docs/DESIGN.md``, "Mean-field limit"):

* particles: the core projected Langevin dynamics ``omega_i <- Proj(omega_i - eta N grad_i H_N
  + sqrt(2 eta / beta) xi)`` of ``H_N = (1/N) sum_i V(omega_i) + lam W_{N,s}`` (core
  ``riesz_grad``) in the box ``[-R, R]^dim``, started from ``N`` i.i.d. draws of ``rho_0``;
* PDE: ``d rho/dt = div(rho grad(V + 2 lam g_s * rho)) + (1/beta) Lap rho`` with no-flux
  faces (:mod:`coulomb_attention.meanfield`), at the matched times ``t = eta * steps``.

``V(omega) = -((1/n) sum_a y_a sqrt(2) cos(omega . x_a + pi/4))^2`` on the fixed synthetic
dataset of :func:`~coulomb_attention.data.synthetic.make_meanfield_dataset`. At a few times the
distance between the particles' empirical measure and the PDE density is measured (1-D: exact
W1; 2-D: Gaussian MMD, plus the mean W1 of the two marginals) for each N and seed, and the
log-log slope of the seed-mean distance versus N at ``t_final`` is fitted (Monte-Carlo
error alone gives -1/2).

Two built-in error checks: the *pooled* distance (all seeds' particles at the largest N as one
sample) against its Monte-Carlo level ``mean / sqrt(seeds)`` bounds the time-step and
finite-N bias, and the PDE on a grid of half the resolution bounds the grid error.

Config in (:class:`MeanfieldConfig`), records out: :func:`run_study` writes under ``out``:
``runs.jsonl`` (one row per PDE snapshot and per particle run and time), ``pde_trace.jsonl``
(free energy and mass per PDE step),
``snapshots.npz`` (PDE densities, particles of the largest N), ``summary.json``,
``table.md`` and the plots ``densities.png``, ``free_energy.png``, ``distance_vs_n.png``
(made from those files by :func:`coulomb_attention.reports.meanfield.plot`).
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..results import append_jsonl, atomic_write_text

if TYPE_CHECKING:
    import torch

    from ..meanfield import Grid

__all__ = ["DEFAULT_NS", "QUICK_NS", "MeanfieldConfig", "run_study", "table_markdown"]


DEFAULT_NS = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_NS = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class MeanfieldConfig:
    """The study's settings (flag names in the messages: the CLI passes them through).

    ``grid``, ``ns`` and ``n_seeds`` default (``None``) to the full or, with ``quick``, the
    reduced values: 256 / 128 cells in 1-D, 64 / 32 in 2-D; N up to 4096 / 1024; 3 / 2 seeds.
    """

    dim: int = 1
    beta: float = 4.0
    lam: float = 0.5
    potential: str = "riesz"
    s: float = 1.0
    eps: float = 0.2
    feature: str = "rff"
    half_width: float = 3.0
    grid: int | None = None
    t_final: float = 0.5
    eta: float = 0.01
    snapshots: int = 4
    ns: tuple[int, ...] | None = None
    n_seeds: int | None = None
    init_mean: float = 0.0
    init_std: float = 0.8
    bandwidth: float = 0.5
    dtype: str = "float32"
    threads: int = 2
    quick: bool = False

    def __post_init__(self) -> None:
        self.resolved()  # validates

    def resolved(self) -> dict:
        """The resolved settings (stored with every record as ``config``)."""
        from .._validation import check_nonnegative, check_positive
        from ..energy import POTENTIALS
        from ..meanfield import DATA_FEATURES

        if self.dim not in (1, 2):
            raise ValueError(f"--dim must be 1 or 2, got {self.dim}")
        check_positive("--beta", self.beta)
        check_nonnegative("--lam", self.lam)
        check_positive("--eps", self.eps)
        check_positive("--half-width", self.half_width)
        check_positive("--t-final", self.t_final)
        check_positive("--eta", self.eta)
        check_positive("--init-std", self.init_std)
        check_positive("--bandwidth", self.bandwidth)
        check_positive("--threads", self.threads, integer=True)
        if self.feature not in DATA_FEATURES:
            raise ValueError(f"unknown --feature {self.feature!r}; valid: "
                             f"{', '.join(sorted(DATA_FEATURES))}")
        if self.potential not in POTENTIALS:
            raise ValueError(f"unknown --potential {self.potential!r}; valid: "
                             f"{', '.join(sorted(POTENTIALS))}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        if self.snapshots < 2:
            raise ValueError(f"--snapshots must be >= 2, got {self.snapshots}")
        n_steps = round(self.t_final / self.eta)
        if n_steps < self.snapshots - 1:
            raise ValueError(f"--t-final / --eta = {self.t_final / self.eta:g} steps is fewer "
                             f"than the {self.snapshots - 1} snapshot intervals")
        default_grid = (128 if self.quick else 256) if self.dim == 1 else \
            (32 if self.quick else 64)
        grid = self.grid if self.grid is not None else default_grid
        check_positive("--grid", grid, integer=True)
        seeds = self.n_seeds if self.n_seeds is not None else (2 if self.quick else 3)
        check_positive("--n-seeds", seeds, integer=True)
        ns = list(QUICK_NS if self.quick else DEFAULT_NS) if self.ns is None else list(self.ns)
        if len(ns) < 2 or any(n < 2 for n in ns):
            raise ValueError(f"--ns needs at least two values >= 2, got {self.ns!r}")
        return {
            "dim": self.dim, "beta": float(self.beta), "lam": float(self.lam),
            "potential": self.potential, "s": float(self.s), "eps": float(self.eps),
            "feature": self.feature, "half_width": float(self.half_width), "grid": int(grid),
            "eta": float(self.eta), "n_steps": int(n_steps),
            "t_final": n_steps * float(self.eta), "snapshots": int(self.snapshots),
            "ns": sorted(set(ns)), "seeds": int(seeds), "init_mean": float(self.init_mean),
            "init_std": float(self.init_std), "bandwidth": float(self.bandwidth),
            "dtype": self.dtype, "threads": int(self.threads), "quick": bool(self.quick),
        }


def _setup(cfg: dict, n_cells: int):
    from ..data.synthetic import make_meanfield_dataset
    from ..energy import make_potential
    from ..meanfield import DataPotential, Grid, GridInteraction, gaussian_density

    grid = Grid(cfg["dim"], cfg["half_width"], n_cells)
    x, y = make_meanfield_dataset(cfg["dim"])
    pot = DataPotential(x, y, feature=cfg["feature"])
    pair = make_potential(cfg["potential"], s=cfg["s"] if cfg["potential"] == "riesz" else None,
                          eps=cfg["eps"], dim=cfg["dim"])
    inter = GridInteraction(grid, pair)
    rho0 = gaussian_density(grid, [cfg["init_mean"]] * cfg["dim"], cfg["init_std"])
    return grid, pot, pair, inter, rho0


def _distances(cfg: dict, grid: Grid, rho, omega: torch.Tensor) -> dict:
    from ..meanfield import Grid, mmd_to_grid_density, w1_to_grid_density

    om = omega.detach().double()
    if grid.dim == 1:
        w1 = w1_to_grid_density(grid, rho, om)
        return {"w1": w1, "distance": w1}
    out = {"mmd": mmd_to_grid_density(grid, rho, om, bandwidth=cfg["bandwidth"])}
    g1 = Grid(1, grid.half_width, grid.n)
    marg = [w1_to_grid_density(g1, rho.sum(1 - k) * grid.h, om[:, k]) for k in range(2)]
    out["w1_marginal"] = float(np.mean(marg))
    out["distance"] = out["mmd"]
    return out


def _coarse_grid_check(cfg: dict, fine_rho: torch.Tensor) -> dict:
    """PDE at t_final on a grid of half the resolution vs the fine solution aggregated."""
    import torch

    from ..meanfield import integrate, mckean_vlasov

    n = cfg["grid"]
    if n % 2 or n < 8:
        return {}
    grid, pot, _, inter, rho0 = _setup(cfg, n // 2)
    init, step = mckean_vlasov(grid, pot, interaction=inter, lam=cfg["lam"],
                               beta=cfg["beta"], track_free_energy=False)
    snaps, _ = integrate(init(rho0), step, [cfg["t_final"]])
    coarse = snaps[cfg["t_final"]].rho * grid.cell_volume  # cell masses
    if cfg["dim"] == 1:
        fine = (fine_rho * (grid.h / 2)).reshape(n // 2, 2).sum(1)
        cdf_diff = torch.cumsum(fine - coarse, 0)
        w1 = float(cdf_diff.abs().sum() * grid.h)  # W1 of the cell masses at the coarse faces
        return {"grid_l1": float((fine - coarse).abs().sum()), "grid_w1": w1}
    fine = (fine_rho * (grid.h / 2) ** 2).reshape(n // 2, 2, n // 2, 2).sum((1, 3))
    return {"grid_l1": float((fine - coarse).abs().sum())}


def run_study(config: MeanfieldConfig, out: str | Path,
              log: Callable[[str], None] = print) -> dict:
    """Solve the PDE, run the particles for every N and seed, and write the files above;
    returns the summary (``summary.json``)."""
    cfg = config.resolved()
    import torch

    from ..dynamics import Box, LangevinSchedule, learn_particles
    from ..meanfield import (
        free_energy,
        integrate,
        loglog_slope,
        mckean_vlasov,
        particle_hamiltonian,
        sample_density,
    )

    torch.set_num_threads(cfg["threads"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.float32 if cfg["dtype"] == "float32" else torch.float64
    t_start, cpu_start = time.perf_counter(), time.process_time()

    # ---- PDE ------------------------------------------------------------------------------
    grid, pot, pair, inter, rho0 = _setup(cfg, cfg["grid"])
    k_snap = [round(j * cfg["n_steps"] / (cfg["snapshots"] - 1))
              for j in range(cfg["snapshots"])]  # Langevin step index of each snapshot
    times = [k * cfg["eta"] for k in k_snap]
    init, step = mckean_vlasov(grid, pot, interaction=inter, lam=cfg["lam"], beta=cfg["beta"])
    t0 = time.perf_counter()
    state = init(rho0)
    f0 = free_energy(grid, state.rho, step.v_grid, inter, cfg["lam"], cfg["beta"])
    snaps, trace = integrate(state, step, times)
    pde_wall = time.perf_counter() - t0
    trace = [{"t": 0.0, "dt": 0.0, "mass": float(grid.mass(state.rho)), **f0}] + trace
    f_vals = np.array([r["free_energy"] for r in trace])
    mass_err = float(np.abs(np.array([r["mass"] for r in trace]) - 1.0).max())
    f_increase = float(np.diff(f_vals).max()) if len(f_vals) > 1 else 0.0
    grid_check = _coarse_grid_check(cfg, snaps[times[-1]].rho)
    log(f"PDE: {len(trace) - 1} steps to t={times[-1]:g} in {pde_wall:.1f}s, "
          f"|mass-1| <= {mass_err:.1e}, F {f_vals[0]:.4f} -> {f_vals[-1]:.4f} "
          f"(max step increase {f_increase:.1e}); grid check {grid_check}")
    atomic_write_text(out / "pde_trace.jsonl", "".join(
        json.dumps({k: r[k] for k in ("t", "dt", "mass", "free_energy", "potential",
                                      "interaction", "entropy")}) + "\n" for r in trace))

    rows: list[dict] = []
    for t in times:
        fe = free_energy(grid, snaps[t].rho, step.v_grid, inter, cfg["lam"], cfg["beta"])
        rows.append({"kind": "pde", "t": t, "mass": float(grid.mass(snaps[t].rho)), **fe})

    # ---- particles ------------------------------------------------------------------------
    ham = particle_hamiltonian(pot, pair, cfg["lam"], repulsion_energy=False)
    box = Box(cfg["half_width"])
    n_max = max(cfg["ns"])
    (out / "runs.jsonl").write_text("")
    written = 0
    kept: dict[str, np.ndarray] = {}
    pooled: dict[int, list[torch.Tensor]] = {}
    snap_steps = sorted(set(k_snap))
    for n in cfg["ns"]:
        for seed in range(cfg["seeds"]):
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(1_000_003 * seed + n)
            omega = sample_density(grid, rho0, n, gen).to(dtype)
            at: dict[int, torch.Tensor] = {}
            if 0 in snap_steps:
                at[0] = box(omega.detach().clone())[0]

            def snapshot(state, info, at=at):
                if state.step in snap_steps:
                    at[state.step] = state.omega.clone()

            if snap_steps[-1] > 0:
                learn_particles(ham, omega, LangevinSchedule(steps=snap_steps[-1],
                                                             eta=cfg["eta"], beta=cfg["beta"]),
                                projection=box, generator=gen, callbacks=[snapshot])
            final = at[snap_steps[-1]]
            for t, k in zip(times, k_snap, strict=True):
                d = _distances(cfg, grid, snaps[t].rho, at[k])
                rows.append({"kind": "particles", "n": n, "seed": seed, "t": t, "step": k,
                             **d})
                if n == n_max and seed == 0:
                    kept[f"particles_t{len(kept)}"] = at[k].double().numpy()
            p_state_omega = final
            if n == n_max:
                pooled.setdefault(0, []).append(p_state_omega.double())
                # stale comparison: the final particles against the PDE at t = 0
                rows[-1]["distance_to_rho0"] = _distances(cfg, grid, rho0,
                                                          p_state_omega)["distance"]
            wall = time.perf_counter() - t0
            rows[-1]["wall_s"] = wall
            last = rows[-1]
            log(f"N={n:5d} seed={seed} t={last['t']:.3g} distance={last['distance']:.4f} "
                f"({wall:.1f}s)")
            for r in rows[written:]:  # incremental: partial runs survive
                append_jsonl(out / "runs.jsonl", {**r, "config": cfg})
            written = len(rows)

    # ---- summary --------------------------------------------------------------------------
    part = [r for r in rows if r["kind"] == "particles"]
    by_t = {}
    for t in times:
        means = [float(np.mean([r["distance"] for r in part if r["n"] == n and r["t"] == t]))
                 for n in cfg["ns"]]
        stds = [float(np.std([r["distance"] for r in part if r["n"] == n and r["t"] == t]))
                for n in cfg["ns"]]
        slope, icpt = loglog_slope(cfg["ns"], means)
        by_t[t] = {"mean": means, "std": stds, "slope": slope, "intercept": icpt}
    t_end = times[-1]
    pooled_all = torch.cat(pooled[0])
    pooled_d = _distances(cfg, grid, snaps[t_end].rho, pooled_all)["distance"]
    single = by_t[t_end]["mean"][-1]
    stale = float(np.mean([r["distance_to_rho0"] for r in part if "distance_to_rho0" in r]))
    summary = {
        "config": cfg,
        "metric": "w1" if cfg["dim"] == 1 else "mmd",
        "times": times,
        "slope": by_t[t_end]["slope"],
        "intercept": by_t[t_end]["intercept"],
        "slopes_by_time": {f"{t:g}": by_t[t]["slope"] for t in times},
        "mean_distance_by_time": {f"{t:g}": by_t[t]["mean"] for t in times},
        "std_distance_by_time": {f"{t:g}": by_t[t]["std"] for t in times},
        "pooled_distance_largest_n": pooled_d,
        "pooled_mc_level": single / math.sqrt(cfg["seeds"]),
        "distance_final_particles_to_rho0": stale,
        "mass_error": mass_err,
        "free_energy_start": float(f_vals[0]),
        "free_energy_end": float(f_vals[-1]),
        "free_energy_increase_max": f_increase,
        "pde_steps": len(trace) - 1,
        "pde_wall_s": pde_wall,
        "grid_check": grid_check,
        "wall_s": time.perf_counter() - t_start,
        "cpu_s": time.process_time() - cpu_start,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    np.savez(out / "snapshots.npz", times=np.array(times),
             **{f"rho_t{i}": snaps[t].rho.numpy() for i, t in enumerate(times)}, **kept,
             v_grid=step.v_grid.numpy(), half_width=cfg["half_width"], n_max=n_max)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    atomic_write_text(out / "table.md", table_markdown(summary))
    from ..reports.meanfield import plot

    plot(out)
    return summary


def table_markdown(s: dict) -> str:
    """The Markdown table of ``summary.json``."""
    cfg = s["config"]
    metric = "W1" if s["metric"] == "w1" else f"MMD (Gaussian, bw={cfg['bandwidth']:g})"
    times = s["times"]
    lines = [
        f"# Particles vs McKean-Vlasov PDE ({cfg['dim']}-D)",
        "",
        f"beta={cfg['beta']:g}, lam={cfg['lam']:g}, {cfg['potential']} s={cfg['s']:g} "
        f"eps={cfg['eps']:g}, feature={cfg['feature']}, box [-{cfg['half_width']:g}, "
        f"{cfg['half_width']:g}]^{cfg['dim']}, grid {cfg['grid']}^{cfg['dim']}, "
        f"eta={cfg['eta']:g} ({cfg['n_steps']} steps), seeds={cfg['seeds']}, "
        f"rho_0 = N({cfg['init_mean']:g}, {cfg['init_std']:g}^2).",
        "",
        f"Mean {metric} (+- std over seeds) between the N-particle empirical measure and the "
        "PDE density at matched times t = eta * steps:",
        "",
        "| N | " + " | ".join(f"t={t:.3g}" for t in times) + " |",
        "|---|" + "---|" * len(times),
    ]
    for i, n in enumerate(cfg["ns"]):
        cells = [f"{s['mean_distance_by_time'][f'{t:g}'][i]:.4f} "
                 f"+- {s['std_distance_by_time'][f'{t:g}'][i]:.4f}" for t in times]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("| slope vs N | " + " | ".join(f"{s['slopes_by_time'][f'{t:g}']:.3f}"
                                                 for t in times) + " |")
    gc = s["grid_check"]
    lines += [
        "",
        f"- fitted log-log slope at t={times[-1]:.3g}: **{s['slope']:.3f}** "
        "(Monte-Carlo error alone: -0.5)",
        f"- pooled {s['metric']} at N={max(cfg['ns'])} (all {cfg['seeds']} seeds as one "
        f"sample): {s['pooled_distance_largest_n']:.4f}; Monte-Carlo level "
        f"(mean / sqrt(seeds)): {s['pooled_mc_level']:.4f}",
        f"- final particles (N={max(cfg['ns'])}) against the PDE at t=0 instead of "
        f"t={times[-1]:.3g}: {s['distance_final_particles_to_rho0']:.4f}",
        f"- PDE: {s['pde_steps']} explicit steps, max |mass - 1| = {s['mass_error']:.1e}, "
        f"free energy {s['free_energy_start']:.5f} -> {s['free_energy_end']:.5f}, largest "
        f"one-step increase {s['free_energy_increase_max']:.1e}",
        "- grid check (half-resolution PDE vs this one at t_final): "
        + (", ".join(f"{k}={v:.2e}" for k, v in gc.items()) if gc else "skipped"),
        f"- wall time {s['wall_s']:.0f}s (CPU time {s.get('cpu_s', float('nan')):.0f}s) with "
        f"{s['torch_threads']} torch threads",
        "",
    ]
    return "\n".join(lines)
