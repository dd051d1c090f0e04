"""coulomb-attention: learn the kernel of linear attention as interacting particles.

Data flows one way: data -> features -> energy -> dynamics -> frozen kernel -> attention
-> model -> metrics -> report. Each idea lives in one place:

- :mod:`coulomb_attention.features`  samplers of omega, feature maps, exact kernels
- :mod:`coulomb_attention.energy`    kernel-target alignment, Riesz pair energy, Hamiltonian
- :mod:`coulomb_attention.dynamics`  projected Langevin ``(init_fn, step_fn)``, projections
- :mod:`coulomb_attention.meanfield` McKean-Vlasov solver and free energy
- :mod:`coulomb_attention.estimators` scikit-learn estimators
- :mod:`coulomb_attention.nn`        linear kernel attention and the classifier
- :mod:`coulomb_attention.train`     one training loop; phase A (alignment), phase B
"""

__version__ = "0.1.0"
