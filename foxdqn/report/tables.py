"""The report of a multirun or population folder: every job in one table, seeds aggregated, plots.

``python -m foxdqn.report DIR`` (``make report DIR=...``) and, at the end of every ``--multirun``,
the Hydra callback :class:`foxdqn.cli.callbacks.SweepReport` (registered in conf/train.yaml) write
into the folder DIR:

* ``report.md``: the *settings* table (jobs whose overrides differ only in ``seed=`` grouped;
  mean ± std [min, max] over seeds and the seed ensemble's statistics, foxdqn.report.seeds), shown
  when a setting has more than one finished job; the *jobs* table (one row per job: its swept
  overrides, seed, validation value, main test metrics and status); the plots;
* ``report.json``: ``sweep_dir``, ``selection`` (``metric``, ``lower_is_better``),
  ``common_overrides`` (the overrides every job shares), ``swept`` (the keys whose value differs
  between jobs, ``seed`` aside), ``jobs`` (the rows of report.csv), ``settings``
  (foxdqn.report.seeds.summarise's entries, each with its short ``label``), ``walk_forward``
  (foxdqn.report.walk_forward's entries of a walk-forward sweep, else empty), ``plots`` (paths
  relative to DIR) and ``warnings`` (plots not drawn);
* ``walk_forward.csv`` (a walk-forward sweep only): every seed's folds chained into one
  out-of-sample curve (foxdqn.report.walk_forward);
* ``report.csv``: one row per job: ``job`` (folder name), ``setting`` (its swept overrides),
  one column per swept key, ``seed``, ``val_metric``, ``val``, ``test_<metric>`` for every agent
  metric of ``eval/summary.json`` (trading runs also ``buy_and_hold_sharpe`` and
  ``buy_and_hold_total_return``), ``env_steps``, ``wall_time_s``, ``stop``, ``status`` (``ok``, ``gate: flat``,
  or why the job has no results) and ``dir``;
* ``plots/vs_<key>.png``: the validation value and the main test metric (Sharpe, or the greedy
  ``mean_return`` of an episodic env) of every job against each swept key;
  ``plots/curves_<column>.png``: learning curves of ``metrics.csv`` (``val/<selection metric>``
  and ``train/episode_return``, where logged) by setting, the mean over seeds with a band from
  their minimum to their maximum, for the best :data:`MAX_CURVES` settings.

Jobs and settings are sorted by the validation value the runs were selected on (``selection`` in
``eval/summary.json``), best first (lower is better for ``max_drawdown``); jobs without a finite
value come last. The test split orders nothing. Jobs without results (halted, failed, unfinished,
an unreadable summary) are rows with their reason as status. Every file is written atomically; the
tables are written before any plot, and a plot that cannot be drawn is a warning.

A folder is a sweep folder when it holds Hydra's ``multirun.yaml`` or job folders (sub-folders
with ``.hydra/overrides.yaml`` or ``eval/summary.json``, foxdqn.report.seeds.find_job_dirs).
"""
from __future__ import annotations

import csv
import logging
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from foxdqn.analysis.metrics import LOWER_IS_BETTER
from foxdqn.errors import FoxdqnError
from foxdqn.io_atomic import write_json_atomic, write_text_atomic
from foxdqn.report.seeds import TRADING_METRICS, find_job_dirs, read_job, summarise, to_markdown
from foxdqn.report.walk_forward import to_markdown as walk_forward_markdown
from foxdqn.report.walk_forward import walk_forward

log = logging.getLogger(__name__)

#: Learning-curve plots hold the best this many settings (by validation value); more would not read.
MAX_CURVES = 10
CURVE_COLUMNS = ("val/{metric}", "train/episode_return")


def check_sweep_dir(path: str | Path) -> Path:
    """``path`` as a Path when it is a sweep folder (see the module docstring).

    Raises:
        FoxdqnError: ``path`` does not exist, is a file, is one run's folder, or holds neither
            ``multirun.yaml`` nor a job folder.
    """
    path = Path(path)
    if not path.exists():
        raise FoxdqnError(f"{path}: no such folder; give a multirun folder (hydra.sweep.dir)")
    if not path.is_dir():
        raise FoxdqnError(f"{path}: a file, not a multirun folder")
    if (path / "multirun.yaml").is_file() or find_job_dirs(path):
        return path
    if (path / ".hydra").is_dir() or (path / "eval" / "summary.json").is_file():
        raise FoxdqnError(f"{path}: one run's folder, not a multirun folder; give the folder that holds the jobs "
                          f"({path.parent}?)")
    raise FoxdqnError(f"{path}: not a multirun folder (no multirun.yaml, which Hydra writes into hydra.sweep.dir, "
                      "and no job folder with .hydra/overrides.yaml)")


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _selection(jobs: list[dict]) -> tuple[str | None, bool, list[str]]:
    """The selection metric most jobs used, whether lower is better, and a warning if they differ."""
    names = Counter((j["summary"].get("selection") or {}).get("metric") for j in jobs if j["summary"])
    names.pop(None, None)
    if not names:
        return None, False, []
    metric = names.most_common(1)[0][0]
    warn = [f"jobs were selected on different validation metrics ({', '.join(sorted(names))}); "
            f"the order compares them as {metric}"] if len(names) > 1 else []
    return metric, metric in LOWER_IS_BETTER, warn


def _row(job: dict, overrides: dict[str, str], swept: list[str], label: str) -> dict[str, Any]:
    s = job["summary"] or {}
    sel = s.get("selection") or {}
    val = _num(sel.get("value"))
    row: dict[str, Any] = {"job": job["dir"].name, "setting": label, **{k: overrides.get(k) for k in swept},
                           "seed": overrides.get("seed"), "val_metric": sel.get("metric"), "val": val}
    metrics = s.get("metrics") or {}
    row.update({f"test_{k}": _num(v) for k, v in (metrics.get("agent") or {}).items()})
    if "split" in s:
        bh = metrics.get("buy_and_hold") or {}
        row.update(buy_and_hold_sharpe=_num(bh.get("sharpe")), buy_and_hold_total_return=_num(bh.get("total_return")))
    row.update(env_steps=s.get("env_steps"), wall_time_s=s.get("wall_time_s"), stop=(s.get("stop") or {}).get("reason"),
               status=job["problem"] or _status(s, val), excluded=bool(sel.get("excluded")), dir=str(job["dir"]))
    return row


def _status(summary: dict, val: float) -> str:
    """A finished job's status: ``ok``; ``gate: flat`` (the deployment gate kept it flat on the evaluated
    split); ``pruned at N env steps`` or ``never trades on val[ and test]``
    (the search did not count it: ``selection.excluded``, foxdqn.run.search); ``never trades on test``
    (the evaluated split); ``no finite validation value``."""
    sel, stop = summary.get("selection") or {}, summary.get("stop") or {}
    never_on_test = "split" in summary and (summary["metrics"]["agent"] or {}).get("num_trades") == 0
    if never_on_test and (summary.get("gate") or {}).get("chosen") == "flat":
        never_on_test = False  # flat by the deployment gate's choice (foxdqn.analysis.gate), not the agent's
        if not sel.get("excluded"):
            return "gate: flat" if math.isfinite(val) else "no finite validation value"
    if sel.get("excluded") == "pruned":
        return f"pruned at {stop.get('at_env_steps')} env steps"
    if sel.get("excluded"):
        return sel["excluded"] + (f" and {summary['split']}" if never_on_test else "")
    if never_on_test:
        return f"never trades on {summary['split']}"
    return "ok" if math.isfinite(val) else "no finite validation value"


def short(value: Any) -> str:
    """An override's value for a table or a label: a number with a fractional part or an exponent
    rounded to 4 significant figures when that is shorter (``0.000123456789`` → ``0.0001235``;
    ``3e-4`` stays), anything else as written (integers, names; booleans as
    :func:`foxdqn.report.seeds.load_jobs` reads them: ``true``)."""
    text = str(value)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)", text.strip()):
        rounded = f"{float(text):.4g}"
        return rounded if len(rounded) < len(text.strip()) else text
    return text


def build_report(sweep_dir: str | Path, job_dirs: list[Path] | None = None) -> dict[str, Any]:
    """The report of ``sweep_dir`` as a dict (the keys of report.json, see the module docstring;
    ``jobs`` is a :class:`pandas.DataFrame` here) without writing anything.

    Args:
        sweep_dir: the multirun or population folder.
        job_dirs: the job folders to report (a multirun's own jobs); default every job folder of
            ``sweep_dir``.

    Never raises for a bad job folder (it becomes a row with its problem as status).
    """
    sweep_dir = Path(sweep_dir)
    jobs = [read_job(j) for j in (find_job_dirs(sweep_dir) if job_dirs is None else job_dirs)]
    parsed = [dict(_split(o) for o in j["overrides"]) for j in jobs]
    keys = list(dict.fromkeys(k for p in parsed for k in p if k != "seed"))
    swept = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    common = [o for o in (jobs[0]["overrides"] if jobs else []) if _split(o)[0] in keys and _split(o)[0] not in swept]
    labels = [" ".join(f"{k}={short(p[k])}" for k in swept if k in p) or "(one setting)" for p in parsed]
    metric, lower, warnings = _selection(jobs)
    frame = pd.DataFrame([_row(j, p, swept, lab) for j, p, lab in zip(jobs, parsed, labels)])
    if not frame.empty:
        frame = (frame.sort_values("val", ascending=lower, na_position="last", kind="stable")
                 .sort_values("excluded", kind="stable").reset_index(drop=True))  # a search's uncounted jobs last
    label_of = {j["setting"]: lab for j, lab in zip(jobs, labels)}
    settings = [{**e, "label": label_of[e["setting"]]} for e in summarise([j for j in jobs if j["summary"]])]
    folds, curves = walk_forward([j for j in jobs if j["summary"]])
    return {"sweep_dir": str(sweep_dir), "selection": {"metric": metric, "lower_is_better": lower},
            "common_overrides": common, "swept": swept, "jobs": frame, "settings": settings, "walk_forward": folds,
            "plots": [], "warnings": warnings, "_job_info": list(zip(jobs, labels)), "_walk_forward_curves": curves}


def _pct(v: float) -> str:
    return f"{v * 100:+.2f} %" if math.isfinite(v) else ""


def _g(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else ""


#: the console shows at most this many jobs with results (the best first) and this many without;
#: report.md has every row
CONSOLE_JOBS = 15


def jobs_markdown(report: dict[str, Any], limit: int | None = None) -> str:
    """The jobs table of ``report`` (:func:`build_report`) as markdown: one row per job, best
    validation value first; empty cells where a job has no such number. ``limit``: at most that
    many jobs whose status is ``ok`` (the best) and that many others (failed, halted, ...), then a
    line with the number of rows left out."""
    frame: pd.DataFrame = report["jobs"]
    if frame.empty:
        return "No job folder in this sweep.\n"
    left_out = 0
    if limit is not None and len(frame) > limit:
        ok = frame["status"].isin(("ok", "gate: flat"))
        keep = (ok & (ok.cumsum() <= limit)) | (~ok & ((~ok).cumsum() <= limit))
        left_out, frame = int((~keep).sum()), frame[keep]
    metric = report["selection"]["metric"] or "metric"
    show = pd.DataFrame({"job": frame["job"]})
    for key in report["swept"]:
        show[key] = frame[key].fillna("").map(short)
    if frame["seed"].notna().any():
        show["seed"] = frame["seed"].fillna("")
    show[f"val {metric}"] = frame["val"].map(_g)
    if "test_sharpe" in frame:  # trading runs
        for col, name, fmt in (("test_total_return", "test return", _pct), ("test_sharpe", "test Sharpe", _g),
                               ("test_max_drawdown", "max drawdown", _pct), ("test_num_trades", "trades", _g)):
            show[name] = frame[col].map(fmt) if col in frame else ""
    if "test_mean_return" in frame:  # episodic envs: the greedy evaluation
        show["test mean return"] = frame["test_mean_return"].map(_g)
    show["status"] = frame["status"]
    more = f"… {left_out} more jobs in report.md\n" if left_out else ""
    return show.to_markdown(index=False, disable_numparse=True) + "\n" + more


def settings_markdown(report: dict[str, Any]) -> str:
    """The settings table (foxdqn.report.seeds.to_markdown, settings named by their swept
    overrides), or "" when no setting has more than one finished job."""
    if not any(e["seeds"] > 1 for e in report["settings"]):
        return ""
    return to_markdown([{**e, "setting": e["label"]} for e in report["settings"]])


def _markdown(report: dict[str, Any]) -> str:
    frame, sel = report["jobs"], report["selection"]
    done = int(frame["val"].notna().sum()) if not frame.empty else 0
    head = (f"# Report of {report['sweep_dir']}\n\n{len(frame)} jobs, {done} with a finite validation value; "
            f"swept: {', '.join(report['swept']) or 'nothing (one setting)'}; common overrides: "
            f"`{' '.join(report['common_overrides']) or 'none'}`.\n"
            f"Sorted by the validation value (val {sel['metric']}, "
            f"{'lower' if sel['lower_is_better'] else 'higher'} is better), best first; the test split orders "
            "nothing.\n\n")
    settings = settings_markdown(report)
    if settings:
        trading = any("ensemble" in e for e in report["settings"])
        head += ("## Settings over seeds\n\nmean ± std [min, max] over the seeds of a setting" +
                 ("; the ensemble is the seeds' per-bar test returns averaged into one portfolio; the ensemble policy "
                  "(a population's seeds acting as one agent, eval.ensemble) is walked once" if trading else "") +
                 ".\n\n" + settings + "\n")
    if report.get("walk_forward"):
        head += ("## Walk-forward\n\nEach fold trains on the bars before its validation block and tests on its own "
                 "block; the concatenated row chains the folds' test curves per seed (walk_forward.csv), means over "
                 "seeds.\n\n" + walk_forward_markdown(report["walk_forward"]) + "\n")
    body = "## Jobs\n\n" + jobs_markdown(report)
    plots = "".join(f"\n![{Path(p).stem}]({p})\n" for p in report["plots"])
    notes = "".join(f"- {w}\n" for w in report["warnings"])
    return head + body + (f"\n## Plots\n{plots}" if plots else "") + (f"\n## Warnings\n\n{notes}" if notes else "")


def _write_tables(sweep_dir: Path, report: dict[str, Any]) -> None:
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    frame: pd.DataFrame = report["jobs"]
    write_text_atomic(sweep_dir / "report.csv", frame.to_csv(index=False))
    write_json_atomic(sweep_dir / "report.json", {**public, "jobs": frame.astype(object).where(frame.notna(), None)
                                                  .to_dict("records")})
    write_text_atomic(sweep_dir / "report.md", _markdown(report))
    curves = report.get("_walk_forward_curves")
    if curves is not None and not curves.empty:
        write_text_atomic(sweep_dir / "walk_forward.csv", curves.to_csv(index=False))


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("_")


def _curves(report: dict[str, Any], column: str) -> dict[str, pd.DataFrame]:
    """Setting label -> DataFrame (env step x seed) of ``column`` of the jobs' metrics.csv."""
    order = [e["label"] for e in report["settings"]]
    groups: dict[str, list[Path]] = {}
    for job, label in report["_job_info"]:
        groups.setdefault(label, []).append(job["dir"])
    labels = (order + [lab for lab in groups if lab not in order])[:MAX_CURVES]
    out = {}
    for label in labels:
        series = []
        for job_dir in groups.get(label, []):
            values = _metric_by_step(job_dir / "metrics.csv", column)
            if values:
                s = pd.Series(list(values.values()), index=pd.Index(list(values), name="step"), name=job_dir.name)
                series.append(s)
        if series:
            out[label] = pd.concat(series, axis=1)
    return out


def _metric_by_step(path: Path, column: str) -> dict[int, float] | None:
    """``column`` of a job's metrics.csv by env step, in file order: the rows whose step and value
    are numbers (a NaN value skipped; of a repeated step, the last such row, at its place), as
    ``pandas.read_csv`` then ``to_numeric(errors="coerce").dropna()`` would keep them, read with the
    csv module (20x faster for a sweep's hundreds of short files). None: no such file, a file that
    cannot be read or parsed (a row with more fields than the header: a torn write), or without
    ``step`` or ``column``."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if header is None or "step" not in header or column not in header:
                return None
            i, k, width = header.index("step"), header.index(column), len(header)
            values: dict[int, float] = {}
            for row in rows:
                if len(row) > width:
                    return None
                if len(row) <= max(i, k):
                    continue
                try:
                    step, value = int(row[i]), float(row[k])
                except ValueError:
                    continue
                if value == value:  # not NaN
                    values.pop(step, None)  # a repeated step: the last row, at its place
                    values[step] = value
            return values
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def _plots(sweep_dir: Path, report: dict[str, Any]) -> None:
    """Draw the plots into ``sweep_dir/plots``; each failure becomes a warning in the report."""
    from foxdqn.report.plots import plot_learning_curves, plot_metric_vs_param

    frame, metric = report["jobs"], report["selection"]["metric"] or "metric"
    test = "test_sharpe" if "test_sharpe" in frame else "test_mean_return"
    name = f"{sweep_dir.name}: "
    todo = [(f"plots/vs_{_slug(key)}.png", lambda p, key=key: plot_metric_vs_param(
                p, key, frame[key].fillna("(unset)").astype(str).map(short).tolist(),
                {f"val {metric}": frame["val"], test.replace("_", " ", 1): frame.get(test, frame["val"] * math.nan)},
                name + f"every job against {key}"))
            for key in report["swept"]]
    if not (frame["val"].notna().any() or frame.get(test, frame["val"]).notna().any()):
        todo = []  # no job has a number: nothing to draw against the keys
    for column in (c.format(metric=metric) for c in CURVE_COLUMNS):
        curves = _curves(report, column)  # a column no job logged (no validation during training): no plot
        if curves:
            todo.append((f"plots/curves_{_slug(column)}.png", lambda p, column=column, curves=curves:
                         plot_learning_curves(p, curves, column,
                                              name + f"{column} by setting\nline: mean over seeds; band: min to max")))
    for rel, draw in todo:
        try:
            draw(sweep_dir / rel)
        except Exception as exc:  # noqa: BLE001 - a plot is never worth the report
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            log.warning("%s not drawn: %s", rel, why)
            report["warnings"].append(f"{rel} not drawn: {why}")
        else:
            report["plots"].append(rel)


def write_report(sweep_dir: str | Path, job_dirs: list[Path] | None = None, plots: bool = True) -> dict[str, Any]:
    """Build the report of ``sweep_dir`` (:func:`build_report`) and write report.md, report.json,
    report.csv and (``plots``) plots/*.png into it, atomically; returns the report.

    Raises:
        OSError: a table file cannot be written (a plot that cannot be written is a warning).
    """
    sweep_dir = Path(sweep_dir)
    report = build_report(sweep_dir, job_dirs)
    _write_tables(sweep_dir, report)  # first: a plot failure must not lose the tables
    if plots and not report["jobs"].empty:
        _plots(sweep_dir, report)
        _write_tables(sweep_dir, report)  # now with the plots and the warnings
    return report


def console_text(report: dict[str, Any]) -> str:
    """What a multirun and ``python -m foxdqn.report`` print: the jobs table (at most
    :data:`CONSOLE_JOBS` rows with results and as many without), the settings table (when a
    setting has several seeds), the count of jobs without results and report.md's path."""
    frame = report["jobs"]
    if frame.empty:
        failed = uncounted = 0
    else:  # results: ok, or a finished run the search did not count, or one that never trades
        results = (frame["status"].isin(("ok", "gate: flat")) | frame["excluded"]
                   | frame["status"].str.startswith("never trades"))
        failed, uncounted = int((~results).sum()), int(frame["excluded"].sum())
    settings = settings_markdown(report)
    return (jobs_markdown(report, CONSOLE_JOBS) + (("\n" + settings) if settings else "") +
            (f"{failed} of {len(frame)} jobs without results (status column)\n" if failed else "") +
            (f"{uncounted} of {len(frame)} jobs not counted by the search (pruned or never trading on val; "
             "listed last)\n" if uncounted else "") +
            f"report: {Path(report['sweep_dir']) / 'report.md'}")
