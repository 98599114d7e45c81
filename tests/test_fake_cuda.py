"""The GPU path of a training step and of beam search, checked on a machine without a GPU.

A CPU run hides three mistakes that a GPU run pays for: a tensor made on the CPU inside the step
(on a GPU, a device-mismatch error), a branch meant for the CPU taken on the GPU (the model picks
its dropout, attention kernel and loss block size by ``x.device.type``), and a host read of a
device value (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``: on a GPU each one waits for the
queue to drain). PyTorch's fake tensors (``FakeTensorMode``) show all three without a GPU. A fake
tensor has a device, a dtype and a shape but no data. Each op runs its meta kernel, an op that mixes
cuda and cpu tensors raises as CUDA would, and reading a value raises ``DataDependentOutputException``.
:class:`GpuWatch` records the ops that a step dispatches and turns those failures into
:class:`CpuTensor` and :class:`HostRead` errors naming the line of our code that caused them.

Fake CUDA tensors need a CUDA device guard. Their backward pass also needs CUDA as the
accelerator, because the autograd engine keeps a stream per device. PyTorch's CPU build has
neither. :data:`SHIM` is a few lines of C++ that register PyTorch's own ``FakeGuardImpl`` for CUDA
and hooks that say CUDA is built. Torch reads those hooks once, on import, so the shim must load
before torch: in a fresh interpreter. The suite's one test here builds the shim and runs this
file's ``check_*`` functions in that interpreter with pytest. A CUDA build of PyTorch has its own
guard and hooks and gets no shim.

What fake tensors cannot show: values (numerics, NaN, the step that GuardedAdamW skips on the
device), the attention kernel a GPU picks (the CPU build has no CUDA kernel choice, so fake CUDA
attention runs the math kernel's ops; the checks see only that the model does not pin the math
kernel itself), and the few host reads of beam search (see
:func:`check_beam_search_steps_on_cuda_read_the_host_only_before_and_after_its_loop`).
"""
import collections
import dataclasses
import functools
import itertools
import linecache
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import (DynamicOutputShapeException, FakeTensorDeviceMismatchError,
                                           FakeTensorMode)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import cll_scale.model.model as mm
from bench.bench_model import NO_KERNEL as BENCH_NO_KERNEL
from cll_scale.data.stream import MIXED, Batch
from cll_scale.evaluation.translator import ModelStepper
from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.model.decoding import DecodeConfig, beam_search
from cll_scale.model.model import CLLTransformer, projected_loss, target_positions
from cll_scale.training.optim import GuardedAdamW
from tests.conftest import ROOT


def train_step(model: CLLTransformer, optimizer: GuardedAdamW, batch: Batch) -> torch.Tensor:
    """One training step of one rank, as the trainer runs it (``Trainer._forward_backward``, then
    the engine's step): the batch to the model's device, forward to the features, the label-smoothed
    loss of the non-pad positions with the tied projection inside it, backward of
    the per-token loss, and the client optimizer's step with the device's verdict on the loss."""
    dev = batch.to(next(model.parameters()).device)
    features = model(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang, lang_runs=dev.lang_runs,
                     features_only=True)
    features, target = target_positions(features, dev.tgt_tokens, model.cfg.pad_id, dev.ntokens)
    loss, nll = projected_loss(features, model.embed.weight, target, model.cfg.pad_id, 0.1)
    optimizer.loss_ok = torch.isfinite(loss)
    (loss / max(batch.ntokens, 1)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@pytest.mark.integration
def test_the_gpu_checks_pass_with_fake_cuda(tmp_path):
    """Every ``check_*`` below, run by pytest in a fresh interpreter that has fake CUDA (see the
    module's docstring). With ``-s`` the checks' report (kernel counts) is printed."""
    # a pytest of its own, not one of make test's workers (tests/conftest.py reads these)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if not torch.backends.cuda.is_built():
        env["CLL_FAKE_CUDA_SHIM"] = str(build_shim(tmp_path))
    run = subprocess.run([sys.executable, "-c", BOOT, "-q", "-s", "-p", "no:cacheprovider",
                          "-o", "python_functions=check_*", __file__],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


# ---------------------------------------------------------------------------------------------
# The checks (collected only in the fake-CUDA interpreter)

DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])


@DTYPES
def check_a_mixed_fcll_training_step_runs_on_cuda_without_a_host_read(dtype):
    """Forward, loss, backward and GuardedAdamW's fused step of a batch mixed over 16 target
    languages: every tensor on the GPU, no value read on the host. A CPU tensor or a host read
    anywhere would raise in :func:`run_step`."""
    seen = plain_step("fcll", dtype)
    assert seen.ops["aten::embedding_dense_backward"] == 2          # backward: the shared embedding's two uses
    assert seen.ops["aten::_fused_adamw_"] == 1                     # one fused kernel for all parameters
    assert seen.ops["aten::_foreach_norm"] == 1                     # the clip norm, on the device
    assert seen.devices == {"cuda"}, seen.devices


@DTYPES
def check_a_step_on_cuda_takes_the_gpu_branches(dtype):
    """``F.dropout``'s fused kernel (not the CPU's 64-bit draws), attention left to PyTorch's
    choice (not pinned to the math kernel), and the loss in one block of rows."""
    taken = cpu_choices(plain_step("fcll", dtype))
    assert not taken, f"CPU-only choices taken on cuda: {taken}"


def check_the_branch_check_sees_a_cpu_step_take_the_cpu_branches():
    """The same step on (fake) CPU tensors, in bf16 with gradients: each of the model's CPU-only
    choices is seen, so the check above fails if one of them is taken on the GPU."""
    assert cpu_choices(plain_step("fcll", torch.bfloat16, device="cpu", steps=1)) == list(CPU_CHOICES)


def _position_table_left_on_the_cpu(model, monkeypatch):
    # as a table kept in a plain attribute would be: Module.to() moves only parameters and buffers
    model.positions = model.positions.cpu()


def _dropout_mask_made_on_the_cpu(model, monkeypatch):
    def dropout(x, p, training):
        if not training or p <= 0.0:
            return x
        return x * (torch.rand(x.shape) >= p) / (1.0 - p)          # no device=x.device
    monkeypatch.setattr(mm, "dropout", dropout)


# mistake -> where the check must say the CPU tensor met the GPU
CPU_TENSOR_MISTAKES = {_position_table_left_on_the_cpu: r"cll_scale/model/model\.py:\d+ in _embed",
                       _dropout_mask_made_on_the_cpu: r"tests/test_fake_cuda\.py:\d+ in dropout"}


@pytest.mark.parametrize("mistake", list(CPU_TENSOR_MISTAKES), ids=lambda f: f.__name__.strip("_"))
def check_a_cpu_tensor_in_the_step_is_caught_where_it_meets_the_gpu(mistake, monkeypatch):
    with pytest.raises(CpuTensor, match=r"cuda:0 and cpu! At " + CPU_TENSOR_MISTAKES[mistake]):
        run_step("fcll", torch.bfloat16, spoil=lambda model: mistake(model, monkeypatch))


def check_a_0d_cpu_tensor_goes_into_elementwise_ops_only():
    """As on CUDA: a 0-d CPU tensor is a number to an element-wise op, a device mismatch to
    ``torch.stack`` (fake tensors alone would let it through)."""
    with FakeTensorMode(), GpuWatch():
        assert (torch.ones(3, device="cuda") * torch.tensor(2.0)).device.type == "cuda"
        with pytest.raises(CpuTensor, match=r"aten::stack: a 0-d CPU tensor among CUDA ones"):
            torch.stack([torch.ones((), device="cuda"), torch.zeros(())])


HOST_READS = {".item()": lambda t: t.sum().item(), "int()": lambda t: int(t.sum()),
              "bool()": lambda t: bool(t.sum() > 0), ".tolist()": lambda t: t.sum(-1).tolist()}


@pytest.mark.parametrize("read", list(HOST_READS))
def check_a_host_read_in_the_step_is_caught_where_it_happens(read, monkeypatch):
    """A read slipped into the step (here a debug statistic in dropout) fails the step, naming the
    line; on a GPU it would only have been slow."""
    plain = mm.dropout

    def reading_dropout(x, p, training):
        HOST_READS[read](x)
        return plain(x, p, training)
    monkeypatch.setattr(mm, "dropout", reading_dropout)
    with pytest.raises(HostRead, match=r"test_fake_cuda\.py:\d+ in <lambda>") as caught:
        run_step("fcll", torch.bfloat16)
    assert "read on the host" in str(caught.value)


def check_a_mixed_batch_without_its_host_runs_makes_the_model_read_the_device():
    """Without ``lang_runs`` the model groups the rows by language from the device ids
    (``LangGroups.from_slots``): fine for decoding, a stall per step in training."""
    with pytest.raises(HostRead, match=r"model\.py:\d+ in from_slots"):
        run_step("fcll", torch.bfloat16, with_runs=False)


class HostRoutedStepper(ModelStepper):
    """:class:`ModelStepper` with the sentences' target languages known on the host, as the
    translator knows them. ``ModelStepper`` routes its rows from the device ids and, at each
    :meth:`reorder`, reads whether the rows still come sentence by sentence (``unique_consecutive``,
    ``torch.equal``): host reads by design, once per reorder, that fake tensors cannot answer. Here
    the routing comes from the host list, and the one reorder before beam search's first look
    (each sentence's beams together) is taken as grouped. ``step`` and ``reorder_beams``, the
    per-step path, are ModelStepper's own."""

    def __init__(self, model, src_tokens, langs: list[int]):
        self.langs, self.beam, self.steps = langs, 1, 0
        super().__init__(model, src_tokens, torch.tensor(langs, device=src_tokens.device))

    def _set_rows(self) -> None:
        self.tgt_lang = self.sent_lang.index_select(0, self.row_sent)
        self.groups = self.model.lang_groups(self.tgt_lang, runs([x for x in self.langs for _ in range(self.beam)]))

    def reorder(self, index: torch.Tensor) -> None:
        self.beam = len(index) // len(self.langs)
        self.row_sent = torch.arange(len(self.langs), device=index.device).repeat_interleave(self.beam)
        self.reorder_beams(index)
        self._set_rows()

    def step(self, prev_tokens: torch.Tensor, t: int) -> torch.Tensor:
        self.steps += 1
        return super().step(prev_tokens, t)


@DTYPES
def check_beam_search_steps_on_cuda_read_the_host_only_before_and_after_its_loop(dtype):
    """Beam search with the model's cached decode step, beam 4, sentences into 3 languages. On a
    GPU the host looks every 8 steps; up to then everything stays on the device. Its reads that fake
    tensors cannot answer: the longest output, read once before the loop (answered here from the
    host's lengths), the look's ``nonzero`` (an output size: the limit of 8 ends the loop before it),
    the stepper's ``reorder`` at a look (see :class:`HostRoutedStepper`) and the final read of the
    hypotheses, where the search must stop after its 8 steps."""
    limit = 8
    with FakeTensorMode():
        model = build_model("fcll", dtype, LANGS[:4]).eval()
        langs = [1, 1, 2, 3]
        src, max_lens = torch.randint(4, VOCAB, (len(langs), 9), device="cuda"), torch.full((4,), limit, device="cuda")
        with torch.no_grad(), GpuWatch(answers={"beam_search": [limit]}) as watch:
            stepper = HostRoutedStepper(model, src, langs)
            with pytest.raises(HostRead, match=r"decoding\.py:\d+ in hypotheses"):
                beam_search(stepper, len(langs), max_lens, model.cfg.bos_id, model.cfg.eos_id, DecodeConfig(beam=4),
                            device="cuda")
    assert stepper.steps == limit and watch.answers == {"beam_search": []}
    assert watch.devices == {"cuda"} and watch.ops["aten::topk"] == limit


def check_a_mixed_batch_runs_its_lsls_as_grouped_matmuls_whatever_its_languages():
    """Kernels launched by a later bf16 `small` step (leaf ops that compute or copy, as
    ``bench/bench_model.py`` counts them; printed with ``-s``): the Baseline, and FCLL on a batch of
    one target language and on batches mixed over 2 and 16. A mixed batch stacks its languages'
    LSL weights and runs each LSL linear layer as one grouped matmul over all of its LSL rows, and
    the element-wise rest once (``CLLFeedForward._mixed``): from 2 languages to 16 the matmuls do
    not grow, and what does is the per-language glue only (the weights stacked, each language's
    gradient gathered into its one Parameter). The counts hold attention as the math kernel's ops
    (about 30 kernels a call in bf16, forward and backward), where a GPU's fused attention takes a
    few."""
    steps = {("baseline", 16): plain_step("baseline", torch.bfloat16),
             **{("fcll", n): plain_step("fcll", torch.bfloat16, languages=n) for n in (1, 2, 16)}}
    for (variant, n), seen in steps.items():
        print(f"fake-cuda kernels of a `small` bf16 step, {variant:8s} {n:2d} target language(s): {kernels(seen)}")
    extra = (kernels(steps["fcll", 16]) - kernels(steps["fcll", 2])) / 14 / CLL_LAYERS
    print(f"fake-cuda kernels per added language and CLL layer: {extra:.1f}")
    assert 0 < kernels(steps["baseline", 16]) < kernels(steps["fcll", 1]) < kernels(steps["fcll", 16])
    two, mixed = steps["fcll", 2].ops, steps["fcll", 16].ops
    # each LSL linear layer: one grouped matmul forward, two backward (input and weight gradients)
    assert two["aten::_grouped_mm"] == mixed["aten::_grouped_mm"] == CLL_LAYERS * 2 * 3
    grown = {name for name in mixed if mixed[name] > two[name]} - NO_KERNEL
    assert grown <= PER_LANGUAGE, {name: (two[name], mixed[name]) for name in grown - PER_LANGUAGE}
    assert extra < 2, extra


# ---------------------------------------------------------------------------------------------
# The checking helpers

LANGS = ["en", "de", "fr", "cs", "es", "it", "nl", "pt", "ro", "ru", "pl", "sv", "fi", "hu", "el", "tr", "bg"]
VOCAB, ROWS, SRC_LEN, TGT_LEN = 8000, 32, 10, 16     # 32 x 16 target rows: 2 loss blocks on a CPU
CLL_LAYERS = PRESETS["small"]["decoder_layers"]         # FCLL: every decoder layer has CLL
# What a language adds to a mixed step: the glue that gathers its gradients into its one
# Parameter (the stacked weights' inputs are views; their gradients come back per language).
PER_LANGUAGE = {"aten::cat", "aten::add", "aten::slice_backward"}


class CpuTensor(AssertionError):
    """A CPU tensor met a CUDA one inside the step (on a GPU: a device-mismatch error)."""


class HostRead(AssertionError):
    """The step read a device value on the host (on a GPU: a wait for the queue to drain)."""


# The ops whose result is a value on the host, and what a step calls to get one.
READS = {"aten::_local_scalar_dense": "a device value read on the host (.item(), int(), float(), bool(), .tolist())",
         "aten::equal": "torch.equal, a device comparison read on the host"}
# Ops that only view or allocate (no kernel on a GPU), as the model bench counts them, and the
# host side of Batch.to.
NO_KERNEL = BENCH_NO_KERNEL | {"aten::is_pinned", "aten::_pin_memory"}
# The model's CPU-only choices (cll_scale.model.model), as the ops of a step show them.
CPU_CHOICES = {
    "dropout from 64-bit draws": lambda seen: seen.ops["aten::randint"] > 0,
    "attention pinned to the math kernel": lambda seen: seen.math_only > 0,
    "the loss in several blocks of rows": lambda seen: seen.ops["aten::_log_softmax"] > 1,
}


def cpu_choices(seen: "GpuWatch") -> list[str]:
    return [name for name, taken in CPU_CHOICES.items() if taken(seen)]


def kernels(seen: "GpuWatch") -> int:
    return sum(n for name, n in seen.ops.items() if name.startswith("aten::") and name not in NO_KERNEL)


class GpuWatch(TorchDispatchMode):
    """Inside a ``FakeTensorMode``: counts the ops dispatched (``ops``, by name), the devices of
    their outputs, and the ops run while attention was pinned to its math kernel. Raises
    :class:`CpuTensor` when an op mixes devices or gets a real (CPU) tensor made outside the fake
    mode, and :class:`HostRead` for a value or an output size read on the host, or a copy to the
    host. Fake tensors let a 0-d CPU tensor into any op, CUDA only into element-wise ones: the watch
    refuses it in ``cat`` and ``stack`` (GuardedAdamW stacks 0-d values). ``answers``: the host
    reads allowed, by the function that makes them, with the values they get."""

    def __init__(self, answers: dict[str, list] | None = None):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.devices: set[str] = set()
        self.math_only = 0
        self.answers = answers or {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name.startswith("prim::"):                  # device and layout queries
            return func(*args, **kwargs)
        self.ops[name] += 1
        self.math_only += not torch.backends.cuda.flash_sdp_enabled()
        if name == "aten::_pin_memory":                # Batch.to: a fake tensor has no memory to pin
            return args[0]
        if name in READS:
            where = _our_frame()
            if self.answers.get(where.function):
                return self.answers[where.function].pop(0)
            raise HostRead(f"{READS[name]} at {where}")
        if name in ("aten::_to_copy", "aten::copy_") and _to_host(name, args, kwargs):
            raise HostRead(f"a copy to the host ({name}) at {_our_frame()}")
        if name in ("aten::cat", "aten::stack") and _devices(args) > 1:
            raise CpuTensor(f"{name}: a 0-d CPU tensor among CUDA ones (an error on CUDA, allowed by fake "
                            f"tensors) at {_our_frame()}")
        try:
            out = func(*args, **kwargs)
        except FakeTensorDeviceMismatchError as e:
            raise CpuTensor(f"{name}: {e} At {_our_frame()}") from None
        except DynamicOutputShapeException:
            raise HostRead(f"{name}: the size of its output is read on the host, at {_our_frame()}") from None
        except AssertionError as e:
            if "convert all Tensors to FakeTensors" not in str(e):
                raise
            raise CpuTensor(f"{name} got a real CPU tensor, made outside the step, at {_our_frame()}") from None
        # 0-d CPU tensors are left out (they mix with CUDA ones as Python numbers do), and the host
        # data of torch.tensor(list, device=...) on its way to the device
        if name != "aten::lift_fresh":
            self.devices.update(t.device.type for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.dim())
        return out


def _devices(args) -> int:
    return len({t.device for t in tree_leaves(args) if isinstance(t, torch.Tensor)})


def _to_host(name, args, kwargs) -> bool:
    if name == "aten::copy_":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"


@dataclasses.dataclass
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {linecache.getline(self.file, self.line).strip()}"


TORCH_DIR = str(Path(torch.__file__).parent)


def _our_frame() -> Frame:
    """The innermost caller outside torch and this watch: the line of our code that asked."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH_DIR)
                                 or frame.f_code.co_name in ("__torch_dispatch__", "_our_frame")):
        frame = frame.f_back
    if frame is None:                                  # a C++ backward formula, on autograd's thread
        return Frame("<the backward pass>", 0, "<autograd>")
    file = frame.f_code.co_filename
    return Frame(os.path.relpath(file, ROOT) if file.startswith(str(ROOT)) else file, frame.f_lineno,
                 frame.f_code.co_name)


def runs(langs: list[int]) -> tuple[tuple[int, int], ...]:
    """(target language, rows) runs in row order, as the stream gives them with a batch."""
    return tuple((lang, len(list(rows))) for lang, rows in itertools.groupby(langs))


def build_model(variant: str, dtype: torch.dtype, languages=LANGS, device="cuda") -> CLLTransformer:
    """The `small` model made where a GPU run has it, inside a FakeTensorMode. Its tensors are made
    in place (default device and dtype): ``Module.to()`` cannot swap fake parameters."""
    cfg = ModelConfig(**{**PRESETS["small"], "lsl_dim": 256}, vocab_size=VOCAB, languages=languages,
                      central_language="en", variant=variant)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return CLLTransformer(cfg).train()
    finally:
        torch.set_default_dtype(default)


def host_batch(languages: int, with_runs: bool = True) -> Batch:
    """A batch as the stream gives it, on the host: rows spread over the first ``languages``
    non-central languages and ordered by target language, with their runs."""
    langs = [1 + i * languages // ROWS for i in range(ROWS)]
    batch = Batch(torch.randint(4, VOCAB, (ROWS, SRC_LEN)), torch.randint(4, VOCAB, (ROWS, TGT_LEN)),
                  torch.zeros(ROWS, dtype=torch.long), torch.tensor(langs), MIXED, ROWS * TGT_LEN,
                  lang_runs=runs(langs))
    if not with_runs:       # as a batch built on the device would come (Batch computes them on the host)
        batch.lang_runs = None
    return batch


@functools.cache
def plain_step(variant: str, dtype: torch.dtype, device: str = "cuda", languages: int = 16, steps: int = 2
               ) -> "GpuWatch":
    """:func:`run_step` without a mistake put in, once for all the checks that look at it. Two steps:
    the first also creates the optimizer's state, the second is every later one."""
    return run_step(variant, dtype, device, languages, steps)


def run_step(variant: str, dtype: torch.dtype, device: str = "cuda", languages: int = 16, steps: int = 1,
             with_runs: bool = True, spoil=None) -> GpuWatch:
    """:func:`train_step` ``steps`` times on fake tensors on ``device``, each step watched: -> what
    the last one dispatched. ``spoil(model)`` puts a mistake into the model first."""
    with FakeTensorMode():
        model = build_model(variant, dtype, device=device)
        optimizer = GuardedAdamW(model.parameters(), clip_norm=1.0, lr=1e-4)
        batch = host_batch(languages, with_runs)
        if spoil is not None:
            spoil(model)
        for _ in range(steps):
            with GpuWatch() as seen:
                train_step(model, optimizer, batch)
    return seen


# The C++ shim: CUDA's device guard and accelerator hooks for PyTorch's CPU build (module docstring).
SHIM = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
namespace at {
struct FakeCUDAHooks : CUDAHooksInterface {
  FakeCUDAHooks(CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }         // CUDA is the accelerator (autograd's streams)
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
};
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks)
}
static c10::impl::DeviceGuardImplRegistrar fake_cuda_guard(
    c10::DeviceType::CUDA, new c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>());
"""
# The fake-CUDA interpreter: the shim before torch, then pytest. os._exit: the shim's guard and
# hooks are not meant to be torn down at exit.
BOOT = ("import ctypes, os, sys\n"
        "if os.environ.get('CLL_FAKE_CUDA_SHIM'):\n"
        "    ctypes.CDLL(os.environ['CLL_FAKE_CUDA_SHIM'], mode=ctypes.RTLD_GLOBAL)\n"
        "import pytest\n"
        "code = pytest.main(sys.argv[1:])\n"
        "sys.stdout.flush()\n"
        "os._exit(int(code))\n")


def build_shim(tmp_path: Path) -> Path:
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the fake-CUDA shim for PyTorch's CPU build")
    from torch.utils.cpp_extension import include_paths
    source, lib = tmp_path / "fake_cuda.cpp", tmp_path / "fake_cuda.so"
    source.write_text(SHIM)
    torch_lib = Path(torch.__file__).parent / "lib"
    subprocess.run([compiler, "-shared", "-fPIC", "-std=c++20", "-O0", "-w", *(f"-I{p}" for p in include_paths()),
                    str(source), f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}", "-o", str(lib)],
                   check=True, capture_output=True, timeout=300)
    return lib
