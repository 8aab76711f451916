"""What a sweep reports while it runs without a terminal: plain progress lines with the count of runs, the time
elapsed and an estimate of the time left weighted by each run's cost (rounds × agents).
"""

from privdl.experiment import run_experiment
from tests.test_experiment import load_config_text

def test_progress_lines_for_logs_count_runs_and_estimate_the_time_left(tmp_path):
    """Without a terminal the runner reports plain lines: the count, the elapsed time and (while runs are left) an
    estimate of the time left."""
    import privdl.experiment.runner as runner

    cfg = load_config_text('iterations = 5\nseeds = 3\nbatch_replicas = 1\n[network]\ntopology = "ring"\nn = 4\n'
                           '[task]\nname = "quadratic"\n[schedule]\nname = "constant"\neta = 0.01\n', tmp_path)
    lines: list[str] = []
    old = runner.Lines.__init__.__defaults__
    runner.Lines.__init__.__defaults__ = (0.0,)  # a line after every run
    try:
        run_experiment(cfg, tmp_path / "o", progress=lines.append)
    finally:
        runner.Lines.__init__.__defaults__ = old
    assert lines[0].endswith("3 runs, 0 already done")
    counts = [ln.split(": ")[1].split(" runs")[0] for ln in lines[1:]]
    assert counts == sorted(counts) and list(dict.fromkeys(counts)) == ["0/3", "1/3", "2/3", "3/3"]
    # before the first run ends, the estimate already counts the rounds measured (a long stacked batch is not
    # silent until it finishes)
    assert "left" in lines[1] and counts[0] == "0/3"
    assert "left" not in lines[-1]
    lines.clear()
    run_experiment(cfg, tmp_path / "o", progress=lines.append)  # resumed: all done
    assert lines == ["experiment: 3 runs, 3 already done"]


def test_the_time_left_weights_runs_by_rounds_and_agents():
    """A sweep that finishes a cheap run first (a central run: one agent) is not promised an early end: the
    estimate scales the time spent by the cost left over the cost done (rounds × agents), not by run counts."""
    import privdl.experiment.runner as runner
    from privdl.experiment.config import RunSpec

    specs = [RunSpec("central", {"iterations": 100, "network": {"n": 1}}, {}),
             *[RunSpec(f"d{k}", {"iterations": 100, "network": {"n": 10}}, {}) for k in range(3)]]
    said: list[str] = []
    lines = runner.Lines("t", {s.run_id: runner.run_cost(s.config) for s in specs}, set(), said.append,
                          every=0.0)
    lines.start -= 10.0  # the central run took 10 s
    lines.update({"central"})
    assert said[-1].startswith("t: 1/4 runs done, 10s elapsed, ≈ 5m00s left")  # 3 × 10 agents at 10 s per agent
    lines.update({"central", "d0", "d1", "d2"})
    assert "left" not in said[-1] and "4/4" in said[-1]
