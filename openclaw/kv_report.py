"""The engine's KV budget in this daemon's terms: how many conversations of the configured context
fit in the pool, said by `openclaw doctor`, /status, /metrics and a warning at start when
`max_num_seqs` of them would not (the engine then preempts). The numbers are the engine's own
(engine/kv_budget.py); over a remote server they are known only where its /metrics states them."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.kv_budget import KVBudget

if TYPE_CHECKING:
    from openclaw.agent import ChatModel
    from openclaw.config import Config
    from openclaw.metrics import Metrics

log = logging.getLogger(__name__)

NOT_KNOWN = "not known (remote server)"


def budget_of(stats: Mapping[str, Any]) -> KVBudget | None:
    return KVBudget.from_stats(dict(stats))


def pool_text(budget: KVBudget) -> str:
    """"46,080 bytes/token; pool 1,456 blocks of 16 = 23,296 tokens (1.00 GiB)"."""
    text = f"{budget.bytes_per_token:,} bytes/token"
    if budget.num_blocks is None:
        return text + "; pool sized at start from free GPU memory (engine.gpu_memory_utilization)"
    return (f"{text}; pool {budget.num_blocks:,} blocks of {budget.block_size} = "
            f"{budget.pool_tokens:,} tokens ({budget.pool_bytes / 2**30:.2f} GiB)")


def fit_text(budget: KVBudget, context: int) -> str:
    fit = budget.conversations(context)
    if fit is None:
        return "conversations that fit: known once the daemon runs (/status)"
    return f"{fit:,} conversation{'' if fit == 1 else 's'} of {context:,} tokens fit at once"


def overcommit(budget: KVBudget, max_num_seqs: int, context: int) -> tuple[str, str] | None:
    """(what, what to change) when `max_num_seqs` conversations of `context` tokens overflow the
    pool; None when they fit (or the pool is not known yet)."""
    if not budget.overcommitted(max_num_seqs, context):
        return None
    fit = budget.conversations(context)
    gib = gib_up(budget.gib_for(max_num_seqs, context))
    if not fit:  # not even one: the engine refuses a prompt over the pool's tokens
        return (f"one conversation of {context:,} tokens needs {budget.blocks_for(context):,} KV "
                f"blocks, the pool holds {budget.num_blocks:,}: a prompt of "
                f"{budget.pool_tokens:,} tokens or more is refused",
                f"set engine.kv_cache_gib = {gib_up(budget.gib_for(1, context))} at least (for "
                f"engine.max_num_seqs conversations, {gib}), or lower agent.context_tokens "
                f"below {budget.pool_tokens:,}")
    need = max_num_seqs * budget.blocks_for(context)
    what = (f"engine.max_num_seqs ({max_num_seqs}) conversations of {context:,} tokens need "
            f"{need:,} KV blocks, the pool holds {budget.num_blocks:,}: when more than {fit} are "
            f"that long at once, the engine preempts (and later recomputes) some of them")
    fix = (f"set engine.kv_cache_gib = {gib} (memory "
           f"permitting; on a GPU, or raise engine.gpu_memory_utilization), or lower "
           f"engine.max_num_seqs to {fit}, or agent.context_tokens")
    return what, fix


def gib_up(gib: float) -> str:
    """`gib` rounded up, to 0.1 from 1 GiB, else to two significant digits: a kv_cache_gib to write
    that holds at least that much."""
    step = 0.1 if gib >= 1 else 10.0 ** (math.floor(math.log10(gib)) - 1)
    decimals = max(1, -math.floor(math.log10(step)))
    return f"{math.ceil(round(gib / step, 6)) * step:.{decimals}f}"


def status_line(stats: Mapping[str, Any], context: int) -> str:
    """/status's line; "" for a model that states no pool and is no server (a test's stand-in)."""
    budget = budget_of(stats)
    if budget is None:
        return f"KV pool: {NOT_KNOWN}" if stats.get("backend") == "openai" else ""
    return f"KV pool: {pool_text(budget)}; {fit_text(budget, context)}"


def warn_if_overcommitted(stats: Mapping[str, Any], max_num_seqs: int, context: int,
                          level: int = logging.WARNING) -> bool:
    """The warning at start, logged when the loaded engine's pool is too small for its batch."""
    budget = budget_of(stats)
    found = overcommit(budget, max_num_seqs, context) if budget else None
    if found is None:
        return False
    log.log(level, "KV cache: %s (%s). To change it: %s", found[0], pool_text(budget), found[1])
    return True


def warn_at_start(config: Config, model: ChatModel, channels: Iterable[str]) -> bool:
    """warn_if_overcommitted for the engine in this process; a server's pool and batch are its own.
    With the console as the only channel (`channels`: the connectors' names) one person talks,
    a conversation at a time: the batch cannot fill the pool, so it is said at INFO, not as a
    warning on every `openclaw chat` of the defaults (64 x 8,192 tokens in 1 GiB on the CPU)."""
    if not isinstance(config.engine, EngineConfig):
        return False
    level = logging.INFO if set(channels) <= {"terminal"} else logging.WARNING
    return warn_if_overcommitted(model.stats(), config.engine.max_num_seqs,
                                 config.agent.conversation_tokens(model.max_model_len), level)


def add_gauges(metrics: Metrics, stats: Callable[[], Mapping[str, Any]],
               context: Callable[[], int]) -> None:
    """openclaw_kv_conversations_fit, at each scrape (the engine's own series say the rest)."""
    def fit() -> float:
        budget = budget_of(stats())
        found = budget.conversations(context()) if budget else None
        if found is None:
            raise LookupError("no KV pool stated")  # left out of the scrape
        return found

    metrics.gauge("openclaw_kv_conversations_fit", fit,
                  "conversations of the configured context that fit in the KV pool at once")
