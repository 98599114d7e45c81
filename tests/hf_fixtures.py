"""Write corpora in the Hugging Face ``Helsinki-NLP/opus-100`` layout, locally and offline."""
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_pair(root: Path, pair: str, split: str, rows: list[tuple[str, str]]) -> Path:
    a, b = pair.split("-")
    (root / pair).mkdir(parents=True, exist_ok=True)
    struct = pa.struct([(a, pa.string()), (b, pa.string())])
    table = pa.table({"translation": pa.array([{a: x, b: y} for x, y in rows], type=struct)})
    path = root / pair / f"{split}-00000-of-00001.parquet"
    pq.write_table(table, path)
    return path


def write_repo_card(root: Path, configs: dict[str, list[str]]) -> None:
    """The README ``configs:`` block with which the hub (and load_dataset on a clone) finds
    each pair's files."""
    lines = ["---", "configs:"]
    for pair, splits in configs.items():
        lines += [f"- config_name: {pair}", "  data_files:"]
        lines += [f"  - split: {s}\n    path: {pair}/{s}-*" for s in splits]
    (root / "README.md").write_text("\n".join(lines + ["---", ""]), encoding="utf-8")


def multi30k_pairs(multi30k: Path, pair: str, split: str, n: int) -> list[tuple[str, str]]:
    a, b = pair.split("-")
    name = "val" if split == "validation" else split
    left = (multi30k / f"{name}.{a}").read_text(encoding="utf-8").splitlines()[:n]
    right = (multi30k / f"{name}.{b}").read_text(encoding="utf-8").splitlines()[:n]
    return list(zip(left, right))
