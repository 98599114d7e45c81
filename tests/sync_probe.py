"""Count the host reads of tensor values in cll-train's steady-state steps (run as a subprocess by
test_train_step.py; writes one JSON object to ``--report``).

On a GPU each ``.item()``, ``.tolist()``, ``bool(tensor)``, ``float(tensor)``, ``torch.equal``,
``.nonzero()``, ``.cpu()`` … of a device tensor, and every explicit synchronize, makes the host
wait until the GPU has drained its queue. On the CPU these calls cost nothing, which is why they
go unnoticed; here they are counted by wrapping them, and each is attributed to the innermost
frame of cll_scale or deepspeed that made it (``file:function``)."""
import collections
import json
import traceback

import torch

from cll_scale.data.manifest import Manifest
from cll_scale.run.build import build_run
from cll_scale.run.trainer import Trainer
from cll_scale.train import build_parser, recipe_from_args
from cll_scale.training import collectives
from tests.ds_probe import split_report

COUNTS: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
STATE = {"step": None, "inside": 0}
MANIFEST_LOADS: list[str] = []      # the manifest is read once per command and passed down
_load = Manifest.load.__func__
Manifest.load = classmethod(lambda cls, directory: MANIFEST_LOADS.append(str(directory)) or _load(cls, directory))


def _site() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename.replace("\\", "/")
        for root in ("/cll_scale/", "/deepspeed/"):
            if root in f and not f.endswith("tests/sync_probe.py"):
                return f[f.index(root) + 1:] + ":" + frame.name
    return "elsewhere"


def _counting(owner, name):
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        # One read counts once: a torch function mode (bf16 matmuls in fp32 on a CPU without bf16
        # units, cll_scale.model.bf16) hands the same call back through this wrapper.
        if STATE["step"] is not None and not STATE["inside"]:
            COUNTS[STATE["step"]][f"{name} @ {_site()}"] += 1
        STATE["inside"] += 1
        try:
            return real(*args, **kwargs)
        finally:
            STATE["inside"] -= 1
    setattr(owner, name, wrapper)


for method in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu", "nonzero"):
    _counting(torch.Tensor, method)
for fn in ("equal", "nonzero", "masked_select", "unique", "allclose"):
    _counting(torch, fn)
_counting(torch.cuda, "synchronize")


def main(argv=None):
    report, argv = split_report(argv)
    args = build_parser().parse_args(argv)
    trainer = Trainer(build_run(recipe_from_args(args), resume=args.resume))
    from deepspeed.accelerator import get_accelerator
    _counting(type(get_accelerator()), "synchronize")
    real_step = trainer.train_step

    def counted_step():
        # A loop iteration runs from one train_step to the next: the step's own work plus the
        # loop's bookkeeping after it (agreement, metrics, logging) are charged to that step.
        STATE["step"] = trainer.state.step + 1
        return real_step()
    trainer.train_step = counted_step
    result = trainer.train()
    STATE["step"] = None
    collectives.shutdown()
    with open(report, "w") as f:
        json.dump({"counts": {step: dict(c) for step, c in COUNTS.items()}, "result": result,
                   "log_every": trainer.cfg.log.every, "manifest_loads": MANIFEST_LOADS}, f)


if __name__ == "__main__":
    main()
