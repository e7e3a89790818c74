"""TRAIN.COMPILE (common/compile.py): the compiled forward computes what the eager one does; a failing
compile falls back to eager mode with one warning, through the real entry point."""
import logging
from types import SimpleNamespace

import torch

from common.compile import compile_forward
from common.modeling.nlp.modeling import BertEncoder, attention_bias
from tests.tiny_vcr import checkpoint, log_text, train_in_process

CONFIG = SimpleNamespace(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                         hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@torch._dynamo.register_backend(name="failing_for_test")
def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no compiler here")


def _encoder_step(encoder, hidden, bias):
    x = hidden.clone().requires_grad_(True)
    out = encoder(x, bias, output_all_encoded_layers=False)[-1]
    out.pow(2).sum().backward()
    return out.detach(), x.grad


def test_compiled_forward_gives_the_eager_outputs_and_gradients():
    torch.manual_seed(0)
    eager = BertEncoder(CONFIG).train()
    compiled = BertEncoder(CONFIG).train()
    compiled.load_state_dict(eager.state_dict())
    assert compile_forward(compiled, "eager") is compiled
    hidden = torch.randn(3, 7, 16)
    bias = attention_bias(torch.arange(7)[None] < torch.tensor([[7], [4], [2]]))
    (a, grad_a), (b, grad_b) = _encoder_step(eager, hidden, bias), _encoder_step(compiled, hidden, bias)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-5, atol=1e-6)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # keys unchanged: checkpoints load
    assert "forward" in compiled.__dict__ and compile_forward(eager, "") is eager and "forward" not in eager.__dict__


def test_failing_compile_falls_back_to_eager_once(caplog):
    torch.manual_seed(0)
    encoder = BertEncoder(CONFIG).eval()
    hidden, bias = torch.randn(2, 5, 16), attention_bias(torch.ones(2, 5, dtype=torch.bool))
    expected = encoder(hidden, bias)[-1]
    compile_forward(encoder, "failing_for_test")
    with caplog.at_level(logging.WARNING):
        got = encoder(hidden, bias)[-1]
        again = encoder(hidden, bias)[-1]
    assert torch.equal(got, expected) and torch.equal(again, expected)  # exact: eager again, the same computation
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and "TRAIN.COMPILE" in r.getMessage()]
    assert len(warnings) == 1 and "failed, training continues in eager mode" in warnings[0]
    assert "no compiler here" in warnings[0] and "forward" not in encoder.__dict__


def test_training_with_a_failing_compile_equals_eager_training(tmp_path, tiny_vcr):
    runs = {}
    for name, backend in (("eager", ""), ("fallback", "failing_for_test")):
        model_dir = tmp_path / name
        assert train_in_process(model_dir, tiny_vcr.opts(TRAIN__COMPILE=backend)) == 0
        runs[name] = checkpoint(model_dir, 0)["state_dict"]
    assert runs["eager"].keys() == runs["fallback"].keys()
    for key, value in runs["eager"].items():  # exact: both train in eager mode, the same computation
        assert torch.equal(value, runs["fallback"][key]), key
    log = log_text(tmp_path / "fallback")
    assert log.count("torch.compile (backend failing_for_test) failed, training continues in eager mode") == 1
    assert "TRAIN.COMPILE" not in log_text(tmp_path / "eager")
