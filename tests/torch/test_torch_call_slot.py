"""Wrappers chained in a module's ``_compiled_call_impl`` slot (``_call_slot``): real
torch modules, the wrappers otelgpu puts there taken out in any order, a foreign callable
(what ``module.compile()`` puts there) ending the chain."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import torch  # the test command installs it: a missing torch must fail, not skip

from otelgpu.instrumentation.torch import _call_slot as call_slot


def test_the_installed_torch_has_the_call_slot() -> None:
    """The pinned torch has the slot and drops it from the pickled state (where it did
    not, the roots would get forward hooks instead, and the tests below would fail)."""
    assert call_slot.has_slot()


def _tagging(log: list[str], tag: str, module: torch.nn.Module) -> Callable[..., Any]:
    def make(box: call_slot.Box) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            log.append(tag)
            inner = box[0]
            if inner is not None:
                return inner(*args, **kwargs)
            return module._call_impl(*args, **kwargs)

        return call

    return make


def test_linked_wrappers_run_outermost_first_and_leave_in_any_order() -> None:
    x = torch.randn(2, 4)
    for order in itertools.permutations(range(3)):
        net = torch.nn.Linear(4, 3)
        expected = net(x)
        log: list[str] = []
        calls = [call_slot.link(net, _tagging(log, f"w{i}", net)) for i in range(3)]
        assert torch.equal(net(x), expected)
        assert log == ["w2", "w1", "w0"]  # the last linked is the outermost
        assert not net._forward_pre_hooks  # the fast call path: no hooks
        for n, i in enumerate(order):
            assert call_slot.unlink(net, calls[i])
            assert not call_slot.linked(net, calls[i])
            log.clear()
            assert torch.equal(net(x), expected)
            assert log == [f"w{j}" for j in (2, 1, 0) if j not in order[: n + 1]]
        assert "_compiled_call_impl" not in vars(net)  # back to the class's None


def test_a_foreign_callable_ends_the_chain_and_is_handed_back() -> None:
    net = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    log: list[str] = []
    ours = call_slot.link(net, _tagging(log, "ours", net))
    theirs_calls: list[int] = []

    def theirs(*args: Any, **kwargs: Any) -> Any:  # module.compile() puts a call here
        theirs_calls.append(1)
        return net._call_impl(*args, **kwargs)

    net._compiled_call_impl = theirs
    assert not call_slot.linked(net, ours)
    assert not call_slot.unlink(net, ours)  # dropped already: nothing to take out
    again = call_slot.link(net, _tagging(log, "again", net))  # wrapped on top of theirs
    net(x)
    assert log == ["again"] and theirs_calls == [1]
    assert call_slot.unlink(net, again)
    assert vars(net)["_compiled_call_impl"] is theirs


def test_copies_and_pickles_leave_the_chain_behind() -> None:
    import io

    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    log: list[str] = []
    call_slot.link(net, _tagging(log, "a", net))
    call_slot.link(net, _tagging(log, "b", net))
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    for other in (copy.deepcopy(net), torch.load(buf, weights_only=False)):
        assert "_compiled_call_impl" not in vars(other)
        other(torch.randn(1, 4))
    assert log == []
