"""Test double of XTuner's ``autotest/utils/metric_report.py`` (written from the contract only).

``publish_comparison_report`` draws baseline vs current per checked metric into
``<cwd>/<$GITHUB_RUN_ID or 0>/<case_name>_comparison.png`` and appends a Markdown section with the
plot's URL on a public reports branch to ``$GITHUB_STEP_SUMMARY`` (default ``./tmp.md``).
"""

import logging
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

logger = logging.getLogger(__name__)
REPORTS_URL = "https://raw.githubusercontent.com/InternLM/xtuner/e2e-reports"


def _values(rows, metric):
    return [float(row[metric]) for row in rows if metric in row]


def publish_comparison_report(case_name, base_rows, cur_rows, metrics, failed):
    """Write the comparison PNG and the step-summary Markdown; return the PNG path."""
    run_id = os.environ.get("GITHUB_RUN_ID", "0")
    out_dir = os.path.join(os.getcwd(), run_id)
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, f"{case_name}_comparison.png")

    count = max(len(metrics), 1)
    fig, axes = plt.subplots(count, 1, figsize=(8, 2.6 * count), squeeze=False)
    for axis, metric in zip(axes[:, 0], metrics):
        base = _values(base_rows, metric)
        cur = _values(cur_rows, metric)
        axis.plot(range(1, len(base) + 1), base, label="base")
        axis.plot(range(1, len(cur) + 1), cur, label="current")
        axis.set_title(f"{metric}{' (FAILED)' if metric in failed else ''}", fontsize=9)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    logger.info("comparison plot written to %s", png)

    summary = os.environ.get("GITHUB_STEP_SUMMARY", "./tmp.md")
    with open(summary, "a", encoding="utf-8") as handle:
        handle.write(f"\n### {case_name}\n\n")
        handle.write("| metric | result |\n|---|---|\n")
        for metric in metrics:
            handle.write(f"| {metric} | {'FAIL: ' + failed[metric] if metric in failed else 'pass'} |\n")
        handle.write(f"\n![{case_name}]({REPORTS_URL}/{run_id}/{case_name}_comparison.png)\n")
    return png
