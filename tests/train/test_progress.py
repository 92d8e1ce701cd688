"""The progress bar shows the job's totals, also to an asynchronous worker that does more
than its share of the budget (a parameter server's: --epochs 2 with 4 workers showed
"epoch 2/8", and a step count past the total)."""

from __future__ import annotations

from disttrain.train.progress import ProgressBar


def test_the_bar_stops_at_the_job_s_epochs_and_steps() -> None:
    bar = ProgressBar(total_steps=44, enabled=True, epochs=2)
    try:
        bar.update(step=60, epoch=5, loss=1.0, samples_per_second=10.0)
        assert bar._progress is not None
        task = bar._progress.tasks[0]
        assert (task.completed, task.total, task.fields["epoch"], task.fields["epochs"]) == (
            44, 44, 2, 2,
        )  # fmt: skip
    finally:
        bar.close()
