"""GPU paths of the workloads checked on CPU torch and fakes (issue 22, items 2, 9, 10, 11).

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

    from milarun.models.translator import _model_class

    seen = []
    real = transformer._detect_is_causal_mask

    def spy(mask, is_causal=None, size=None):
        if mask is not None:   # the encoder has no mask: nothing to compare, no sync
            seen.append(is_causal)
        return real(mask, is_causal, size)

    monkeypatch.setattr(transformer, "_detect_is_causal_mask", spy)
    net = _model_class(torch)(50, 16, 2, 1, 32, 0.0, 0, max_len=20)
    src = torch.randint(1, 50, (3, 7))
    tgt = torch.randint(1, 50, (3, 5))
    out = net(src, tgt)
    assert out.shape == (3, 5, 50)
    assert seen and all(flag is True for flag in seen), seen


def test_translator_causal_hint_gives_the_same_output_as_the_detected_mask():
    """The hint changes how attention is computed, not what it computes."""
    from milarun.models.translator import _model_class

    torch.manual_seed(0)
    net = _model_class(torch)(50, 16, 2, 1, 32, 0.0, 0, max_len=20).eval()
    src = torch.randint(1, 50, (2, 6))
    tgt = torch.randint(1, 50, (2, 4))
    tgt[1, 3] = 0   # padding, so the padding mask and the causal mask combine
    with torch.no_grad():
        hinted = net(src, tgt)
        t = net.transformer
        mask = t.generate_square_subsequent_mask(4, dtype=torch.bool)
        ref = t(net.embed_pos(src), net.embed_pos(tgt), tgt_mask=mask,
                src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0,
                memory_key_padding_mask=src == 0) @ net.embed.weight.t()
    assert torch.allclose(hinted, ref, atol=1e-5)
