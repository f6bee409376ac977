"""The eval plots read on their own: a title (model, gen length, samples), an accuracy axis fitted
to the data, every marker in the legend, the coupling caption, AR points inside the frame and
labelled as AR."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from dllm_decode.eval.harness import plots  # noqa: E402


def point(acc, answer, canvas, **params):
    return {"mean_accuracy": acc, "answer_tokens_per_step": answer, "tokens_per_step": canvas, "params": params}


def cell(task, group, label, model, acc, answer, **params):
    return {"task": task, "group": group, "label": label, "model": model, "accuracy": acc,
            "answer_tokens_per_step": answer, "tokens_per_step": answer * 8, "params": params,
            "swept": list(params)}


@pytest.fixture()
def summary():
    ar = "ar:ar_target+ar_draft"
    return {
        "model": f"{ar}, embedded", "num_samples": 48, "gen_lengths": [32],
        "leaderboard": [
            {"label": "embedded threshold", "model": "embedded", "swept": ["threshold"],
             "points": [point(97.0, 2.7, 19.0, threshold=0.9), point(84.0, 2.9, 21.0, threshold=0.5)]},
            {"label": f"{ar} threshold", "model": ar, "swept": [], "points": [point(99.0, 3.2, 3.9)]},
        ],
        "oracle": [{"label": "embedded threshold", "group": "g1", "model": "embedded", "mean_accuracy": 98.0,
                    "answer_tokens_per_step": 2.8, "tokens_per_step": 20.0,
                    "tasks": {"copy": {"accuracy": 100.0, "answer_tokens_per_step": 3.0}}}],
        "results": [cell("copy", "g1", "embedded threshold", "embedded", 100.0, 3.0, threshold=0.9),
                    cell("shuffle", "g1", "embedded threshold", "embedded", 80.0, 1.0, threshold=0.9),
                    cell("copy", "g2", f"{ar} threshold", ar, 100.0, 3.5),
                    cell("shuffle", "g2", f"{ar} threshold", ar, 95.0, 3.4)],
        "tasks": {"copy": {"total_correlation_bits": 0.0}, "shuffle": {"total_correlation_bits": 3.65}},
    }


def _legend_texts(fig):
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    for ax in fig.axes:
        if ax.get_legend() is not None:
            texts += [t.get_text() for t in ax.get_legend().get_texts()]
    return texts


def test_the_overall_figure_is_titled_ranged_and_fully_labelled(summary):
    fig = plots.overall_figure(summary)
    assert fig._suptitle.get_text() == "ar:ar_target+ar_draft, embedded · gen 32 · 48 samples"
    answer_ax = fig.axes[0]
    low, high = answer_ax.get_ylim()
    assert 75 < low < 84 and 99 < high <= 103            # fitted to 84-99, not 0-100
    assert answer_ax.get_xlim()[1] > 3.2                 # the AR point sits inside the frame
    texts = _legend_texts(fig)
    assert "AR ar_target+ar_draft (draft length: threshold)" in texts
    assert any(t.startswith("oracle: best point per sample") for t in texts)
    assert "embedded threshold" in texts
    plots._pyplot().close(fig)


def test_the_per_task_grid_explains_coupling_and_keeps_every_marker(summary):
    fig = plots.per_task_figure(summary)
    assert "accuracy per task" in fig._suptitle.get_text() and "48 samples" in fig._suptitle.get_text()
    captions = [t.get_text() for t in fig.texts]
    assert any(c.startswith("C = the task's conditional total correlation") for c in captions)
    assert {ax.get_title() for ax in fig.axes[:2]} == {"copy  (C=0.00 bits)", "shuffle  (C=3.65 bits)"}
    texts = _legend_texts(fig)
    assert any(t.startswith("oracle: best point per sample") for t in texts)
    assert "AR ar_target+ar_draft (draft length: threshold)" in texts
    shuffle = next(ax for ax in fig.axes if ax.get_title().startswith("shuffle"))
    assert shuffle.get_xlim()[1] > 3.4 and shuffle.get_ylim()[0] > 60
    plots._pyplot().close(fig)


@pytest.mark.parametrize("values, lo, hi", [([90, 100], 89.5, 100.5), ([50], 44.5, 55.5), ([], -3, 103), ([0, 100], -3, 103)])
def test_accuracy_limits(values, lo, hi):
    assert plots.accuracy_limits(values) == pytest.approx((lo, hi))


def test_plot_summary_writes_both_files(summary, tmp_path):
    paths = plots.plot_summary(summary, tmp_path)
    assert [p.name for p in paths] == [plots.OVERALL, plots.PER_TASK] and all(p.stat().st_size > 10_000 for p in paths)


def test_point_labels_never_overlap_and_no_tick_passes_100(summary):
    """Many sweep points close together (a threshold sweep on one task): every drawn label is
    clear of the others, and a 100% panel's axis stops its ticks at 100."""
    crowd = [cell("copy", "g1", "embedded threshold", "embedded", 100.0 - 0.2 * i, 2.0 + 0.02 * i,
                  threshold=round(0.5 + 0.05 * i, 2)) for i in range(9)]
    summary = {**summary, "results": crowd, "oracle": []}
    fig = plots.per_task_figure(summary)
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) >= 3
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert max(ax.get_yticks()) <= 100 and ax.get_ylim()[1] > 100
    plots._pyplot().close(fig)
