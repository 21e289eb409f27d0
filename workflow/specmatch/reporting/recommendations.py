"""What to deploy, in words: each records.Recommendation with its engine's configuration (the lines the
engine's adapter rendered: records.Deployment), its evidence and its measured verification
(records.Verification), rendered."""
from __future__ import annotations

from ..controls import CACHE, OFF
from ..metrics import LABEL
from ..records import Decision, Deployment, Outcome, Recommendation, Verification
from .context import answers_kept, flag_keys
from .decided import Decided
from .formats import concurrencies, number
from .verdicts import not_drafting


def verification_text(v: Verification | None) -> str:
    """A recommendation's measured check: verified, failed, undecided or why it was not verified."""
    if v is None:
        return ""
    rows = v.per_concurrency
    one_sided = (1 + v.equivalence_confidence) / 2 if v.equivalence_confidence is not None else None
    level = (f" ({LABEL.get(v.metric, v.metric)}; verified: at every concurrency no more than {v.min_effect:.0%} "
             f"worse than its reference, each at {number(one_sided, '.0%')} one-sided (non-inferiority); "
             f"failed: a cost at {number(v.per_test_confidence, '.1%')} per concurrency; P(verified if a concurrency "
             "costs more) ≤ "
             f"{v.error_rates.get('verified_if_costly', 1 - v.confidence):.0%}, P(failed if it matches) ≤ "
             f"{v.error_rates.get('failed_if_correct', 1 - v.confidence):.0%})") if rows else ""
    why = f" ({v.reason})" if v.reason else ""
    if v.outcome == Outcome.VERIFIED:
        return (f" **Verified:** `{v.server}` matched the server its schedule runs at " + ", ".join(
            f"c={x.concurrency} (`{x.against}`: {number(x.speedup)}x [{number(x.lo)}, {number(x.hi)}])"
            for x in rows) + level + why + ".")
    if v.outcome == Outcome.FAILED:
        costs = [x for x in rows if x.verdict == Decision.LOSES]
        return (f" **Verification failed:** `{v.server}` " + "; ".join(
            f"ran at {number(x.speedup)}x [{number(x.lo)}, {number(x.hi)}] of `{x.against}` at "
            f"c={x.concurrency}" for x in costs) + ": the schedule's switch costs throughput" + level + why + ".")
    if v.outcome == Outcome.UNDECIDED and not rows:   # nothing was compared: the reason says why
        return f" **Verification undecided:** `{v.server}`{why}."
    if v.outcome == Outcome.UNDECIDED:
        return (f" **Verification undecided:** `{v.server}` against the server its schedule runs at each concurrency: "
                + ", ".join(f"c={x.concurrency} {x.verdict.value} vs `{x.against}` ({number(x.speedup)}x)"
                            for x in rows) + level + why + ".")
    if v.outcome == Outcome.NOT_VERIFIABLE:
        return f" **Not verified:** {v.reason}."
    return f" **Not verified yet:** {v.reason or 'not measured'}."


def deploy_lines(deploy: Deployment | None) -> list[str]:
    """What the engine's adapter said of a deployment: what to set, then its own word on it."""
    return [x for x in ((deploy.flag, deploy.note) if deploy else ()) if x]


def recommendation_lines(d: Decided, recs: list[Recommendation]) -> list[str]:
    """One paragraph per recommendation: what to do, the engine's configuration, the evidence, the
    verification, and where the gain comes with the configuration rather than from drafting."""
    lines = []
    for r in recs:
        text = f"- **{r.server}** (`{r.suite}`): {r.text}" + "".join(f". {x}" for x in deploy_lines(r.deploy))
        text += f" — evidence: {r.evidence}."
        if r.measured_by and r.verified is not None and r.verified.per_concurrency:
            text += f" The recommended deployment is `{r.measured_by}`'s configuration, measured on the same grid."
        if r.verified is not None:
            text += verification_text(r.verified)
        elif r.as_configured:
            text += f" The recommended deployment is one already measured (`{r.server}` as configured)."
        elif r.action == "off":
            text += f" The recommended deployment is one already measured (the baseline `{d.baseline}`)."
        cause = not_drafting(d, r.server, r.suite)
        if cause["configured"]:
            text += (f" At c={concurrencies(cause['configured'])} its configured-off control `{r.server}{OFF}` pays as "
                     "much: the gain comes with the configuration, not from drafting (see \"Why it pays\").")
        lines.append(text + cache_flag_text(d, r.server))
    return lines


def cache_flag_text(d: Decided, server: str) -> str:
    """The engine's prefix-cache opt-out, named where its cache arm paid on the session suites against
    the server as configured and kept the answers the server gives without it (see "Sessions")."""
    arm = server + CACHE
    led = [x for x in d.decisions.stopping.ledgers if x.server == arm and x.against == server and x.verdict]
    if not led:
        return ""
    pays = [x for x in led if x.verdict == Decision.PAYS]
    costs = [x for x in led if x.verdict == Decision.LOSES]
    kept = [answers_kept(d, arm, server, x.suite, x.concurrency) for x in pays]
    same = all(k is not False for k in kept)
    flag = flag_keys(d, arm, server) or "the engine's prefix-cache opt-out"
    if pays and same and not costs:
        answers = ("the same answers" if all(kept) else "answers not compared (no output recorded)")
        return (f" **On agentic sessions add {flag}:** with it `{server}`'s session throughput was "
                + ", ".join(f"{number(x.speedup.value)}x [{number(x.speedup.lo)}, {number(x.speedup.hi)}] at "
                            f"c={x.concurrency}" for x in pays)
                + f" of its own as configured, {answers} (see \"Sessions\"); measured beside it in the same repeats, "
                  "not yet in a deployment of its own.")
    if pays and not same:
        return f" {flag} ran its sessions faster but changed answers: not recommended (see \"Sessions\")."
    if costs:
        return f" {flag} costs session time at c={concurrencies([x.concurrency for x in costs])}: leave it off."
    return ""
