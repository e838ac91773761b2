"""What one training step asks of a GPU, checked on CPU (issue 22): at world size 1 no DDP
wrapper and one compiled graph; the lm model in SDPA's flash kernel; one host read per step,
taken after the update is queued; and an EMA that is foreach kernels only.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.conftest import TEST_TASK
from trainer import distributed
from trainer.config import build_config
from trainer.parts.optimizer import Ema
from trainer.tasks import load_task
from trainer.tasks.lm import LMTask
from trainer.tasks.vision import VisionTask
from trainer.telemetry.events import Reporter
from trainer.train import Trainer

# A two-layer lm model small enough for Dynamo to trace in a second on CPU.
LM_TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0}


def _trainer(env: distributed.DistEnv, tmp_path: Path, **settings) -> Trainer:
    cfg = build_config(
        {
            "device": "cpu",
            "progress": "never",
            "resume": "never",
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 0},
            **settings,
        }
    )
    reporter = Reporter(env.is_main, cfg.max_steps, "never", None, stream=io.StringIO())
    return Trainer(cfg, env, load_task(cfg.task, cfg.task_args), reporter)


def test_one_rank_compiles_the_lm_model_whole(one_rank_group, tmp_path: Path) -> None:
    """At world size 1 the step calls torch.compile(model) itself, no DDP around it (whose
    DDPOptimizer would split the graph at each gradient bucket), and Dynamo captures the lm
    model's forward and loss in one graph with no break, in train and in eval mode."""
    trainer = _trainer(
        one_rank_group,
        tmp_path,
        task="lm",
        task_args=LM_TINY,
        batch_size=4,
        compile=True,
        precision="bf16",
    )
    assert trainer.model is trainer.fwd_model and not trainer.ddp
    x, y = next(iter(trainer.train_loader))
    for training in (True, False):
        trainer.raw_model.train(training)
        with torch.no_grad() if not training else torch.enable_grad(), trainer._autocast():
            explained = torch._dynamo.explain(trainer.raw_model)(x, y)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
        assert explained.out_guards  # Dynamo really traced it (guards on the inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lm_model_trains_in_the_flash_attention_kernel(dtype: torch.dtype) -> None:
    """With SDPA allowed only its flash kernel (CPU has one), forward and backward run: the
    model calls SDPA with is_causal and no mask, which is what flash takes (a mask would leave
    SDPA no kernel: "No available kernel"). Dropout 0, as in the GPU check's runs."""
    task = LMTask(**LM_TINY)
    torch.manual_seed(0)
    model = task.build_model().train()
    x = torch.randint(0, len(task.vocab), (3, LM_TINY["block_size"]))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), autocast:
        loss, _ = task.loss(model, (x, x.roll(-1, 1)))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # attention got a gradient


def test_vocab_is_padded_for_tensor_cores_and_the_flops_count_the_real_one() -> None:
    task = LMTask(**LM_TINY)
    model = task.build_model()
    assert len(task.vocab) % 64 != 0  # the shipped corpus: the padding is real
    assert model.tok.weight.shape[0] % 64 == 0 and model.tok.weight.shape[0] >= len(task.vocab)
    assert model.head.weight is model.tok.weight
    assert task.model_args["vocab_size"] == len(task.vocab)


_READS = (
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
)


class _Reads(TorchFunctionMode):
    """Records every read of a tensor's values into Python while ``on`` (on a GPU, each read
    of a device tensor would wait for the device)."""

    def __init__(self, flags: torch.Tensor):
        super().__init__()
        self.flags, self.on, self.log = flags, True, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.on and func in _READS:
            self.log.append("flags" if args[0] is self.flags else func.__name__)
        return func(*args, **(kwargs or {}))


def _paused(mode: _Reads, fn):
    def wrapper(*args, **kwargs):
        mode.on = False
        try:
            return fn(*args, **kwargs)
        finally:
            mode.on = True

    return wrapper


def test_a_step_reads_the_host_once_after_its_update_is_queued(tmp_path: Path) -> None:
    """Per step the loop reads one thing, the [loss, stop] pair, from the pinned copy made
    right after backward, and only after the optimizer step is queued: on a GPU that read
    waits for the end of backward, not for the whole queue. Nothing else in the step reads a
    tensor (the EMA included; torch's AveragedModel read its update count on every step), but
    the grad norm once per log window. The data pipeline's host tensors and the final eval and
    checkpoint are left out: they are not steps."""
    env = distributed.setup("cpu", "gloo", 60)  # no launcher variables: one plain process
    steps = 6
    trainer = _trainer(
        env,
        tmp_path,
        task=TEST_TASK,
        max_steps=steps,
        log_every=3,
        batch_size=8,
        ema_decay=0.9,
        grad_clip=1.0,
    )
    mode = _Reads(trainer.train_step.host_flags.values)
    trainer.optimizer.register_step_pre_hook(lambda *_: mode.log.append("optimizer.step"))
    trainer.batches._draw = _paused(mode, trainer.batches._draw)
    trainer.evaluator.run = _paused(mode, trainer.evaluator.run)
    trainer.state_dict = _paused(mode, trainer.state_dict)
    trainer.checkpoints.save = _paused(mode, trainer.checkpoints.save)
    with mode:
        assert trainer.fit() == "completed"
    window = ["optimizer.step", "flags"] * 2 + ["optimizer.step", "flags", "__float__"]
    assert mode.log == window * (steps // 3)
    assert trainer.ema is not None and trainer.ema.updates == steps


def test_ema_is_averaged_models_result_in_foreach_kernels() -> None:
    """The EMA gives torch's AveragedModel(get_ema_multi_avg_fn) result bit for bit, weights
    averaged and BatchNorm buffers copied, with one foreach lerp and one foreach copy per
    update and nothing else (no per-tensor copies, no reads of a count)."""
    torch.manual_seed(0)
    model = VisionTask(width=8).build_model().train()
    ours = Ema(model, decay=0.75)
    ref = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.75))
    ops: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(4, 3, 16, 16))  # train mode: BatchNorm's running stats move
        ops.clear()
        with Ops():
            ours.update()
        assert set(ops) <= {"aten._foreach_copy_.default", "aten._foreach_lerp_.Scalar"}, ops
        assert len(ops) == 2  # the weights (copied the first time, then lerped), the buffers
        ref.update_parameters(model)
    want = ref.module.state_dict()
    got = ours.module.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    assert not torch.equal(got["head.weight"], model.state_dict()["head.weight"])
    # The checkpoint format is AveragedModel's: an EMA saved before this class loads.
    again = Ema(model, decay=0.75)
    again.load_state_dict({"model": ref.module.state_dict(), "n_averaged": ref.n_averaged})
    assert again.updates == 3 == int(ours.state_dict()["n_averaged"])
