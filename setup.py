"""cll-scale: multilingual NMT with Central Language-aware Layers, trained with DeepSpeed."""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

SHIPPED = {"ds_configs": "*.json", "recipes": "*.yaml"}     # cll_scale.core.resources reads them


class BuildWithShippedFiles(build_py):
    """A wheel carries the engine settings and the recipes inside the package
    (``cll_scale/_shipped/``), where an installed cll-scale finds them; a source checkout reads
    them at its top."""

    def run(self):
        super().run()
        for name, pattern in SHIPPED.items():
            target = Path(self.build_lib) / "cll_scale" / "_shipped" / name
            target.mkdir(parents=True, exist_ok=True)
            for f in sorted(Path(name).glob(pattern)):
                shutil.copy2(f, target / f.name)


setup(
    name="cll-scale",
    version="0.1.0",
    description="Multilingual NMT with Central Language-aware Layers (Qu & Watanabe, 2022) on DeepSpeed",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["cll_scale", "cll_scale.*", "data_tools", "data_tools.*", "demo", "demo.*"]),
    include_package_data=True,
    install_requires=[
        # A range: GPU users bring their own CUDA build; scripts/setup_env.sh pins the CPU build
        # where no GPU is present (a bare resolve would fetch a multi-GB CUDA wheel).
        "torch>=2.4,<2.15",
        "deepspeed>=0.16,<0.20",
        "sentencepiece>=0.2",
        "protobuf>=4",              # sentencepiece's model proto: cll-extend appends pieces
        "datasets>=3.0",
        "pyarrow>=15",
        "numpy>=1.24",
        "sacrebleu>=2.4",
        "langdetect>=1.0.9",
        "lingua-language-detector>=2.0",   # cll-eval --lid lingua: models inside the wheel, no download
        "safetensors>=0.4",
        "tqdm>=4.60",
        "pyyaml>=6.0",
        "matplotlib>=3.7",
        "captum>=0.8",              # cll-analyze attribution (paper Fig. 5): integrated gradients
    ],
    extras_require={
        "demo": ["gradio>=5.0", "gradio_client>=1.0"],
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "psutil>=5.9", "transformers>=5", "playwright>=1.40",
                "tensorboard>=2.15"],   # log.tensorboard's test writes an event file
    },
    cmdclass={"build_py": BuildWithShippedFiles},
    entry_points={
        "console_scripts": [
            "cll-shards=data_tools.cli:main",
            "cll-train=cll_scale.train:main",
            "cll-translate=cll_scale.translate:main",
            "cll-eval=cll_scale.evaluate:main",
            "cll-repro=cll_scale.repro.cli:main",
            "cll-bt=cll_scale.backtranslate:main",
            "cll-extend=cll_scale.extend:main",
            "cll-analyze=cll_scale.analyze:main",
            "cll-export=cll_scale.export:main",
            "cll-demo=demo.cli:main",
        ],
    },
)
