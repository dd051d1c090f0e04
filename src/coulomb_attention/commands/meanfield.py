"""``coulomb-attention meanfield``: the particle system versus its McKean-Vlasov limit.

One problem, two solvers (DESIGN, "Mean-field limit"):

* particles: the core projected Langevin dynamics ``omega_i <- Proj(omega_i - eta N grad_i H_N
  + sqrt(2 eta / beta) xi)`` of ``H_N = (1/N) sum_i V(omega_i) + lam W_{N,s}`` (core
  ``riesz_grad``) in the box ``[-R, R]^dim``, started from ``N`` i.i.d. draws of ``rho_0``;
* PDE: ``d rho/dt = div(rho grad(V + 2 lam g_s * rho)) + (1/beta) Lap rho`` with no-flux
  faces (:mod:`coulomb_attention.meanfield`), at the matched times ``t = eta * steps``.

``V(omega) = -((1/n) sum_a y_a sqrt(2) cos(omega . x_a + pi/4))^2`` on the fixed synthetic
dataset of :func:`~coulomb_attention.meanfield.make_dataset`. At a few times the distance
between the particles' empirical measure and the PDE density is measured (1-D: exact W1;
2-D: Gaussian MMD, plus the mean W1 of the two marginals) for each N and seed, and the
log-log slope of the seed-mean distance versus N at ``t_final`` is fitted (Monte-Carlo
error alone gives -1/2).

Two built-in error checks: the *pooled* distance (all seeds' particles at the largest N as one
sample) against its Monte-Carlo level ``mean / sqrt(seeds)`` bounds the time-step and
finite-N bias, and the PDE on a grid of half the resolution bounds the grid error.

Writes under ``--out`` (default ``runs/meanfield``): ``runs.jsonl`` (one row per PDE snapshot
and per particle run and time), ``pde_trace.jsonl`` (free energy and mass per PDE step),
``snapshots.npz`` (PDE densities, particles of the largest N), ``summary.json``,
``table.md`` and the plots ``densities.png``, ``free_energy.png``, ``distance_vs_n.png``
(made from those files by :func:`plot`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..results import append_jsonl, atomic_write_text

if TYPE_CHECKING:  # torch and the solvers are imported where used: a fast ``--help``
    import torch

    from ..meanfield import Grid

__all__ = ["add_arguments", "run", "plot"]

DEFAULT_NS = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_NS = (64, 128, 256, 512, 1024)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=1, help="parameter dimension: 1 or 2")
    parser.add_argument("--beta", type=float, default=4.0, help="inverse temperature")
    parser.add_argument("--lam", type=float, default=0.5, help="repulsion strength lambda")
    parser.add_argument("--potential", default="riesz", help="pair potential: riesz|coulomb|log")
    parser.add_argument("--s", type=float, default=1.0, help="Riesz exponent s")
    parser.add_argument("--eps", type=float, default=0.2, help="softening of g_s")
    parser.add_argument("--feature", default="rff", help="data feature: rff|positive")
    parser.add_argument("--half-width", type=float, default=3.0, help="box [-R, R]^dim")
    parser.add_argument("--grid", type=int, default=None,
                        help="cells per dimension (default 256 in 1-D, 64 in 2-D)")
    parser.add_argument("--t-final", type=float, default=0.5, help="final time t = eta*steps")
    parser.add_argument("--eta", type=float, default=0.01, help="Langevin step size")
    parser.add_argument("--snapshots", type=int, default=4,
                        help="comparison times, evenly spaced in [0, t_final] (>= 2)")
    parser.add_argument("--ns", default=None,
                        help="comma-separated particle numbers (default 64,...,4096)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per N (default 3; 2 with --quick)")
    parser.add_argument("--init-mean", type=float, default=0.0, help="rho_0 = N(mean, std^2)")
    parser.add_argument("--init-std", type=float, default=0.8)
    parser.add_argument("--bandwidth", type=float, default=0.5, help="MMD kernel bandwidth")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="particle dtype (the PDE is float64)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default="runs/meanfield", help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="N up to 1024, 2 seeds, coarser grid (about a minute)")


def _parse_ns(text: str | None, quick: bool) -> list[int]:
    if text is None:
        return list(QUICK_NS if quick else DEFAULT_NS)
    try:
        ns = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError as exc:
        raise ValueError(f"--ns must be comma-separated integers, got {text!r}") from exc
    if len(ns) < 2 or any(n < 2 for n in ns):
        raise ValueError(f"--ns needs at least two values >= 2, got {text!r}")
    return sorted(set(ns))


def _validate(args) -> dict:
    from .._validation import check_nonnegative, check_positive
    from ..energy import POTENTIALS
    from ..meanfield import DATA_FEATURES

    if args.dim not in (1, 2):
        raise ValueError(f"--dim must be 1 or 2, got {args.dim}")
    check_positive("--beta", args.beta)
    check_nonnegative("--lam", args.lam)
    check_positive("--eps", args.eps)
    check_positive("--half-width", args.half_width)
    check_positive("--t-final", args.t_final)
    check_positive("--eta", args.eta)
    check_positive("--init-std", args.init_std)
    check_positive("--bandwidth", args.bandwidth)
    check_positive("--threads", args.threads, integer=True)
    if args.feature not in DATA_FEATURES:
        raise ValueError(f"unknown --feature {args.feature!r}; valid: "
                         f"{', '.join(sorted(DATA_FEATURES))}")
    if args.potential not in POTENTIALS:
        raise ValueError(f"unknown --potential {args.potential!r}; valid: "
                         f"{', '.join(sorted(POTENTIALS))}")
    if args.snapshots < 2:
        raise ValueError(f"--snapshots must be >= 2, got {args.snapshots}")
    n_steps = round(args.t_final / args.eta)
    if n_steps < args.snapshots - 1:
        raise ValueError(f"--t-final / --eta = {args.t_final / args.eta:g} steps is fewer "
                         f"than the {args.snapshots - 1} snapshot intervals")
    default_grid = (128 if args.quick else 256) if args.dim == 1 else (32 if args.quick else 64)
    grid = args.grid if args.grid is not None else default_grid
    check_positive("--grid", grid, integer=True)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 3)
    check_positive("--seeds", seeds, integer=True)
    return {
        "dim": args.dim, "beta": float(args.beta), "lam": float(args.lam),
        "potential": args.potential, "s": float(args.s), "eps": float(args.eps),
        "feature": args.feature, "half_width": float(args.half_width), "grid": int(grid),
        "eta": float(args.eta), "n_steps": int(n_steps), "t_final": n_steps * float(args.eta),
        "snapshots": int(args.snapshots), "ns": _parse_ns(args.ns, args.quick),
        "seeds": int(seeds), "init_mean": float(args.init_mean),
        "init_std": float(args.init_std), "bandwidth": float(args.bandwidth),
        "dtype": args.dtype, "threads": int(args.threads), "quick": bool(args.quick),
    }


def _setup(cfg: dict, n_cells: int):
    from ..energy import make_potential
    from ..meanfield import DataPotential, Grid, GridInteraction, gaussian_density, make_dataset

    grid = Grid(cfg["dim"], cfg["half_width"], n_cells)
    x, y = make_dataset(cfg["dim"])
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


def run(args: argparse.Namespace) -> int:
    cfg = _validate(args)
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
    out = Path(args.out)
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
    print(f"PDE: {len(trace) - 1} steps to t={times[-1]:g} in {pde_wall:.1f}s, "
          f"|mass-1| <= {mass_err:.1e}, F {f_vals[0]:.4f} -> {f_vals[-1]:.4f} "
          f"(max step increase {f_increase:.1e}); grid check {grid_check}", flush=True)
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
            print(f"N={n:5d} seed={seed} t={last['t']:.3g} distance={last['distance']:.4f} "
                  f"({wall:.1f}s)", flush=True)
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
    table = _table(summary)
    atomic_write_text(out / "table.md", table)
    plot(out)
    print(table)
    print(f"wrote {out}/runs.jsonl, table.md, summary.json, densities.png, free_energy.png, "
          f"distance_vs_n.png ({summary['wall_s']:.0f}s)")
    return 0


def _table(s: dict) -> str:
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


def plot(out: str | Path) -> None:
    """Make ``densities.png``, ``free_energy.png`` and ``distance_vs_n.png`` from the files
    in ``out`` (``summary.json``, ``pde_trace.jsonl``, ``snapshots.npz``)."""
    from ..reports import pyplot

    plt = pyplot()

    out = Path(out)
    s = json.loads((out / "summary.json").read_text())
    cfg = s["config"]
    snap = np.load(out / "snapshots.npz")
    times = list(snap["times"])
    R = float(snap["half_width"])
    n = cfg["grid"]
    edges = np.linspace(-R, R, n + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    n_max = int(snap["n_max"])

    # densities
    if cfg["dim"] == 1:
        fig, axes = plt.subplots(1, len(times), figsize=(3.2 * len(times), 3), sharey=True)
        for i, (ax, t) in enumerate(zip(np.atleast_1d(axes), times, strict=True)):
            ax.hist(snap[f"particles_t{i}"][:, 0], bins=min(60, n), range=(-R, R),
                    density=True, alpha=0.5, color="tab:orange", label=f"particles N={n_max}")
            ax.plot(centres, snap[f"rho_t{i}"], color="k", lw=1.5, label="PDE")
            ax.set_title(f"t = {t:.3g}")
            ax.set_xlabel("omega")
        np.atleast_1d(axes)[0].legend(fontsize=8)
        np.atleast_1d(axes)[0].set_ylabel("density")
    else:
        # one colour scale per time (column): the PDE's maximum; a colour bar under each
        # column (a histogram above that maximum is clipped: the bar then has an arrow)
        fig, axes = plt.subplots(2, len(times), figsize=(3.0 * len(times), 7.2),
                                 squeeze=False, layout="constrained")
        for i, t in enumerate(times):
            rho = snap[f"rho_t{i}"]
            vmax = rho.max()
            im = axes[0, i].imshow(rho.T, origin="lower", extent=(-R, R, -R, R), vmin=0,
                                   vmax=vmax)
            axes[0, i].set_title(f"PDE t = {t:.3g}")
            h, _, _ = np.histogram2d(*snap[f"particles_t{i}"].T, bins=min(16, n),
                                     range=[[-R, R], [-R, R]], density=True)
            axes[1, i].imshow(h.T, origin="lower", extent=(-R, R, -R, R), vmin=0, vmax=vmax)
            axes[1, i].set_title(f"particles N={n_max}")
            axes[1, i].set_xlabel("omega_0")
            fig.colorbar(im, ax=axes[:, i], location="bottom", shrink=0.9,
                         extend="max" if h.max() > vmax else "neither",
                         label=f"density at t = {t:.3g}")
        axes[0, 0].set_ylabel("omega_1")
        axes[1, 0].set_ylabel("omega_1")
    if cfg["dim"] == 1:
        fig.tight_layout()
    fig.savefig(out / "densities.png", dpi=110)
    plt.close(fig)

    # free energy
    trace = [json.loads(line) for line in (out / "pde_trace.jsonl").read_text().splitlines()]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ts = [r["t"] for r in trace]
    for key, style in (("free_energy", "k-"), ("potential", "C0--"), ("interaction", "C1--"),
                       ("entropy", "C2--")):
        ax.plot(ts, [r[key] for r in trace], style, label=key.replace("_", " "))
    ax.set_xlabel("t")
    ax.set_title("PDE free energy F(rho_t) and its terms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "free_energy.png", dpi=110)
    plt.close(fig)

    # distance vs N
    fig, ax = plt.subplots(figsize=(5, 4))
    ns = np.array(cfg["ns"], float)
    for j, t in enumerate(times):
        key = f"{t:g}"
        mean = np.array(s["mean_distance_by_time"][key])
        std = np.array(s["std_distance_by_time"][key])
        ax.errorbar(ns, mean, yerr=std, marker="o", ms=3, capsize=2, color=f"C{j}",
                    label=f"t={t:.3g}, slope {s['slopes_by_time'][key]:.2f}")
    fit = np.exp(s["intercept"]) * ns ** s["slope"]
    ax.plot(ns, fit, "k--", lw=1, label=f"fit at t={times[-1]:.3g}: slope {s['slope']:.3f}")
    ax.plot(ns, fit[0] * (ns / ns[0]) ** -0.5, ":", color="gray", label="N^-1/2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (particles)")
    ax.set_ylabel("W1" if s["metric"] == "w1" else "MMD")
    ax.set_title(f"particles vs PDE ({cfg['dim']}-D)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "distance_vs_n.png", dpi=110)
    plt.close(fig)
