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
