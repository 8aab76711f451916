"""The plots of an experiment (privdl.experiment.plot): series told apart by colour, style and marker, human
labels and the privacy caption; one figure per task where a sweep mixes tasks.
"""

import pytest

from privdl.experiment import run_experiment
from tests.test_experiment import load_config_text

def test_plots_are_readable_at_a_glance():
    """Series differ in colour, line style and marker; a series on top of another says so; reference lines never
    take a series' colour; labels are human names; the caption is written."""
    import matplotlib.colors as mcolors

    from privdl.experiment.plot import figure, label

    series = [("ε=1", [1, 2, 3], [1.0, 2.0, 3.0], None), ("ε=10", [1, 2, 3], [1.0, 2.0, 3.0], None),
              ("ε=100", [1, 2, 3], [3.0, 2.0, 1.0], None)]
    fig = figure(series, xlabel=label("mechanism.epsilon"), ylabel=label("test_accuracy"), title="t",
                 references=[("non-private", 2.5, 0.1)], caption="privacy: agent-level, δ = 1e-05")
    ax = fig.axes[0]
    lines = ax.get_lines()
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in lines[:3]}
    assert len(styles) == 3
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ε=10 (coincides with ε=1)" in texts and "ε=100" in texts
    ref = lines[3]
    assert all(mcolors.to_hex(ref.get_color()) != mcolors.to_hex(ln.get_color()) for ln in lines[:3])
    assert ax.get_xlabel() == "ε" and ax.get_ylabel() == "test accuracy"
    assert any("δ = 1e-05" in t.get_text() for t in fig.texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.slow
def test_experiment_plots_split_by_task_and_carry_the_privacy_caption(tmp_path):
    from privdl.experiment.plot import plot_experiment, privacy_caption

    cfg = load_config_text(
        'iterations = 20\neval_every = 10\nseeds = 2\n[network]\ntopology = "ring"\nn = 4\n[mechanism]\nclip = 1.0\n'
        'delta = 1e-5\n[sweep]\n"mechanism.name" = ["none", "gaussian_ldp"]\n"mechanism.epsilon" = [10.0, 100.0, 30.0]\n'
        '[[sweep.task]]\nlabel = "quadratic"\ntask = { name = "quadratic" }\nschedule = { name = "constant", eta = 0.01 }\n'
        '[[sweep.task]]\nlabel = "logistic"\ntask = { name = "logistic", dataset = "breast_cancer", batch_size = 8 }\n'
        'schedule = { name = "constant", eta = 0.1 }\n', tmp_path)
    run_experiment(cfg, tmp_path / "o", progress=False)
    files = {p.name for p in plot_experiment(tmp_path / "o")}
    assert "quadratic_consensus_distance_vs_iteration.png" in files
    assert "logistic_consensus_distance_vs_iteration.png" in files
    assert not any(f.startswith("consensus") for f in files)  # no axis mixes the two tasks
    cap = privacy_caption(tmp_path / "o")
    assert "agent-level" in cap and "δ = 1e-05" in cap and "accountant" in cap and "mechanism none" in cap
