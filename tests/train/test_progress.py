"""The progress bar and the summary table agree: epochs count from 1, the last is N of N; the
bar shows the job's totals, also to an asynchronous worker that does more than its share of
the budget (a parameter server's: --epochs 2 with 4 workers showed "epoch 2/8")."""

from __future__ import annotations

import pytest

from disttrain.train.progress import ProgressBar, print_summary


def test_the_bar_ends_at_the_last_epoch_counted_from_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = ProgressBar(20, enabled=True, epochs=2)
    for step in range(1, 21):
        bar.update(step, (step - 1) // 10, 0.5, 100.0)  # the loop's epoch index: 0, then 1
    bar.close()
    err = capsys.readouterr().err
    assert "epoch 2/2" in err and "step 20/20" in err, err
    assert "epoch 1/2" not in err.splitlines()[-1]


def test_the_table_shows_test_and_train_loss_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    summary = {
        "strategy": "allreduce",
        "world_size": 2,
        "epochs": 2,
        "final_test_loss": 0.25,
        "final_train_loss": 0.125,
        "time_breakdown": {},
    }
    print_summary(summary, "out")
    out = capsys.readouterr().out
    assert "final_test_loss" in out and "0.2500" in out
    assert "final_train_loss" in out and "0.1250" in out
    assert "final_loss " not in out


def test_the_bar_stops_at_the_job_s_epochs_and_steps() -> None:
    bar = ProgressBar(total_steps=44, enabled=True, epochs=2)
    try:
        bar.update(step=60, epoch=5, loss=1.0, samples_per_second=10.0)
        assert bar._progress is not None
        task = bar._progress.tasks[0]
        assert (task.completed, task.total, task.fields["epoch"], task.fields["epochs"]) == (
            44,
            44,
            2,
            2,
        )
    finally:
        bar.close()


def test_rates_and_times_read_to_a_tenth_whatever_their_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """969.6192 and 7,002 samples/s were both shown: one rule for the column now."""
    for rate, shown in ((969.6192, "969.6"), (7002.31, "7,002.3")):
        summary = {
            "strategy": "allreduce",
            "world_size": 2,
            "samples_per_second": rate,
            "time_breakdown": {},
        }
        print_summary(summary, "out")
        assert f" {shown} " in capsys.readouterr().out
