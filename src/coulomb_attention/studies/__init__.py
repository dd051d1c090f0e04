"""Studies: a frozen config in, records and result files out (``docs/architecture.md``).

- :mod:`.synthetic`      fixed versus learned random features on synthetic tasks
- :mod:`.concentration`  spread across seeds of the learned kernel versus N and beta
- :mod:`.meanfield`      the particle system versus its McKean-Vlasov limit
- :mod:`.demo`           the short fixed-versus-learned demo
- :mod:`.suite`          every attention x kernel variant of the run pipeline
- :mod:`.minilm`         the pretrained-encoder comparison
- :mod:`.recall`         the MQAR grid (resumable result rows, the report)
- :mod:`.convert_grid`   the conversion comparison over M, seeds, variants and lambda
- :mod:`.ablation`       the ablation study (what each ingredient buys): one framework, one module
                         per arena (``ablation_synthetic``, ``ablation_mqar``, ``ablation_convert``)

Submodules are imported by name (``from coulomb_attention.studies import synthetic``); this
package imports nothing, so a command's ``--help`` stays light.
"""
