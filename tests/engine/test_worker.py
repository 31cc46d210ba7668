"""The worker base: commands in order, a clean stop, a fatal error reported, retry alone."""

from __future__ import annotations

import threading

import pytest

from streamtts.engine.worker import Worker, each_alone


class Recorder(Worker[str]):
    def __init__(self, *, inline: bool = False) -> None:
        self.seen: list[str] = []
        self.fatal: list[BaseException] = []
        self.failed_all: list[BaseException] = []
        super().__init__("recorder", self.fatal.append, inline=inline)

    def run(self) -> None:
        while (commands := self.take(block=True)) is not None:
            for command in commands:
                if command == "die":
                    raise RuntimeError("the loop broke")
                self.seen.append(command)

    def fail_all(self, exc: BaseException) -> None:
        self.failed_all.append(exc)


def test_commands_before_a_stop_are_all_taken() -> None:
    worker = Recorder()
    for command in ("a", "b", "c"):
        worker.post(command)
    worker.start()
    worker.stop()
    assert worker.seen == ["a", "b", "c"] and not worker.is_alive() and not worker.fatal


def test_an_exception_out_of_the_loop_is_fatal_and_reported() -> None:
    worker = Recorder()
    worker.start()
    worker.post("die")
    worker._thread.join(timeout=5)
    assert not worker.is_alive()
    assert (
        [str(e) for e in worker.fatal] == ["the loop broke"] == [str(e) for e in worker.failed_all]
    )


def test_an_inline_worker_has_no_thread() -> None:
    worker = Recorder(inline=True)
    worker.start()
    assert worker.is_alive() and "recorder" not in {t.name for t in threading.enumerate()}
    worker.post("x")
    assert worker.take(block=False) == ["x"] and worker.take(block=False) == []
    worker.stop()
    assert not worker.is_alive()


@pytest.mark.parametrize(("items", "bad"), [([1, 2, 3], {2}), ([1], {1}), ([1, 2], set())])
def test_each_alone_fails_only_the_items_that_fail_alone(items: list[int], bad: set[int]) -> None:
    runs: list[list[int]] = []
    failed: list[int] = []

    def run(batch: object) -> None:
        batch = list(batch)  # type: ignore[call-overload]
        runs.append(batch)
        if bad & set(batch):
            raise ValueError("bad item in batch")

    each_alone(items, run, lambda item, exc: failed.append(item))
    assert failed == sorted(bad)
    if not bad:
        assert runs == [items]
    elif len(items) > 1:
        assert runs == [items] + [[i] for i in items]  # the batch, then each alone
    else:
        assert runs == [items]  # a single item is not retried
