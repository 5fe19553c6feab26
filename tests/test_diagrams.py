"""Diagrams drawn by notebooks/diagrams.py."""
import diagrams


def test_parameter_server_diagram_draws_every_box_and_both_directions():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    fig, ax = plt.subplots()
    diagrams.draw_parameter_servers(ax, workers=3, servers=2)
    kinds = [type(p) for p in ax.patches]
    assert kinds.count(FancyBboxPatch) == 3 + 2  # workers and servers
    assert kinds.count(FancyArrowPatch) == 2 * 3 * 2  # a push and a pull per pair
    assert sorted(t.get_text() for t in ax.texts)[:2] == ['server 0\nshard 0', 'server 1\nshard 1']
    plt.close(fig)


def test_zero_diagram_draws_every_worker_its_shard_and_both_collectives():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    fig, ax = plt.subplots()
    diagrams.draw_zero(ax, workers=3, pushed=0, pulled=2)
    kinds = [type(p) for p in ax.patches]
    assert kinds.count(FancyBboxPatch) == 2 * 3  # a worker and its shard's server each
    assert kinds.count(FancyArrowPatch) == 2 * (3 - 1)  # the push and the pull of one shard
    texts = [t.get_text() for t in ax.texts]
    assert [f'server of\nshard {w}' in texts for w in range(3)] == [True] * 3
    assert any('reduce-scatter' in t and 'shard 0' in t for t in texts)
    assert any('all-gather' in t and 'shard 2' in t for t in texts)
    plt.close(fig)


def test_data_parallel_mlp_and_timeline_draw_what_they_are_given():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    fig, (top, bottom) = plt.subplots(2)
    diagrams.draw_data_parallel_mlp(top)
    kinds = [type(p) for p in top.patches]
    assert kinds.count(FancyBboxPatch) == 2 + 2 * 6   # two CPU steps, six steps per GPU
    assert kinds.count(FancyArrowPatch) == 1 + 2 * 6 + 2  # CPU, each lane, the exchange
    diagrams.draw_timeline(bottom, {'compute': [(0, 2), (3, 2)], 'copy': [(2, 1)]}, marks=[0, 3])
    assert [t.get_text() for t in bottom.get_yticklabels()] == ['copy', 'compute']
    assert len(bottom.collections) == 2 and len(bottom.lines) == 2
    plt.close(fig)


def test_ring_diagram_draws_each_process_and_an_arrow_to_its_right():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyArrowPatch
    fig, ax = plt.subplots()
    diagrams.draw_ring(ax, n=5)
    kinds = [type(p) for p in ax.patches]
    assert kinds.count(Circle) == 5 and kinds.count(FancyArrowPatch) == 5
    assert sorted(t.get_text() for t in ax.texts) == ['0', '1', '2', '3', '4']
    assert 'n=5' in ax.get_title()
    plt.close(fig)


def test_pipeline_schedule_and_mesh_draw_every_stage_and_rank():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    fig, (top, bottom) = plt.subplots(2)
    events = [[(0.0, 0.001, 'F'), (0.002, 0.004, 'B')], [(0.001, 0.002, 'F'), (0.002, 0.003, 'B')]]
    diagrams.draw_pipeline_schedule(top, events, title='m=1')
    assert [t.get_text() for t in top.get_yticklabels()] == ['stage 0', 'stage 1']
    assert len(top.collections) == 4 and top.get_title() == 'm=1'  # F and B per stage
    assert top.get_ylim()[0] > top.get_ylim()[1]  # stage 0 on top
    diagrams.draw_mesh(bottom, 2, 3)
    boxes = [p for p in bottom.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 6 and len(bottom.lines) == 2 * 2 + 3  # tp links per row, dp per column
    assert sum('rank' in t.get_text() for t in bottom.texts) == 6
    plt.close(fig)
