"""Run by the multi-process tests under the `deepspeed` launcher: train through cll-train's
Trainer, then report from every rank what the tests check (ZeRO-2 partitioning, identical
parameters across ranks) into a JSON file written by rank 0."""
import hashlib
import json
import sys

import torch

from cll_scale.run.build import build_run
from cll_scale.run.trainer import Trainer
from cll_scale.train import build_parser, recipe_from_args
from cll_scale.training import collectives


def split_report(argv=None) -> tuple[str, list[str]]:
    """(the --report path, cll-train's own arguments) of a probe's command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    report = argv.pop(argv.index("--report") + 1)
    argv.remove("--report")
    return report, argv


def main(argv=None):
    report, argv = split_report(argv)
    args = build_parser().parse_args(argv)
    trainer = Trainer(build_run(recipe_from_args(args), resume=args.resume))
    result = trainer.train()
    eng = trainer.engine
    digest = hashlib.sha256()
    for p in eng.module.parameters():
        digest.update(p.detach().float().numpy().tobytes())
    partition = sum(t.numel() for t in eng.optimizer.single_partition_of_fp32_groups)
    info = {"rank": trainer.rank, "world": trainer.world, "param_sha": digest.hexdigest(),
            "opt_partition_numel": int(partition),
            "total_params": int(sum(p.numel() for p in eng.module.parameters())),
            "loss": result.get("loss"), "step": result["step"], "threads": torch.get_num_threads()}
    gathered = collectives.all_gather_object(info)
    if trainer.rank == 0:
        with open(report, "w") as f:
            json.dump(gathered, f)
    collectives.shutdown()


if __name__ == "__main__":
    main()
