"""GPU paths of the workloads checked on CPU torch and fakes.

No GPU runs here: each test drives the code path a GPU would take with CPU
tensors, a ``torch.device`` that only names the accelerator, or a fake
``torch.cuda``/``torch.xpu`` namespace that records what was asked of it.
"""

import pytest

torch = pytest.importorskip("torch")


# -- item 9: translator tells the decoder its mask is causal -------------------------


def test_translator_decoder_gets_causal_hint_so_it_never_reads_the_mask_on_the_host(monkeypatch):
    """Without ``tgt_is_causal=True``, nn.TransformerDecoder compares the bool mask
    with a causal one and calls ``bool()`` on the result every forward (a host
    sync per step on a GPU)."""
    from torch.nn.modules import transformer

    from milarun.models.translator import Seq2Seq

    seen = []
    real = transformer._detect_is_causal_mask

    def spy(mask, is_causal=None, size=None):
        if mask is not None:  # the encoder has no mask: nothing to compare, no sync
            seen.append(is_causal)
        return real(mask, is_causal, size)

    monkeypatch.setattr(transformer, "_detect_is_causal_mask", spy)
    net = Seq2Seq(50, 16, 2, 1, 32, 0.0, 0, max_len=20)
    src = torch.randint(1, 50, (3, 7))
    tgt = torch.randint(1, 50, (3, 5))
    out = net(src, tgt)
    assert out.shape == (3, 5, 50)
    assert seen and all(flag is True for flag in seen), seen


def test_translator_causal_hint_gives_the_same_output_as_the_detected_mask():
    """The hint changes how attention is computed, not what it computes."""
    from milarun.models.translator import Seq2Seq

    torch.manual_seed(0)
    net = Seq2Seq(50, 16, 2, 1, 32, 0.0, 0, max_len=20).eval()
    src = torch.randint(1, 50, (2, 6))
    tgt = torch.randint(1, 50, (2, 4))
    tgt[1, 3] = 0  # padding, so the padding mask and the causal mask combine
    with torch.no_grad():
        hinted = net(src, tgt)
        t = net.transformer
        mask = t.generate_square_subsequent_mask(4, dtype=torch.bool)
        ref = (
            t(
                net.embed_pos(src),
                net.embed_pos(tgt),
                tgt_mask=mask,
                src_key_padding_mask=src == 0,
                tgt_key_padding_mask=tgt == 0,
                memory_key_padding_mask=src == 0,
            )
            @ net.embed.weight.t()
        )
    assert torch.allclose(hinted, ref, atol=1e-5)


# -- item 10: fused optimizers, so the fp16 scaler never reads found_inf on the host ---


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_make_optimizer_is_fused_on_cuda_and_xpu_and_default_on_the_cpu(name):
    from milarun.bench.step import make_optimizer

    w = torch.nn.Parameter(torch.zeros(3))  # a CPU tensor: torch 2.13 has CPU fused kernels too
    for kind in ("cuda", "xpu"):
        opt = make_optimizer(name, [w], torch.device(kind), lr=0.1)
        assert opt.defaults["fused"] is True, kind
    assert not make_optimizer(name, [w], torch.device("cpu"), lr=0.1).defaults["fused"]


def _count_items(monkeypatch):
    calls = []
    real = torch.Tensor.item

    def item(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(torch.Tensor, "item", item)
    return calls


@pytest.mark.parametrize("clip", [None, 1.0])
def test_fp16_scaled_step_with_a_fused_optimizer_makes_no_host_sync(monkeypatch, clip):
    """The CPU scaler runs the same GradScaler code as CUDA's: with a fused
    optimizer it never calls ``.item()``; with an ordinary one it calls it every
    step (the sync the fix removes)."""
    from milarun.bench.step import MixedPrecisionStep, make_optimizer

    net = torch.nn.Linear(4, 2)
    mp = MixedPrecisionStep(torch.device("cpu"), "fp32", enabled_scaler=True)
    assert mp.scaler.is_enabled()
    fused = make_optimizer("Adam", net.parameters(), torch.device("cuda"), lr=1e-3)
    plain = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(8, 4)
    counts = {}
    for label, opt in (("fused", fused), ("plain", plain)):
        calls = _count_items(monkeypatch)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            mp(net(x).square().mean(), opt, clip_norm=clip, params=net.parameters())
        counts[label] = len(calls)
        monkeypatch.undo()
    # the plain CPU Adam also reads its step counters; the scaler alone reads one per step
    assert counts["fused"] == 0 and counts["plain"] >= 3, counts


def test_scaler_is_on_for_fp16_on_cuda_and_xpu_only(monkeypatch):
    from milarun.bench.step import MixedPrecisionStep

    asked = []

    class Scaler:
        def __init__(self, device_type, enabled):
            asked.append((device_type, enabled))

    monkeypatch.setattr(torch.amp, "GradScaler", Scaler)
    for kind in ("cuda", "xpu", "cpu"):
        for precision in ("fp32", "tf32", "fp16", "bf16"):
            MixedPrecisionStep(torch.device(kind), precision)
    on = {
        (kind, p)
        for (kind, enabled), p in zip(asked, ["fp32", "tf32", "fp16", "bf16"] * 3)
        if enabled
    }
    assert on == {("cuda", "fp16"), ("xpu", "fp16")}


def test_no_workload_builds_an_optimizer_or_a_scaler_by_hand():
    """Every optimizer comes from make_optimizer (fused where it can be) and every
    scaled step from MixedPrecisionStep."""
    import ast
    import pathlib

    import milarun.models

    offenders = []
    for path in sorted(pathlib.Path(milarun.models.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                text = ast.unparse(node.func)
                if (
                    (text.startswith("torch.optim.") and "lr_scheduler" not in text)
                    or text.endswith("GradScaler")
                    or text == "grad_scaler"
                    or text.startswith("scaler.")
                ):
                    offenders.append(f"{path.name}:{node.lineno}: {text}")
    assert not offenders, offenders


# -- item 11: infer double-buffers its copies and waits for no stream -----------------


class FakeAccel:
    """A fake ``torch.cuda``: streams, events and the current stream, with a log.

    An event completes when the test says so (``finish``), so the test decides how
    far the "device" has got.
    """

    def __init__(self):
        self.log = []
        self.current = "default"
        self.events = []
        api = self

        class Stream:
            def __init__(self, device=None):
                self.name = f"stream{len([e for e in api.log if e[0] == 'stream'])}"
                api.log.append(("stream", self.name))

            def wait_event(self, ev):
                api.log.append(("wait_event", self.name, ev.id))

            def synchronize(self):
                api.log.append(("stream.synchronize", self.name))

        class Event:
            def __init__(self, **kw):
                self.id = len(api.events)
                self.done = False
                api.events.append(self)

            def record(self, stream=None):
                api.log.append(("record", self.id, stream.name))

            def query(self):
                return self.done

            def synchronize(self):
                api.log.append(("event.synchronize", self.id))
                self.done = True

        self.Stream, self.Event = Stream, Event

    def stream(self, s):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            prev, self.current = self.current, s.name
            try:
                yield
            finally:
                self.current = prev

        return ctx()


class FakeBatch:
    def __init__(self, n, api, tag):
        self.n, self.api, self.tag = n, api, tag

    def __len__(self):
        return self.n

    def to(self, device, non_blocking=False):
        self.api.log.append(("copy", self.tag, self.api.current, non_blocking))
        return self


def _pipeline(api):
    from milarun.models.infer import Pipeline

    def model(x):
        api.log.append(("infer", x.tag, api.current))

    return Pipeline(api, "cuda:0", model, lambda xd: xd)


def test_pipeline_copies_on_one_stream_computes_on_another_and_never_waits_per_batch():
    api = FakeAccel()
    pipe = _pipeline(api)
    copy_s, compute_s = pipe.copy_stream.name, pipe.compute_stream.name
    assert copy_s != compute_s
    pipe.submit(FakeBatch(4, api, "a"))
    pipe.submit(FakeBatch(4, api, "b"))
    # both batches queued without any wait on the host
    assert not [e for e in api.log if "synchronize" in e[0]]
    assert ("copy", "a", copy_s, True) in api.log and ("copy", "b", copy_s, True) in api.log
    assert ("infer", "a", compute_s) in api.log and ("infer", "b", compute_s) in api.log
    # the compute stream waits, on the device, for each batch's copy event
    copied = [e[1] for e in api.log if e[0] == "record" and e[2] == copy_s]
    assert [e[2] for e in api.log if e[0] == "wait_event"] == copied
    assert pipe.finished() == 0 and len(pipe) == 2  # nothing done yet, nothing waited for
    api.events[1].done = True  # a's done event (events: a copied, a done, b copied, b done)
    assert pipe.finished() == 4 and len(pipe) == 1
    assert pipe.finished(block=True) == 4 and len(pipe) == 0
    assert [e for e in api.log if e[0] == "event.synchronize"] == [("event.synchronize", 3)]


def test_run_pipeline_keeps_two_batches_in_flight_and_reports_every_item():
    import queue

    from milarun.models.infer import PIPELINE_DEPTH, run_pipeline

    api = FakeAccel()
    pipe = _pipeline(api)
    inputs = queue.Queue()
    for i in range(5):
        inputs.put(FakeBatch(3, api, i))
    inputs.put(None)
    most = []
    real_submit = pipe.submit

    def submit(x):
        real_submit(x)
        most.append(len(pipe))

    pipe.submit = submit
    reported = []
    run_pipeline(pipe, inputs, reported.append)
    assert sum(reported) == 15
    assert max(most) == PIPELINE_DEPTH == 2
    assert not [e for e in api.log if e[0] == "stream.synchronize"]
    # the copy of batch i+1 is queued before the host waits for batch i
    log = [e for e in api.log if e[0] in ("copy", "event.synchronize")]
    assert log[:3] == [
        ("copy", 0, pipe.copy_stream.name, True),
        ("copy", 1, pipe.copy_stream.name, True),
        ("event.synchronize", 1),
    ]


def test_infer_prepares_inputs_in_the_inference_dtype_and_channels_last():
    from milarun.models.infer import Cast, _prepare, use_channels_last

    x = torch.randn(2, 3, 8, 8)
    half = Cast(torch.bfloat16)(x)
    assert half.dtype == torch.bfloat16
    y = _prepare(half, torch.bfloat16, torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert _prepare(torch.arange(4), torch.float16, None).dtype == torch.int64  # token ids
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert use_channels_last("resnet50", "fp16", gpu)
    assert use_channels_last("resnet50", "bf16", torch.device("xpu"))
    assert not use_channels_last("resnet50", "fp32", gpu)
    assert not use_channels_last("encoder", "fp16", gpu)
    assert not use_channels_last("resnet50", "fp16", cpu)


# -- item 2: Intel XPU is timed by its own events, or refused with one line ----------


class FakeXpuModule:
    """What milarun asks of ``torch.xpu``: events, synchronize, device_count."""

    def __init__(self, count=2):
        self.log = []
        self.count = count
        mod = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = len(mod.log)

            def record(self, stream=None):
                mod.log.append("record")

            def query(self):
                return True

            def synchronize(self):
                mod.log.append("event.synchronize")

            def elapsed_time(self, end):  # milliseconds, as torch's events
                return 250.0

        self.Event = Event

    def synchronize(self, device=None):
        self.log.append(("synchronize", str(device)))

    def device_count(self):
        return self.count


def test_rate_logger_times_xpu_windows_with_xpu_events_and_syncs_a_bare_run(monkeypatch):
    from milarun.bench import device as devices
    from milarun.bench.rate import CudaEventTimer, PerfCounterTimer

    fake = FakeXpuModule()
    monkeypatch.setattr(torch, "xpu", fake, raising=False)
    timer = devices.event_timer(torch.device("xpu", 0))
    assert isinstance(timer, devices.XpuEventTimer)
    a, b = timer.mark(), timer.mark()
    assert timer.elapsed(a, b) == 0.25  # seconds
    assert fake.log == ["record", "record", "event.synchronize"]
    assert isinstance(devices.event_timer(torch.device("cuda", 0)), CudaEventTimer)
    assert isinstance(devices.event_timer(torch.device("cpu")), PerfCounterTimer)
    devices.sync_function(torch.device("xpu", 1))()
    assert fake.log[-1] == ("synchronize", "xpu:1")
    assert devices.sync_function(torch.device("cpu")) is None
    assert devices.module(torch.device("xpu", 1)) is fake
    assert devices.module(torch.device("cuda", 0)) is torch.cuda
    assert devices.module(torch.device("cpu")) is None and devices.module(None) is None


def test_rate_logger_of_an_xpu_experiment_gets_the_xpu_timer(monkeypatch):
    """Before: only "cuda" got an event timer, so XPU windows timed the queueing."""
    from milarun.bench import loop
    from milarun.bench.device import XpuEventTimer

    monkeypatch.setattr(torch, "xpu", FakeXpuModule(), raising=False)

    class Exp:
        device = torch.device("xpu", 0)
        origin = 0.0
        options = {
            "profile_trace": None,
            "no_instrument": False,
            "max_count": 10,
            "sample_duration": 1.0,
            "warmup": 1,
            "min_steady": 0,
        }

        def attach_rate(self, logger):
            self.rate = logger

        def start_monitor(self):
            pass

    exp = Exp()
    loop.rate_logger(exp)
    assert isinstance(exp.rate.timer, XpuEventTimer)
    exp.options = {**exp.options, "no_instrument": True}
    loop.rate_logger(exp)
    exp.rate._sync()
    assert torch.xpu.log[-1] == ("synchronize", "xpu:0")


def test_matmul_times_xpu_matmuls_with_xpu_events(monkeypatch):
    from milarun.models.matmul import AUTO_PRECISIONS, _Timings

    fake = FakeXpuModule()
    monkeypatch.setattr(torch, "xpu", fake, raising=False)
    t = _Timings(torch.device("xpu", 0))
    start = t.start()
    t.stop("bf16", start, True)
    t.drain()
    assert t.count["bf16"] == 1 and t.seconds["bf16"] == 0.25
    assert "record" in fake.log
    assert AUTO_PRECISIONS["xpu"] == "fp32,fp16,bf16"


def test_infer_runs_on_every_xpu_the_process_sees(monkeypatch):
    """Before: an XPU process ran its inference on CPU threads."""
    from milarun.models.infer import own_devices

    monkeypatch.setattr(torch, "xpu", FakeXpuModule(), raising=False)

    class Exp:
        device = torch.device("xpu")
        result = {"devices": [0]}

    assert own_devices(Exp()) == [torch.device("xpu", 0), torch.device("xpu", 1)]


@pytest.mark.parametrize(
    "module,argv",
    [
        ("ddp_convnet", ["--batch-size", "2"]),
        ("scaling", ["--batch-size", "2"]),
        ("lightning_convnet", ["--batch-size", "2"]),
    ],
)
def test_workloads_not_wired_for_xpu_refuse_it_in_one_line(module, argv, monkeypatch, tmp_path):
    """Never a record that says xpu for work done on the CPU (or on xpu:0 by every rank)."""
    import importlib

    from conftest import run_model

    mod = importlib.import_module(f"milarun.models.{module}")

    def fake_init(exp):
        exp.device = torch.device("xpu")
        exp.result["host"]["device_type"] = "xpu"
        return exp.device

    monkeypatch.setattr(mod, "init_torch", fake_init)
    res = run_model(f"milarun.models.{module}:main", argv, tmp_path=tmp_path)
    assert res["success"] is False
    assert res["error"]["reason"] == "wrong-device"
    message = res["error"]["message"]
    assert message.startswith(f"{module} does not run on an Intel XPU: ") and "\n" not in message
