"""engine/collector.py: no garbage collection inside a step's masks and pick; startup's heap frozen."""

import gc

from engine.collector import freeze_startup, no_collection
from engine.sampling import SamplingParams
from engine_fixtures import run_hooked, tiny_model  # noqa: F401 (fixtures)


def test_the_window_pauses_the_collector_nests_and_restores_it():
    assert gc.isenabled()
    with no_collection():
        assert not gc.isenabled()
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer window is still open
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()  # a collector disabled before stays disabled
    finally:
        gc.enable()


def test_a_collection_due_in_the_masks_runs_after_the_pick(tiny_model, smollm_tokenizer):
    """A logits hook that keeps ~3,000 new container objects per step crosses the young generation's
    threshold (700) at every step: the collection starts after the step's pick, never inside the hook."""
    inside, started_inside, started, kept = [False], [], [], []

    def watch(phase, info):
        if phase == "start":
            started.append(info["generation"])
            started_inside.append(inside[0])

    def hook(logits, seqs):
        inside[0] = True
        kept.extend([i] for i in range(3000))  # tracked lists that outlive the step
        inside[0] = False

    gc.callbacks.append(watch)
    try:
        events = run_hooked(tiny_model, smollm_tokenizer, hook, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    finally:
        gc.callbacks.remove(watch)
    assert events[-1].completion_tokens == 6
    assert started, "the hook's objects should have made collections fall due"
    assert not any(started_inside)


def test_freeze_startup_freezes_what_is_alive():
    try:
        assert freeze_startup() > 1000  # the test process's modules, torch's among them
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
