"""
Where the study's numbers come from, in words: the command, machine and date under each figure and at the top of
the results page, from results/machine.json (experiments/gather.py) and results/mqar.json (experiments/mqar.py).
experiments/report.py puts them on the page, experiments/mqar.py under its figure.

    python -m experiments.report                     # the page, every line of provenance on it
"""


def machine_lines(machine: dict) -> list:
    """One line per machine the runs ran on: device, threads, torch, date, how many runs."""
    lines = []
    for m in machine.get("machines", []):
        where = (f"{m['device']}, {count(m['threads'], 'thread')}, torch {m['torch']}, {m['date']}"
                 if m.get("device") else "not recorded")
        lines.append(f"{where}: {count(m['runs'], 'run')}")
    return lines or ["not recorded"]


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def provenance(machine: dict) -> str:
    """The command, machine and date in one line (under each figure, on each plot)."""
    if not machine.get("command"):
        return "an unrecorded command on an unrecorded machine (no machine.json)"
    return f"`{machine['command']}` on {'; '.join(machine_lines(machine))}"


def short_provenance(machine: dict) -> str:
    """The command, the runs, the machines and the dates in a few words (the summary; the page has each machine)."""
    if not machine.get("command"):
        return provenance(machine)
    found = machine.get("machines", [])
    devices = "; ".join(dict.fromkeys(m["device"] for m in found if m.get("device"))) or "an unrecorded machine"
    dates = sorted({m["date"] for m in found if m.get("date")})
    when = f", {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") if dates else ""
    return f"`{machine['command']}`, {count(sum(m['runs'] for m in found), 'run')} on {devices}{when}"


def partial_banner(machine: dict) -> list:
    """The page's warning while runs or attention analyses of the plan are missing (none once all are made)."""
    done, total = machine.get("runs_finished"), machine.get("runs_planned")
    analysed, planned = machine.get("attention_models", [0, 0])
    if done == total and analysed == planned:
        return []
    attention = f", the attention of {analysed} of {planned} models analysed" if analysed < planned else ""
    return [f"**Partial: {done} of {total} runs finished{attention}. Missing rows are runs not yet made; a verdict "
            f"can change when they are.**", ""]


def mqar_provenance(where: dict) -> str:
    """The MQAR experiment's command, machine, date and training minutes in one line (mqar.json: its section, its
    figure, the summary)."""
    if not where:
        return "an unrecorded command on an unrecorded machine (no mqar.json)"
    if "runs" not in where:  # an mqar.json before the runs' own records were read: the machine that rebuilt the table
        return (f"`{where['command']}` on {where['device']}, {count(where['threads'], 'thread')}, torch "
                f"{where['torch']}, {where['date']} ({where['train_minutes']:.0f} minutes of training)")
    threads = ", ".join(f"{count(n, 'run')} at {count(int(t), 'thread')}" for t, n in where["threads"].items())
    dates = " to ".join(dict.fromkeys(where["dates"])) or "undated"
    unrecorded = where["runs"] - where["recorded"]
    return (f"`{where['command']}`: {count(where['runs'], 'run')} on {'; '.join(where['devices'])} ({threads}"
            + (f"; {unrecorded} unrecorded" if unrecorded else "") + f"), torch {', '.join(where['torch'])}, "
            f"{dates} ({where['train_minutes']:.0f} minutes of training)")
