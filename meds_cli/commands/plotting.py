"""Matplotlib for the commands that write figures (ablate report, cluster inspect)."""


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, imported on first use: matplotlib is slow to
    import and only the commands that draw need it."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    return plt
