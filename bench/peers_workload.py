"""The workload of bench/peers.py: agent conversations every system stores the same way.

Seeded, so every system (each in its own process) builds the same messages: 200
sessions x 50 messages, about a tenth of them in Chinese, Japanese or Korean,
assistant turns that call tools (``tool_calls`` JSON with arguments) followed by one
``tool`` result per call (JSON output), and final answers.
Text comes from bench/generate.py's pools (the corpus run.py measures), with its
length distributions. Messages are neutral dicts in Hermes' shape (role, content,
tool_calls, tool_name, tool_call_id); each system's adapter turns them into what its
API takes.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

SEED = 32
SESSIONS = 200
PER_SESSION = 50
WRITERS = 8
PER_WRITER = 100

#: Word searches: frequent, middling, rare, and one absent (the worst case of a LIKE
#: scan, which then reads every row).
SEARCH_WORDS = ("timeout", "kubernetes", "checkpoint", "segfault", "zeppelinx")

_TOOLS = ("terminal", "read_file", "search_files", "web_search", "patch")
_CJK_LANGS = ("zh", "zh", "ja", "ko")

_texts: Any = None


def _pool() -> Any:
    """bench/generate.py's seeded text pools (Zipf English vocabulary, Chinese, Japanese, Korean)."""
    global _texts
    if _texts is None:
        import generate

        _texts = generate.Corpus(random.Random(SEED), en_chars=400_000, cjk_chars=150_000)
    return _texts


def _len(rng: random.Random, median: float, lo: int, hi: int) -> int:
    """A clipped log-normal length, as bench/generate.py draws them."""
    return max(lo, min(hi, int(rng.lognormvariate(math.log(median), 0.9))))


def _args(rng: random.Random, tool: str, lang: str) -> dict[str, Any]:
    text = _pool().text
    if tool == "terminal":
        return {"command": rng.choice(("pytest -x ", "git diff ", "docker compose logs ", "grep -rn ", "kubectl logs "))
                + text("en", 20).split(" ")[0], "timeout": rng.choice((30, 60, 120))}
    if tool in ("read_file", "patch"):
        args: dict[str, Any] = {"path": f"src/{text('en', 12).split(' ')[0]}.py"}
        if tool == "patch":
            args["content"] = text("en", rng.randint(40, 300))
        return args
    return {"query": text(lang if rng.random() < 0.5 else "en", rng.randint(8, 60))}


def conversation(rng: random.Random, sid: str, n: int, lang: str) -> list[dict[str, Any]]:
    """``n`` messages of one session: user, tool-calling assistant, tool results, answer, again."""
    text = _pool().text
    out: list[dict[str, Any]] = []
    call = 0
    while len(out) < n:
        out.append({"role": "user", "content": text(lang, _len(rng, 70, 10, 300))})
        calls = []
        for _ in range(rng.randint(1, 2)):
            call += 1
            tool = rng.choice(_TOOLS)
            calls.append({"id": f"call_{sid}_{call}", "type": "function",
                          "function": {"name": tool, "arguments": json.dumps(_args(rng, tool, lang),
                                                                             ensure_ascii=False)}})
        out.append({"role": "assistant", "content": text(lang, _len(rng, 80, 20, 400)) if rng.random() < 0.5 else "",
                    "tool_calls": calls, "finish_reason": "tool_calls"})
        for c in calls:
            body_lang = lang if rng.random() < 0.8 else "en"
            output = {"exit_code": rng.choice((0, 0, 0, 1)), "output": text(body_lang, _len(rng, 700, 100, 4000))}
            out.append({"role": "tool", "content": json.dumps(output, ensure_ascii=False),
                        "tool_call_id": c["id"], "tool_name": c["function"]["name"]})
        out.append({"role": "assistant", "content": text(lang, _len(rng, 350, 50, 2000)), "finish_reason": "stop"})
    # Cut to n, never ending on an assistant's tool call without its result.
    msgs = out[:n]
    if msgs and msgs[-1].get("tool_calls"):
        msgs[-1] = {"role": "assistant", "content": text(lang, _len(rng, 350, 50, 2000)), "finish_reason": "stop"}
    return msgs


def _lang(i: int) -> str:
    """Chinese, Japanese or Korean: 12 % of the sessions, which gives about a tenth of the
    messages with CJK text (tool output stays English in a fifth of their results)."""
    return _CJK_LANGS[(i // 10) % len(_CJK_LANGS)] if i % 10 == 3 or i % 50 == 8 else "en"


def corpus(sessions: int = SESSIONS, per_session: int = PER_SESSION, seed: int = SEED
           ) -> list[tuple[str, list[dict[str, Any]]]]:
    """(session id, messages) for every session of the store loaded before the timed operations."""
    rng = random.Random(seed)
    return [(f"peer-{i:04d}", conversation(rng, f"peer-{i:04d}", per_session, _lang(i))) for i in range(sessions)]


def extra_messages(count: int, seed: int = SEED + 1) -> list[dict[str, Any]]:
    """Messages appended during the timed append and writer runs (the same mix, CJK included)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < count:
        out.extend(conversation(rng, f"x{i}", 10, _lang(i)))
        i += 1
    return out[:count]
