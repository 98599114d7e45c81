"""``cll-repro``: the Multi30k zero-shot reproduction, one command, resumable.

    cll-repro --condition triangle --minutes-per-model 90
    cll-repro --condition centered --variants baseline,sd,fcll --minutes-per-model 120
    cll-repro --condition triangle --variants baseline,fcll,sd,sd_attn --seeds 1,2,3 --steps-per-model 4200
    cll-repro --condition triangle --settings paper --seeds 1,2,3 --steps-per-model 4000
    cll-repro --condition triangle --settings paper_small --seeds 1,2,3 --steps-per-model 4200

Builds the shards of the condition (paper §4.1) if missing, trains every variant from
``recipes/multi30k_<condition>_<variant>.yaml`` (``--settings paper``: the
``multi30k_<condition>_paper_<variant>.yaml`` recipes, which follow the authors' code;
``--settings paper_small``: their settings at the ``small`` size, the closest a CPU trains) with the
same seed and budget (with ``--seeds``, every variant once per seed, seed 1 of every variant
first; a seed sets both the initialisation and the data order, so the variants of one seed see
the same batches, and the report gives mean ± std over seeds beside each seed's rows; re-running resumes
each unfinished model from its checkpoint, so a long CPU run can span several sittings; a GPU is
used when present), evaluates every export on the Multi30k test sets, and writes
``<out>/<condition>.md`` (``<condition>-seeds.md`` with ``--seeds``) with the tables, plots,
budget, steps, epochs, hardware and command; it is rewritten as each model ends, naming the ones
still to train. A finished model's record (no weights) is kept beside the report and stands in for
its run directory when that is gone.
Everything goes under ``runs/repro/`` of the current directory unless told otherwise; the
project's committed reports are rewritten only with an explicit ``--out docs/results``.
"""
