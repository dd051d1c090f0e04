"""Energies: kernel-target alignment, Riesz/Coulomb/log pair potentials, the Hamiltonian."""

from .alignment import (
    AlignmentStats,
    alignment,
    alignment_from_stats,
    alignment_stats,
    alignment_value_and_grad,
    encode_labels,
)
from .hamiltonian import Hamiltonian
from .riesz import (
    POTENTIALS,
    PairPotential,
    make_potential,
    pairwise_sq_dists,
    riesz_energy,
    riesz_energy_naive,
    riesz_grad,
    riesz_weight_grad,
    row_block,
    sharded_riesz_energy_and_grad,
)
from .teacher import (
    EmbeddingTeacher,
    TeacherAttention,
    TeacherBatch,
    WindowWeights,
    naive_teacher_value,
    per_head,
    teacher_mass_gradient,
    teacher_rows,
)
from .terms import Comm, DataTerm, LabelAlignment, LinearPotential
from .token_pair import TokenPairAlignment as TokenPairAlignment

__all__ = [
    "Comm",
    "DataTerm",
    "EmbeddingTeacher",
    "LabelAlignment",
    "LinearPotential",
    "TeacherAttention",
    "TeacherBatch",
    "WindowWeights",
    "naive_teacher_value",
    "per_head",
    "teacher_mass_gradient",
    "teacher_rows",
    "row_block",
    "sharded_riesz_energy_and_grad",
    "POTENTIALS",
    "AlignmentStats",
    "Hamiltonian",
    "PairPotential",
    "alignment",
    "alignment_from_stats",
    "alignment_stats",
    "alignment_value_and_grad",
    "encode_labels",
    "make_potential",
    "pairwise_sq_dists",
    "riesz_energy",
    "riesz_energy_naive",
    "riesz_grad",
    "riesz_weight_grad",
]
