"""metrics.jsonl's writer: the last step with a training line, also across a takeover."""

from __future__ import annotations

from pathlib import Path

from disttrain.train.metrics import MetricsWriter


def test_a_writer_that_takes_over_knows_the_last_step_line_in_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "metrics.jsonl")
    first = MetricsWriter(path)
    first.write(step=1, loss=0.9)
    first.write(step=2, loss=0.8)
    first.write(step=2, epoch=0, test_loss=0.7)  # an evaluation line is no step line
    first.write(event="membership", step=3, lost=[0])
    assert first.last_step == 2
    first.close()
    with open(path, "a") as fh:
        fh.write('{"step": 3, "loss"')  # a line cut by a crash is skipped, not fatal
    # the new rank 0 after a membership change appends: it must not write step 2 again
    taken = MetricsWriter(path, append=True)
    assert taken.last_step == 2
    taken.write(step=3, loss=0.6)
    assert taken.last_step == 3
    taken.close()
    lines = Path(path).read_text().splitlines()
    assert lines[-2:] == ['{"step": 3, "loss"', '{"step": 3, "loss": 0.6}']  # on its own line
